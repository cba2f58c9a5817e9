"""GLUE fine-tuning, scoring and leaderboard submission files for a pretrained growcram checkpoint.

    python evaluate_glue.py --download --glue-dir glue_data          # fetch the data (once)
    python evaluate_glue.py --checkpoint runs/cram/final --glue-dir glue_data --seeds 5

Protocol: cramming's "GLUE-sane" (Geiping & Goldstein 2023, "Cramming: Training a Language Model on
a Single GPU in One Day", ICML; `eval/GLUE_sane.yaml` in JonasGeiping/cramming). One set of
hyperparameters for every task: AdamW lr 4e-5, betas (0.9, 0.98), eps 1e-6, no weight decay, batch
16, 5 epochs, cosine decay after a 10% linear warmup, dropout 0.1, max length 128, inputs `[CLS] a
[SEP] b [SEP]`, a fresh head per task. The dev score after the LAST epoch is kept (no best-epoch
picking) and `--seeds K` reports the median of K fine-tunes. Three defaults differ from it, each
measured to win (docs/evaluate_glue.md): the head reads the mean of the real tokens, not [CLS],
each matrix's lr is scaled by how far pretraining grew it, and a checkpoint train.py pretrained
with Muon is fine-tuned with Muon (its final/args.json says so). `--pooling cls --lr-scaling none
--optimizer adamw` is cramming's protocol exactly. `--control random-init` fine-tunes a fresh copy
of the network beside the checkpoint, to show what pretraining bought.

Score: the mean of 9 numbers, CoLA MCC, SST-2 acc, MRPC F1, STS-B Pearson, QQP F1, MNLI-m acc,
MNLI-mm acc, QNLI acc, RTE acc, WNLI excluded (cramming reports 78.6-80.4 this way;
bert-base-uncased gets 80.9). All metrics are reported in percent (x100), as in the papers.

Data: the classic `glue_data/` folder of tab-separated files (no quoting anywhere; CoLA train/dev
have no header). Test-set predictions are written in the leaderboard's format (`CoLA.tsv` ...
`AX.tsv`).
"""
import argparse
import copy
import json
import math
import os
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

import data
import download
import files
import flags
import model
import muon
import tokenizer
from checkpoint import load_folder
from glue_tasks import (
    SUBMISSION_FILES,
    TASKS,
    check_tasks,
    glue_score,
    load_task,
    load_task_file,
    subset,
    task_metrics,
)

# -----------------------------------------------------------------------------
# Inputs: [CLS] a [SEP] b [SEP], tokenized once per task, padded per batch

def join_pair(a, b, ids, max_len):
    """Token lists a, b (or None) -> [CLS] a [SEP] (b [SEP]), at most max_len tokens.

    When too long the longer segment is cut first, ending with the two halves equal (a keeps the
    extra token of an odd budget), the same result as removing one token at a time from the longer
    side.
    """
    if b is None:
        return [ids["cls"]] + a[:max_len - 2] + [ids["sep"]]
    budget = max_len - 3
    keep_b = min(len(b), max(budget // 2, budget - len(a)))
    keep_a = min(len(a), budget - keep_b)
    return [ids["cls"]] + a[:keep_a] + [ids["sep"]] + b[:keep_b] + [ids["sep"]]


def encode_split(enc, split, ids, max_len, clean=lambda t: t):
    """A parsed split -> list of token-id lists (tiktoken's batch encoder runs on several threads).
    clean: the same text cleaning the pretraining corpus had (e.g. lowercasing), applied before
    encoding."""
    a = enc.encode_ordinary_batch([clean(t) for t in split["a"]])
    b = [None] * len(a)
    if split["b"] is not None:
        b = enc.encode_ordinary_batch([clean(t) for t in split["b"]])
    # int32 arrays take ~5x less memory than lists of Python ints (QQP and MNLI: ~400k pairs each)
    return [np.array(join_pair(x, y, ids, max_len), dtype=np.int32) for x, y in zip(a, b)]


def pad_batch(seqs, pad_id, device):
    """Right-pad to the longest sequence in this batch: input_ids (B, T) and attention_mask (B, T)
    with 1 = real."""
    T = max(len(s) for s in seqs)
    input_ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), T), dtype=np.int64)
    for i, s in enumerate(seqs):
        input_ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return torch.from_numpy(input_ids).to(device), torch.from_numpy(mask).to(device)


# -----------------------------------------------------------------------------
# Fine-tuning one task with one seed

def lr_factor(step, warmup_steps, total_steps):
    """Multiplier of the peak lr before optimizer step `step` (0-based): linear warmup from 0, then
    cosine to 0, on a step clock (the same numbers as train.py's cosine schedule)."""
    total = max(1, total_steps)
    p, warmup = step / total, warmup_steps / total
    # Warmup, as in BERT's recipe (Devlin et al. 2019; its fine-tuning code warms up over 10% of
    # the steps): a fresh head's first gradients are large and noisy, and full steps on them would
    # disturb the pretrained trunk.
    if warmup > 0 and p < warmup:
        return p / warmup
    # Then one half-period of a cosine down to 0 (SGDR, Loshchilov & Hutter 2017), as cramming's
    # GLUE protocol does: the lr is near 0 for the last steps, so the last-epoch score is settled.
    q = (p - warmup) / (1.0 - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(q, 1.0)))


def autocast(device):
    """bf16 on a GPU that supports it, plain fp32 elsewhere. train.py's --dtype auto also picks
    bf16 on a CPU with bf16 matmul instructions; fine-tuning stays in fp32 there, so its scores
    do not depend on which CPU ran them."""
    # bf16 keeps fp32's exponent range, so no loss scaling is needed
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    dtype = torch.bfloat16 if bf16 else torch.float32
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


