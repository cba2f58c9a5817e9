"""Zero-shot evaluation of a checkpoint: multiple choice by log-likelihood and last-word prediction,
scored the way EleutherAI's evaluation harness scores them (BigScience chose BLOOM's architecture
by these numbers).

    python evaluate_lm.py --checkpoint runs/clm/final --task-file my_task.jsonl
    python evaluate_lm.py --checkpoint runs/clm/final --held-out cache/sample-... --task cloze

Task files are JSONL, one object per line:
  multiple choice   {"context": "The cat sat on the", "choices": ["mat", "moon"], "label": 0}
  last word         {"text": "a passage whose final word is to be predicted"}
Built-in tasks (`--task NAME`, repeatable), made deterministically from the held-out documents of
a prepared data folder (data.py's validation split: never a training document), so models can be
compared without downloading anything:
  cloze       a sentence, then its true next sentence among 3 from other held-out documents
  last-word   the final word of a 40-word passage (LAMBADA-style)

Scoring (lm-eval 0.4's definitions). A choice is scored by the summed log-probability of its tokens
after the context and a space: `acc` takes the argmax of the sums, `acc_norm` of the sums divided by
the choice's length in characters. Last word: `acc` is whether greedy decoding gives exactly the
word's tokens (every position's argmax is the true token), `perplexity` = exp(-mean log-probability
of the word). Causal models score in one forward pass per item. Masked models get the
pseudo-log-likelihood (Salazar et al. 2020): each token of the choice is masked in turn, one forward
pass per token; slower, and labelled "PLL" in the output.
"""
import argparse
import json
import math
import os
import random
import re
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

import files
import model
import tokenizer
from loader import load_meta, read_shard

BUILT_IN = ("cloze", "last-word")

# -----------------------------------------------------------------------------
# Tasks: from a JSONL file, or built from held-out documents


def read_task_file(path):
    """(kind, items) of a JSONL task file: kind "multiple_choice" ({"context", "choices", "label"})
    or "last_word" ({"text"}), decided by the first line. Raises ValueError naming file:line and
    what is wrong."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: task file not found")
    items, kind = [], None
    # bytes, decoded line by line, so that bad UTF-8 is reported with its line number
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for n, raw in enumerate(lines, 1):
        if not raw.strip():  # blank lines (a trailing newline, spacing) are not items
            continue
        # file:line, the form editors and terminals turn into a link
        where = f"{path}:{n}"
        try:
            item = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ValueError(f"{where}: invalid UTF-8") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not a JSON object ({e.msg})") from None
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a JSON object")
        # the keys decide the kind; one file holds one kind, so its metrics mean one thing
        this = "multiple_choice" if "choices" in item else "last_word" if "text" in item else None
        if this is None:
            raise ValueError(f"{where}: needs \"context\", \"choices\" and \"label\" "
                             "(multiple choice) or \"text\" (last word)")
        if kind and this != kind:
            raise ValueError(f"{where}: a {this.replace('_', ' ')} item in a "
                             f"{kind.replace('_', ' ')} file")
        kind = this
        items.append(check_item(item, kind, where))
    if not items:
        raise ValueError(f"{path}: no items")
    return kind, items


def check_item(item, kind, where):
    if kind == "last_word":
        if not isinstance(item["text"], str) or len(item["text"].split()) < 2:
            raise ValueError(f"{where}: \"text\" must be a string of at least two words")
        return {"text": item["text"]}
    context, choices, label = item.get("context"), item.get("choices"), item.get("label")
    if not isinstance(context, str):
        raise ValueError(f"{where}: \"context\" must be a string")
    strings = isinstance(choices, list) and all(isinstance(c, str) and c.strip() for c in choices)
    if not strings or len(choices) < 2:
        raise ValueError(f"{where}: \"choices\" must be a list of at least two non-empty strings")
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(choices):
        raise ValueError(f"{where}: \"label\" must be an index into choices "
                         f"(0..{len(choices) - 1}), got {label!r}")
    return {"context": context, "choices": choices, "label": label}


def held_out_documents(folder):
    """The documents of a prepared data folder's validation split, decoded back to text."""
    meta = load_meta(folder)
    enc = tokenizer.load_tokenizer(meta["tokenizer"])
    sep = tokenizer.special_ids(enc)["sep"]
    docs = []
    # validation text: the model never trained on it, so a built-in task cannot be memorized
    for shard in meta["val"]:
        tokens = np.asarray(read_shard(shard))
        # data.py ends every document with [SEP], so the [SEP] positions cut the stream back apart
        cuts = np.flatnonzero(tokens == sep)
        starts = np.concatenate([[0], cuts[:-1] + 1])
        docs += [enc.decode(tokens[a:b].tolist()) for a, b in zip(starts, cuts) if b > a]
    if not docs:
        raise ValueError(f"{folder}: the validation split has no documents")
    return docs


