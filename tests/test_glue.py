"""evaluate_glue.py as a spec: TSV formats, numpy metrics, the GLUE-score convention, downloads,
an end-to-end run.

    python -m pytest -q tests/test_glue.py

The fixture glue_data/ below is written in the exact formats of the classic GLUE distribution (a few
rows per task); the end-to-end run fine-tunes a tiny random model on it on the CPU in seconds.
"""
import functools
import http.server
import io
import json
import math
import os
import shutil
import socket
import threading
import zipfile

import numpy as np
import pytest
import torch

import data
import download
import evaluate_glue as eg
import glue_tasks as gt
from conftest import random_checkpoint

# -----------------------------------------------------------------------------
# A fixture glue_data/ in the distributed formats

MNLI_TRAIN_HEAD = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                   "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
                   "sentence2"]
STSB_HEAD = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
             "sentence2"]
MRPC_HEAD = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
WORDS = ("the cat dog sat ran on a mat big small red house tree quickly slowly happy sad river "
         "bank").split()


def sentence(i, n=6):
    """Deterministic varied text; its quotes and apostrophes check that nothing reads quoting."""
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n + i % 4)]
    return ('"' if i % 3 == 0 else "") + " ".join(words) + ("'s end ." if i % 2 else " .")


def tsv(path, header, rows, bom=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lines = (["\t".join(header)] if header else []) + ["\t".join(map(str, r)) for r in rows]
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(("\ufeff" if bom else "") + "\n".join(lines) + "\n")


def write_fixture(root, n_train=8, n_dev=6, n_test=4):
    """Every task folder with train/dev/test files as GLUE's distribution lays them out, and AX."""
    j = os.path.join
    label2 = lambda i: i % 2  # noqa: E731
    nli3 = ["contradiction", "entailment", "neutral"]
    ent2 = ["entailment", "not_entailment"]
    for split, n, off in (("train", n_train, 0), ("dev", n_dev, 100)):
        r = range(off, off + n)
        # CoLA has no header: source, label, original label, sentence
        tsv(j(root, "CoLA", f"{split}.tsv"), None,
            [["gj04", label2(i), "" if label2(i) else "*", sentence(i)] for i in r])
        tsv(j(root, "SST-2", f"{split}.tsv"), ["sentence", "label"],
            [[sentence(i) + " ", label2(i)] for i in r])
        tsv(j(root, "MRPC", f"{split}.tsv"), MRPC_HEAD,
            [[label2(i), 1000 + i, 2000 + i, sentence(i), sentence(i + 1)] for i in r], bom=True)
        tsv(j(root, "STS-B", f"{split}.tsv"), STSB_HEAD + ["score"],
            [[i, "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", sentence(i),
              sentence(i + 2), f"{(i % 6) * 0.8:.3f}"] for i in r])
        qqp = [[i, 3 * i, 3 * i + 1, sentence(i) + "?", sentence(i + 3) + "?", label2(i)]
               for i in r]
        if split == "train":  # a malformed row: a question cut by a newline, as in QQP's train file
            qqp.insert(2, [99999, 1, 2, "How is the life of a math student?"])
        tsv(j(root, "QQP", f"{split}.tsv"),
            ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"], qqp)
        parses = ["( a )", "( b )", "(ROOT a)", "(ROOT b)"]
        tsv(j(root, "QNLI", f"{split}.tsv"), ["index", "question", "sentence", "label"],
            [[i, sentence(i) + "?", sentence(i + 1), ent2[i % 2]] for i in r])
        for task, labels in (("RTE", ent2), ("WNLI", ["0", "1"])):
            tsv(j(root, task, f"{split}.tsv"), ["index", "sentence1", "sentence2", "label"],
                [[i, sentence(i), sentence(i + 1), labels[i % 2]] for i in r])
        if split == "train":
            tsv(j(root, "MNLI", "train.tsv"), MNLI_TRAIN_HEAD + ["label1", "gold_label"],
                [[i, i, f"{i}e", "fiction", *parses, sentence(i), sentence(i + 1), nli3[i % 3],
                  nli3[i % 3]] for i in r])
        else:
            for name, o in (("dev_matched", 0), ("dev_mismatched", 50)):
                tsv(j(root, "MNLI", f"{name}.tsv"),
                    MNLI_TRAIN_HEAD + [f"label{k}" for k in range(1, 6)] + ["gold_label"],
                    [[i, i, f"{i}n", "travel", *parses, sentence(i + o), sentence(i + o + 1),
                      *[nli3[i % 3]] * 5, nli3[i % 3]] for i in r])
    t = range(200, 200 + n_test)
    for task in ("CoLA", "SST-2"):
        tsv(j(root, task, "test.tsv"), ["index", "sentence"],
            [[k, sentence(i)] for k, i in enumerate(t)])
    tsv(j(root, "MRPC", "test.tsv"), ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
        [[k, 3000 + i, 4000 + i, sentence(i), sentence(i + 1)] for k, i in enumerate(t)])
    tsv(j(root, "STS-B", "test.tsv"), STSB_HEAD,
        [[k, "main-news", "headlines", "2015", f"{i:04d}", "none", "none", sentence(i),
          sentence(i + 1)] for k, i in enumerate(t)])
    tsv(j(root, "QQP", "test.tsv"), ["id", "question1", "question2"],
        [[k, sentence(i) + "?", sentence(i + 1) + "?"] for k, i in enumerate(t)])
    for name in ("test_matched", "test_mismatched"):
        tsv(j(root, "MNLI", f"{name}.tsv"), MNLI_TRAIN_HEAD,
            [[k, i, f"{i}c", "slate", *parses, sentence(i), sentence(i + 1)]
             for k, i in enumerate(t)])
    tsv(j(root, "QNLI", "test.tsv"), ["index", "question", "sentence"],
        [[k, sentence(i) + "?", sentence(i + 1)] for k, i in enumerate(t)])
    for task in ("RTE", "WNLI"):
        tsv(j(root, task, "test.tsv"), ["index", "sentence1", "sentence2"],
            [[k, sentence(i), sentence(i + 1)] for k, i in enumerate(t)])
    tsv(j(root, "diagnostic", "diagnostic.tsv"), ["index", "sentence1", "sentence2"],
        [[k, sentence(i), sentence(i + 5)] for k, i in enumerate(range(300, 305))])
    return root


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    return write_fixture(str(tmp_path_factory.mktemp("glue") / "glue_data"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, glue_dir):
    """A tiny random model and a tokenizer trained on the fixture text, saved as a run would."""
    return random_checkpoint(tmp_path_factory.mktemp("ckpt"), [sentence(i) for i in range(400)] * 4)


# -----------------------------------------------------------------------------
# Reading the formats

def test_cola_train_has_no_header_and_keeps_every_row(glue_dir):
    d = gt.load_task("CoLA", glue_dir)
    assert len(d["train"]["a"]) == 8 and d["train"]["b"] is None
    assert d["train"]["a"][0] == sentence(0)  # column 4, its leading quote kept (no quoting)
    assert d["train"]["labels"].tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert d["test"]["CoLA"]["index"] == ["0", "1", "2", "3"]  # the test file has a header


def test_qqp_malformed_row_is_skipped_and_counted(glue_dir):
    d = gt.load_task("QQP", glue_dir)
    assert d["train"]["skipped"] == 1 and len(d["train"]["a"]) == 8
    assert d["test"]["QQP"]["index"] == ["0", "1", "2", "3"]  # QQP's test file has `id` for it


def test_mrpc_header_with_byte_order_mark_is_read_by_name(glue_dir):
    d = gt.load_task("MRPC", glue_dir)
    assert d["train"]["a"][1] == sentence(1) and d["train"]["b"][1] == sentence(2)
    assert d["train"]["labels"].tolist()[:2] == [0, 1]


def test_mnli_reads_gold_label_and_both_dev_sets_and_ax(glue_dir):
    d = gt.load_task("MNLI", glue_dir)
    assert d["train"]["labels"].tolist()[:3] == [0, 1, 2]  # contradiction, entailment, neutral
    assert sorted(d["dev"]) == ["m", "mm"] and d["dev"]["mm"]["a"][0] == sentence(150)
    assert sorted(d["test"]) == ["AX", "MNLI-m", "MNLI-mm"] and len(d["test"]["AX"]["a"]) == 5


def test_stsb_score_is_a_float_label(glue_dir):
    d = gt.load_task("STS-B", glue_dir)
    assert d["train"]["labels"].dtype == np.float32
    assert d["train"]["labels"][:3].tolist() == pytest.approx([0.0, 0.8, 1.6])


def test_missing_task_folder_is_one_line_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"RTE: task folder for RTE not found") as e:
        gt.load_task("RTE", str(tmp_path))
    assert "\n" not in str(e.value) and str(tmp_path) in str(e.value)


def test_missing_column_names_the_file_and_column(tmp_path):
    tsv(str(tmp_path / "SST-2" / "train.tsv"), ["text", "label"], [["good", 1]])
    with pytest.raises(ValueError, match=r"SST-2/train.tsv: missing column 'sentence'"):
        gt.load_task("SST-2", str(tmp_path))


def test_unknown_label_names_the_file_and_row(tmp_path):
    tsv(str(tmp_path / "RTE" / "train.tsv"), ["index", "sentence1", "sentence2", "label"],
        [[0, "a", "b", "entailment"], [1, "a", "b", "maybe"]])
    message = r"RTE/train.tsv, line 3: unknown label 'maybe'; expected one of"
    with pytest.raises(ValueError, match=message):
        gt.load_task("RTE", str(tmp_path))


def test_cli_turns_bad_input_into_one_line_exit(tmp_path, checkpoint):
    with pytest.raises(SystemExit) as e:
        eg.main(["--checkpoint", checkpoint, "--glue-dir", str(tmp_path), "--tasks", "CoLA",
                 "--no-progress", "--out", str(tmp_path / "run")])
    message = str(e.value)
    assert message.startswith("error: ") and "CoLA" in message and "\n" not in message


def test_task_file_detects_regression_and_holds_out_ten_percent(tmp_path):
    path = str(tmp_path / "mine.tsv")
    tsv(path, ["sentence1", "sentence2", "label"],
        [[sentence(i), sentence(i + 1), i * 0.5] for i in range(20)])
    name, spec, d = gt.load_task_file(path)
    assert name == "mine" and spec["classes"] is None
    assert spec["metrics"] == ("pearson", "spearman")
    assert len(d["dev"][""]["a"]) == 2 and len(d["train"]["a"]) == 18


# -----------------------------------------------------------------------------
# Metrics against hand-computed values

def test_binary_metrics_match_a_hand_computed_confusion_matrix():
    pred, gold = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]  # TP 2, FP 1, TN 1, FN 1
    assert gt.accuracy(pred, gold) == pytest.approx(3 / 5)
    assert gt.f1_score(pred, gold) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    mcc = (2 * 1 - 1 * 1) / math.sqrt(3 * 3 * 2 * 2)
    assert gt.matthews_corrcoef(pred, gold) == pytest.approx(mcc)


def test_multiclass_mcc_matches_a_hand_computation():
    # c=4 correct of s=6; true counts t=(2,2,2), predicted p=(2,3,1):
    # (4*6 - 12) / sqrt((36-14)(36-12))
    mcc = gt.matthews_corrcoef([0, 1, 1, 1, 2, 0], [0, 0, 1, 1, 2, 2])
    assert mcc == pytest.approx(12 / math.sqrt(22 * 24))


def test_constant_predictions_score_zero_for_mcc_and_f1_and_are_undefined_for_correlations():
    gold = [0, 1, 1, 0]
    assert gt.matthews_corrcoef([1, 1, 1, 1], gold) == 0.0
    assert gt.f1_score([0, 0, 0, 0], gold) == 0.0
    assert gt.f1_score([1, 1, 1, 1], gold) == pytest.approx(2 * 2 / (4 + 2))
    # undefined, as in scipy; the CLI refuses to report it
    assert math.isnan(gt.pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]))
    assert math.isnan(gt.spearman([3, 3, 3], [1, 2, 3]))