@torch.no_grad()
def predict(net, seqs, pad_id, batch_size, device, classes):
    """Class ids (argmax) or regression outputs (classes=None) for token lists, batched
    longest-first so that each batch pads little."""
    net.eval()
    order = np.argsort([-len(s) for s in seqs], kind="stable")
    out = np.zeros((len(seqs), net.config["num_labels"]), dtype=np.float32)
    for start in range(0, len(seqs), batch_size):
        idx = order[start:start + batch_size]
        input_ids, mask = pad_batch([seqs[i] for i in idx], pad_id, device)
        with autocast(device):
            logits = net.classify(input_ids, mask)["logits"]
        out[idx] = logits.float().cpu().numpy()
    if not np.isfinite(out).all():
        raise ValueError("non-finite predictions: fine-tuning diverged (lower --lr)")
    return out[:, 0] if classes is None else out.argmax(-1)


def param_groups(net, lr, scaling):
    """AdamW's parameter groups for fine-tuning. scaling "none": one lr for every tensor.
    "relative": each matrix's lr times its RMS over the init std (at least 1), so every matrix moves
    by the same fraction of itself per step as a freshly initialized one.

    Why: Adam's step is about lr per entry whatever the weight's size, and pretraining at a high lr
    grows the matrices far past their init (a 10-minute tiny model's reach an RMS of 0.2-0.5, and
    its embedding 1.2, against an init std of 0.02). Behind a norm only a matrix's direction
    matters, so a step of lr turns a 20x larger matrix 20x less (van Laarhoven 2017, "L2
    regularization versus batch and weight normalization"); the random-init control, all at init
    scale, would fine-tune 20x faster than the pretrained model at the same lr. The per-tensor
    ratio is LARS's trust ratio (You et al. 2017). Fresh matrices (the head, a random-init
    control) sit at init scale, so their factor is about 1: a small matrix's sample RMS can be a
    few percent above init_std (a 1-row regression head's up to about 10%), and its lr rises by
    that much, the same in both arms. Norms and biases keep lr."""
    if scaling == "none":
        return [{"params": list(net.parameters()), "lr": lr}]
    init_std = net.config["init_std"]
    groups = []
    for p in net.parameters():
        factor = 1.0
        if p.dim() >= 2:
            factor = max(1.0, p.detach().float().pow(2).mean().sqrt().item() / init_std)
        groups.append({"params": [p], "lr": lr * factor})
    return groups


def layer_depth(name, n_layers):
    """A parameter's depth by its name: 0 for the embedding (and what sits beside it), i + 1 for
    blocks.i, and n_layers + 1 for everything above the last block (final norm, pooler,
    classifier): the head counts as one more layer, as in ELECTRA's fine-tuning."""
    parts = name.split(".")
    if parts[0] == "blocks":
        return int(parts[1]) + 1
    if parts[0] in ("tok_emb", "emb_norm", "pos_emb", "pos_scale"):
        return 0
    return n_layers + 1


def layer_decayed(groups, net, decay):
    """groups (as param_groups makes them), one per parameter, each lr times
    decay ** (n_layers + 1 - depth): the head at lr, the last block at lr * decay, the embedding
    at lr * decay ** (n_layers + 1). Layer-wise lr decay (Howard & Ruder 2018, ULMFiT's
    discriminative fine-tuning; Clark et al. 2020, ELECTRA, Appendix A: 0.8 for Base): the lower
    layers hold the most general features, so they move least. decay 1: unchanged."""
    if decay == 1:
        return groups
    n_layers = len(net.blocks)
    depth = {id(p): layer_depth(name, n_layers) for name, p in net.named_parameters()}
    return [{**g, "params": [p], "lr": g["lr"] * decay ** (n_layers + 1 - depth[id(p)])}
            for g in groups for p in g["params"]]


def make_optimizer(net, settings, params=None):
    """The fine-tuning optimizer over param_groups (of params only, when given): AdamW (betas
    0.9/0.98, eps 1e-6), or with optimizer "muon" Muon on the blocks' matrices and that AdamW on
    the rest, as train.py pretrains (muon.py: train.py's momentum and the update RMS 0.2). Why
    offer Muon: a model is said to fine-tune best with the optimizer it was pretrained with, since
    Adam and Muon leave weights of different structure (Muon: flatter singular values) and the
    other optimizer's steps undo it ("Can Muon fine-tune Adam-pretrained models?", arXiv
    2605.10468)."""
    groups = param_groups(net, settings["lr"], settings["lr_scaling"])
    groups = layer_decayed(groups, net, settings["layer_decay"])
    if params is not None:  # only these (the head, while the network is frozen)
        wanted = {id(p) for p in params}
        groups = [{**g, "params": [p for p in g["params"] if id(p) in wanted]} for g in groups]
        groups = [g for g in groups if g["params"]]
    if settings["optimizer"] == "adamw":
        return torch.optim.AdamW(groups, lr=settings["lr"], betas=(0.9, 0.98), eps=1e-6,
                                 weight_decay=settings["weight_decay"],
                                 fused=settings["device"].type == "cuda")
    hidden = {id(p) for name, p in net.named_parameters() if muon.is_hidden_matrix(name, p)}
    split = [{**g, "params": [p for p in g["params"] if (id(p) in hidden) == on], "use_muon": on}
             for g in groups for on in (True, False)]
    return muon.MuonAdamW([g for g in split if g["params"]], lr=settings["lr"],
                          momentum=muon.RECIPE_MOMENTUM,
                          betas=(0.9, 0.98), eps=1e-6, weight_decay=settings["weight_decay"])


def layer_decay_words(layer_decay):
    """How the printout names the layer-wise decay after the lr: nothing when it is off."""
    return "" if layer_decay == 1 else f", times {layer_decay:g} per layer below the head"


def head_words(head_epochs):
    """How the printout names the head-first epochs: nothing when there are none."""
    return f"{head_epochs} epoch(s) of the head alone, then " if head_epochs else ""


# How the printout and results.md name each optimizer, and each lr scaling after the lr.
OPTIMIZER_WORDS = {"adamw": "AdamW", "muon": "Muon on the blocks' matrices, AdamW on the rest,"}
LR_SCALING_WORDS = {"none": "", "relative": " times each matrix's RMS / init std"}


