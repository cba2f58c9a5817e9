"""Specification of bench/bench_model.py, the throughput and MFU benchmark: python -m pytest -q tests/test_bench.py

The numbers it prints depend on the machine; what is checked here is that it runs, times the same work for both
models, and turns a throughput into MFU with model.py's FLOP count.
"""
import importlib.util
import json
import os
import sys

import pytest
import torch

import model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def bench_model():
    spec = importlib.util.spec_from_file_location("bench_model", os.path.join(ROOT, "bench", "bench_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_bench(bench_model, monkeypatch, tmp_path, *flags):
    out = tmp_path / "result.json"
    monkeypatch.setattr(sys, "argv", ["bench_model.py", "--preset", "tiny", "--batch-size", "2", "--steps", "2",
                                      "--out", str(out), *flags])
    bench_model.main()
    return json.loads(out.read_text())


def test_batch_masks_the_same_positions_for_the_sparse_and_the_dense_loss(bench_model):
    cfg = model.make_config("tiny")
    b = bench_model.make_batch(cfg, batch_size=3, device="cpu")
    k = round(cfg["mask_rate"] * cfg["max_seq_len"])
    assert b["positions"].shape == b["labels"].shape == (3, k)
    assert ((b["dense"] != -100).sum(1) == k).all()                          # k distinct masked slots per row
    assert torch.equal(b["dense"].gather(1, b["positions"]), b["labels"])
    assert (b["ids"].gather(1, b["positions"]) == 4).all()                   # the [MASK] id at every target


def test_our_model_alone_reports_throughput_and_mfu_against_the_gpu_peak(bench_model, monkeypatch, tmp_path):
    monkeypatch.setattr(bench_model, "gpu_peak_flops", lambda device: 1e12)  # pretend a 1 TFLOP/s accelerator
    result = run_bench(bench_model, monkeypatch, tmp_path, "--skip-hf")
    cfg = model.make_config("tiny")
    assert result["params_ours"] == model.count_params(cfg) and result["tokens_per_s_ours"] > 0
    assert "speedup" not in result
    assert result["mfu_ours"] == pytest.approx(result["tokens_per_s_ours"] * model.flops_per_token(cfg) / 1e12,
                                               abs=1e-3)


def test_no_mfu_without_a_known_gpu_peak(bench_model, monkeypatch, tmp_path):
    assert "mfu_ours" not in run_bench(bench_model, monkeypatch, tmp_path, "--skip-hf")  # the CPU has no table entry


def test_comparison_with_hugging_face_bert_prints_the_ratio(bench_model, monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    result = run_bench(bench_model, monkeypatch, tmp_path)
    assert result["speedup"] == pytest.approx(result["tokens_per_s_ours"] / result["tokens_per_s_hf"], rel=1e-2)
    assert result["params_hf"] > result["params_ours"]                       # post-LN BERT: biases, dense MLM head


def test_compiled_model_runs(bench_model, monkeypatch, tmp_path):
    assert run_bench(bench_model, monkeypatch, tmp_path, "--skip-hf", "--compile")["tokens_per_s_ours"] > 0