def split_sentences(text, min_words=4):
    """Sentences of at least min_words words: text cut after . ! ? followed by whitespace."""
    # a crude splitter on purpose: no language model or library, the same cuts in every language
    # with Latin punctuation; short fragments (abbreviations, headings) are dropped by min_words
    parts = re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
    return [p for p in parts if len(p.split()) >= min_words]


def build_cloze(docs, n_items=500, n_choices=4, seed=0):
    """Multiple-choice items: a sentence as context; the sentence that follows it in its document,
    against n_choices - 1 sentences from other held-out documents. Deterministic for a seed."""
    per_doc = [split_sentences(d) for d in docs]
    pairs = [(i, s[j], s[j + 1]) for i, s in enumerate(per_doc) for j in range(len(s) - 1)]
    if len(per_doc) < 2 or not pairs:
        raise ValueError("the held-out documents are too few or too short for a cloze task")
    # one seeded generator: two checkpoints scored with the same seed see the very same items
    rng = random.Random(seed)
    items = []
    for i, context, truth in rng.sample(pairs, min(n_items, len(pairs))):
        # distractors from other documents: fluent sentences that do not follow from the context,
        # as in the story cloze test (Mostafazadeh et al. 2016) but with random, not written, foils
        others = [s for k, ss in enumerate(per_doc) if k != i for s in ss]
        distractors = rng.sample(others, min(n_choices - 1, len(others)))
        choices = [truth] + distractors
        rng.shuffle(choices)
        items.append({"context": context, "choices": choices, "label": choices.index(truth)})
    return "multiple_choice", items


def build_last_word(docs, n_items=500, words=40, seed=0):
    """Last-word items: passages of `words` consecutive words whose final word is alphabetic
    (LAMBADA-style)."""
    candidates = []
    for d in docs:
        w = d.split()
        # non-overlapping windows: no two items share words, so they are independent samples
        for start in range(0, len(w) - words + 1, words):
            passage = w[start:start + words]
            # LAMBADA (Paperno et al. 2016) asks for a word; a number or a quote mark is no test
            # of understanding the passage
            if passage[-1].isalpha():
                candidates.append(" ".join(passage))
    if not candidates:
        raise ValueError(f"the held-out documents hold no {words}-word passage ending in a word")
    rng = random.Random(seed)
    return "last_word", [{"text": t} for t in rng.sample(candidates, min(n_items, len(candidates)))]


# -----------------------------------------------------------------------------
# Scoring: log-likelihood of a continuation after a context


def continuation(context, choice):
    """The harness's target: the choice after a space, unless the context ends or the choice starts
    with one."""
    # BPE vocabularies fold the space into the next token (" cat"), so a choice scored without its
    # space would be tokenized as the model never saw it mid-sentence
    return choice if not context or context[-1].isspace() or choice[:1].isspace() else " " + choice


@torch.no_grad()
def score_causal(net, specials, context_ids, cont_ids_list):
    """[(sum of log p(continuation tokens | context), all greedy?)] for continuations of one
    context, in one batched forward pass: [SEP] context continuation (a document starts after [SEP]
    in the training stream), cut from the left to the model's length."""
    T = net.config["max_seq_len"]
    # cut from the left: the words nearest the continuation matter most for predicting it
    rows = [([specials["sep"]] + context_ids + c)[-T:] for c in cont_ids_list]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), specials["pad"], dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    logits = net(ids.to(net.tok_emb.weight.device))["logits"]                  # (B, width, V)
    logp = logits.float().log_softmax(-1).cpu()
    out = []
    for i, (r, c) in enumerate(zip(rows, cont_ids_list)):
        pos = torch.arange(len(r) - len(c) - 1, len(r) - 1)  # the positions that predict c
        target = torch.tensor(c)
        # the sum, not the mean: a choice is scored as the probability of the whole string
        greedy = bool((logp[i, pos].argmax(-1) == target).all())
        out.append((float(logp[i, pos, target].sum()), greedy))
    return out