def finetune(trunk, spec, encoded, labels, settings, seed, desc=""):
    """Copy the pretrained trunk, attach a fresh head, train for settings["epochs"] epochs and
    return the trained model. encoded: the token lists of the train split; labels: its (N,) class
    ids or floats. settings: evaluate's, with "device", "pad_id" and "progress".

    With settings["head_epochs"] > 0 the fresh head first trains alone, the network frozen, for
    that many epochs; then everything trains (LP-FT: Kumar et al. 2022, "Fine-Tuning can Distort
    Pretrained Features and Underperform Out-of-Distribution": a random head's large early
    gradients flow into the pretrained features and distort them)."""
    torch.manual_seed(seed)  # the head init and dropout masks
    net = copy.deepcopy(trunk)
    model.add_classifier(net, 1 if spec["classes"] is None else len(spec["classes"]),
                         pooling=settings["pooling"])
    model.set_dropout(net, settings["dropout"])  # dropout: off in pretraining, on for fine-tuning
    net.to(device=settings["device"]).train()
    rng = np.random.default_rng(seed)
    target = torch.from_numpy(labels)
    steps_per_epoch = math.ceil(len(encoded) / settings["batch_size"])
    bar = tqdm(total=(settings["head_epochs"] + settings["epochs"]) * steps_per_epoch, desc=desc,
               leave=False, disable=not settings["progress"])
    if settings["head_epochs"]:
        train_head_alone(net, encoded, target, settings, rng, bar)
    train_epochs(net, make_optimizer(net, settings), settings["epochs"], encoded, target,
                 settings, rng, bar)
    bar.close()
    return net


def train_head_alone(net, encoded, target, settings, rng, bar):
    """LP-FT's first phase: train net's head (pooler and classifier) for settings["head_epochs"]
    epochs with the rest of net frozen, then unfreeze it."""
    head = [*net.pooler.parameters(), *net.classifier.parameters()]
    frozen = [p for p in net.parameters() if all(p is not h for h in head)]
    for p in frozen:
        p.requires_grad_(False)  # so autograd neither keeps nor computes the trunk's graph
    train_epochs(net, make_optimizer(net, settings, params=head), settings["head_epochs"],
                 encoded, target, settings, rng, bar)
    for p in frozen:
        p.requires_grad_(True)
    return net


def train_epochs(net, opt, epochs, encoded, target, settings, rng, bar):
    """Train net with opt for epochs passes over encoded (shuffled by rng), batch_size sequences a
    step, under linear warmup then cosine decay to 0 over these epochs' steps."""
    bs, n = settings["batch_size"], len(encoded)
    total = epochs * math.ceil(n / bs)
    warmup = int(round(settings["warmup"] * total))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup, total))
    for _ in range(epochs):
        perm = rng.permutation(n)
        for start in range(0, n, bs):
            idx = perm[start:start + bs]
            input_ids, mask = pad_batch([encoded[i] for i in idx], settings["pad_id"],
                                        settings["device"])
            with autocast(settings["device"]):
                loss = net.classify(input_ids, mask, target[idx].to(settings["device"]))["loss"]
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            bar.update(1)
            if bar.n % 50 == 0:  # .item() waits for the GPU, so only now and then
                bar.set_postfix(loss=f"{loss.item():.4f}")


def write_text(path, text):
    files.atomic_write(path, lambda f: f.write(text.encode("utf-8")))  # tmp file, then os.replace


def write_task_corpus(path, tasks, glue_dir, cap=None):
    """Write the text of each task's training rows, without their labels, to `path` as a JSONL
    corpus for train.py --data: one document per row, a pair's two sentences on two lines. cap:
    the rows --max-train-examples fine-tunes on (the same seed-0 subset), else every training row.
    Dev and test rows are left out, so no score is measured on text pretraining saw. Pretraining
    on a task's own unlabelled text is task-adaptive pretraining (Gururangan et al. 2020, "Don't
    Stop Pretraining", section 4). Returns {task: rows written}."""
    lines, rows = [], {}
    for name in check_tasks(tasks):
        spec = TASKS[name]
        train = training_rows(name, spec, load_task(name, glue_dir, spec)["train"], cap)
        pairs = zip(train["a"], train["b"] or [None] * len(train["a"]))
        for a, b in pairs:
            lines.append(json.dumps({"text": a if b is None else f"{a}\n{b}"}) + "\n")
        rows[name] = len(train["a"])
    write_text(path, "".join(lines))
    return rows


def write_submission(path, index, preds, classes):
    """The leaderboard format: header `index<TAB>prediction`, labels as the task's strings, STS-B
    in [0, 5]."""
    lines = ["index\tprediction\n"]
    for i, p in zip(index, preds):
        if classes is None:  # STS-B's similarity, clipped to the scale's [0, 5]
            lines.append(f"{i}\t{min(5.0, max(0.0, float(p))):.3f}\n")
        else:
            lines.append(f"{i}\t{classes[int(p)]}\n")
    write_text(path, "".join(lines))


# -----------------------------------------------------------------------------
# The whole evaluation: each task fine-tuned, scored and written

def text_cleaning(checkpoint, clean=None):
    """The cleaning data.py applied before pretraining (Unicode form, lowercasing, accents), so
    fine-tuning text looks like pretraining text: `clean` if given, else the `settings.clean` of a
    meta.json in the checkpoint folder, else data.py's defaults."""
    if clean is not None:
        return clean, "given"
    path = os.path.join(checkpoint, "meta.json")
    if os.path.isfile(path):
        with open(path) as f:
            found = json.load(f).get("settings", {}).get("clean")
        if found is not None:
            return found, path
    return {}, "data.py defaults"


