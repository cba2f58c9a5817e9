"""glue_tasks.py: the GLUE tasks, their files as distributed, and their metrics.

    spec = TASKS["RTE"]              # columns, classes, dev and test files, metrics
    task = load_task("RTE", "glue_data")                # {"train", "dev": {suffix: split}, "test"}
    task_metrics(spec, {"": predictions}, task)         # {"accuracy": 66.4}: percent, per dev set
    name, spec, task = load_task_file("mine/train.tsv") # a TSV with sentence(s) and a label

evaluate_glue.py fine-tunes and scores with these; nothing here imports torch. The metrics are
written out in numpy (a few lines each) so that scoring needs no scikit-learn or scipy.
"""
import csv
import io
import math
import os

import numpy as np

csv.field_size_limit(1 << 24)  # a few MNLI/QQP fields are long; the default 128 KiB limit is close

# -----------------------------------------------------------------------------
# The nine tasks: where their files are, which columns hold text and label, what is measured.
# `dev` maps a suffix for metric names to a file ("" = one dev set); `test` maps a submission file
# name to the test file it predicts (AX is the MNLI model applied to the diagnostic set).

TASKS = {
    "CoLA": dict(text=("sentence", None), label="label", classes=["0", "1"], metrics=("mcc",),
                 dev={"": "dev.tsv"}, test={"CoLA": "test.tsv"}, score={"CoLA": "mcc"},
                 # train/dev have no header: source, label, original label ('*' or empty), sentence
                 no_header=("source", "label", "original_label", "sentence")),
    "SST-2": dict(text=("sentence", None), label="label", classes=["0", "1"], metrics=("accuracy",),
                  dev={"": "dev.tsv"}, test={"SST-2": "test.tsv"}, score={"SST-2": "accuracy"}),
    "MRPC": dict(text=("#1 String", "#2 String"), label="Quality", classes=["0", "1"],
                 metrics=("f1", "accuracy"),
                 dev={"": "dev.tsv"}, test={"MRPC": "test.tsv"}, score={"MRPC": "f1"}),
    "STS-B": dict(text=("sentence1", "sentence2"), label="score", classes=None,
                  metrics=("pearson", "spearman"),
                  dev={"": "dev.tsv"}, test={"STS-B": "test.tsv"}, score={"STS-B": "pearson"}),
    "QQP": dict(text=("question1", "question2"), label="is_duplicate", classes=["0", "1"],
                metrics=("f1", "accuracy"),
                dev={"": "dev.tsv"}, test={"QQP": "test.tsv"}, score={"QQP": "f1"}),
    "MNLI": dict(text=("sentence1", "sentence2"), label="gold_label", metrics=("accuracy",),
                 classes=["contradiction", "entailment", "neutral"],
                 dev={"m": "dev_matched.tsv", "mm": "dev_mismatched.tsv"},
                 test={"MNLI-m": "test_matched.tsv", "MNLI-mm": "test_mismatched.tsv",
                       "AX": os.path.join("..", "diagnostic", "diagnostic.tsv")},
                 score={"MNLI-m": "accuracy_m", "MNLI-mm": "accuracy_mm"}),
    "QNLI": dict(text=("question", "sentence"), label="label",
                 classes=["entailment", "not_entailment"], metrics=("accuracy",),
                 dev={"": "dev.tsv"}, test={"QNLI": "test.tsv"}, score={"QNLI": "accuracy"}),
    "RTE": dict(text=("sentence1", "sentence2"), label="label",
                classes=["entailment", "not_entailment"], metrics=("accuracy",),
                dev={"": "dev.tsv"}, test={"RTE": "test.tsv"}, score={"RTE": "accuracy"}),
    "WNLI": dict(text=("sentence1", "sentence2"), label="label", classes=["0", "1"],
                 metrics=("accuracy",),
                 dev={"": "dev.tsv"}, test={"WNLI": "test.tsv"}, score={"WNLI": "accuracy"}),
}
SUBMISSION_FILES = ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI-m", "MNLI-mm", "QNLI", "RTE",
                    "WNLI", "AX"]


def task_key(name):
    """'SST-2', 'sst2', 'Sst_2' -> 'sst2': GLUE's folder names and Hugging Face's, alike."""
    return name.lower().replace("-", "").replace("_", "")