@torch.no_grad()
def score_masked(net, specials, context_ids, cont_ids_list):
    """Pseudo-log-likelihood (Salazar et al. 2020): for each continuation, [CLS] context
    continuation [SEP] with one of its tokens masked at a time; the sum of log p(true token) over
    those passes, and whether each was the argmax. One forward pass per continuation token
    (batched)."""
    T = net.config["max_seq_len"]
    out = []
    for c in cont_ids_list:
        # room for [CLS], [SEP] and the whole continuation; the context is cut from the left
        keep = max(0, T - 2 - len(c))
        row = [specials["cls"]] + context_ids[len(context_ids) - keep:] + c + [specials["sep"]]
        first = len(row) - 1 - len(c)                       # where the continuation starts
        ids = torch.tensor(row).repeat(len(c), 1)           # (len(c), L): a row per masked token
        positions = torch.arange(first, first + len(c))
        # masking one token at a time is what makes a masked LM's score a (pseudo) likelihood:
        # each token is predicted from all the others, as in pretraining
        ids[torch.arange(len(c)), positions] = specials["mask"]
        device = net.tok_emb.weight.device
        # One label position per row: logits is (len(c), 1, V).
        logits = net(ids.to(device), label_positions=positions[:, None].to(device))["logits"]
        logp = logits[:, 0].float().log_softmax(-1).cpu()
        target = torch.tensor(c)
        out.append((float(logp[torch.arange(len(c)), target].sum()),
                    bool((logp.argmax(-1) == target).all())))
    return out


def pick(logprobs, choices):
    """(acc choice, acc_norm choice): argmax of the sums, and of the sums per character of the
    choice."""
    # acc_norm divides by length in characters, as the harness does: a long choice has more tokens,
    # so its summed log-probability is lower whether or not it is right (Gao et al. 2021)
    per_char = [lp / max(1, len(c)) for lp, c in zip(logprobs, choices)]
    return int(np.argmax(logprobs)), int(np.argmax(per_char))


def evaluate_items(net, enc, kind, items, progress=True, desc=""):
    """Score one task. Returns its metrics (percent; perplexity as a number) and the per-item
    results."""
    specials = tokenizer.special_ids(enc)
    score = score_causal if net.config["objective"] == "clm" else score_masked
    T = net.config["max_seq_len"]
    per_item = []
    for item in tqdm(items, desc=desc, unit="item", disable=not progress):
        if kind == "multiple_choice":
            ctx = enc.encode_ordinary(item["context"])
            # at most T - 2 tokens: the room left beside [CLS] and [SEP]
            conts = [enc.encode_ordinary(continuation(item["context"], c))[:T - 2]
                     for c in item["choices"]]
            scores = score(net, specials, ctx, conts)
            acc, acc_norm = pick([s for s, _ in scores], item["choices"])
            per_item.append({"acc": acc == item["label"], "acc_norm": acc_norm == item["label"]})
        else:
            # right only if greedy decoding produces every token of the word (LAMBADA's accuracy)
            head, word = item["text"].rstrip().rsplit(None, 1)
            ctx = enc.encode_ordinary(head)
            (lp, greedy), = score(net, specials, ctx, [enc.encode_ordinary(" " + word)[:T - 2]])
            per_item.append({"acc": greedy, "logprob": lp})
    metrics = {"acc": 100.0 * float(np.mean([r["acc"] for r in per_item]))}
    if kind == "multiple_choice":
        metrics["acc_norm"] = 100.0 * float(np.mean([r["acc_norm"] for r in per_item]))
    else:
        # per word, not per token: exp of the mean negative log-likelihood of the last words
        metrics["perplexity"] = float(math.exp(-np.mean([r["logprob"] for r in per_item])))
    return metrics, per_item


# -----------------------------------------------------------------------------
# EleutherAI's evaluation harness (optional: pip install lm-eval), for the published tasks