def fine_tuning_optimizer(checkpoint, optimizer=None):
    """The optimizer to fine-tune with: `optimizer` if given, else the one that pretrained the
    checkpoint (the "optimizer" of the args.json train.py's final/ holds), else AdamW (cramming's
    protocol, and what checkpoints without an args.json, such as Hugging Face models, were
    pretrained with). Returns (name, where it came from). Why match: on two train.py checkpoints
    Muon fine-tuning gave the pretrained model 2.2 GLUE points and 5.5-6.6 of word order over
    AdamW (docs/evaluate_glue.md, "Muon while fine-tuning")."""
    if optimizer is not None:
        return optimizer, "given"
    path = os.path.join(checkpoint, "args.json")
    if os.path.isfile(path):
        with open(path) as f:
            # a run older than the flag (no key, or null) trained as flags.py's resume says it did
            found = json.load(f).get("optimizer") or flags.BEFORE_THE_FLAG["optimizer"]
        if found not in OPTIMIZER_WORDS:
            raise ValueError(f"{path}: optimizer {found!r} is not one of "
                             f"{', '.join(OPTIMIZER_WORDS)}; pass --optimizer")
        return found, f"as pretrained, {path}"
    return "adamw", "no args.json in the checkpoint: cramming's"


def run_task(name, spec, task_data, trunk, enc, clean, settings):
    """Fine-tune one task settings["seeds"] times and score every run on the dev sets. Returns
    (result dict, {submission name: test predictions of the median run}). trunk: the pretrained
    model; enc: its tokenizer; clean: text -> text, the pretraining corpus's cleaning; settings:
    evaluate's protocol with "device", "pad_id", "predict_test", "progress" and "save_model"."""
    t0 = time.time()
    train = training_rows(name, spec, task_data["train"], settings["max_train_examples"])
    # Tokenized once here; every seed reuses the token lists.
    tokens = encode_task(enc, train, task_data, settings["max_len"], clean,
                         with_test=settings["predict_test"])
    runs = []
    for seed in range(settings["seeds"]):
        net = finetune(trunk, spec, tokens["train"], train["labels"], settings, seed,
                       desc=f"{name} seed {seed}")
        try:
            preds = predict_splits(net, tokens, spec["classes"], settings["pad_id"],
                                   settings["eval_batch_size"], settings["device"])
            metrics = dev_metrics(spec, preds["dev"], task_data)
        except ValueError as e:
            raise ValueError(f"{name}, seed {seed}: {e}") from None
        runs.append({"seed": seed, "metrics": metrics, "test": preds["test"]})
        if seed == 0 and settings["save_model"]:  # one fine-tuned model per task for export.py
            save_finetuned(net, enc, spec["classes"], os.path.join(settings["save_model"], name))
        del net
    metrics = median_metrics(runs)
    chosen = median_run(runs, spec, dev_suffixes=list(task_data["dev"]))
    skipped = skipped_rows(task_data)
    print_task(name, metrics, skipped, time.time() - t0)
    result = {"metrics": metrics, "per_seed": [{"seed": r["seed"], **r["metrics"]} for r in runs],
              "submission_seed": chosen["seed"], "n_train": len(tokens["train"]),
              "n_dev": {k or "dev": len(v) for k, v in tokens["dev"].items()},
              "skipped_rows": skipped, "seconds": round(time.time() - t0, 2)}
    return result, chosen["test"]


def training_rows(name, spec, train, cap):
    """The training split, or a fixed random subset of cap rows (seed 0) of it for quick runs
    (cap None: all); an error when it has fewer rows than the task has classes."""
    if cap and len(train["a"]) > cap:
        picked = np.random.default_rng(0).choice(len(train["a"]), cap, replace=False)
        train = subset(train, np.sort(picked))
    if spec["classes"] and len(train["a"]) < len(spec["classes"]):
        raise ValueError(f"{name}: {len(train['a'])} training row(s) for {len(spec['classes'])} "
                         "classes")
    return train


def encode_task(enc, train, task_data, max_len, clean, with_test):
    """{"train": token lists, "dev": {suffix: token lists}, "test": {submission name: token
    lists}} of one task: the inputs [CLS] a [SEP] b [SEP] (encode_split). with_test=False leaves
    "test" empty."""
    ids = tokenizer.special_ids(enc)
    encode = lambda split: encode_split(enc, split, ids, max_len, clean)  # noqa: E731
    tokens = {"train": encode(train),
              "dev": {k: encode(split) for k, split in task_data["dev"].items()}, "test": {}}
    if with_test:  # test sets are only needed for the submission files
        tokens["test"] = {k: encode(split) for k, split in task_data["test"].items()}
    return tokens


def predict_splits(net, tokens, classes, pad_id, batch_size, device):
    """{"dev": {suffix: predictions}, "test": {submission name: predictions}} of a fine-tuned
    model for encode_task's token lists."""
    return {split: {k: predict(net, seqs, pad_id, batch_size, device, classes)
                    for k, seqs in tokens[split].items()}
            for split in ("dev", "test")}


def dev_metrics(spec, dev_preds, task_data):
    """task_metrics of one run, or an error when a metric is undefined: every prediction was the
    same, and a number would hide that the fine-tuned model collapsed."""
    metrics = task_metrics(spec, dev_preds, task_data)
    undefined = [k for k, v in metrics.items() if math.isnan(v)]
    if undefined:
        raise ValueError(f"{', '.join(undefined)} undefined on dev: every prediction is the same "
                         "(the fine-tuned model collapsed; try another --lr or more --epochs)")
    return metrics


def median_metrics(runs):
    """{metric: its median over the runs (one per seed)}: the number reported per metric."""
    return {k: float(np.median([r["metrics"][k] for r in runs])) for k in runs[0]["metrics"]}


def median_run(runs, spec, dev_suffixes):
    """The run whose headline metric (the task's first, averaged over its dev sets: MNLI's "m" and
    "mm", or "" for one) is closest to the median: its test predictions become the submission
    files. For an odd number of seeds it is the median run itself."""
    headline = [spec["metrics"][0] + (f"_{k}" if k else "") for k in dev_suffixes]
    per_run = np.array([np.mean([r["metrics"][k] for k in headline]) for r in runs])
    return runs[int(np.argmin(np.abs(per_run - np.median(per_run))))]


