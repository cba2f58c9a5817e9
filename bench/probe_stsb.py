"""Why pretraining does not pay off on STS-B at CPU budgets: four probes of a checkpoint and of its
random-init control (docs/evaluate_glue.md, "STS-B: the networks fit the pairs").

    python bench/probe_stsb.py --checkpoint runs/cram/final --glue-dir glue_data

1. Word overlap: the Pearson correlation between the gold scores and the Jaccard overlap of the two
   sentences' lowercase word sets, on the dev set, with no training at all. It shows what one
   feature that generalizes is worth.
2. Copying: in `[CLS] a [SEP] b [SEP]` one token of b is masked, and the MLM head guesses it. Top-1
   accuracy is counted apart for tokens that also occur in a (they can be copied across the [SEP])
   and tokens that do not. A network that matches tokens across the pair scores much higher on the
   first; both are 0 for a random network.
3. Frozen features: a ridge regression from the frozen network's final states (mean-pooled and
   [CLS], standardized, penalty 1000) to the scores. It shows whether the pooled features hold
   what the copying finds.
4. Fit: evaluate_glue.py's protocol on STS-B (one seed), with the Pearson correlation on the
   training rows beside the dev set's. It shows whether fine-tuning learns a similarity or memorizes
   the pairs.
Prints one line per probe and arm, and writes --out/probe_stsb.json.
"""
import argparse
import json
import os
import re
import sys

import numpy as np
import torch

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(BENCH), BENCH]
import data  # noqa: E402
import evaluate_glue  # noqa: E402
import glue_tasks  # noqa: E402
import tokenizer  # noqa: E402
from probe_frozen import fit_ridge  # noqa: E402  (beside this file)


def word_overlap_pearson(split):
    """Pearson (percent) between split's gold scores and the Jaccard overlap of each pair's word
    sets (lowercase \\w+ runs)."""
    def words(text):
        return set(re.findall(r"\w+", text.lower()))
    overlap = [len(words(a) & words(b)) / max(1, len(words(a) | words(b)))
               for a, b in zip(split["a"], split["b"])]
    return 100.0 * glue_tasks.pearson(np.array(overlap), np.asarray(split["labels"], float))


def copy_accuracy(net, enc, split, clean, n_pairs=800, seed=0):
    """Mask one random token of each pair's second sentence (the first n_pairs pairs) and return
    {"copyable": top-1 %, "n_copyable", "other": top-1 %, "n_other"}: copyable when the masked
    token also occurs in the first sentence."""
    ids = tokenizer.special_ids(enc)
    rng = np.random.default_rng(seed)
    hits = {True: [], False: []}
    net.eval()
    for a, b in list(zip(split["a"], split["b"]))[:n_pairs]:
        ta, tb = enc.encode_ordinary(clean(a)), enc.encode_ordinary(clean(b))
        if not tb:
            continue
        seq = [ids["cls"], *ta, ids["sep"], *tb, ids["sep"]]
        where = len(ta) + 2 + int(rng.integers(len(tb)))      # a position inside b
        target, seq[where] = seq[where], ids["mask"]
        with torch.no_grad():
            logits = net(torch.tensor([seq], device=net.tok_emb.weight.device))["logits"]
        hits[target in ta].append(int(logits[0, where].argmax()) == target)
    share = lambda h: 100.0 * float(np.mean(h)) if h else None  # noqa: E731
    return {"copyable": share(hits[True]), "n_copyable": len(hits[True]),
            "other": share(hits[False]), "n_other": len(hits[False])}


def frozen_ridge_pearson(net, tokens, train_labels, dev_labels, pad_id, penalty=1000.0):
    """Dev Pearson (percent) of a ridge regression from the frozen net's (mean-pooled final state,
    [CLS] final state) features, each standardized on the training rows, to the scores."""
    def features(seqs):                                                   # (N, 2d)
        rows = []
        with torch.no_grad():
            for start in range(0, len(seqs), 256):
                ids, mask = evaluate_glue.pad_batch(seqs[start:start + 256], pad_id,
                                                    net.tok_emb.weight.device)
                h = net.trunk(ids, mask)                                  # (B, T, d)
                real = mask[..., None].float()
                rows.append(torch.cat([(h * real).sum(1) / real.sum(1), h[:, 0]], -1))
        return torch.cat(rows).double().cpu().numpy()
    net.eval()
    predict, _ = fit_ridge(features(tokens["train"]), np.asarray(train_labels, float), penalty)
    return 100.0 * glue_tasks.pearson(predict(features(tokens["dev"][""])),
                                      np.asarray(dev_labels, float))