def harness_model_class():
    """lm_eval's LM subclass for our checkpoints, registered as "growcram" (lm_eval imported here,
    lazily)."""
    from lm_eval.api.model import LM
    from lm_eval.api.registry import MODEL_REGISTRY, register_model

    class GrowcramLM(LM):
        """loglikelihood / loglikelihood_rolling / generate_until over one checkpoint folder, with
        the scoring above (log-likelihood for causal models, PLL for masked ones)."""

        def __init__(self, checkpoint, device=None, **kwargs):
            super().__init__()
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            self.net = model.load_model(checkpoint, device).eval()
            self.enc = tokenizer.load_tokenizer(os.path.join(checkpoint, "tokenizer.json"))
            self.specials = tokenizer.special_ids(self.enc)
            self.score = score_causal if self.net.config["objective"] == "clm" else score_masked

        def loglikelihood(self, requests, disable_tqdm=False):
            out = []
            for r in tqdm(requests, disable=disable_tqdm, desc="loglikelihood"):
                context, cont = r.args
                T = self.net.config["max_seq_len"]
                out.append(self.score(self.net, self.specials, self.enc.encode_ordinary(context),
                                      [self.enc.encode_ordinary(cont)[:T - 2]])[0])
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            out = []
            for r in tqdm(requests, disable=disable_tqdm, desc="loglikelihood_rolling"):
                # windows of T - 2 tokens (room for [CLS]/[SEP]), each scored after the text before
                # it: a document longer than the model still gets one total log-likelihood
                ids, step = self.enc.encode_ordinary(r.args[0]), self.net.config["max_seq_len"] - 2
                out.append(sum(self.score(self.net, self.specials, ids[:i], [ids[i:i + step]])[0][0]
                               for i in range(0, len(ids), step)))
            return out

        def generate_until(self, requests, disable_tqdm=False):
            if self.net.config["objective"] != "clm":
                raise ValueError("generate_until needs a causal model; "
                                 "this checkpoint is a masked LM")
            out = []
            for r in tqdm(requests, disable=disable_tqdm, desc="generate_until"):
                context, kwargs = r.args
                until = kwargs.get("until", []) if isinstance(kwargs, dict) else []
                text = model.generate(self.net, self.enc, context, kwargs.get("max_gen_toks", 32))
                # cut at the earliest stop string: what follows it is not part of the answer
                cuts = [text.find(u) for u in until if u and u in text]
                out.append(text[:min(cuts)] if cuts else text)
            return out

    if "growcram" not in MODEL_REGISTRY:
        register_model("growcram")(GrowcramLM)
    return MODEL_REGISTRY["growcram"]


