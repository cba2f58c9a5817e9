"""What pretraining put into the features before fine-tuning moves them: linear probes of a frozen
checkpoint and of its random-init control on CoLA, SST-2, MRPC, STS-B and RTE
(docs/evaluate_glue.md, "Frozen features against fine-tuning").

    python bench/probe_frozen.py --checkpoint runs/cram/final --glue-dir glue_data

Each sentence is encoded alone, `[CLS] s [SEP]`, and its final states are averaged over its own
tokens: u, shape (d,). A single-sentence task reads u; a pair task reads [u, v, |u - v|, u * v,
cos(u, v)], the features sentence encoders compare two sentences by (SBERT: Reimers & Gurevych
2019, section 3). A ridge regression maps the standardized features to the label (to one-hot rows
for a classification task, which then predicts the argmax). Its penalty is picked from PENALTIES on
a random fifth of the training rows, then the ridge is refit on all of them and scored on the dev
set with GLUE's metric. No weight of the network changes, so the score measures the features alone;
evaluate_glue.py's fine-tuning, which trains every weight, is printed beside it when --glue-results
names its results.json.

Prints one line per task and writes --out/probe_frozen.json.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data  # noqa: E402
import evaluate_glue  # noqa: E402
import glue_tasks  # noqa: E402
import tokenizer  # noqa: E402

TASKS = ("CoLA", "SST-2", "MRPC", "STS-B", "RTE")
PENALTIES = (1.0, 10.0, 100.0, 1000.0, 10000.0)


def sentence_features(net, enc, texts, clean, max_len, batch_size=256):
    """(N, d) float64: the mean of each text's final states over its tokens, the text encoded
    alone as [CLS] text [SEP] (at most max_len tokens); [CLS] and [SEP] are left out of the mean."""
    ids = tokenizer.special_ids(enc)
    seqs = [[ids["cls"], *enc.encode_ordinary(clean(t))[:max_len - 2], ids["sep"]] for t in texts]
    device = net.tok_emb.weight.device
    rows = []
    net.eval()
    with torch.no_grad():
        for start in range(0, len(seqs), batch_size):
            batch, mask = evaluate_glue.pad_batch(seqs[start:start + batch_size], ids["pad"],
                                                  device)
            h = net.trunk(batch, mask).float()                                  # (B, T, d)
            own = mask.clone()
            own[:, 0] = 0                                                       # not [CLS]
            own[torch.arange(len(own)), mask.sum(1) - 1] = 0                    # not [SEP]
            own = own[..., None].float()
            rows.append((h * own).sum(1) / own.sum(1).clamp(min=1))             # (B, d)
    return torch.cat(rows).double().cpu().numpy()


def pair_features(u, v):
    """(N, 4d + 1): [u, v, |u - v|, u * v, cos(u, v)] for the two sentences' (N, d) features."""
    cos = (u * v).sum(1) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1) + 1e-12)
    return np.concatenate([u, v, np.abs(u - v), u * v, cos[:, None]], axis=1)


def fit_ridge(x, y, penalty):
    """(predict, weights): a ridge regression of targets y ((N,) or (N, k)) on features x (N, p),
    each feature standardized by x's mean and std; predict(x_new) gives (N_new,) or (N_new, k)."""
    mean, std = x.mean(0), x.std(0) + 1e-6
    z = (x - mean) / std
    w = np.linalg.solve(z.T @ z + penalty * np.eye(z.shape[1]), z.T @ (y - y.mean(0)))
    return (lambda x_new: ((x_new - mean) / std) @ w + y.mean(0)), w