def skipped_rows(task_data):
    """{"train", "dev" or "dev_<suffix>": malformed rows read_tsv skipped in that file}."""
    dev = {"dev" + (f"_{k}" if k else ""): s["skipped"] for k, s in task_data["dev"].items()}
    return {"train": task_data["train"]["skipped"], **dev}


def print_task(name, metrics, skipped, seconds):
    """The task's lines of the report: the files with skipped rows, then the median metrics."""
    for k, n in skipped.items():
        if n:
            print(f"{name}: skipped {n} malformed row(s) in {k}")
    print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in metrics.items())
          + f"  ({seconds:.0f} s)")


def save_finetuned(net, enc, classes, folder):
    """folder: model.py's files, tokenizer.json and labels.json (the class names in id order; null
    for a regression), so export.py can name the labels of the exported classifier."""
    model.save_model(net, folder)
    tokenizer.save_tokenizer(enc, os.path.join(folder, "tokenizer.json"))
    write_text(os.path.join(folder, "labels.json"), json.dumps(classes))


# evaluate()'s settings: cramming's GLUE-sane protocol (Geiping & Goldstein 2023), whose
# hyperparameters are set once for all tasks; pass a dict with the keys to change
DEFAULTS = {
    "glue_dir": "glue_data",     # folder with CoLA/, SST-2/, ... (download.py fills it)
    "seeds": 5,                  # fine-tuning runs per task, median reported: small sets are noisy
    "out": None,                 # folder for results.json, results.md, submission/*.tsv
    "epochs": 5,                 # cramming's rule: at most 5 epochs of fine-tuning
    "head_epochs": 0,            # epochs for the fresh head alone, the network frozen (LP-FT)
    "lr": 4e-5,                  # peak AdamW lr; BERT picked from 2e-5..5e-5 (Devlin et al. 4.1)
    "batch_size": 16,            # sequences per step: many updates even on RTE's 2.5k rows
    "warmup": 0.1,               # linear warmup over this share of the steps, then cosine to 0
    "dropout": 0.1,              # on while fine-tuning (off in pretraining), as BERT's 0.1
    "weight_decay": 0.0,         # none, as cramming's protocol sets it
    "max_len": 128,              # tokens per input with [CLS]/[SEP] (cramming's max_seq_length)
    # The two defaults that differ from cramming's protocol (which is pooling "cls", lr_scaling
    # "none"): each won on real GLUE at the 10-minute CPU default (docs/evaluate_glue.md).
    "pooling": "mean",           # the head reads all real positions ("mean") or [CLS] ("cls", BERT)
    "lr_scaling": "relative",    # each matrix's lr times its RMS over the init std; "none": one lr
    "layer_decay": 1.0,          # lr times layer_decay per layer below the head (ELECTRA); 1: off
    "optimizer": None,           # "adamw" | "muon"; None: as the checkpoint was pretrained
    "control": None,             # "random-init": the same protocol on a fresh copy of the network
    "eval_batch_size": 128,      # no gradients at evaluation, so bigger batches fit
    "max_train_examples": None,  # a fixed random subset of each training set (quick runs)
    "include_wnli": False,       # count WNLI in the score (cramming does not: adversarial dev set)
    "device": None,              # None: cuda if available, else cpu
    "task_file": None,           # your own TSV task (load_task_file), run after the GLUE tasks
    "task_dev_file": None,       # its dev TSV; None holds out 10% of its rows
    "task_type": "auto",         # classification | regression | auto (from the labels)
    "clean": None,               # data.clean_text keywords; None: as the checkpoint's meta.json
    "progress": True,            # progress bars
    "save_model": None,          # folder: each task's seed-0 fine-tuned model in save_model/TASK/
}


def fine_tuning_length(max_len, cfg):
    """The tokens per fine-tuning input: max_len, or the pretraining length (cfg["max_seq_len"])
    when max_len is None. Learned and sinusoidal tables end there, so they are capped to it; rotary,
    ALiBi and none run past it, on positions pretraining never trained, and a note says so."""
    trained = cfg["max_seq_len"]
    if max_len is None:
        return trained
    if max_len > trained:
        if cfg["positions"] in ("learned", "sinusoidal"):
            print(f"max length {max_len} > the model's {trained} positions: using {trained}")
            return trained
        print(f"max length {max_len} > the {trained} tokens the model was pretrained on: its "
              f"{cfg['positions']} positions past {trained} were never trained")
    return max_len


CONTROL_SEED = 0  # the random-init control's initialization