def check_tasks(tasks):
    """GLUE folder names (CoLA, SST-2, STS-B) or Hugging Face's (cola, sst2, stsb), in any case ->
    folder names."""
    by_key = {task_key(t): t for t in TASKS}
    unknown = [t for t in tasks if task_key(t) not in by_key]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; choose from {','.join(TASKS)} (or cola, "
                         "sst2, stsb, ...)")
    return [by_key[task_key(t)] for t in tasks]


# -----------------------------------------------------------------------------
# Reading the TSV files exactly as distributed

def read_tsv(path, names=None):
    """(header, rows as dicts with their line number under "_line", n_skipped) of a TSV file.

    names=None: the first row is the header. Rows whose field count differs from the header are
    malformed (QQP's train file has a few) and are skipped and counted rather than guessed at.
    utf-8-sig drops the byte-order mark that MRPC's files start with.
    """
    if not os.path.isfile(path):
        raise ValueError(f"{path}: file not found")
    # bytes first, so that a bad byte is reported with its line number, not a bare decode error
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}, line {line}: invalid UTF-8 "
                         f"(byte 0x{raw[e.start]:02x})") from None
    # no GLUE file uses quoting: a quote mark is text (a quoted phrase), never a field delimiter
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    header = list(names) if names else next(reader, None)
    if not header:
        raise ValueError(f"{path}: empty file, expected a header row")
    rows, skipped = [], 0
    for row in reader:
        if len(row) != len(header):
            skipped += 1
            continue
        rows.append({**dict(zip(header, row)), "_line": reader.line_num})
    return header, rows, skipped


def no_rows(path, skipped):
    """The error for a file with nothing to train or score on (no score from no data)."""
    why = (f" ({skipped} malformed row(s) skipped: their field count differs from the header's)"
           if skipped else "")
    return f"{path}: no usable rows{why}"


def parse_split(spec, path, labelled):
    """One split as plain lists:
    {"a", "b" (or None), "labels" (int class ids / floats / None), "index", ...}."""
    names = spec.get("no_header") if labelled else None  # CoLA's test file does have a header
    header, rows, skipped = read_tsv(path, names)
    col_a, col_b = spec["text"]
    needed = [c for c in (col_a, col_b, spec["label"] if labelled else None) if c]
    for c in needed:
        if c not in header:
            raise ValueError(f"{path}: missing column {c!r} (header has {header})")
    if not rows:
        raise ValueError(no_rows(path, skipped))
    split = {"path": path, "skipped": skipped, "a": [r[col_a] for r in rows],
             "b": [r[col_b] for r in rows] if col_b else None, "labels": None,
             # test files carry an `index` (QQP: `id`) column that the leaderboard wants echoed back
             "index": [r.get("index", r.get("id", str(i))) for i, r in enumerate(rows)]}
    if labelled:
        split["labels"] = parse_labels([(r[spec["label"]], r["_line"]) for r in rows],
                                       spec["classes"], path)
    return split


def parse_labels(raw, classes, path):
    """(label string, line number) pairs -> class ids in `classes` order, or floats when classes
    is None."""
    lookup = {c: i for i, c in enumerate(classes or [])}
    out = []
    for x, line in raw:
        try:
            value = float(x) if classes is None else lookup[x]
            # a NaN or infinite target would silently poison the regression loss (STS-B)
            if not math.isfinite(value):
                raise ValueError
            out.append(value)
        except (KeyError, ValueError):
            expected = "a finite number" if classes is None else f"one of {classes}"
            raise ValueError(f"{path}, line {line}: unknown label {x!r}; expected "
                             f"{expected}") from None
    return np.array(out, dtype=np.float32 if classes is None else np.int64)