def test_pearson_and_spearman_match_hand_computations_with_tied_ranks():
    assert gt.pearson([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    # a three-way tie shares the ranks 3, 4 and 5
    assert gt.rankdata([5, 1, 5, 3, 5]).tolist() == [4.0, 1.0, 4.0, 2.0, 4.0]
    # ranks x = (1, 2.5, 2.5, 4), y = (1, 2, 3, 4): covariance 4.5, variances 4.5 and 5
    assert gt.spearman([1, 2, 2, 3], [10, 20, 30, 40]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))


def test_glue_score_is_mean_of_nine_numbers_without_wnli():
    numbers = {"CoLA": 44.5, "SST-2": 92.2, "MRPC": 87.5, "STS-B": 84.6, "QQP": 87.3,
               "MNLI-m": 83.9, "MNLI-mm": 84.1, "QNLI": 89.5, "RTE": 53.8, "WNLI": 10.0}
    score, convention = gt.glue_score(numbers)
    assert score == pytest.approx(78.6, abs=0.05)  # cramming v1 (A6000) row
    assert "9 numbers" in convention and "WNLI excluded" in convention
    assert "PARTIAL" not in convention
    score, convention = gt.glue_score(numbers, include_wnli=True)
    assert score == pytest.approx((78.6 * 9 + 10.0) / 10, abs=0.05) and "10 numbers" in convention


def test_glue_score_of_a_subset_says_partial():
    score, convention = gt.glue_score({"CoLA": 40.0, "RTE": 60.0})
    assert score == 50.0 and "PARTIAL: 2 of 9 numbers" in convention


# -----------------------------------------------------------------------------
# Inputs and schedule

def test_pair_truncation_cuts_the_longer_segment_first():
    ids = {"cls": 1, "sep": 2}
    a, b = list(range(10, 40)), list(range(100, 105))  # 30 and 5 tokens, room for 20 - 3 = 17
    x = eg.join_pair(a, b, ids, 20)
    assert x == [1] + a[:12] + [2] + b + [2]
    x = eg.join_pair(a, list(range(100, 140)), ids, 20)  # both long: 9 + 8 (a keeps the odd token)
    assert x == [1] + a[:9] + [2] + list(range(100, 108)) + [2]
    assert eg.join_pair(a, None, ids, 8) == [1] + a[:6] + [2]


def test_text_is_cleaned_like_the_pretraining_corpus(tmp_path, checkpoint):
    import data
    import tokenizer
    enc = tokenizer.load_tokenizer(os.path.join(checkpoint, "tokenizer.json"))
    ids = tokenizer.special_ids(enc)
    split = {"a": ["The CAT sat"], "b": None}
    with open(tmp_path / "meta.json", "w") as f:  # prepared data whose corpus was lowercased
        json.dump({"settings": {"clean": {"lowercase": True}}}, f)
    clean, source = eg.text_cleaning(str(tmp_path))
    assert clean == {"lowercase": True} and source.endswith("meta.json")
    cleaner = lambda t: data.clean_text(t, **clean)[0]  # noqa: E731
    got = eg.encode_split(enc, split, ids, 32, cleaner)[0].tolist()
    assert got == [ids["cls"]] + enc.encode_ordinary("the cat sat") + [ids["sep"]]
    assert eg.text_cleaning(checkpoint) == ({}, "data.py defaults")


def test_batches_are_right_padded_to_their_longest_row():
    ids, mask = eg.pad_batch([np.array([5, 6, 7]), np.array([8])], 0, "cpu")
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_predictions_come_back_in_input_order_despite_length_sorting():
    class LengthNet(torch.nn.Module):  # "predicts" each row's length; class = length parity
        config = {"num_labels": 2}

        def classify(self, input_ids, attention_mask):
            n = attention_mask.sum(1).float()
            return {"logits": torch.stack([n, n + (n % 2) * 2 - 1], 1)}
    seqs = [np.arange(n) for n in (3, 7, 1, 4, 4, 9, 2)]
    got = eg.predict(LengthNet(), seqs, 0, 2, torch.device("cpu"), classes=["even", "odd"])
    assert got.tolist() == [1, 1, 1, 0, 0, 1, 0]
    # a regression: the first output
    got = eg.predict(LengthNet(), seqs, 0, 3, torch.device("cpu"), classes=None)
    assert got.tolist() == [3, 7, 1, 4, 4, 9, 2]


def test_each_metric_is_the_median_and_the_submission_comes_from_the_median_run():
    # MNLI's headline metric is its accuracy averaged over both dev sets: 70, 51 and 59 here
    runs = [{"seed": 0, "metrics": {"accuracy_m": 80.0, "accuracy_mm": 60.0}},
            {"seed": 1, "metrics": {"accuracy_m": 50.0, "accuracy_mm": 52.0}},
            {"seed": 2, "metrics": {"accuracy_m": 58.0, "accuracy_mm": 60.0}}]
    assert eg.median_run(runs, gt.TASKS["MNLI"], dev_suffixes=["m", "mm"])["seed"] == 2
    # each metric's own median, which may come from different runs
    assert eg.median_metrics(runs) == {"accuracy_m": 58.0, "accuracy_mm": 60.0}


def test_a_collapsed_fine_tune_is_an_error_not_a_score():
    task = {"dev": {"": {"labels": np.array([1.0, 2.0, 3.0])}}}
    constant = {"": np.array([2.0, 2.0, 2.0])}  # every STS-B prediction the same
    with pytest.raises(ValueError, match="pearson, spearman undefined on dev: every prediction"):
        eg.dev_metrics(gt.TASKS["STS-B"], constant, task)


def test_fine_tuning_lr_warms_up_linearly_then_decays_by_cosine_to_zero():
    assert [eg.lr_factor(s, 10, 110) for s in (0, 5, 10)] == [0.0, 0.5, 1.0]
    assert eg.lr_factor(60, 10, 110) == pytest.approx(0.5)  # halfway through the cosine
    assert eg.lr_factor(110, 10, 110) == pytest.approx(0.0)


# -----------------------------------------------------------------------------
# End to end: every metric, every submission file

def test_end_to_end_tiny_model_produces_every_metric_and_submission_file(tmp_path, glue_dir,
                                                                         checkpoint, capsys):
    out = str(tmp_path / "run")
    results = eg.main(["--checkpoint", checkpoint, "--glue-dir", glue_dir, "--out", out,
                       "--epochs", "1", "--seeds", "1", "--max-train-examples", "6",
                       "--batch-size", "4", "--no-progress"])
    metrics = {t: set(r["metrics"]) for t, r in results["tasks"].items()}
    assert metrics == {"CoLA": {"mcc"}, "SST-2": {"accuracy"}, "MRPC": {"f1", "accuracy"},
                       "STS-B": {"pearson", "spearman"}, "QQP": {"f1", "accuracy"},
                       "MNLI": {"accuracy_m", "accuracy_mm"},
                       "QNLI": {"accuracy"}, "RTE": {"accuracy"}, "WNLI": {"accuracy"}}
    qqp = results["tasks"]["QQP"]
    assert qqp["n_train"] == 6 and qqp["skipped_rows"]["train"] == 1
    assert results["settings"]["max_len"] == 64  # capped at the tiny model's 64 positions
    nine = list(results["glue_numbers"].values())
    assert len(nine) == 9 and results["glue_score"] == pytest.approx(np.mean(nine))
    printed = capsys.readouterr().out
    assert "GLUE score (cramming convention: mean of 9 numbers" in printed
    assert "WNLI excluded" in printed
    # the leaderboard's files: header, one row per test example, labels as the task's strings
    sub = os.path.join(out, "submission")
    assert sorted(os.listdir(sub)) == sorted(f"{s}.tsv" for s in gt.SUBMISSION_FILES)
    for name in gt.SUBMISSION_FILES:
        lines = open(os.path.join(sub, f"{name}.tsv")).read().splitlines()
        assert lines[0] == "index\tprediction" and len(lines) == 1 + (5 if name == "AX" else 4)
        preds = [line.split("\t")[1] for line in lines[1:]]
        allowed = {"MNLI-m": gt.TASKS["MNLI"]["classes"], "MNLI-mm": gt.TASKS["MNLI"]["classes"],
                   "AX": gt.TASKS["MNLI"]["classes"], "QNLI": ["entailment", "not_entailment"],
                   "RTE": ["entailment", "not_entailment"]}.get(name, ["0", "1"])
        if name == "STS-B":
            assert all(0.0 <= float(p) <= 5.0 for p in preds)
        else:
            assert set(preds) <= set(allowed)
    saved = json.load(open(os.path.join(out, "results.json")))
    assert saved["glue_score"] == pytest.approx(results["glue_score"])
    assert not saved["missing_submissions"]
    table = open(os.path.join(out, "results.md")).read()
    assert "| CoLA | mcc | " in table and "| WNLI | accuracy (not in score) |" in table


def test_seeds_report_the_median_and_missing_ax_is_reported(tmp_path, glue_dir, checkpoint):
    no_ax = str(tmp_path / "glue_data")
    shutil.copytree(glue_dir, no_ax, ignore=shutil.ignore_patterns("diagnostic"))
    r = eg.evaluate(checkpoint, ["RTE", "MNLI"],
                    {"glue_dir": no_ax, "seeds": 3, "out": str(tmp_path / "run"), "epochs": 1,
                     "batch_size": 4, "max_train_examples": 4, "progress": False})
    rte = r["tasks"]["RTE"]
    per_seed = [p["accuracy"] for p in rte["per_seed"]]
    assert len(per_seed) == 3 and rte["metrics"]["accuracy"] == pytest.approx(np.median(per_seed))
    # the test files come from the median run
    assert per_seed[rte["submission_seed"]] == np.median(per_seed)
    ax_file = os.path.join("diagnostic", "diagnostic.tsv")
    assert r["missing_submissions"]["AX"].endswith(ax_file + " not found")
    assert r["missing_submissions"]["CoLA"] == "its task was not run"
    assert not os.path.exists(str(tmp_path / "run" / "submission" / "AX.tsv"))
    assert "PARTIAL: 3 of 9 numbers" in r["glue_convention"]


def test_a_task_file_is_fine_tuned_end_to_end_and_gets_no_glue_score(tmp_path, checkpoint):
    path = str(tmp_path / "sentiment.tsv")
    tsv(path, ["sentence", "label"], [[sentence(i), ["neg", "pos"][i % 2]] for i in range(20)])
    r = eg.evaluate(checkpoint, None, {"task_file": path, "seeds": 1, "epochs": 1, "batch_size": 4,
                                       "progress": False, "out": str(tmp_path / "run")})
    assert set(r["tasks"]) == {"sentiment"}
    assert set(r["tasks"]["sentiment"]["metrics"]) == {"accuracy", "mcc"}
    assert r["glue_score"] is None
    assert r["missing_submissions"] == {}  # no GLUE task ran: no leaderboard files are missing


def test_a_task_file_after_glue_tasks_is_fine_tuned_on_its_own_rows(tmp_path, glue_dir,
                                                                   checkpoint):
    path = str(tmp_path / "sentiment.tsv")
    tsv(path, ["sentence", "label"], [[sentence(i), ["neg", "pos"][i % 2]] for i in range(30)])
    r = eg.evaluate(checkpoint, ["RTE"], {"glue_dir": glue_dir, "task_file": path, "seeds": 1,
                                          "epochs": 1, "batch_size": 4, "progress": False})
    # 27 rows train and 3 are held out: the file's own rows, not the task loaded before it
    assert r["tasks"]["sentiment"]["n_train"] == 27
    assert r["tasks"]["sentiment"]["n_dev"] == {"dev": 3}
    assert r["tasks"]["RTE"]["n_train"] != 27


# -----------------------------------------------------------------------------
# What pretraining bought: the random-init control, pooling and the fine-tuning length

def test_the_task_corpus_holds_the_training_rows_text_and_no_labels_or_dev_text(tmp_path,
                                                                               glue_dir):
    path = str(tmp_path / "tasks.jsonl")
    rows = eg.main(["--write-corpus", path, "--glue-dir", glue_dir, "--tasks", "sst2,mrpc"])
    docs = list(data.iter_documents(path))
    assert rows == {"SST-2": 8, "MRPC": 8} and len(docs) == 16
    # SST-2's rows, then MRPC's: one document per row, a pair's sentences on two lines
    assert docs[0] == sentence(0) + " " and docs[8] == f"{sentence(0)}\n{sentence(1)}"
    dev_text = {sentence(i) for i in range(100, 106)}
    assert not any(line in dev_text for d in docs for line in d.split("\n"))
    assert all(set(json.loads(line)) == {"text"} for line in open(path))


def test_the_task_corpus_with_a_row_cap_holds_the_rows_fine_tuning_picks(tmp_path, glue_dir):
    path = str(tmp_path / "tasks.jsonl")
    eg.main(["--write-corpus", path, "--glue-dir", glue_dir, "--tasks", "cola",
             "--max-train-examples", "3"])
    spec = gt.TASKS["CoLA"]
    picked = eg.training_rows("CoLA", spec, gt.load_task("CoLA", glue_dir)["train"], 3)["a"]
    assert list(data.iter_documents(path)) == picked and len(picked) == 3


def test_the_control_is_the_same_network_freshly_initialized_without_touching_the_rng():
    import model
    trunk = model.build_model(model.make_config("tiny", n_layers=1, d_model=32, n_heads=2,
                                                ffn_dim=64))
    torch.manual_seed(5)
    before = torch.rand(3)
    torch.manual_seed(5)
    control = eg.random_init_copy(trunk, seed=0)
    assert torch.equal(torch.rand(3), before)  # the pretrained arm's draws are unchanged
    assert control.config == trunk.config and control is not trunk
    again = eg.random_init_copy(trunk, seed=0)
    for (name, p), c, a in zip(trunk.named_parameters(), control.parameters(),
                               again.parameters()):
        assert c.shape == p.shape and torch.equal(c, a)  # seeded: the same control every time
        if p.dim() == 2:  # matrices are drawn afresh (norms start at 1 in both)
            assert not torch.equal(c, p), name


def quick_run(checkpoint, task_file, out, *flags):
    """evaluate_glue's command line on task_file: one seed, one epoch, no progress bars."""
    return eg.main(["--checkpoint", checkpoint, "--task-file", task_file, "--seeds", "1",
                    "--epochs", "1", "--no-progress", "--out", out, *flags])


@pytest.fixture(scope="module")
def similarity_task(tmp_path_factory):
    """A tiny regression task file: a float label per pair, so any change of weights changes the
    Pearson correlation."""
    path = str(tmp_path_factory.mktemp("task") / "similarity.tsv")
    tsv(path, ["sentence1", "sentence2", "label"],
        [[sentence(i), sentence(i + i % 3), f"{(i % 5) * 1.25:.2f}"] for i in range(60)])
    return path


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory):
    torch.manual_seed(123)  # weights that are not the control's seed-0 draw
    return random_checkpoint(tmp_path_factory.mktemp("other"), [sentence(i) for i in range(400)])