def ridge_predictions(x_train, labels, x_dev, classes, metric, penalties=PENALTIES):
    """(dev predictions, chosen penalty): class ids (argmax of a ridge on one-hot rows) when classes
    is a list, else scores. The penalty is the one whose ridge, fit on four fifths of the training
    rows (a fixed random draw), scores best on the other fifth by metric(pred, gold), the task's
    own (an accuracy would favour predicting CoLA's majority class); the final ridge is fit on
    every training row."""
    labels = np.asarray(labels)
    y = np.eye(len(classes))[labels.astype(int)] if classes else labels.astype(float)

    def predict(x_fit, y_fit, x_new, penalty):
        out = fit_ridge(x_fit, y_fit, penalty)[0](x_new)
        return out.argmax(1) if classes else out

    order = np.random.default_rng(0).permutation(len(x_train))  # GLUE files are sorted by source
    fit_rows, held_out = order[:len(order) * 4 // 5], order[len(order) * 4 // 5:]

    def held_out_score(penalty):
        pred = predict(x_train[fit_rows], y[fit_rows], x_train[held_out], penalty)
        return metric(pred, labels[held_out])
    best = max(penalties, key=held_out_score)
    return predict(x_train, y, x_dev, best), best


def probe_task(name, net, enc, task, train, clean, max_len):
    """{"score": the task's GLUE number on dev (percent), "penalty"} of the frozen net's ridge."""
    spec = glue_tasks.TASKS[name]

    def features(split):
        u = sentence_features(net, enc, split["a"], clean, max_len)
        if split["b"] is None:
            return u
        return pair_features(u, sentence_features(net, enc, split["b"], clean, max_len))
    dev = task["dev"][""]
    (key,) = spec["score"].values()                             # MCC, accuracy, F1 or Pearson
    pred, penalty = ridge_predictions(features(train), train["labels"], features(dev),
                                      spec["classes"], glue_tasks.METRICS[key])
    metrics = glue_tasks.task_metrics(spec, {"": pred}, {"dev": {"": dev}})
    return {"score": metrics[key], "penalty": penalty}


def probe(checkpoint, glue_dir, tasks=TASKS, max_train_examples=4000, glue_results=()):
    """Both arms' frozen-feature scores on each task, and their mean. glue_results: paths of
    evaluate_glue.py results.json files run with a random-init control, whose fine-tuned scores
    are copied beside them (a later file's task wins)."""
    given = {**evaluate_glue.DEFAULTS, "max_len": None}
    loaded = evaluate_glue.load_checkpoint(checkpoint, given)
    enc, trunk, max_len = loaded["enc"], loaded["trunk"], loaded["max_len"]

    def clean(text):
        return data.clean_text(text, **loaded["clean"])[0]
    control = evaluate_glue.random_init_copy(trunk, evaluate_glue.CONTROL_SEED)
    fine_tuned = {}  # task -> {"pretrained": score, "random_init": score}
    for path in glue_results:
        run = json.load(open(path))
        for name, task_result in run["tasks"].items():
            (key,) = glue_tasks.TASKS[name]["score"].values()
            fine_tuned[name] = {"pretrained": task_result["metrics"][key],
                                "random_init": run["control"]["tasks"][name]["metrics"][key]}
    result = {"checkpoint": checkpoint, "max_train_examples": max_train_examples,
              "features": "mean of final states per sentence; pairs [u, v, |u-v|, u*v, cos]",
              "tasks": {}}
    for name in tasks:
        spec = glue_tasks.TASKS[name]
        task = glue_tasks.load_task(name, glue_dir)
        train = evaluate_glue.training_rows(name, spec, task["train"], max_train_examples)
        row = {arm: probe_task(name, net, enc, task, train, clean, max_len)
               for arm, net in (("pretrained", trunk), ("random_init", control))}
        row["gain"] = row["pretrained"]["score"] - row["random_init"]["score"]
        line = (f"{name}: frozen pretrained {row['pretrained']['score']:.1f}, random init "
                f"{row['random_init']['score']:.1f} ({row['gain']:+.1f})")
        if name in fine_tuned:
            row["fine_tuned"] = fine_tuned[name]
            line += (f"; fine-tuned {row['fine_tuned']['pretrained']:.1f} and "
                     f"{row['fine_tuned']['random_init']:.1f}")
        print(line, flush=True)
        result["tasks"][name] = row
    for arm in ("pretrained", "random_init"):
        result[f"mean_{arm}"] = float(np.mean([r[arm]["score"] for r in result["tasks"].values()]))
    result["mean_gain"] = result["mean_pretrained"] - result["mean_random_init"]
    print(f"mean of {len(result['tasks'])} tasks, frozen: pretrained "
          f"{result['mean_pretrained']:.2f}, random init {result['mean_random_init']:.2f} "
          f"({result['mean_gain']:+.2f})")
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="train.py's final/ folder")
    p.add_argument("--glue-dir", required=True, help="the folder that holds CoLA/, SST-2/, ...")
    p.add_argument("--tasks", default=",".join(TASKS),
                   help="comma-separated, of " + ", ".join(TASKS))
    p.add_argument("--max-train-examples", type=int, default=4000,
                   help="training rows per task (evaluate_glue.py's fixed subset)")
    p.add_argument("--glue-results", nargs="+", default=(), metavar="RESULTS_JSON",
                   help="evaluate_glue.py results.json files (run with --control random-init) "
                        "whose fine-tuned scores are printed beside")
    p.add_argument("--out", default="runs/probe_frozen", help="folder for probe_frozen.json")
    args = p.parse_args(argv)
    try:
        tasks = glue_tasks.check_tasks([t.strip() for t in args.tasks.split(",") if t.strip()])
    except ValueError as e:
        p.error(f"--tasks: {e}")
    if set(tasks) - set(TASKS):
        p.error(f"--tasks: {', '.join(sorted(set(tasks) - set(TASKS)))} not one of "
                f"{', '.join(TASKS)}")
    result = probe(args.checkpoint, args.glue_dir, tasks, args.max_train_examples,
                   args.glue_results)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "probe_frozen.json")
    evaluate_glue.write_text(path, json.dumps(result, indent=1))  # a temporary file, then a rename
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