def load_task(name, glue_dir, spec=None):
    """Train, dev and (where present) test splits of one GLUE task folder."""
    spec = spec or TASKS[name]
    folder = os.path.join(glue_dir, name)
    if not os.path.isdir(folder):
        raise ValueError(f"{folder}: task folder for {name} not found (use --download, or point "
                         "--glue-dir at the folder that holds CoLA/, SST-2/, ...)")
    task = {"train": parse_split(spec, os.path.join(folder, "train.tsv"), True),
            "dev": {k: parse_split(spec, os.path.join(folder, f), True)
                    for k, f in spec["dev"].items()},
            "test": {}, "missing_test": []}
    # a missing test file costs only its submission file: the dev score needs none, so it is
    # recorded and reported rather than an error
    for sub, f in spec["test"].items():
        path = os.path.normpath(os.path.join(folder, f))
        if os.path.isfile(path):
            task["test"][sub] = parse_split(spec, path, False)
        else:
            task["missing_test"].append((sub, f"{path} not found"))
    return task


def load_task_file(path, dev_path=None, task_type="auto"):
    """A user's own task: a headed TSV with `sentence` or `sentence1` [+ `sentence2`] and `label`.

    Classification unless every label is a number and at least one is not an integer (or task_type
    says so). Without dev_path a fixed 10% of the rows (seed 0) is held out as dev.
    """
    header, rows, skipped = read_tsv(path)
    if not rows:
        raise ValueError(no_rows(path, skipped))
    col_a = "sentence1" if "sentence1" in header else "sentence"
    col_b = "sentence2" if "sentence2" in header else None
    for c in (col_a, "label"):
        if c not in header:
            raise ValueError(f"{path}: missing column {c!r} (need `sentence` or `sentence1`[, "
                             "`sentence2`], `label`)")
    raw = [r["label"] for r in rows]
    if task_type == "auto":
        try:
            values = [float(x) for x in raw]
            task_type = "regression" if any(v != int(v) for v in values) else "classification"
        except ValueError:
            task_type = "classification"
    # sorted: a label gets the same class id on every run, whatever the order of the rows
    classes = sorted(set(raw)) if task_type == "classification" else None
    if classes is not None and len(classes) < 2:
        raise ValueError(f"{path}: a classification task needs at least 2 labels, found {classes}")
    spec = dict(text=(col_a, col_b), label="label", classes=classes, dev={"": ""}, test={},
                score={}, metrics=("accuracy", "mcc") if classes else ("pearson", "spearman"))
    train = parse_split(spec, path, True)
    if dev_path:
        dev = parse_split(spec, dev_path, True)
    else:  # hold out 10% of the training rows, the same rows every run
        perm = np.random.default_rng(0).permutation(len(train["a"]))
        n_dev = max(1, len(perm) // 10)
        if len(perm) - n_dev < 2:
            raise ValueError(f"{path}: {len(perm)} row(s) leave no training rows after holding out "
                             "10% for dev; add rows or give --task-dev-file")
        dev, train = subset(train, np.sort(perm[:n_dev])), subset(train, np.sort(perm[n_dev:]))
    name = os.path.splitext(os.path.basename(path))[0]
    return name, spec, {"train": train, "dev": {"": dev}, "test": {}, "missing_test": []}


def subset(split, idx):
    """The rows `idx` of a split (used by --max-train-examples and the task-file dev hold-out)."""
    pick = lambda xs: None if xs is None else [xs[i] for i in idx]  # noqa: E731
    out = {**split, "a": pick(split["a"]), "b": pick(split["b"]), "index": pick(split["index"])}
    out["labels"] = None if split["labels"] is None else split["labels"][idx]
    return out


# -----------------------------------------------------------------------------
# Metrics in numpy. All return fractions in [-1, 1] or [0, 1]; the report multiplies by 100.
# GLUE's choice per task (Wang et al. 2019, sec. 3): MCC for CoLA, whose classes are unbalanced;
# F1 (with accuracy) for MRPC and QQP, whose positive class is the rarer one; Pearson and Spearman
# for STS-B, a similarity score in [0, 5]; accuracy elsewhere.

def accuracy(pred, gold):
    """Fraction right; NaN for no rows (no score from no data)."""
    return float(np.mean(np.asarray(pred) == np.asarray(gold))) if len(gold) else math.nan


def f1_score(pred, gold, positive=1):
    """F1 of the positive class = 2TP / (2TP + FP + FN); 0 when there is no positive anywhere."""
    pred, gold = np.asarray(pred) == positive, np.asarray(gold) == positive
    # true negatives do not count: a model that says "not a paraphrase" everywhere scores 0
    tp, fp, fn = np.sum(pred & gold), np.sum(pred & ~gold), np.sum(~pred & gold)
    return float(2 * tp / (2 * tp + fp + fn)) if tp + fp + fn > 0 else 0.0


def matthews_corrcoef(pred, gold):
    """Matthews correlation (Gorodkin's K-class form; for 2 classes (TP*TN - FP*FN) / sqrt(...)).

    With confusion matrix C (K,K), c = trace, s = total, t_k = true counts, p_k = predicted counts:
    MCC = (c*s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) (s^2 - sum_k t_k^2)). A constant
    prediction makes the denominator 0; we return 0 there (no information), like scikit-learn.
    """
    pred, gold = np.asarray(pred), np.asarray(gold)
    # the classes seen on either side; a class neither predicted nor present adds nothing
    classes = np.union1d(pred, gold)
    t = np.array([np.sum(gold == k) for k in classes], dtype=np.float64)
    p = np.array([np.sum(pred == k) for k in classes], dtype=np.float64)
    c, s = float(np.sum(pred == gold)), float(len(gold))
    denom = math.sqrt((s * s - p @ p) * (s * s - t @ t))
    return float((c * s - p @ t) / denom) if denom > 0 else 0.0


def pearson(x, y):
    """Pearson correlation; NaN where it is undefined: a constant side, a NaN anywhere, fewer than
    2 pairs (as scipy). The CLI turns a NaN into an error rather than report a number."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return math.nan
    # centred, then the cosine of the two vectors: the textbook definition, in float64
    x, y = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y / denom) if denom > 0 else math.nan


def rankdata(x):
    """Ranks 1..n with ties sharing the average of the ranks they span
    (e.g. [5, 1, 5] -> [2.5, 1, 2.5])."""
    _, which, counts = np.unique(np.asarray(x), return_inverse=True, return_counts=True)
    # the distinct values, in order, occupy ranks last-count+1 .. last
    last = np.cumsum(counts)
    return ((last - counts + 1 + last) / 2.0)[which.reshape(-1)]


def spearman(x, y):
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):  # ranks would hide the NaN
        return math.nan
    # Spearman is Pearson on ranks: it asks only whether the order of the scores is right
    return pearson(rankdata(x), rankdata(y))


METRICS = {"accuracy": accuracy, "f1": f1_score, "mcc": matthews_corrcoef, "pearson": pearson,
           "spearman": spearman}


def task_metrics(spec, dev_preds, task):
    """{metric[_suffix]: percent} over every dev set of a task, e.g. MNLI -> accuracy_m, _mm."""
    out = {}
    for suffix, split in task["dev"].items():
        for name in spec["metrics"]:
            key = f"{name}_{suffix}" if suffix else name
            out[key] = 100.0 * METRICS[name](dev_preds[suffix], split["labels"])
    return out


def glue_score(numbers, include_wnli=False):
    """(score, convention sentence) from {"CoLA": mcc, ..., "MNLI-m": acc, "MNLI-mm": acc, ...},
    in percent.

    cramming's convention: the arithmetic mean of 9 numbers (MNLI-m and -mm separate, MRPC/QQP F1,
    STS-B Pearson, CoLA MCC, the rest accuracy), WNLI excluded. A subset of tasks is marked as
    partial because its mean is not comparable to published scores.
    """
    full = [k for t, spec in TASKS.items() for k in spec["score"] if t != "WNLI" or include_wnli]
    used = [k for k in full if k in numbers]
    if not used:
        return None, "no GLUE task was evaluated"
    # unweighted (cramming's 9-number mean): a small task such as RTE counts as much as MNLI-m
    score = float(np.mean([numbers[k] for k in used]))
    wnli = "WNLI accuracy included" if include_wnli else "WNLI excluded"
    convention = (f"cramming convention: mean of {len(full)} numbers, MNLI-m and -mm separate, "
                  f"MRPC/QQP F1, STS-B Pearson, CoLA MCC, others accuracy, {wnli}")
    if len(used) < len(full):
        missing = [k for k in full if k not in numbers]
        convention += f"; PARTIAL: {len(used)} of {len(full)} numbers, missing {', '.join(missing)}"
    return score, convention