def test_the_control_is_reported_beside_the_pretrained_scores(tmp_path, similarity_task,
                                                              other_checkpoint):
    protocol = {"task_file": similarity_task, "seeds": 2, "epochs": 2, "batch_size": 8,
                "lr": 1e-3, "progress": False}
    alone = eg.evaluate(other_checkpoint, None, protocol)
    out = str(tmp_path / "run")
    both = eg.evaluate(other_checkpoint, None, {**protocol, "control": "random-init", "out": out})
    # the pretrained arm is the same run with or without a control beside it
    assert both["tasks"]["similarity"]["metrics"] == alone["tasks"]["similarity"]["metrics"]
    ours = both["tasks"]["similarity"]["metrics"]["pearson"]
    control = both["control"]["tasks"]["similarity"]["metrics"]["pearson"]
    assert both["control"]["kind"] == "random-init" and both["control"]["init_seed"] == 0
    assert control != ours and len(both["control"]["tasks"]["similarity"]["per_seed"]) == 2
    assert both["settings"]["control"] == "random-init"
    saved = json.load(open(os.path.join(out, "results.json")))
    assert saved["control"]["tasks"]["similarity"]["metrics"]["pearson"] == pytest.approx(control)
    table = open(os.path.join(out, "results.md")).read()
    assert "| task | metric | median | per seed | random init | gain |" in table
    assert f"{control:.2f} | {ours - control:+.2f} |" in table