def evaluate_harness(checkpoint, tasks, include_path=None, limit=None, device=None):
    """lm_eval.simple_evaluate on our checkpoint: {task: {metric: value}} as the harness reports
    them."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ValueError("--harness needs EleutherAI's evaluation harness: "
                         "pip install lm-eval") from None
    lm = harness_model_class()(checkpoint, device=device)
    task_manager = TaskManager(include_path=include_path) if include_path else None
    out = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), limit=limit,
                                  task_manager=task_manager)
    return {t: {k: v for k, v in m.items() if isinstance(v, (int, float))}
            for t, m in out["results"].items()}


# -----------------------------------------------------------------------------
# The whole evaluation

# Settings of evaluate() besides what to score; pass a dict with the keys to change
DEFAULTS = {
    "held_out": None,  # prepared data folder: the built-in tasks come from its validation documents
    "out": None,       # folder for results.json and results.md; None: return the results only
    "n_items": 500,    # items per built-in task: ~2 points of standard error on a 50% accuracy
    "seed": 0,         # picks the built-in tasks' documents, so two checkpoints see the same items
    "device": None,    # None: the GPU if there is one, else the CPU
    "progress": True,  # a progress bar per task
}


def evaluate(checkpoint, task_files=(), tasks=(), settings=None):
    """Zero-shot scores of `checkpoint` (a folder with config.json, model.pt, tokenizer.json) on
    every task file and built-in task. Returns
    {"checkpoint", "scoring", "tasks": {name: {"kind", "n", "metrics"}}};
    with out, also writes out/results.json and out/results.md. settings: the keys of DEFAULTS to
    change."""
    settings = {**DEFAULTS, **(settings or {})}
    held_out, out, device = settings["held_out"], settings["out"], settings["device"]
    n_items, seed, progress = settings["n_items"], settings["seed"], settings["progress"]
    # check every input before loading the model: a typo fails in a second, not after a load
    if not task_files and not tasks:
        raise ValueError("nothing to evaluate: give --task-file FILE and/or --task cloze|last-word")
    unknown = [t for t in tasks if t not in BUILT_IN]
    if unknown:
        raise ValueError(f"unknown built-in task(s) {unknown}; choose from {', '.join(BUILT_IN)}")
    if tasks and not held_out:
        raise ValueError("built-in tasks need --held-out: a prepared data folder (e.g. "
                         "cache/sample-<hash>) whose validation documents they are built from")
    # a task file's name (without .jsonl) names its task in the results
    jobs = [(os.path.splitext(os.path.basename(p))[0], *read_task_file(p)) for p in task_files]
    docs = held_out_documents(held_out) if tasks else []
    builders = {"cloze": build_cloze, "last-word": build_last_word}
    jobs += [(t, *builders[t](docs, n_items=n_items, seed=seed)) for t in tasks]
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    net = model.load_model(checkpoint, device).eval()
    enc = tokenizer.load_tokenizer(os.path.join(checkpoint, "tokenizer.json"))
    # a tokenizer from another run could emit ids past the embedding table: refuse, not crash
    if enc.n_vocab > net.config["vocab_size"]:
        raise ValueError(f"{checkpoint}: tokenizer has {enc.n_vocab} tokens, the model "
                         f"{net.config['vocab_size']}")
    # the two scorings are not on one scale: compare a causal and a masked model by accuracy only
    scoring = ("log-likelihood" if net.config["objective"] == "clm"
               else "PLL (pseudo-log-likelihood, masked LM)")
    results = {"checkpoint": checkpoint, "objective": net.config["objective"], "scoring": scoring,
               "units": "percent (perplexity: a number)", "tasks": {}}
    for name, kind, items in jobs:
        t0 = time.time()
        metrics, _ = evaluate_items(net, enc, kind, items, progress, name)
        results["tasks"][name] = {"kind": kind, "n": len(items), "metrics": metrics,
                                  "seconds": round(time.time() - t0, 2)}
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in metrics.items())
              + f"  ({len(items)} items)")
    table = markdown_table(results)
    print(table)
    if out:
        os.makedirs(out, exist_ok=True)
        text = json.dumps(results, indent=2)
        files.atomic_write(os.path.join(out, "results.json"), lambda f: f.write(text.encode()))
        files.atomic_write(os.path.join(out, "results.md"), lambda f: f.write(table.encode()))
        print(f"wrote {out}/results.json and {out}/results.md")
    return results


def markdown_table(results):
    lines = [f"# Zero-shot results for `{results['checkpoint']}` ({results['scoring']})", "",
             "| task | kind | items | acc | acc_norm | perplexity |",
             "|---|---|---:|---:|---:|---:|"]
    for name, r in results["tasks"].items():
        m = r["metrics"]
        cell = lambda k, spec: format(m[k], spec) if k in m else ""  # noqa: E731
        lines.append(f"| {name} | {r['kind'].replace('_', ' ')} | {r['n']} | {cell('acc', '.2f')} "
                     f"| {cell('acc_norm', '.2f')} | {cell('perplexity', '.2f')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="evaluate_lm.py",
        description="Zero-shot evaluation (multiple choice by log-likelihood, last word).",
        usage="%(prog)s --checkpoint DIR --task-file FILE | --task NAME [flags]  "
              "(--help lists them)")
    p.add_argument("--checkpoint", required=True,
                   help="folder with config.json, model.pt, tokenizer.json")
    p.add_argument("--task-file", action="append", default=[],
                   help="a JSONL task file (repeatable)")
    p.add_argument("--task", action="append", default=[], choices=BUILT_IN,
                   help="a built-in task (repeatable)")
    p.add_argument("--held-out", default=None,
                   help="prepared data folder whose validation documents the built-in "
                        "tasks are made from (e.g. cache/sample-<hash>)")
    p.add_argument("--items", type=int, default=500, help="items per built-in task")
    p.add_argument("--seed", type=int, default=0, help="seed of the built-in tasks' choices")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if available)")
    p.add_argument("--out", default=None, help="folder for results.json and results.md")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("--harness", default=None,
                   help="comma-separated tasks of EleutherAI's evaluation harness "
                        "(pip install lm-eval; they download their data), e.g. "
                        "hellaswag,piqa,lambada_openai")
    p.add_argument("--harness-include", default=None,
                   help="folder of extra harness task YAML files (local tasks)")
    p.add_argument("--limit", type=int, default=None,
                   help="harness: at most this many items per task")
    args = p.parse_args(argv)
    if args.items < 1:
        p.error(f"--items must be >= 1 (got {args.items})")
    try:
        if args.harness:
            results = evaluate_harness(args.checkpoint,
                                       [t for t in args.harness.split(",") if t.strip()],
                                       args.harness_include, args.limit, args.device)
            print(json.dumps(results, indent=2))
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                files.atomic_write(os.path.join(args.out, "harness.json"),
                                   lambda f: f.write(json.dumps(results, indent=2).encode()))
            if not (args.task_file or args.task):
                return results
        return evaluate(args.checkpoint, args.task_file, args.task, {
            "held_out": args.held_out, "out": args.out, "n_items": args.items, "seed": args.seed,
            "device": args.device, "progress": not args.no_progress})
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