def fit(trunk, tokens, train_labels, dev_labels, settings, n_train_scored=1500):
    """Fine-tune trunk on the training rows with settings (evaluate_glue's protocol, seed 0) and
    return {"train": Pearson % on the first n_train_scored training rows, "dev": on dev}."""
    spec = glue_tasks.TASKS["STS-B"]
    net = evaluate_glue.finetune(trunk, spec, tokens["train"], train_labels, settings, seed=0)
    net.eval()

    def pearson(seqs, gold):
        pred = evaluate_glue.predict(net, seqs, settings["pad_id"], settings["eval_batch_size"],
                                     settings["device"], None)
        return 100.0 * glue_tasks.pearson(np.asarray(pred, float), np.asarray(gold, float))
    return {"train": pearson(tokens["train"][:n_train_scored], train_labels[:n_train_scored]),
            "dev": pearson(tokens["dev"][""], dev_labels)}


def probe(checkpoint, glue_dir, settings):
    """All four probes for the checkpoint and its random-init control (evaluate_glue's). settings:
    evaluate_glue.DEFAULTS keys to change (lr, epochs, optimizer, max_train_examples...)."""
    given = {**evaluate_glue.DEFAULTS, **settings}
    loaded = evaluate_glue.load_checkpoint(checkpoint, given)
    enc, trunk, optimizer = loaded["enc"], loaded["trunk"], loaded["optimizer"]

    def clean(text):
        return data.clean_text(text, **loaded["clean"])[0]

    task = glue_tasks.load_task("STS-B", glue_dir)
    train = evaluate_glue.training_rows("STS-B", glue_tasks.TASKS["STS-B"], task["train"],
                                        given["max_train_examples"])
    tokens = evaluate_glue.encode_task(enc, train, task, loaded["max_len"], clean,
                                       with_test=False)
    run = {**given, "optimizer": optimizer, "max_len": loaded["max_len"],
           "device": loaded["device"], "pad_id": tokenizer.special_ids(enc)["pad"],
           "progress": False}
    dev = task["dev"][""]
    result = {"checkpoint": checkpoint, "optimizer": optimizer, "lr": given["lr"],
              "epochs": given["epochs"], "word_overlap_dev_pearson": word_overlap_pearson(dev)}
    print("word overlap (Jaccard), no training: dev Pearson "
          f"{result['word_overlap_dev_pearson']:.1f}")
    control = evaluate_glue.random_init_copy(trunk, evaluate_glue.CONTROL_SEED)
    for arm, net in (("pretrained", trunk), ("random_init", control)):
        copying = copy_accuracy(net, enc, dev, clean)
        frozen = frozen_ridge_pearson(net, tokens, train["labels"], dev["labels"], run["pad_id"])
        fitted = fit(net, tokens, train["labels"], dev["labels"], run)
        result[arm] = {"copy": copying, "frozen_dev": frozen, "fit": fitted}
        print(f"{arm}: masked token of b found {shown(copying['copyable'])}% when it occurs in "
              f"a ({copying['n_copyable']} pairs), {shown(copying['other'])}% when not "
              f"({copying['n_other']}); frozen features: dev Pearson {frozen:.1f}; "
              f"fine-tuned ({optimizer}, lr {given['lr']:g}, "
              f"{given['epochs']} epochs): train Pearson {fitted['train']:.1f}, "
              f"dev {fitted['dev']:.1f}", flush=True)
    return result


def shown(percent):
    return "-" if percent is None else f"{percent:.1f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="train.py's final/ folder")
    p.add_argument("--glue-dir", required=True, help="the folder that holds STS-B/")
    p.add_argument("--lr", type=float, default=1e-3, help="fine-tuning lr (the issue's protocol)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--optimizer", default=None, choices=("adamw", "muon"),
                   help="default: as evaluate_glue.py, the one that pretrained the checkpoint")
    p.add_argument("--max-train-examples", type=int, default=4000)
    p.add_argument("--out", default="runs/probe_stsb", help="folder for probe_stsb.json")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    result = probe(args.checkpoint, args.glue_dir,
                   {"lr": args.lr, "epochs": args.epochs, "optimizer": args.optimizer,
                    "max_train_examples": args.max_train_examples})
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "probe_stsb.json")
    evaluate_glue.write_text(path, json.dumps(result, indent=1))  # a temporary file, then a rename
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