def test_the_glue_score_gain_is_the_pretrained_score_minus_the_controls(tmp_path, glue_dir,
                                                                        checkpoint):
    r = eg.evaluate(checkpoint, ["RTE", "STS-B"],
                    {"glue_dir": glue_dir, "seeds": 1, "epochs": 1, "batch_size": 4,
                     "progress": False, "control": "random-init"})
    control = r["control"]
    assert set(control["glue_numbers"]) == {"RTE", "STS-B"}
    assert control["glue_score"] == pytest.approx(np.mean(list(control["glue_numbers"].values())))
    assert r["pretraining_gain"]["glue_score"] == pytest.approx(r["glue_score"]
                                                                - control["glue_score"])
    assert r["pretraining_gain"]["RTE"] == pytest.approx(r["glue_numbers"]["RTE"]
                                                         - control["glue_numbers"]["RTE"])


def test_relative_lr_scaling_gives_each_matrix_lr_times_its_growth_over_init():
    import model
    net = model.build_model(model.make_config("tiny", n_layers=1, d_model=32, n_heads=2,
                                              ffn_dim=64))
    std = net.config["init_std"]
    with torch.no_grad():
        net.blocks[0].qkv.weight.normal_(0, 20 * std)   # grew 20x, as in pretraining
        net.blocks[0].out.weight.normal_(0, std / 2)    # shrank: never slowed below lr
    lrs = {id(g["params"][0]): g["lr"] for g in eg.param_groups(net, 1e-3, "relative")}
    rms = net.blocks[0].qkv.weight.pow(2).mean().sqrt().item()
    assert lrs[id(net.blocks[0].qkv.weight)] == pytest.approx(1e-3 * rms / std)
    assert lrs[id(net.blocks[0].out.weight)] == pytest.approx(1e-3)
    assert lrs[id(net.blocks[0].norm1.weight)] == pytest.approx(1e-3)  # norms keep lr
    assert len(lrs) == len(list(net.parameters()))
    # a fresh network (the random-init control) gets lr, within its sampling noise
    fresh = model.build_model(net.config)
    fresh_lrs = [g["lr"] for g in eg.param_groups(fresh, 1e-3, "relative")]
    assert max(fresh_lrs) < 1.1e-3
    assert eg.param_groups(net, 1e-3, "none")[0]["lr"] == 1e-3


