"""Specification of bad input: python -m pytest -q tests/test_bad_input.py

Every command line (train.py, data.py, evaluate_glue.py, grow.py, scaling.py, model.py) refuses
nonsense with one line that names the flag or the file and what is wrong, before it writes
anything. Flag errors come from argparse as its short usage line plus `PROG: error: ...` (exit 2);
errors found in files are `error: ...` (exit 1). No evaluator reports a score from no data. The
cases run the real command lines in-process.
"""
import json
import os
import shutil

import numpy as np
import pytest
import torch

import data
import evaluate_glue
import glue_tasks
import grow
import model
import scaling
import train
from conftest import random_checkpoint


def refuse(main, argv, capsys):
    """Run a command line that must fail and return its one error line.

    The shape of the output is checked first."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    code, err = stop.value.code, capsys.readouterr().err.strip().splitlines()
    # raise SystemExit("error: ..."): Python prints exactly this line.
    if isinstance(code, str):
        assert code.startswith("error: ") and "\n" not in code
        return code
    assert code == 2 and len(err) == 2        # argparse: the short usage line, then the error
    assert err[0].startswith("usage: ") and len(err[0]) < 100 and "error: " in err[1]
    return err[1]


# --- train.py: every flag checked before anything is read or written ------------------------------

TRAIN = ["--data", "sample", "--max-steps", "1"]


@pytest.mark.parametrize("flags,message", [
    (["--clip", "-1"], "--clip must be >= 0 (0 = off) (got -1.0)"),
    (["--grow-noise", "-1"], "--grow-noise must be >= 0"),
    (["--grow-rewarm", "1"], "--grow-rewarm must be in [0, 1)"),
    (["--checkpoint-steps", "-1"], "--checkpoint-steps must be >= 0"),
    (["--checkpoint-minutes", "0"], "--checkpoint-minutes must be > 0"),
    (["--grow", ""], "--grow must be a schedule, a preset name, auto, or none"),
    (["--mask-rate", "0"], "--mask-rate must be in (0, 1)"),
    (["--mask-rate", "1.5"], "--mask-rate must be in (0, 1)"),
    (["--eval-mask-rate", "1"], "--eval-mask-rate must be in (0, 1)"),
    (["--mask-rate-end", "0"], "--mask-rate-end must be in (0, 1)"),
    (["--lr", "nan"], "--lr must be positive"),
    (["--lr", "-1"], "--lr must be positive"),
    (["--eval-batches", "0"], "--eval-batches must be >= 1"),
    (["--log-every", "0"], "--log-every must be >= 1"),
    (["--max-bad-steps", "0"], "--max-bad-steps must be >= 1"),
    (["--weight-decay", "-0.1"], "--weight-decay must be >= 0"),
    (["--eps", "0"], "--eps must be > 0"),
    (["--neuron-beta2", "1"], "--neuron-beta2 must be in [0, 1) (0 = plain Muon)"),
    (["--ns-steps", "0"], "--ns-steps must be >= 1"),
    (["--betas", "0.9", "1.5"], "--betas must be two numbers in [0, 1)"),
    (["--d-model", "0"], "--d-model must be >= 1"),
    (["--minutes", "inf"], "--minutes must be positive"),
    (["--schedule", "square"], "invalid choice: 'square'"),
])
def test_train_flags_that_make_no_sense_are_one_line_errors(flags, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert message in refuse(train.main, TRAIN + flags + ["--out", str(out)], capsys)
    assert not out.exists()                                                # nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_train_device_cuda_without_a_gpu_is_a_one_line_error(tmp_path, capsys):
    argv = TRAIN + ["--device", "cuda", "--out", str(tmp_path / "run")]
    assert "--device cuda: no CUDA GPU visible" in refuse(train.main, argv, capsys)


@pytest.mark.parametrize("flags,message", [
    (["--model", "tiny", "--d-model", "63"], "--n-heads (4) must divide --d-model (63)"),
    (["--model", "tiny", "--n-heads", "5"], "--n-heads (5) must divide --d-model (64)"),
    (["--model", "tiny", "--grow", "0:layers=1; 0.5:layers=banana"], "--grow"),
    (["--model", "tiny", "--max-seq-len", "8", "--mask-rate", "0.05"],
     "--mask-rate 0.05 masks 0 of 8 tokens"),
    (["--model", "tiny", "--max-seq-len", "8", "--eval-mask-rate", "0.05"],
     "--eval-mask-rate 0.05 masks 0 of 8 tokens"),
    (["--model", "tiny", "--max-seq-len", "8", "--mask-rate-end", "0.05"],
     "--mask-rate-end 0.05 masks 0 of 8 tokens"),
])
def test_train_shapes_that_build_no_model_fail_before_data_is_prepared(flags, message, tmp_path,
                                                                        capsys):
    cache, out = tmp_path / "cache", tmp_path / "run"
    line = refuse(train.main, TRAIN + flags + ["--cache", str(cache), "--out", str(out)], capsys)
    assert message in line
    assert not out.exists() and not cache.exists()  # no tokenizer trained, no run folder


def test_train_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "taken").write_text("mine")
    assert "--out" in refuse(train.main, TRAIN + ["--out", str(tmp_path / "taken")], capsys)
    assert (tmp_path / "taken").read_text() == "mine"


def test_argparse_errors_show_the_short_usage_not_the_whole_help(capsys):
    line = refuse(train.main, ["--minutes", "two"], capsys)
    assert "argument --minutes: invalid float value: 'two'" in line


# --- data.py --------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,message", [
    (["--val-fraction", "0"], "--val-fraction must be in (0, 0.5]"),
    (["--val-fraction", "2"], "--val-fraction must be in (0, 0.5]"),
    (["--tokenizer-chars", "0"], "--tokenizer-chars must be >= 1"),
    (["--vocab-size", "10"], "--vocab-size must be >= 64"),
    (["--workers", "0"], "--workers must be >= 1"),
    (["--max-tokens-per-char", "0"], "--max-tokens-per-char must be > 0"),
    (["--normalize", "XYZ"], "--normalize must be NFC, NFD, NFKC, NFKD or none (got 'XYZ')"),
])
def test_data_settings_that_prepare_nothing_useful_are_refused(flags, message, tmp_path, capsys):
    cache = tmp_path / "cache"
    assert message in refuse(data.main, ["--data", "sample", "--out", str(cache), *flags], capsys)
    assert not cache.exists()


def damaged_tokenizer(folder):
    path = folder / "tok.json"
    path.write_text('{"format": "growcram-tokenizer", "version": 1, "ranks": ["!!"]')
    return path


@pytest.mark.parametrize("corpus,extra,message", [
    ("empty.jsonl", [], "empty.jsonl"),
    ("no_text.jsonl", [], "no_text.jsonl"),
    ("broken.jsonl", [], "broken.jsonl"),
    ("good.jsonl", ["--tokenizer", "TOK"], "tok.json"),
])
def test_a_failed_preparation_leaves_no_cache_folder_and_names_the_file(corpus, extra, message,
                                                                       tmp_path, capsys):
    files = {"empty.jsonl": "", "no_text.jsonl": json.dumps({"body": "words"}) + "\n",
             "broken.jsonl": '{"text": "one"}\n{"text": \n',
             "good.jsonl": small_corpus(tmp_path).read_text()}
    (tmp_path / corpus).write_text(files[corpus])
    extra = [str(damaged_tokenizer(tmp_path)) if e == "TOK" else e for e in extra]
    cache, out = tmp_path / "cache", tmp_path / "run"
    for main, argv in ((data.main, ["--out", str(cache)]),
                       (train.main, TRAIN[2:] + ["--cache", str(cache), "--out", str(out)])):
        line = refuse(main, ["--data", str(tmp_path / corpus), *extra, *argv], capsys)
        assert message in line
        assert not cache.exists() and not out.exists()  # not even an empty folder


def test_data_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "cache").write_text("")
    argv = ["--data", "sample", "--out", str(tmp_path / "cache")]
    assert "is a file" in refuse(data.main, argv, capsys)


def small_corpus(tmp_path):
    """60 short documents as JSONL (a .txt file would be one document)."""
    path = tmp_path / "c.jsonl"
    lines = (json.dumps({"text": f"document {i} says something about item {i % 7}."}) + "\n"
             for i in range(60))
    path.write_text("".join(lines))
    return path


def test_data_removes_temporary_folders_of_killed_preparations(tmp_path):
    corpus = small_corpus(tmp_path)
    cache = tmp_path / "cache"
    meta = data.prepare_data(str(corpus), str(cache), {"vocab_size": 320}, progress=False)
    dead = f"{meta['dir']}.999999999.tmp"       # no such process
    alive = f"{meta['dir']}.{os.getppid()}.tmp"  # a live process: still preparing
    for folder in (dead, alive):
        os.makedirs(folder)
    shutil.rmtree(meta["dir"])                  # force a new preparation
    data.prepare_data(str(corpus), str(cache), {"vocab_size": 320}, progress=False)
    assert not os.path.exists(dead) and os.path.exists(alive)


def test_a_damaged_shard_is_a_one_line_error_in_train(tmp_path, capsys):
    corpus = small_corpus(tmp_path)
    cache = tmp_path / "cache"
    meta = data.prepare_data(str(corpus), str(cache), {"vocab_size": 320}, progress=False)
    shard = meta["train"][0]
    with open(shard, "r+b") as f:
        f.write(b"JUNK")                                                   # bad magic
    argv = ["--data", str(corpus), "--cache", str(cache), "--vocab-size", "320", "--max-steps", "1",
            "--out", str(tmp_path / "run")]
    line = refuse(train.main, argv, capsys)
    assert shard in line
    assert not (tmp_path / "run").exists()


# --- evaluate_glue.py: no score from no data ------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    texts = [f"line {i} of the play, said the {i % 5} actor" for i in range(300)]
    return random_checkpoint(tmp_path_factory.mktemp("ckpt"), texts)


def task_file(path, rows, header=("sentence", "label")):
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(r) + "\n" for r in rows))
    return str(path)


def glue(checkpoint, tmp_path, *flags):
    return ["--checkpoint", checkpoint, "--seeds", "1", "--epochs", "1", "--no-progress",
            "--out", str(tmp_path / "out"), *flags]


def test_glue_header_only_training_file_is_refused(checkpoint, tmp_path, capsys):
    train_tsv = task_file(tmp_path / "t.tsv", [])
    dev = task_file(tmp_path / "d.tsv", [("a b", "x"), ("c d", "y")])
    argv = glue(checkpoint, tmp_path, "--task-file", train_tsv, "--task-dev-file", dev)
    line = refuse(evaluate_glue.main, argv, capsys)
    assert line == f"error: {train_tsv}: no usable rows"
    assert not (tmp_path / "out").exists()


def test_glue_all_malformed_rows_are_refused_and_counted(checkpoint, tmp_path, capsys):
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "train.tsv").write_text(
        "sentence\tlabel\nno tab here\ntoo\tmany\tfields\n")
    argv = glue(checkpoint, tmp_path, "--glue-dir", str(tmp_path), "--tasks", "sst2")
    line = refuse(evaluate_glue.main, argv, capsys)
    assert "SST-2/train.tsv: no usable rows (2 malformed row(s) skipped" in line


def test_glue_one_row_task_file_leaves_nothing_to_train_on(checkpoint, tmp_path, capsys):
    path = task_file(tmp_path / "one.tsv", [("a line", "x")])
    argv = glue(checkpoint, tmp_path, "--task-file", path)
    assert "at least 2 labels" in refuse(evaluate_glue.main, argv, capsys)
    path = task_file(tmp_path / "two.tsv", [("a line", "x"), ("b line", "y")])
    argv = glue(checkpoint, tmp_path, "--task-file", path)
    assert "leave no training rows" in refuse(evaluate_glue.main, argv, capsys)


def test_glue_nan_label_names_the_line(checkpoint, tmp_path, capsys):
    path = task_file(tmp_path / "r.tsv", [("a", "0.5"), ("b", "nan"), ("c", "1.5")])
    argv = glue(checkpoint, tmp_path, "--task-file", path, "--task-type", "regression")
    line = refuse(evaluate_glue.main, argv, capsys)
    assert f"{path}, line 3: unknown label 'nan'; expected a finite number" in line


def test_glue_invalid_utf8_names_the_file_and_line(checkpoint, tmp_path, capsys):
    path = tmp_path / "u.tsv"
    path.write_bytes(b"sentence\tlabel\nfine\tx\nbad \xff byte\ty\n")
    line = refuse(evaluate_glue.main, glue(checkpoint, tmp_path, "--task-file", str(path)), capsys)
    assert f"{path}, line 3: invalid UTF-8" in line


@pytest.mark.parametrize("flags,message", [
    (["--epochs", "-1"], "--epochs must be >= 1"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--max-len", "2"], "--max-len must be >= 8"),
    (["--lr", "nan"], "--lr must be a positive number"),
    (["--warmup", "1"], "--warmup must be in [0, 1)"),
    (["--max-train-examples", "0"], "--max-train-examples must be >= 1 or -1"),
])
def test_glue_protocol_flags_are_checked_before_anything_runs(flags, message, checkpoint, tmp_path,
                                                              capsys):
    assert message in refuse(evaluate_glue.main, glue(checkpoint, tmp_path, *flags), capsys)
    assert not (tmp_path / "out").exists()


def test_glue_accepts_hugging_face_task_names_in_any_case():
    names = ["cola", "SST2", "stsb", "Mnli", "qqp", "mrpc", "qnli", "rte", "wnli"]
    assert glue_tasks.check_tasks(names) == \
        ["CoLA", "SST-2", "STS-B", "MNLI", "QQP", "MRPC", "QNLI", "RTE", "WNLI"]
    with pytest.raises(ValueError, match="unknown task"):
        glue_tasks.check_tasks(["sst3"])


def test_correlations_are_undefined_on_nan_or_constant_input():
    assert np.isnan(glue_tasks.pearson([1.0, np.nan, 3.0], [1.0, 2.0, 3.0]))
    assert np.isnan(glue_tasks.spearman([1.0, np.nan, 3.0], [1.0, 2.0, 3.0]))
    assert np.isnan(glue_tasks.pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]))
    assert np.isnan(glue_tasks.pearson([1.0], [1.0]))
    assert np.isnan(glue_tasks.accuracy([], []))


def test_glue_refuses_to_score_nan_predictions(checkpoint, tmp_path, monkeypatch, capsys):
    rows = [(f"line {i} of the play", str(i % 2)) for i in range(20)]
    path = task_file(tmp_path / "t.tsv", rows)
    real = model.Transformer.classify
    monkeypatch.setattr(model.Transformer, "classify", lambda self, *a, **k: {
        **real(self, *a, **k),
        **({} if self.training else {"logits": torch.full((a[0].shape[0], 2), float("nan"))})})
    line = refuse(evaluate_glue.main, glue(checkpoint, tmp_path, "--task-file", path), capsys)
    assert "non-finite predictions" in line and not (tmp_path / "out").exists()


# --- grow.py, scaling.py, model.py ----------------------------------------------------------------

def test_grow_cli_names_an_unknown_preset_in_one_line(capsys):
    assert "unknown model preset 'huge'" in refuse(grow.main, ["compound", "huge"], capsys)


@pytest.mark.parametrize("argv,message", [
    (["plan", "--hours", "-1", "--gpu", "H100"], "--hours must be a positive number"),
    (["plan", "--hours", "1", "--gpu", "H100", "--mfu", "1.5"], "--mfu must be in (0, 1]"),
    (["sweep", "--hours", "1", "--gpu", "H100", "--sizes", "1"], "--sizes must be >= 2"),
])
def test_scaling_numbers_that_plan_nothing_are_refused(argv, message, capsys):
    assert message in refuse(scaling.main, argv, capsys)


def test_a_truncated_model_file_is_a_one_line_error(checkpoint, tmp_path, capsys):
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    weights = folder / "model.pt"
    weights.write_bytes(weights.read_bytes()[:100])
    line = refuse(model.main, [str(folder), "a [MASK]"], capsys)
    assert f"{weights}: not loadable" in line
    line = refuse(evaluate_glue.main, glue(str(folder), tmp_path, "--tasks", "RTE"), capsys)
    assert f"{weights}: not loadable" in line