def random_init_copy(trunk, seed):
    """The trunk's network (same config, same device) freshly initialized with `seed`: the control
    that shows what pretraining bought. The global RNG is restored, so the pretrained arm's
    fine-tuning is the same with or without a control."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = model.build_model(dict(trunk.config))
    return fresh.to(trunk.tok_emb.weight.device)


def load_checkpoint(checkpoint, given):
    """What fine-tuning needs from a checkpoint folder, given the full settings (DEFAULTS and the
    caller's changes): {"enc": its tokenizer, "trunk": its network on the device, "device",
    "max_len": the fine-tuning length, "clean"/"clean_source": the pretraining corpus's text
    cleaning, "optimizer"/"optimizer_source": the fine-tuning optimizer}, each with the rule that
    decides it (fine_tuning_length, text_cleaning, fine_tuning_optimizer)."""
    device = torch.device(given["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))
    tok_path = os.path.join(checkpoint, "tokenizer.json")
    enc = tokenizer.load_tokenizer(tok_path)
    trunk = load_folder(checkpoint).to(device)  # train.py's final/, or an exported folder
    if enc.n_vocab > model.padded_vocab_size(trunk.config):
        raise ValueError(f"{tok_path}: {enc.n_vocab} tokens but the model embeds only "
                         f"{trunk.config['vocab_size']}")
    clean, clean_source = text_cleaning(checkpoint, given["clean"])
    optimizer, optimizer_source = fine_tuning_optimizer(checkpoint, given["optimizer"])
    return {"enc": enc, "trunk": trunk, "device": device,
            "max_len": fine_tuning_length(given["max_len"], trunk.config),
            "clean": clean, "clean_source": clean_source,
            "optimizer": optimizer, "optimizer_source": optimizer_source}


def evaluate(checkpoint, tasks=None, settings=None):
    """Fine-tune `checkpoint` (train.py's final/, or a folder export.py or transformers'
    save_pretrained wrote) on each task settings["seeds"] times. settings: the keys of DEFAULTS
    to change.

    Returns the results dict (also written to out/results.json with out/results.md and
    out/submission/*.tsv):
    {"tasks": {name: {"metrics": median per metric, "per_seed": [...], ...}}, "glue_score",
    "glue_convention", "glue_numbers", "submission_files", "missing_submissions", ...}, all metrics
    in percent. tasks=None means all nine GLUE tasks (or only the task file when one is given).
    clean: keyword arguments of data.clean_text (default: what the checkpoint's meta.json records,
    else data.py's defaults).
    """
    given = {**DEFAULTS, **(settings or {})}
    glue_dir, out = given["glue_dir"], given["out"]
    task_file = given["task_file"]
    tasks = ([] if task_file else list(TASKS)) if tasks is None else check_tasks(tasks)
    loaded = load_checkpoint(checkpoint, given)
    enc, trunk, device, max_len = (loaded[k] for k in ("enc", "trunk", "device", "max_len"))
    clean, clean_source = loaded["clean"], loaded["clean_source"]
    optimizer, optimizer_source = loaded["optimizer"], loaded["optimizer_source"]
    ids = tokenizer.special_ids(enc)
    # the protocol as run (and recorded in results.json), in this order
    protocol = {"epochs": given["epochs"], "head_epochs": given["head_epochs"],
                "optimizer": optimizer,
                **{k: given[k] for k in ("lr", "lr_scaling", "layer_decay", "batch_size",
                                         "warmup", "dropout", "weight_decay")}}
    protocol.update(max_len=max_len, pooling=given["pooling"], seeds=given["seeds"],
                    eval_batch_size=given["eval_batch_size"],
                    max_train_examples=given["max_train_examples"], clean=clean,
                    control=given["control"])
    # what run_task and finetune need besides the protocol; not recorded
    settings = {**protocol, "pad_id": ids["pad"], "predict_test": bool(out), "device": device,
                "progress": given["progress"], "save_model": given["save_model"]}
    print(f"fine-tuning optimizer: {optimizer} ({optimizer_source})")
    print(f"protocol: {OPTIMIZER_WORDS[protocol['optimizer']]} "
          f"lr {protocol['lr']:g}{LR_SCALING_WORDS[protocol['lr_scaling']]}"
          f"{layer_decay_words(protocol['layer_decay'])} "
          f"(betas 0.9/0.98, eps 1e-6, wd {protocol['weight_decay']:g}), "
          f"batch {protocol['batch_size']}, "
          f"{head_words(protocol['head_epochs'])}"
          f"{protocol['epochs']} epochs, cosine with {protocol['warmup']:.0%} warmup, "
          f"dropout {protocol['dropout']:g}, max length {max_len}, {given['pooling']} pooling, "
          "last-epoch dev score, "
          f"median of {protocol['seeds']} seed(s), device {device}; "
          f"text cleaning {clean} ({clean_source})")

    def clean_text(text):  # fine-tuning text cleaned as the pretraining corpus was
        return data.clean_text(text, **clean)[0]

    results = {"checkpoint": checkpoint, "glue_dir": glue_dir, "units": "percent",
               "settings": protocol, "tasks": {}, "submission_files": []}
    # The control answers "what did pretraining buy?": the same network, tokenizer and protocol
    # from a fresh initialization, fine-tuned beside the pretrained one on every task.
    control = None
    if given["control"] == "random-init":
        control = random_init_copy(trunk, seed=CONTROL_SEED)
        results["control"] = {"kind": "random-init", "init_seed": CONTROL_SEED, "tasks": {}}
    missing = {}  # submission name -> why it was not written
    jobs = [(name, TASKS[name], lambda name=name: load_task(name, glue_dir)) for name in tasks]
    if task_file:
        name, spec, own_data = load_task_file(task_file, given["task_dev_file"],
                                              given["task_type"])
        jobs.append((name, spec, lambda: own_data))
    for name, spec, load in jobs:
        task_data = load()  # one task at a time in memory: QQP and MNLI are large
        results["tasks"][name], test_preds = run_task(name, spec, task_data, trunk, enc,
                                                      clean_text, settings)
        if control is not None:  # no submission files or saved models for the control
            results["control"]["tasks"][name], _ = run_task(
                f"{name} (random init)", spec, task_data, control, enc, clean_text,
                {**settings, "predict_test": False, "save_model": None})
        missing.update({sub: why for sub, why in task_data["missing_test"]})
        for sub, preds in test_preds.items():  # empty unless out is set
            os.makedirs(os.path.join(out, "submission"), exist_ok=True)
            write_submission(os.path.join(out, "submission", f"{sub}.tsv"),
                             task_data["test"][sub]["index"], preds, spec["classes"])
            results["submission_files"].append(f"{sub}.tsv")
    return report(results, missing, out, given["include_wnli"])


def report(results, missing, out, include_wnli):
    """Add the GLUE score and the missing submission files to results, print the table and write
    out/results.json and out/results.md when out is set. Returns results."""
    numbers = score_numbers(results["tasks"], include_wnli)
    score, convention = glue_score(numbers, include_wnli)
    results.update(glue_score=score, glue_convention=convention, glue_numbers=numbers)
    if "control" in results:  # the control's score, and what pretraining bought over it
        control = results["control"]
        control["glue_numbers"] = score_numbers(control["tasks"], include_wnli)
        control["glue_score"] = glue_score(control["glue_numbers"], include_wnli)[0]
        results["pretraining_gain"] = {
            "glue_score": None if score is None else score - control["glue_score"],
            **{k: v - control["glue_numbers"][k] for k, v in numbers.items()}}
    # a --task-file run alone makes no leaderboard files
    ran_glue = any(t in TASKS for t in results["tasks"])
    results["missing_submissions"] = {} if not (out and ran_glue) else {
        sub: missing.get(sub, "its task was not run") for sub in SUBMISSION_FILES
        if f"{sub}.tsv" not in results["submission_files"]}
    table = markdown_table(results)
    print(table)
    for sub, why in results["missing_submissions"].items():
        print(f"{sub}.tsv not written: {why}")
    if out:
        os.makedirs(out, exist_ok=True)
        write_text(os.path.join(out, "results.json"), json.dumps(results, indent=2) + "\n")
        write_text(os.path.join(out, "results.md"), table)
        print(f"wrote {out}/results.json, {out}/results.md and "
              f"{len(results['submission_files'])} submission file(s)")
    return results


def score_numbers(task_results, include_wnli):
    """{submission name: the number the GLUE score averages} for the tasks in task_results."""
    scored = [t for t in TASKS if t in task_results and (t != "WNLI" or include_wnli)]
    return {sub: task_results[t]["metrics"][key]
            for t in scored for sub, key in TASKS[t]["score"].items()}


def markdown_table(results):
    """One row per reported number: median over seeds, then each seed's value; with a control,
    its median and the gain from pretraining beside them."""
    s = results["settings"]
    control = results.get("control")
    scaled = LR_SCALING_WORDS[s["lr_scaling"]]
    lines = [f"# GLUE dev results for `{results['checkpoint']}`", "",
             f"{OPTIMIZER_WORDS[s['optimizer']]} lr {s['lr']:g}{scaled}"
             f"{layer_decay_words(s.get('layer_decay', 1.0))}, batch {s['batch_size']}, "
             f"{head_words(s.get('head_epochs', 0))}{s['epochs']} epochs, cosine with "
             f"{s['warmup']:.0%} warmup, dropout {s['dropout']:g}, max length {s['max_len']}, "
             f"{s['pooling']} pooling; median of {s['seeds']} seed(s); percent."
             + (" Control: the same network from a random initialization (seed "
                f"{control['init_seed']}), fine-tuned the same way." if control else ""), "",
             "| task | metric | median | per seed |" + (" random init | gain |" if control else ""),
             "|---|---|---:|---|" + ("---:|---:|" if control else "")]
    for name, r in results["tasks"].items():
        score_keys = TASKS[name]["score"].items() if name in TASKS else ()
        in_score = {key for sub, key in score_keys if sub in results["glue_numbers"]}
        for k, v in r["metrics"].items():
            mark = "" if k in in_score else " (not in score)"
            seeds = ", ".join(f"{p[k]:.2f}" for p in r["per_seed"])
            row = f"| {name} | {k}{mark} | {v:.2f} | {seeds} |"
            if control:
                c = control["tasks"][name]["metrics"][k]
                row += f" {c:.2f} | {v - c:+.2f} |"
            lines.append(row)
    score = "n/a" if results["glue_score"] is None else f"{results['glue_score']:.2f}"
    text = "\n".join(lines) + f"\n\nGLUE score ({results['glue_convention']}): {score}\n"
    if control and control["glue_score"] is not None:
        text += (f"random init: {control['glue_score']:.2f}; pretraining gain: "
                 f"{results['pretraining_gain']['glue_score']:+.2f} points\n")
    return text


# -----------------------------------------------------------------------------
# Command line

def check_args(parser, args):
    """One-line errors for flags that parse but cannot give a score, before any file is read."""
    rules = [("seeds", args.seeds >= 1, ">= 1"), ("epochs", args.epochs >= 1, ">= 1"),
             ("head_epochs", args.head_epochs >= 0, ">= 0"),
             ("lr", args.lr > 0 and math.isfinite(args.lr), "a positive number"),
             ("layer_decay", 0 < args.layer_decay <= 1, "in (0, 1]"),
             ("batch_size", args.batch_size >= 1, ">= 1"),
             ("eval_batch_size", args.eval_batch_size >= 1, ">= 1"),
             ("warmup", 0 <= args.warmup < 1, "in [0, 1)"),
             ("dropout", 0 <= args.dropout < 1, "in [0, 1)"),
             ("weight_decay", args.weight_decay >= 0, ">= 0"),
             ("max_len", args.max_len == 0 or args.max_len >= 8,
              ">= 8 (room for [CLS], [SEP] and the text) or 0 (the pretraining length)"),
             ("max_train_examples", args.max_train_examples == -1 or args.max_train_examples >= 1,
              ">= 1 or -1 (all)"),
             ("retries", args.retries >= 1, ">= 1")]
    for name, ok, rule in rules:
        if not ok:
            parser.error(f"--{name.replace('_', '-')} must be {rule} (got {getattr(args, name)!r})")
    if args.task_dev_file and not args.task_file:
        parser.error("--task-dev-file needs --task-file")


def make_parser():
    """The command line; the defaults are DEFAULTS' (cramming's GLUE-sane protocol, with mean
    pooling and relative lr scaling)."""
    p = argparse.ArgumentParser(
        prog="evaluate_glue.py",
        description="GLUE fine-tuning and scoring (cramming's GLUE-sane protocol).",
        usage="%(prog)s --checkpoint DIR [flags]  (--help lists them)")
    # Inputs
    p.add_argument("--checkpoint",
                   help="pretrained run folder holding config.json, model.pt and tokenizer.json "
                   "(train.py's final/), or a folder export.py or transformers' save_pretrained "
                   "wrote")
    p.add_argument("--glue-dir", default="glue_data",
                   help="folder with CoLA/, SST-2/, ... (default glue_data)")
    p.add_argument("--tasks", default=None,
                   help=f"comma-separated subset of {','.join(TASKS)} (default all nine)")
    p.add_argument("--task-file", default=None,
                   help="your own headed TSV task: sentence or sentence1[,sentence2], "
                        "label (class name or float)")
    p.add_argument("--task-dev-file", default=None,
                   help="dev TSV for --task-file (default: hold out 10%% of rows)")
    p.add_argument("--task-type", default="auto", choices=("auto", "classification", "regression"),
                   help="label type of --task-file (auto: regression iff some label is a "
                        "non-integer number)")
    # Protocol (defaults: cramming GLUE-sane, with mean pooling and relative lr scaling)
    p.add_argument("--seeds", type=int, default=5,
                   help="fine-tuning runs per task; the median is reported")
    p.add_argument("--epochs", type=int, default=5, help="passes over each training set")
    p.add_argument("--head-epochs", type=int, default=0,
                   help="first train the fresh head alone for this many epochs, the network "
                        "frozen, then everything for --epochs (LP-FT); 0: off")
    p.add_argument("--lr", type=float, default=4e-5, help="peak AdamW learning rate")
    p.add_argument("--lr-scaling", default="relative", choices=("none", "relative"),
                   help="relative (default): each weight matrix's lr times its RMS over the init "
                        "std (>= 1), so pretrained matrices that grew move as fast, relatively, as "
                        "fresh ones; none: one lr for all (cramming)")
    p.add_argument("--layer-decay", type=float, default=1.0,
                   help="layer-wise lr decay: the head at --lr, each layer below it at this "
                        "factor times the one above, the embedding lowest (ELECTRA: 0.8); "
                        "1: off (default)")
    p.add_argument("--optimizer", default=None, choices=("adamw", "muon"),
                   help="adamw (cramming's) or muon: Muon on the blocks' matrices and AdamW on "
                        "the rest (default: the one that pretrained the checkpoint, as its "
                        "args.json records; adamw without one)")
    p.add_argument("--batch-size", type=int, default=16, help="training batch size in sequences")
    p.add_argument("--warmup", type=float, default=0.1,
                   help="linear warmup as a fraction of all steps, then cosine")
    p.add_argument("--dropout", type=float, default=0.1,
                   help="dropout probability during fine-tuning")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--max-len", type=int, default=128,
                   help="max tokens per input including [CLS]/[SEP]; 0: the length the "
                        "checkpoint was pretrained at")
    p.add_argument("--pooling", default="mean", choices=model.CHOICES["pooling"],
                   help="what the classification head reads: the mean over all real tokens "
                        "(mean, default, ModernBERT's option) or the [CLS] position (cls, BERT)")
    p.add_argument("--control", default=None, choices=("random-init",),
                   help="also fine-tune a freshly initialized copy of the network with the same "
                        "protocol and report it beside the pretrained scores")
    p.add_argument("--lowercase", action="store_true", default=None,
                   help="lowercase GLUE text (default: as the checkpoint's meta.json records, "
                        "else no); set it if the pretraining corpus was lowercased")
    p.add_argument("--strip-accents", action="store_true", default=None,
                   help="strip accents (default: as recorded)")
    p.add_argument("--include-wnli", action="store_true",
                   help="count WNLI accuracy in the GLUE score (cramming: no)")
    # Speed
    p.add_argument("--eval-batch-size", type=int, default=128,
                   help="sequences per evaluation batch")
    p.add_argument("--max-train-examples", type=int, default=-1,
                   help="train on a fixed random subset (-1 = all)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if available)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    # Download
    p.add_argument("--download", action="store_true",
                   help="fetch the missing task folders into --glue-dir first")
    p.add_argument("--download-url", default=download.GLUE_URL,
                   help="base URL of the GLUE zips, AX.tsv and mrpc_dev_ids.tsv")
    p.add_argument("--mrpc-url", default=download.MRPC_URL,
                   help="base URL of SentEval's msr_paraphrase_{train,test}.txt")
    p.add_argument("--retries", type=int, default=3, help="download attempts per file")
    # Output
    p.add_argument("--out", default="runs/glue",
                   help="folder for results.json, results.md and submission/*.tsv")
    p.add_argument("--write-corpus", default=None, metavar="FILE",
                   help="write the --tasks' training text, without labels, to FILE (.jsonl) for "
                        "train.py --data, and stop: task-adaptive pretraining")
    p.add_argument("--save-model", default=None, metavar="DIR",
                   help="also write each task's seed-0 fine-tuned model to DIR/TASK/ (model.py's "
                        "files, tokenizer.json, labels.json) for export.py")
    return p


def main(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    check_args(p, args)

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    clean = None if args.lowercase is None and args.strip_accents is None else \
        {"lowercase": bool(args.lowercase), "strip_accents": bool(args.strip_accents)}
    cap = args.max_train_examples if args.max_train_examples > 0 else None  # -1: all rows
    try:
        if args.download:
            # download.py fetches: resumed, retried, each task folder renamed into place whole
            download.download_glue(args.glue_dir, check_tasks(tasks or TASKS), args.download_url,
                                   args.mrpc_url, args.retries)
            if not args.checkpoint:
                return None
        if args.write_corpus:
            rows = write_task_corpus(args.write_corpus, tasks or TASKS, args.glue_dir, cap)
            print(f"wrote {sum(rows.values()):,} training rows' text (no labels) to "
                  f"{args.write_corpus}: " + ", ".join(f"{k} {v:,}" for k, v in rows.items()))
            return rows
        if not args.checkpoint:
            raise ValueError("--checkpoint is required (a pretrained run folder), unless "
                             "--download or --write-corpus is used alone")
        # the flags by DEFAULTS' names (-1, "all rows", becomes None)
        settings = {k: getattr(args, k) for k in DEFAULTS if hasattr(args, k)}
        settings.update(max_train_examples=cap, max_len=args.max_len or None,
                        clean=clean, progress=not args.no_progress)
        return evaluate(args.checkpoint, tasks, settings)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