def test_muon_fine_tuning_steps_the_blocks_matrices_by_muon_at_their_relative_lr():
    """--optimizer muon: the blocks' 2-D weights on Muon, everything else (embedding, norms, the
    classifier head) on AdamW, each tensor at its relative lr as with AdamW; adamw is one AdamW."""
    import model
    import muon
    net = model.build_model(model.make_config("tiny", n_layers=1, d_model=32, n_heads=2,
                                              ffn_dim=64))
    model.add_classifier(net, 2, pooling="mean")
    std = net.config["init_std"]
    with torch.no_grad():
        net.blocks[0].qkv.weight.normal_(0, 20 * std)
    settings = {"lr": 1e-3, "lr_scaling": "relative", "layer_decay": 1.0, "weight_decay": 0.0,
                "device": torch.device("cpu")}
    opt = eg.make_optimizer(net, {**settings, "optimizer": "muon"})
    assert isinstance(opt, muon.MuonAdamW)
    on_muon = {id(p) for g in opt.param_groups if g["use_muon"] for p in g["params"]}
    assert on_muon == {id(p) for name, p in net.named_parameters()
                       if name.startswith("blocks.") and p.dim() == 2}
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(net.parameters()))
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    rms = net.blocks[0].qkv.weight.pow(2).mean().sqrt().item()
    assert lr_of[id(net.blocks[0].qkv.weight)] == pytest.approx(1e-3 * rms / std)
    # one step moves a Muon matrix by at most update_rms * lr in RMS times Newton-Schulz's top
    # singular value (about 1.2), whatever its gradient's size
    before = net.blocks[0].out.weight.detach().clone()
    ids = torch.randint(5, 500, (4, 12), generator=torch.Generator().manual_seed(0))
    net.classify(ids, torch.ones_like(ids, dtype=torch.bool), torch.tensor([0, 1, 0, 1]))[
        "loss"].mul(1000).backward()
    opt.step()
    moved = (net.blocks[0].out.weight.detach() - before).pow(2).mean().sqrt().item()
    assert 0 < moved <= 0.2 * 1.25 * lr_of[id(net.blocks[0].out.weight)]
    assert isinstance(eg.make_optimizer(net, {**settings, "optimizer": "adamw"}),
                      torch.optim.AdamW)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_head_first_epochs_train_the_head_alone_then_unfreeze_the_network(optimizer):
    """--head-epochs (LP-FT): the fresh head learns while every other weight stays bit-equal,
    and afterwards the whole network trains again."""
    from tqdm import tqdm

    import model
    net = model.build_model(model.make_config("tiny", n_layers=1, d_model=32, n_heads=2,
                                              ffn_dim=64))
    model.add_classifier(net, 2, pooling="mean")
    settings = {"lr": 1e-2, "lr_scaling": "relative", "weight_decay": 0.0, "batch_size": 4,
                "warmup": 0.0, "head_epochs": 2, "optimizer": optimizer, "pad_id": 0,
                "layer_decay": 1.0,
                "device": torch.device("cpu")}
    rng = np.random.default_rng(0)
    encoded = [list(rng.integers(5, 500, size=6)) for _ in range(8)]
    target = torch.tensor([0, 1] * 4)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    bar = tqdm(file=io.StringIO())  # counts the steps
    eg.train_head_alone(net, encoded, target, settings, rng, bar)
    after = net.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved == {"pooler.weight", "pooler.bias", "classifier.weight", "classifier.bias"}
    assert bar.n == 2 * 2                                   # 2 epochs of 2 batches
    assert all(p.requires_grad for p in net.parameters())   # unfrozen again
    eg.train_epochs(net, eg.make_optimizer(net, settings), 1, encoded, target, settings, rng,
                    bar)
    assert not torch.equal(before["blocks.0.qkv.weight"], net.state_dict()["blocks.0.qkv.weight"])


def test_head_first_epochs_are_recorded_in_the_protocol(tmp_path, similarity_task, checkpoint):
    r = quick_run(checkpoint, similarity_task, str(tmp_path / "run"), "--head-epochs", "1")
    assert r["settings"]["head_epochs"] == 1
    table = (tmp_path / "run" / "results.md").read_text()
    assert "1 epoch(s) of the head alone, then 1 epochs" in table
    with pytest.raises(SystemExit):
        eg.main(["--checkpoint", checkpoint, "--head-epochs", "-1"])


def test_the_optimizer_is_recorded_in_the_protocol(tmp_path, similarity_task, checkpoint):
    r = quick_run(checkpoint, similarity_task, str(tmp_path / "run"), "--optimizer", "muon")
    assert r["settings"]["optimizer"] == "muon"
    assert "Muon on the blocks' matrices" in (tmp_path / "run" / "results.md").read_text()


def test_the_optimizer_defaults_to_the_one_that_pretrained_the_checkpoint(tmp_path,
                                                                         similarity_task,
                                                                         checkpoint):
    """train.py's final/args.json names the pretraining optimizer; a folder without one (a
    Hugging Face model, an export) is fine-tuned with AdamW, and --optimizer always wins."""
    folder = tmp_path / "final"
    shutil.copytree(checkpoint, folder)
    assert eg.fine_tuning_optimizer(str(folder))[0] == "adamw"            # no args.json
    (folder / "args.json").write_text(json.dumps({"lr": 0.01}))
    assert eg.fine_tuning_optimizer(str(folder))[0] == "adamw"            # older than the flag
    (folder / "args.json").write_text(json.dumps({"optimizer": None}))
    assert eg.fine_tuning_optimizer(str(folder))[0] == "adamw"            # saved unset
    (folder / "args.json").write_text(json.dumps({"optimizer": "muon", "lr": 0.01}))
    assert eg.fine_tuning_optimizer(str(folder)) == ("muon",
                                                     f"as pretrained, {folder}/args.json")
    assert eg.fine_tuning_optimizer(str(folder), "adamw") == ("adamw", "given")
    r = eg.main(["--checkpoint", str(folder), "--task-file", similarity_task, "--seeds", "1",
                 "--epochs", "1", "--no-progress", "--out", str(tmp_path / "run")])
    assert r["settings"]["optimizer"] == "muon"
    (folder / "args.json").write_text(json.dumps({"optimizer": "lion"}))
    with pytest.raises(ValueError, match="args.json: optimizer 'lion' is not one of adamw, muon"):
        eg.fine_tuning_optimizer(str(folder))


def test_mean_pooling_is_recorded_and_saved_with_the_fine_tuned_model(tmp_path, similarity_task,
                                                                      checkpoint):
    import model
    saved = str(tmp_path / "models")
    r = quick_run(checkpoint, similarity_task, str(tmp_path / "run"), "--pooling", "mean",
                  "--save-model", saved)
    assert r["settings"]["pooling"] == "mean"
    assert model.load_model(os.path.join(saved, "similarity")).config["pooling"] == "mean"


def test_the_fine_tuning_length_defaults_to_the_pretraining_length_and_says_when_it_passes_it(
        capsys):
    import model
    rotary = model.make_config("tiny", positions="rotary")          # pretrained at 64 tokens
    assert eg.fine_tuning_length(None, rotary) == 64
    assert eg.fine_tuning_length(32, rotary) == 32 and capsys.readouterr().out == ""
    assert eg.fine_tuning_length(128, rotary) == 128                 # stated: kept, with a note
    assert "pretrained on: its rotary positions past 64 were never trained" in \
        capsys.readouterr().out
    learned = model.make_config("tiny", positions="learned")         # no table rows past 64
    assert eg.fine_tuning_length(128, learned) == 64


def test_max_len_zero_on_the_command_line_means_the_pretraining_length(tmp_path, similarity_task,
                                                                       checkpoint):
    r = quick_run(checkpoint, similarity_task, str(tmp_path / "run"), "--max-len", "0")
    assert r["settings"]["max_len"] == 64


# -----------------------------------------------------------------------------
# Download against a local HTTP server

def build_mirror(glue_dir, root):
    """The public layout: task zips and AX.tsv under glue/, SentEval's raw MRPC files under
    senteval/."""
    os.makedirs(os.path.join(root, "glue"))
    os.makedirs(os.path.join(root, "senteval"))
    for task, zip_name in download.ZIPS.items():
        with zipfile.ZipFile(os.path.join(root, "glue", zip_name), "w") as z:
            for f in sorted(os.listdir(os.path.join(glue_dir, task))):
                z.write(os.path.join(glue_dir, task, f), f"{task}/{f}")
    shutil.copy(os.path.join(glue_dir, "diagnostic", "diagnostic.tsv"),
                os.path.join(root, "glue", "AX.tsv"))
    _, train, _ = gt.read_tsv(os.path.join(glue_dir, "MRPC", "train.tsv"))
    _, dev, _ = gt.read_tsv(os.path.join(glue_dir, "MRPC", "dev.tsv"))
    # the dev pairs are picked by their ids, wherever they are in the file
    mixed = [dev[0]] + train[:4] + dev[1:] + train[4:]
    tsv(os.path.join(root, "senteval", "msr_paraphrase_train.txt"), MRPC_HEAD,
        [[r[c] for c in MRPC_HEAD] for r in mixed], bom=True)
    tsv(os.path.join(root, "senteval", "msr_paraphrase_test.txt"), MRPC_HEAD,
        [[1, 3000 + i, 4000 + i, sentence(i), sentence(i + 1)] for i in range(200, 204)], bom=True)
    tsv(os.path.join(root, "glue", "mrpc_dev_ids.tsv"), None,
        [[r["#1 ID"], r["#2 ID"]] for r in dev])


@pytest.fixture
def mirror(tmp_path, glue_dir):
    root = str(tmp_path / "mirror")
    build_mirror(glue_dir, root)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=root))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_download_reproduces_the_glue_folder(tmp_path, glue_dir, mirror):
    dest = str(tmp_path / "downloaded")
    eg.main(["--download", "--glue-dir", dest, "--download-url", mirror + "/glue/",
             "--mrpc-url", mirror + "/senteval"])
    for task in gt.TASKS:
        for f in ("train.tsv", "dev.tsv", "dev_matched.tsv", "test.tsv", "test_matched.tsv"):
            if os.path.exists(os.path.join(glue_dir, task, f)):
                got = gt.read_tsv(os.path.join(dest, task, f))[1]
                assert got == gt.read_tsv(os.path.join(glue_dir, task, f))[1], f"{task}/{f}"
    # QQP's own file, not STS-B's: the two addresses are not swapped
    assert open(os.path.join(dest, "QQP", "train.tsv")).readline().startswith("id\tqid1")
    assert os.path.isfile(os.path.join(dest, "diagnostic", "diagnostic.tsv"))
    leftovers = [f for f in os.listdir(dest)
                 if f.endswith((".zip", ".tmp")) or f.startswith(".extract")]
    assert not leftovers
    # every task is there: nothing is fetched, so an unreachable address does not matter
    download.download_glue(dest, list(gt.TASKS), base_url="http://invalid.invalid/")


def test_download_missing_file_fails_at_once_naming_the_url(tmp_path, mirror):
    with pytest.raises(SystemExit, match=r"download failed: .*/nowhere/RTE.zip: HTTP 404"):
        download.download_glue(str(tmp_path / "g"), ["RTE"], base_url=mirror + "/nowhere/",
                               retry_wait_s=60)


def test_download_offline_is_one_line_error(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now: connection refused
    with pytest.raises(SystemExit) as e:
        download.download_glue(str(tmp_path / "g"), ["RTE"], base_url=f"http://127.0.0.1:{port}/",
                               retries=2, retry_wait_s=0)
    msg = str(e.value)
    assert msg.startswith(f"download failed: cannot download http://127.0.0.1:{port}/RTE.zip")
    assert "\n" not in msg
    assert not os.listdir(str(tmp_path / "g"))  # no partial files left behind


# -----------------------------------------------------------------------------
# bench/probe_stsb.py: why pretraining does not reach STS-B

def load_bench(name):
    """bench/NAME.py as a module (bench/ is not a package)."""
    import importlib.util

    from conftest import ROOT
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_probe():
    return load_bench("probe_stsb")


def test_word_overlap_scores_pairs_by_the_jaccard_overlap_of_their_words():
    probe = load_probe()
    split = {"a": ["The cat sat.", "a b c d", "x y", "one two"],
             "b": ["the CAT sat", "a b e f", "z w", "one two three four"],
             "labels": np.array([5.0, 2.0, 0.0, 2.5])}
    # overlaps 1, 2/6, 0, 2/4: their Pearson correlation with the labels, in percent
    expected = np.corrcoef([1, 1 / 3, 0, 0.5], [5.0, 2.0, 0.0, 2.5])[0, 1] * 100
    assert probe.word_overlap_pearson(split) == pytest.approx(expected)


def test_the_copy_probe_sorts_masked_tokens_by_whether_the_first_sentence_holds_them(checkpoint):
    import model
    import tokenizer
    probe = load_probe()
    enc = tokenizer.load_tokenizer(os.path.join(checkpoint, "tokenizer.json"))
    net = model.load_model(checkpoint)
    texts = [sentence(i) for i in range(12)]
    same = probe.copy_accuracy(net, enc, {"a": texts, "b": texts}, clean=str)
    assert (same["n_copyable"], same["n_other"]) == (12, 0) and same["other"] is None
    # no token of "zzzz" sits in the fixture's sentences (its tokenizer spells it in pieces)
    assert not set(enc.encode_ordinary("zzzz")) & {t for s in texts
                                                  for t in enc.encode_ordinary(s)}
    apart = probe.copy_accuracy(net, enc, {"a": texts, "b": ["zzzz"] * 12}, clean=str)
    assert (apart["n_copyable"], apart["n_other"]) == (0, 12)
    assert 0 <= apart["other"] <= 100


def test_the_frozen_ridge_probe_fits_scores_it_can_see(checkpoint):
    """With more features (2d) than rows and almost no penalty, the ridge regression reproduces the
    training scores, so scoring it on the training rows themselves gives a Pearson of 100."""
    import model
    import tokenizer
    probe = load_probe()
    enc = tokenizer.load_tokenizer(os.path.join(checkpoint, "tokenizer.json"))
    net = model.load_model(checkpoint)
    seqs = [enc.encode_ordinary(sentence(i)) for i in range(10)]
    scores = np.arange(10.0) % 4
    assert 2 * net.config["d_model"] > len(seqs)
    tokens = {"train": seqs, "dev": {"": seqs}}
    pad = tokenizer.special_ids(enc)["pad"]
    assert probe.frozen_ridge_pearson(net, tokens, scores, scores, pad, penalty=1e-9) == \
        pytest.approx(100.0, abs=0.1)
    assert probe.frozen_ridge_pearson(net, tokens, scores, scores, pad, penalty=1e9) < 99


def test_the_stsb_probe_counts_copyable_tokens_and_fits_both_arms(tmp_path, glue_dir, checkpoint):
    probe = load_probe()
    r = probe.main(["--checkpoint", checkpoint, "--glue-dir", glue_dir, "--epochs", "1",
                    "--out", str(tmp_path)])
    dev = gt.load_task("STS-B", glue_dir)["dev"][""]
    for arm in ("pretrained", "random_init"):
        copy = r[arm]["copy"]
        assert copy["n_copyable"] + copy["n_other"] == len(dev["a"])  # one masked token per pair
        assert -100 <= r[arm]["fit"]["train"] <= 100 and -100 <= r[arm]["fit"]["dev"] <= 100
        assert -100 <= r[arm]["frozen_dev"] <= 100
    # the fixture checkpoint is itself a random network, but not the control's draw
    assert r["pretrained"]["fit"] != r["random_init"]["fit"]
    assert r["optimizer"] == "adamw"  # no args.json in the fixture checkpoint
    assert json.load(open(tmp_path / "probe_stsb.json"))["word_overlap_dev_pearson"] == \
        pytest.approx(r["word_overlap_dev_pearson"])


# -----------------------------------------------------------------------------
# bench/probe_frozen.py: linear probes of the frozen features, both arms

def load_frozen_probe():
    return load_bench("probe_frozen")


def test_a_sentence_feature_is_the_mean_of_its_own_final_states_whatever_the_batch(checkpoint):
    """[CLS], [SEP] and padding are left out: a short sentence batched beside a long one gets the
    same features as alone, and they are the mean of positions 1..n of its unpadded states."""
    import model
    import tokenizer
    probe = load_frozen_probe()
    enc = tokenizer.load_tokenizer(os.path.join(checkpoint, "tokenizer.json"))
    net = model.load_model(checkpoint)
    short, long = sentence(1, n=3), sentence(2, n=12)
    both = probe.sentence_features(net, enc, [short, long], str, max_len=64)
    alone = probe.sentence_features(net, enc, [short], str, max_len=64)
    assert both.shape == (2, net.config["d_model"])
    np.testing.assert_allclose(both[0], alone[0], atol=1e-5)
    ids = tokenizer.special_ids(enc)
    tokens = enc.encode_ordinary(short)
    seq = torch.tensor([[ids["cls"], *tokens, ids["sep"]]])
    with torch.no_grad():
        states = net.trunk(seq, torch.ones_like(seq))[0]                   # (n + 2, d)
    np.testing.assert_allclose(alone[0], states[1:-1].mean(0).double().numpy(), atol=1e-5)


def test_pair_features_are_both_sentences_their_distance_product_and_cosine():
    probe = load_frozen_probe()
    u, v = np.array([[1.0, 0.0], [3.0, 4.0]]), np.array([[0.0, 2.0], [3.0, 4.0]])
    x = probe.pair_features(u, v)
    np.testing.assert_allclose(x[0], [1, 0, 0, 2, 1, 2, 0, 0, 0])          # orthogonal: cos 0
    np.testing.assert_allclose(x[1], [3, 4, 3, 4, 0, 0, 9, 16, 1])         # equal: cos 1


def test_the_ridge_probe_recovers_labels_that_its_features_determine():
    """Classes that a feature separates are all predicted right, and a score that is a linear
    function of the features is predicted with a Pearson near 1; noise-free data picks the
    smallest penalty."""
    probe = load_frozen_probe()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 5))
    classes = (x[:, 0] > 0).astype(int)
    pred, penalty = probe.ridge_predictions(x[:150], classes[:150], x[150:], ["0", "1"],
                                            gt.accuracy, penalties=(0.01, 1e6))
    assert (pred == classes[150:]).mean() >= 0.95 and penalty == 0.01
    scores = x @ np.array([1.0, -2.0, 0.5, 0.0, 3.0]) + 2.5
    pred, penalty = probe.ridge_predictions(x[:150], scores[:150], x[150:], None, gt.pearson,
                                            penalties=(0.01, 1e6))
    assert gt.pearson(pred, scores[150:]) > 0.999 and penalty == 0.01
    np.testing.assert_allclose(pred, scores[150:], atol=0.05)


def test_the_frozen_probe_scores_both_arms_on_the_five_tasks(tmp_path, glue_dir, checkpoint):
    probe = load_frozen_probe()
    fine_tuned = {"tasks": {"RTE": {"metrics": {"accuracy": 60.0}}},
                  "control": {"tasks": {"RTE": {"metrics": {"accuracy": 55.0}}}}}
    (tmp_path / "results.json").write_text(json.dumps(fine_tuned))
    r = probe.main(["--checkpoint", checkpoint, "--glue-dir", glue_dir,
                    "--glue-results", str(tmp_path / "results.json"), "--out", str(tmp_path)])
    assert list(r["tasks"]) == ["CoLA", "SST-2", "MRPC", "STS-B", "RTE"]
    for name, row in r["tasks"].items():
        assert row["gain"] == pytest.approx(row["pretrained"]["score"] -
                                            row["random_init"]["score"])
        assert row["pretrained"]["penalty"] in probe.PENALTIES
    # the fixture checkpoint is a random network, but not the control's draw
    assert r["tasks"]["STS-B"]["pretrained"] != r["tasks"]["STS-B"]["random_init"]
    assert r["tasks"]["RTE"]["fine_tuned"] == {"pretrained": 60.0, "random_init": 55.0}
    assert "fine_tuned" not in r["tasks"]["CoLA"]
    assert r["mean_gain"] == pytest.approx(r["mean_pretrained"] - r["mean_random_init"])
    assert json.load(open(tmp_path / "probe_frozen.json"))["mean_gain"] == \
        pytest.approx(r["mean_gain"])
    with pytest.raises(SystemExit):
        probe.main(["--checkpoint", checkpoint, "--glue-dir", glue_dir, "--tasks", "qqp"])


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_layer_decay_gives_each_layer_the_lr_of_the_one_above_times_the_decay(optimizer):
    """--layer-decay 0.5 on 2 blocks: the head (final norm, pooler, classifier) at lr, blocks.1 at
    lr / 2, blocks.0 at lr / 4, the embedding at lr / 8; each on top of relative scaling."""
    import model
    net = model.build_model(model.make_config("tiny", n_layers=2, d_model=32, n_heads=2,
                                              ffn_dim=64))
    model.add_classifier(net, 2, pooling="mean")
    with torch.no_grad():
        net.blocks[0].up.weight.mul_(10)  # a grown matrix: relative scaling raises its lr ~10x
    settings = {"lr": 1e-2, "lr_scaling": "relative", "weight_decay": 0.0, "optimizer": optimizer,
                "device": torch.device("cpu")}
    plain = eg.make_optimizer(net, {**settings, "layer_decay": 1.0})
    decayed = eg.make_optimizer(net, {**settings, "layer_decay": 0.5})
    names = {id(p): n for n, p in net.named_parameters()}

    def lrs(opt):
        return {names[id(p)]: g["lr"] for g in opt.param_groups for p in g["params"]}
    before, after = lrs(plain), lrs(decayed)
    assert before.keys() == after.keys() == {n for n, _ in net.named_parameters()}
    expected = {"classifier.weight": 1, "pooler.bias": 1, "final_norm.weight": 1,
                "blocks.1.qkv.weight": 0.5, "blocks.1.norm2.bias": 0.5,
                "blocks.0.up.weight": 0.25, "blocks.0.down.weight": 0.25,
                "tok_emb.weight": 0.125, "emb_norm.weight": 0.125}
    for name, factor in expected.items():
        assert after[name] == pytest.approx(before[name] * factor), name
    assert before["blocks.0.up.weight"] == pytest.approx(10 * before["blocks.0.down.weight"],
                                                         rel=0.1)


def test_layer_decay_is_checked_and_recorded_in_the_protocol(tmp_path, similarity_task,
                                                             checkpoint):
    r = quick_run(checkpoint, similarity_task, str(tmp_path / "run"), "--layer-decay", "0.8")
    assert r["settings"]["layer_decay"] == 0.8
    assert "times 0.8 per layer below the head" in (tmp_path / "run" / "results.md").read_text()
    for bad in ("0", "1.5"):
        with pytest.raises(SystemExit):
            eg.main(["--checkpoint", checkpoint, "--layer-decay", bad])
