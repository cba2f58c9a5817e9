"""Specification of train.py: python -m pytest -q tests/test_train.py

Every run uses the bundled Shakespeare sample with a 512-token BPE, prepared once per session
(conftest's sample_cache), and the tiny preset.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import types

import pytest
import torch

import budget
import checkpoint
import flags
import grow
import held_out
import model
import parallel
import planning
import train
from conftest import CRAMMING_ADAMW, ROOT, read_log

TINY = ["--data", "sample", "--vocab-size", "512", "--model", "tiny", "--max-seq-len", "32",
        "--micro-batch", "4", "--batch-tokens", "256", "--lr", "1e-3", "--eval-batches", "2",
        "--log-every", "1", "--dtype", "fp32"]
# fp32 is pinned because --dtype auto picks bf16 on a CPU with bf16 instructions, and the tests
# must compute the same on every CPU. The bf16 path has tests of its own.


def run(cache, out, *flags):
    return train.main(TINY + ["--cache", cache, "--out", str(out), *flags])


def weights(folder):
    return torch.load(os.path.join(folder, "model.pt"), weights_only=True)


def spawn(cache, out, *flags, launcher=()):
    command = [sys.executable, *launcher, os.path.join(ROOT, "train.py"), *TINY,
               "--cache", cache, "--out", str(out), *flags]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def killed_at_its_first_checkpoint(cache, out, *flags):
    """Start train.py and kill -9 it as soon as its first checkpoint.pt is in out."""
    proc = spawn(cache, out, *flags)
    while not (out / "checkpoint.pt").exists() and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"


# --- schedules --------------------------------------------------------------------------

def test_triangle_rises_from_a_quarter_to_the_peak_at_75_percent_then_falls_to_zero():
    values = [train.lr_multiplier(p, "triangle") for p in (0.0, 0.25, 0.5, 0.75, 0.875, 1.0)]
    assert values == pytest.approx([0.25, 0.5, 0.75, 1.0, 0.5, 0.0])


def test_one_cycle_peaks_at_half_the_budget():
    values = [train.lr_multiplier(p, "one-cycle") for p in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert values == pytest.approx([0, 0.5, 1, 0.5, 0])


def test_linear_and_cosine_warm_up_then_decay_to_zero():
    for shape in ("linear", "cosine"):
        assert train.lr_multiplier(0.05, shape, warmup=0.1) == pytest.approx(0.5)
        assert train.lr_multiplier(0.1, shape, warmup=0.1) == pytest.approx(1.0)
        assert train.lr_multiplier(1.0, shape, warmup=0.1) == pytest.approx(0.0)
    assert train.lr_multiplier(0.55, "linear", warmup=0.1) == pytest.approx(0.5)
    assert train.lr_multiplier(0.55, "cosine", warmup=0.1) == pytest.approx(0.5)


def test_wsd_and_trapezoid_hold_the_peak_then_decay_to_zero_over_the_last_fraction():
    for shape in ("wsd", "trapezoid"):
        f = lambda p: train.lr_multiplier(p, shape, warmup=0.1, decay=0.2)  # noqa: E731
        assert f(0.05) == pytest.approx(0.5) and f(0.1) == f(0.5) == f(0.8) == 1.0
        assert f(1.0) == pytest.approx(0.0) and f(1.1) == pytest.approx(0.0)
    assert train.lr_multiplier(0.85, "wsd", warmup=0.1, decay=0.2) == pytest.approx(0.5)  # 1-sqrt
    assert train.lr_multiplier(0.9, "trapezoid", warmup=0.1, decay=0.2) == pytest.approx(0.5)
    assert train.lr_multiplier(0.75, "trapezoid", warmup=0.0, decay=0.5) == pytest.approx(0.5)


def test_batch_ramp_reaches_the_target_at_60_percent():
    steps = [train.accumulation_steps(p, 8, ramp=0.6) for p in (0.0, 0.1, 0.3, 0.59, 0.6, 0.9)]
    assert steps == [1, 2, 5, 8, 8, 8]
    assert train.accumulation_steps(0.0, 8, ramp=0.0) == 8


# --- defaults chosen from the device and the budget ------------------------------------

def chosen(argv, flops_per_s, on_gpu):
    """The defaults choose_defaults picks when the device trains every model at flops_per_s (a
    number), or at flops_per_s(cfg) (a function of the model config)."""
    args = flags.parse_args(["--data", "sample", *argv])
    speed = flops_per_s if callable(flops_per_s) else lambda cfg: flops_per_s
    return planning.choose_defaults(args, speed, 1, "cuda" if on_gpu else "cpu")[0]


def cpu_speeds(cfg):
    """FLOP/s by model width as planning.cpu_step_flops measured them on 2 AVX512-BF16 cores
    (bf16, docs/train.md): a small model's step keeps a smaller share of the matmul speed."""
    return {64: 1.5e11, 128: 3.3e11, 256: 5.0e11, 512: 6.0e11, 768: 6.4e11}[cfg["d_model"]]


def test_two_cpu_minutes_get_the_tiny_model_and_thousands_of_small_steps():
    picks = chosen(["--minutes", "2"], flops_per_s=4e10, on_gpu=False)
    assert picks == {"model": "tiny", "vocab_size": 512, "max_seq_len": 64, "batch_tokens": 2048,
                     "micro_batch": 32, "grow": "depth", "value_residual": "on", "ema": 0.99,
                     "lr": 0.048,  # Muon: 4 x AdamW's 0.012
                     "compile": False}  # a CPU runs eager unless asked


def test_ten_minutes_of_a_cpu_with_bf16_matmuls_get_the_speedruns_shape():
    picks = chosen(["--minutes", "10"], flops_per_s=cpu_speeds, on_gpu=False)
    assert (picks["model"], picks["vocab_size"], picks["max_seq_len"]) == ("micro", 4096, 128)
    micro = model.make_config("micro")
    assert (micro["n_layers"], micro["d_model"]) == (4, 128)
    assert chosen(["--minutes", "2"], flops_per_s=cpu_speeds, on_gpu=False)["model"] == "tiny"


def test_a_cpu_budget_gets_larger_models_as_it_grows():
    """Each preset is planned at its own measured speed: an hour buys mini and a day small, where
    one speed for all (tiny's) would plan them a preset smaller."""
    names = [chosen(["--minutes", str(m)], flops_per_s=cpu_speeds, on_gpu=False)["model"]
             for m in (2, 10, 90, 240, 1440)]
    assert names == ["tiny", "micro", "mini", "mini", "small"]
    assert chosen(["--minutes", "90"], flops_per_s=1.5e11, on_gpu=False)["model"] == "micro"


def test_the_batch_is_planned_at_the_chosen_models_own_speed():
    # mini at 500 GFLOP/s for 90 minutes: ~2000 steps of what that speed buys
    picks = chosen(["--minutes", "90"], flops_per_s=cpu_speeds, on_gpu=False)
    cfg = model.make_config("mini", vocab_size=picks["vocab_size"], mask_rate=0.4)
    tokens = 90 * 60 * 5.0e11 / model.flops_per_token(cfg)
    assert 2000 <= tokens / picks["batch_tokens"] < 4000


def test_a_cpu_plans_with_its_own_measured_step_of_the_model(monkeypatch):
    timed = []
    monkeypatch.setattr(planning, "cpu_step_flops",
                        lambda cfg, dtype: timed.append((cfg["d_model"], dtype)) or 1e12)
    cfg = model.make_config("micro")
    assert planning.sustained_flops(cfg, torch.device("cpu"), torch.bfloat16) == 1e12
    assert timed == [(128, torch.bfloat16)]  # the model itself, in the run's autocast dtype
    monkeypatch.undo()
    start = time.perf_counter()
    # at one micro-batch of 32 sequences for both (a run's own micro-batch, the default, gives tiny
    # 128 sequences and micro 64, which evens out their speeds)
    tiny = planning.cpu_step_flops(model.make_config("tiny"), torch.float32, rows=32)
    micro = planning.cpu_step_flops(model.make_config("micro"), torch.float32, rows=32)
    assert time.perf_counter() - start < 5  # FLOP/s of a real forward and backward, in ~0.2 s
    assert 1e8 < tiny < micro < 1e15  # the wider model keeps more of the machine busy


def test_only_a_wall_clock_budget_measures_the_cpu(sample_cache, tmp_path, monkeypatch):
    timed = []
    monkeypatch.setattr(planning, "cpu_step_flops",
                        lambda cfg, dtype: timed.append(dtype) or 1e11)
    run(sample_cache, tmp_path / "steps", "--max-steps", "1")
    assert timed == []  # a step budget plans nothing from the machine's speed
    run(sample_cache, tmp_path / "clock", "--minutes", "0.01")
    assert timed == [torch.float32]  # TINY's --dtype fp32, and its one model timed once


def test_every_rank_plans_with_the_slowest_ranks_speed():
    """Each rank measures its own CPU; two ranks that measured 2 and 3 TFLOP/s both plan with 2,
    or they would build different models."""
    code = ("import torch, torch.distributed as dist, parallel\n"
            "dist.init_process_group('gloo')\n"
            "print(parallel.slowest_over_ranks(2e12 + 1e12 * dist.get_rank(), "
            "torch.device('cpu'), 2))\n"
            "dist.destroy_process_group()\n")
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, text=True,
                              env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE)
             for rank in range(2)]
    assert [float(p.communicate(timeout=120)[0]) for p in procs] == [2e12, 2e12]
    assert parallel.slowest_over_ranks(3e12, torch.device("cpu"), 1) == 3e12


def test_a_gpu_day_gets_crammings_base_model_and_batch():
    picks = chosen(["--hours", "24"], flops_per_s=0.4 * 989e12, on_gpu=True)
    assert picks == {"model": "base", "vocab_size": 32768, "max_seq_len": 128,
                     "batch_tokens": 8192 * 128, "micro_batch": 128, "grow": "depth",
                     "value_residual": "on", "ema": 0.99, "lr": 4e-3,  # Muon's
                     "compile": True}


def test_the_chosen_model_grows_with_the_budget():
    names = [chosen(["--hours", str(h)], flops_per_s=0.4 * 989e12, on_gpu=True)["model"]
             for h in (0.002, 0.05, 24)]
    assert names == ["mini", "small", "base"]


def test_a_token_budget_sizes_the_batch_for_about_2000_steps():
    picks = chosen(["--max-tokens", "8e6"], flops_per_s=2e10, on_gpu=False)
    assert picks["batch_tokens"] == 2048 and 2000 <= 8e6 / picks["batch_tokens"] < 4000


def test_flags_given_always_win_over_the_chosen_defaults():
    argv = ["--minutes", "2", "--model", "mini", "--batch-tokens", "4096", "--max-seq-len", "32"]
    picks = chosen(argv, flops_per_s=2e10, on_gpu=False)
    assert picks == {"vocab_size": 8192, "micro_batch": 128,  # the whole batch of 4096
                     "grow": "depth", "ema": 0.99, "value_residual": "on",
                     "lr": 0.012,  # Muon: 4 x 0.003
                     "compile": False}


def test_a_cpu_micro_batch_holds_about_8192_tokens_and_never_more_than_the_batch():
    def micro(*argv):
        return chosen(["--max-steps", "10", *argv], flops_per_s=2e10, on_gpu=False)["micro_batch"]
    assert micro("--model", "tiny", "--batch-tokens", "16384") == 128  # 128 x 64 tokens
    assert micro("--model", "micro", "--batch-tokens", "16384") == 64  # 64 x 128 tokens
    assert micro("--model", "micro", "--batch-tokens", "2048") == 16  # the whole batch
    assert micro("--model", "tiny", "--max-seq-len", "32", "--batch-tokens", "65536") == 128
    assert micro("--model", "micro", "--max-seq-len", "512", "--batch-tokens", "65536") == 16


def test_torch_compile_is_chosen_for_time_budgets_that_pay_for_it(monkeypatch):
    def compiles(device_type, *argv):
        args = flags.parse_args(["--data", "sample", *argv])
        return planning.choose_defaults(args, lambda cfg: 2e10, 1, device_type)[0].get("compile")
    monkeypatch.setattr(planning, "cpp_compiler_found", lambda: True)
    assert compiles("cuda", "--minutes", "10") is True    # planning.COMPILE_FROM_SECONDS
    assert compiles("cpu", "--minutes", "10") is True
    assert compiles("cuda", "--minutes", "9") is False    # the compile would eat too much of it
    assert compiles("cpu", "--minutes", "2") is False     # the quick start stays eager
    assert compiles("cuda", "--max-tokens", "1e9") is False  # no clock to weigh it against
    assert compiles("mps", "--hours", "24") is False      # never measured
    assert compiles("cpu", "--minutes", "2", "--compile") is None     # given: wins
    assert compiles("cuda", "--hours", "24", "--no-compile") is None
    monkeypatch.setattr(planning, "cpp_compiler_found", lambda: False)
    assert compiles("cpu", "--hours", "24") is False      # inductor could not build its kernels
    assert "compile off" in planning.why_chosen({"compile": False}, "a step budget", None, None)


def test_a_cpp_compiler_is_looked_for_on_the_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert not planning.cpp_compiler_found()
    (tmp_path / "clang++").write_text("#!/bin/sh\n")
    (tmp_path / "clang++").chmod(0o755)
    assert planning.cpp_compiler_found()


def test_the_value_residual_is_chosen_for_the_crammed_family_only():
    def picked(*argv):
        return chosen(["--minutes", "2", *argv], flops_per_s=2e10, on_gpu=False)
    assert picked()["value_residual"] == "on"
    assert picked("--arch", "modernbert")["value_residual"] == "off"  # stays ModernBERT exactly
    assert "value_residual" not in picked("--value-residual", "off")  # given: wins
    # A run saved before the flag existed resumes without it, as it ran.
    assert flags.BEFORE_THE_FLAG["value_residual"] == "off"


def test_depth_growth_is_chosen_unless_the_run_cannot_grow():
    def picked(*argv):
        return chosen(["--minutes", "2", *argv], flops_per_s=2e10, on_gpu=False)["grow"]
    assert picked() == "depth"
    assert picked("--n-layers", "1") == "none"                  # nothing to halve
    assert picked("--shard", "fsdp") == "none"                  # the operators need whole tensors
    assert picked("--arch", "modernbert") == "none"             # its first block has no growth rule
    assert "grow" not in chosen(["--minutes", "2", "--grow", "none"], 2e10, False)  # given: wins
    stages = grow.parse_schedule("depth", model.make_config("mini"))
    assert [(s["at"], s["config"]["n_layers"]) for s in stages] == [(0.0, 1), (0.07, 2),
                                                                     (0.15, 4)]


def test_a_default_run_grows_at_15_percent_and_older_runs_resume_as_they_grew(
        sample_cache, tmp_path):
    out = tmp_path / "grown"
    run(sample_cache, out, "--max-steps", "10", "--optimizer", "muon")
    grows = [r for r in read_log(out) if r["kind"] == "grow"]
    assert [(g["step"], g["from"].split()[0], g["to"].split()[0]) for g in grows] == [
        (2, "n_layers=1", "n_layers=2")]
    # args.json saves the fractions, so a later change of the preset cannot move a resumed run's
    # growth
    assert json.loads((out / "args.json").read_text())["grow"] == "depth@0.07,0.15"
    # An args.json written before depth growth became the default saved "grow": null, which
    # meant no growth; resuming it must not start growing.
    old = tmp_path / "old"
    run(sample_cache, old, "--max-steps", "4", "--grow", "none", "--checkpoint-steps", "2")
    saved = json.loads((old / "args.json").read_text())
    (old / "args.json").write_text(json.dumps({**saved, "grow": None}))
    run(sample_cache, old, "--max-steps", "8", "--resume")
    assert not [r for r in read_log(old) if r["kind"] == "grow"]
    # One written before record 6 saved "depth", which grew at 30%: resumed at step 2 of 10 (20%),
    # it grows at step 3, not at once.
    older = tmp_path / "older"
    run(sample_cache, older, "--max-steps", "2", "--optimizer", "muon", "--checkpoint-steps", "1",
        "--grow", "0:n_layers=1; 0.9:n_layers=2")  # one layer, as depth's first stage
    saved = json.loads((older / "args.json").read_text())
    (older / "args.json").write_text(json.dumps({**saved, "grow": "depth"}))
    run(sample_cache, older, "--max-steps", "10", "--resume")
    assert [g["step"] for g in read_log(older) if g["kind"] == "grow"] == [3]


def test_a_run_without_flags_prints_its_choice_and_saves_it_for_resume(sample_cache, tmp_path,
                                                                       capsys):
    train.main(["--data", "sample", "--cache", sample_cache, "--vocab-size", "512",
                "--max-steps", "3", "--eval-batches", "1", "--out", str(tmp_path)])
    assert "defaults: chose model tiny" in capsys.readouterr().out
    with open(tmp_path / "args.json") as f:
        saved = json.load(f)
    picked = (saved["model"], saved["max_seq_len"], saved["micro_batch"])
    assert picked == ("tiny", 64, 16)   # a step budget


def test_the_held_out_loss_masks_25_percent_whatever_the_training_rate(sample_cache, tmp_path):
    """Before any step, a model trained at 40% (the default) and one trained at 25% see the same
    held-out batches, masked at --eval-mask-rate's 25%: the same untrained loss. Scored at its
    own 40%, it differs."""
    def first_eval(name, *flags):
        summary = run(sample_cache, tmp_path / name, "--max-steps", "2", *flags)
        return read_log(tmp_path / name)[0]["val_loss"], summary["comparable"]["mask_rate"]

    at_25 = first_eval("a", "--mask-rate", "0.25")
    assert at_25[1] == 0.25 and first_eval("b") == at_25
    own_rate, comparable = first_eval("c", "--eval-mask-rate", "0.4")
    assert comparable == 0.4 and own_rate != at_25[0]


def test_a_falling_masking_rate_goes_linearly_from_start_to_end_and_resumes_exactly(
        sample_cache, tmp_path):
    """--mask-rate-end (Ankner et al. 2023): the rate falls linearly with progress. The first step
    is the constant rate's; the run differs after; killed mid-run and resumed, it ends with the
    same weights as a run never stopped (the rate is a function of progress alone)."""
    falling = flags.parse_args(["--max-steps", "1", "--mask-rate", "0.5",
                                "--mask-rate-end", "0.25"])
    assert [train.masking_rate(falling, p) for p in (0.0, 0.5, 1.0)] == [0.5, 0.375, 0.25]
    assert train.masking_rate(flags.parse_args(["--max-steps", "1"]), 0.9) == 0.4  # constant
    steps = ["--max-steps", "24", "--checkpoint-steps", "4", "--grow", "none", "--mask-rate", "0.5"]
    run(sample_cache, tmp_path / "constant", *steps)
    run(sample_cache, tmp_path / "straight", *steps, "--mask-rate-end", "0.25")
    first = [[r["loss"] for r in read_log(tmp_path / name) if r["kind"] == "train"]
             for name in ("constant", "straight")]
    assert first[0][0] == first[1][0] and first[0][-1] != first[1][-1]
    killed = tmp_path / "killed"
    command = [sys.executable, os.path.join(ROOT, "tests", "kill_at.py"), "step", "14", *TINY,
               "--cache", sample_cache, "--out", str(killed), *steps, "--mask-rate-end", "0.25"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-500:]
    run(sample_cache, killed, "--resume")
    a, b = weights(tmp_path / "straight" / "final"), weights(killed / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_progress_line_shows_what_is_left_of_every_kind_of_budget():
    clock = budget.Budget(flags.parse_args(["--minutes", "2", "--max-tokens", "10000"]))
    assert clock.left(step=5, tokens=9000, elapsed=30.0) == "1,000 tokens"
    assert clock.left(step=5, tokens=100, elapsed=90.0) == "0.5 min"
    assert budget.Budget(flags.parse_args(["--max-steps", "40"])).left(10, 0, 0.0) == "30 steps"


# --- end to end -------------------------------------------------------------------------

def test_end_to_end_run_learns_and_writes_every_output(sample_cache, tmp_path):
    summary = run(sample_cache, tmp_path, "--max-steps", "60", "--lr", "3e-3", *CRAMMING_ADAMW)
    evals = [r["val_loss"] for r in read_log(tmp_path) if r["kind"] == "eval"]
    # The first record evaluates the untrained model, off the clock.
    assert read_log(tmp_path)[0] == {"kind": "eval", "step": 0, "tokens": 0, "flops": 0.0,
                                     "elapsed": 0.0, "progress": 0.0, "val_loss": evals[0]}
    assert len(evals) >= 10 and evals[-1] < evals[0] - 0.5      # held-out loss falls by > 0.5 nats
    assert summary["steps"] == 60 and summary["final_val_loss"] == evals[-1]
    assert json.load(open(tmp_path / "summary.json"))["steps"] == 60
    comparable = summary["comparable"]
    assert comparable == {"data": comparable["data"], "vocab_size": 512, "objective": "mlm",
                          "seq_len": 32, "mask_rate": 0.25}
    assert comparable["data"].startswith("sample-")
    net = model.load_model(tmp_path / "final")
    assert net.config["n_layers"] == 2 and net.config["vocab_size"] == 512
    import tokenizer
    enc = tokenizer.load_tokenizer(str(tmp_path / "final" / "tokenizer.json"))
    assert enc.decode(enc.encode_ordinary("To be, or not to be")) == "To be, or not to be"
    # final/ carries the run's flags, so it says how it was trained wherever it is copied
    assert json.load(open(tmp_path / "final" / "args.json")) == json.load(
        open(tmp_path / "args.json"))
    assert json.load(open(tmp_path / "final" / "args.json"))["optimizer"] == "adamw"


def test_auto_dtype_is_bf16_on_a_gpu_or_a_cpu_with_bf16_instructions(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(parallel, "cpu_has_fast_bf16", lambda: True)
    assert parallel.autocast_dtype("auto", cpu) == torch.bfloat16
    assert parallel.autocast_dtype("fp32", cpu) == torch.float32          # the flag wins
    monkeypatch.setattr(parallel, "cpu_has_fast_bf16", lambda: False)
    assert parallel.autocast_dtype("auto", cpu) == torch.float32
    assert parallel.autocast_dtype("bf16", cpu) == torch.bfloat16
    assert parallel.autocast_dtype("auto", torch.device("mps")) == torch.float32


def test_fast_bf16_is_read_from_the_cpu_flags():
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo to compare with")
    flags = open("/proc/cpuinfo").read().split()
    assert parallel.cpu_has_fast_bf16() == ("avx512_bf16" in flags or "amx_tile" in flags)


WHERE_A_LARGE_BLOCK_LIVES = """
import ctypes, sys, torch, parallel
if sys.argv[1] == "keep":
    assert parallel.keep_freed_memory()
sbrk = ctypes.CDLL(None).sbrk
sbrk.restype = ctypes.c_void_p
block = torch.ones(16 * 2**20)       # 64 MB, as a step's logits are
print("heap" if block.data_ptr() < sbrk(0) else "mapping")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_on_a_cpu_large_blocks_come_from_the_heap_that_keeps_freed_memory(monkeypatch):
    """parallel.keep_freed_memory (setup_device calls it on a CPU): a 64 MB block comes from the
    heap below the program break, which freeing does not hand back, where glibc's defaults give it
    a mapping of its own that free unmaps (and the next step faults in again)."""
    def where(mode):
        done = subprocess.run([sys.executable, "-c", WHERE_A_LARGE_BLOCK_LIVES, mode], cwd=ROOT,
                              capture_output=True, text=True, check=True)
        return done.stdout.strip()
    assert where("keep") == "heap"
    assert where("default") == "mapping"
    calls = []                          # and train.py gets it through setup_device
    monkeypatch.setattr(parallel, "keep_freed_memory", lambda: calls.append("kept"))
    assert parallel.setup_device("cpu") == (torch.device("cpu"), 0, 1)
    assert calls == ["kept"]


def masked_lm_loss_and_grads(net, dtype=None):
    """The masked-LM loss of one fixed batch of 4 x 32 tokens, 8 masked per row (every 4th), and
    every parameter's gradient; under CPU autocast to dtype when one is given."""
    ids = torch.randint(5, 512, (4, 32), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(0, 32, 4).repeat(4, 1)                           # (4, 8)
    net.zero_grad()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        loss = net(ids, labels=ids.gather(1, positions), label_positions=positions)["loss"]
    loss.backward()
    return loss.item(), [p.grad.clone() for p in net.parameters()]


def test_compile_compiles_each_block_in_place_and_growth_compiles_nothing_new():
    """--compile (parallel.compile_blocks): the state dict keeps the plain model's names, the loss
    and gradients are eager's, and the blocks of a model stacked from 2 to 4 layers reuse the
    graphs already compiled."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()           # graphs counted from here
    cfg = model.make_config("tiny", n_layers=2, vocab_size=512, value_residual=True)
    net = model.build_model(cfg)
    eager_loss, eager_grads = masked_lm_loss_and_grads(net)
    names = list(net.state_dict())
    parallel.compile_blocks(net)
    compiled_loss, compiled_grads = masked_lm_loss_and_grads(net)
    assert list(net.state_dict()) == names
    assert abs(compiled_loss - eager_loss) < 1e-5
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(compiled_grads, eager_grads))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs == 2                       # one for every block (the first too), one for the head
    grown, _ = grow.grow_model(net, {**cfg, "n_layers": 4})
    parallel.compile_blocks(grown)
    masked_lm_loss_and_grads(grown)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_compile_puts_the_head_and_loss_in_a_region_of_their_own_with_eager_losses_in_bf16():
    """compile_blocks compiles the final norm, projection and loss too (model.head_and_loss), where
    inductor fuses the plain loss; in bf16 on a CPU eager runs model.py's FusedCrossEntropy
    instead, and the two agree on the loss and the gradients to bf16's rounding."""
    torch._dynamo.reset()
    net = model.build_model(model.make_config("tiny", n_layers=2, vocab_size=512))
    fused = []
    real_apply = model.FusedCrossEntropy.apply

    def counted_apply(*tensors):
        fused.append(1)
        return real_apply(*tensors)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model.FusedCrossEntropy, "apply", counted_apply)
        eager_loss, eager_grads = masked_lm_loss_and_grads(net, torch.bfloat16)
        assert fused == [1]                                  # eager bf16 on a CPU: the fused loss
        parallel.compile_blocks(net)
        compiled_loss, compiled_grads = masked_lm_loss_and_grads(net, torch.bfloat16)
        assert fused == [1]                                  # compiled: the plain loss, fused
    assert compiled_loss == pytest.approx(eager_loss, abs=2e-2)
    for a, b in zip(compiled_grads, eager_grads):
        assert (a - b).norm() <= 0.05 * b.norm() + 1e-6


def test_the_sample_line_runs_eager_under_compile_and_compiles_nothing(enc):
    """The sample printed at every evaluation (held_out.samples) runs eager: under --compile its
    one short sequence, outside autocast, would compile every block and the head once more, on the
    clock of the run's first evaluation."""
    torch._dynamo.reset()
    net = model.build_model(model.make_config("tiny", n_layers=2, vocab_size=512,
                                              value_residual=True))   # enc's ids lie below 512
    args = flags.parse_args(["--max-steps", "1"])
    eager_line = held_out.samples(net, enc, args, rank=0)
    parallel.compile_blocks(net)
    masked_lm_loss_and_grads(net, torch.bfloat16)              # the training graphs, as a step
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs >= 3                                         # two blocks' and the head's
    assert held_out.samples(net, enc, args, rank=0) == eager_line
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_bf16_autocast_and_torch_compile_train_like_fp32(sample_cache, tmp_path):
    """The GPU recipe (bf16 autocast, torch.compile), run on the CPU with the same data and the
    same seed, reaches the same final loss."""
    # 25% masking: in 30 steps of 256 tokens the 40% default has not yet left log 512 by 0.2 nats;
    # the trained weights themselves (--ema 0): in 30 steps an average lags them
    flags = ("--max-steps", "30", "--lr", "3e-3", "--mask-rate", "0.25", "--ema", "0")
    fp32 = run(sample_cache, tmp_path / "fp32", *flags, "--dtype", "fp32")
    bf16 = run(sample_cache, tmp_path / "bf16", *flags, "--dtype", "bf16")
    compiled = run(sample_cache, tmp_path / "compiled", *flags, "--dtype", "bf16", "--compile")
    assert (fp32["dtype"], bf16["dtype"], compiled["dtype"]) == ("float32", "bfloat16", "bfloat16")
    assert fp32["final_val_loss"] < 6.0  # it learned (log 512 = 6.24 at the start)
    assert abs(bf16["final_val_loss"] - fp32["final_val_loss"]) < 0.02
    assert abs(compiled["final_val_loss"] - fp32["final_val_loss"]) < 0.02


def test_log_records_lr_and_batch_ramp(sample_cache, tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "20", "--batch-ramp", "0.5", "--schedule",
        "triangle")
    steps = [r for r in read_log(tmp_path) if r["kind"] == "train"]
    assert [r["step"] for r in steps] == list(range(1, 21))
    assert steps[0]["batch_tokens"] == 128 and steps[-1]["batch_tokens"] == 256
    assert steps[0]["lr"] == pytest.approx(1e-3 * 0.25)
    assert steps[-1]["lr"] == pytest.approx(1e-3 * 4 * (1 - 19 / 20))


def test_the_step_cut_at_the_deadline_is_the_last_even_if_the_clock_stops_just_short():
    # The clock starts 0.1 s before the deadline.
    clock = budget.Budget(flags.parse_args(["--minutes", "1"]), elapsed=59.9)
    state = train.RunState()
    assert clock.progress(0, 0, clock.elapsed()) < 1.0
    # One more micro-batch of 0.5 s would end 0.4 s late, so no new step starts.
    assert budget.ends_past_deadline(clock, state, None, 1, micro_seconds=0.5)
    assert clock.progress(0, 0, clock.elapsed()) == 1.0


def test_a_micro_batch_that_ends_before_the_deadline_is_not_the_last():
    clock = budget.Budget(flags.parse_args(["--minutes", "1"]), elapsed=50.0)
    assert not budget.ends_past_deadline(clock, train.RunState(), None, 1, micro_seconds=0.5)
    assert clock.progress(0, 0, clock.elapsed()) < 1.0


def test_wall_clock_budget_stops_within_one_step(sample_cache, tmp_path):
    # --minutes 0.05 is a 3-second budget.
    summary = run(sample_cache, tmp_path, "--minutes", "0.05", "--eval-every", "0.5")
    steps = [r for r in read_log(tmp_path) if r["kind"] == "train"]
    step_time = max(b["elapsed"] - a["elapsed"] for a, b in zip(steps, steps[1:]))
    assert 3.0 <= summary["elapsed_s"] <= 3.0 + step_time + 0.5
    assert steps[-1]["progress"] < 1.0 and summary["status"] == "budget spent"


def test_a_step_begun_just_before_the_deadline_is_logged_before_it():
    """A step that began 4 µs before the deadline (p = 0.999996) is logged as 0.99999: rounded to
    the nearest, it read 1.0, as if it had begun after the budget was spent."""
    records = []
    state = types.SimpleNamespace(step=7, tokens=896, flops=1e9)
    clock = types.SimpleNamespace(seconds=3.0, elapsed=lambda: 2.999988, left=lambda *_: "0.0 min")
    hw = types.SimpleNamespace(rank=1, world=1, peak=None)  # rank 1: no progress bar
    out = types.SimpleNamespace(log=records.append, say=print)
    progress = train.Progress(state, clock, hw, out, resumed=True)
    progress.log_step(state, 0.999996, {"loss": 5.0, "grad_norm": None}, lr=1e-3, batch_tokens=128)
    assert records[0]["progress"] == 0.99999


def test_a_budget_shorter_than_one_step_ends_within_a_micro_batch(sample_cache, tmp_path):
    # One step of 2^20 tokens is 8192 micro-batches of 4 x 32 tokens (tens of seconds).
    # The budget is 3 seconds.
    summary = run(sample_cache, tmp_path, "--minutes", "0.05", "--batch-tokens", str(2 ** 20),
                  "--batch-ramp", "0", "--eval-every", "1")
    assert summary["steps"] == 1 and 0 < summary["tokens"] < 2 ** 20
    # The last micro-batch may end a little before or after the 3 seconds.
    assert abs(summary["elapsed_s"] - 3.0) <= 0.5


def test_a_step_cut_short_is_the_mean_over_the_micro_batches_it_has(sample_cache, tmp_path):
    """A step cut after a few of its 8192 micro-batches must still be scaled to their mean.
    Unscaled, it would carry ~1/1000 of a normal gradient."""
    # One shape throughout: a growth event would spend this 2-second budget on its evaluations.
    run(sample_cache, tmp_path / "one", "--max-steps", "1", "--batch-tokens", "128",
        "--grow", "none")
    run(sample_cache, tmp_path / "cut", "--minutes", "0.03", "--batch-tokens", str(2 ** 20),
        "--batch-ramp", "0", "--grow", "none")
    one, cut = ([r for r in read_log(tmp_path / name) if r["kind"] == "train"][0]
                for name in ("one", "cut"))
    assert 128 < cut["batch_tokens"] < 2 ** 20
    assert one["grad_norm"] / 3 < cut["grad_norm"] < one["grad_norm"] * 3
    assert abs(cut["loss"] - one["loss"]) < 0.5


def test_sigterm_during_a_long_step_saves_and_exits_within_seconds(sample_cache, tmp_path):
    proc = spawn(sample_cache, tmp_path, "--max-steps", "5", "--batch-tokens", str(2 ** 22),
                 "--batch-ramp", "0")
    for line in proc.stdout:  # the loop starts right after the batch line
        if line.startswith("global batch"):
            break
    time.sleep(2.0)
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert time.time() - sent < 5.0, "a preempted run must not finish a step that lasts minutes"
    assert proc.returncode == 0 and "stopped by signal" in output
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["state"]
    assert state["step"] == 1 and 0 < state["tokens"] < 2 ** 22


def test_sequence_length_warm_up_shows_in_the_log_at_equal_tokens_per_step(sample_cache, tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "10", "--batch-ramp", "0",
        "--grow", "0:max_seq_len=16; 0.5:max_seq_len=32")
    log = read_log(tmp_path)
    grows = [r for r in log if r["kind"] == "grow"]
    assert len(grows) == 1 and grows[0]["step"] == 5
    assert grows[0]["from"].endswith("max_seq_len=16") and grows[0]["to"].endswith("max_seq_len=32")
    # Every step has 256 tokens: 4 x 16 tokens x 4 micro-batches, then 4 x 32 x 2.
    assert {r["batch_tokens"] for r in log if r["kind"] == "train"} == {256}


def test_token_budget_counts_all_tokens(sample_cache, tmp_path):
    summary = run(sample_cache, tmp_path, "--max-tokens", "2560", "--batch-ramp", "0")
    assert summary["tokens"] == 2560 and summary["steps"] == 10


def two_source_mixture(folder):
    """--data for a two-source mixture made of whole works of the sample: plays 0.7, sonnets 0.3."""
    import data
    works = list(data.iter_documents(data.SAMPLE_CORPUS))
    for name, docs in (("plays", works[:4]), ("sonnets", works[4:6])):
        with open(folder / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    return f"{folder / 'plays.jsonl'}:0.7,{folder / 'sonnets.jsonl'}:0.3"


def run_mixture(mixture, cache, out, *flags):
    return train.main(["--data", mixture, *TINY[2:],
                       "--cache", str(cache), "--out", str(out), *flags])


def test_a_mixture_run_logs_each_sources_held_out_loss_and_how_often_it_read_each(tmp_path,
                                                                                  capsys):
    mixture = two_source_mixture(tmp_path)
    summary = run_mixture(mixture, tmp_path / "cache", tmp_path / "out", "--max-steps", "4",
                          "--eval-every", "0.5")
    evals = [r for r in read_log(tmp_path / "out") if r["kind"] == "eval"]
    assert len(evals) == 3 and evals[0]["step"] == 0 and evals[-1]["step"] == 4
    for r in evals:
        by = r["val_loss_by_source"]
        assert set(by) == {"plays", "sonnets"}
        assert r["val_loss"] == pytest.approx(0.7 * by["plays"] + 0.3 * by["sonnets"])
    assert summary["val_loss_by_source"] == evals[-1]["val_loss_by_source"]
    assert summary["final_val_loss"] == evals[-1]["val_loss"]
    epochs = summary["epochs_by_source"]
    assert set(epochs) == {"plays", "sonnets"} and epochs["plays"] > 0
    out = capsys.readouterr().out  # the progress line names each source
    assert re.search(r"50% held-out loss \d\.\d{3} \(plays \d\.\d{3}, sonnets \d\.\d{3}\)", out)
    for name in ("plays", "sonnets"):  # preparing the mixture printed each source's fertility
        pattern = name + r": +weight 0\.\d{3}, .* \d\.\d\d bytes/token, \d\.\d\d tokens/word"
        assert re.search(pattern, out)


def crash_after_the_first_checkpoint(monkeypatch):
    """An in-process kill: train.save_checkpoint raises just after it writes, so the run dies at
    its first checkpoint and nothing after it is saved (monkeypatch.undo() ends it)."""
    real = train.save_checkpoint

    def save_then_crash(*args, **kwargs):
        real(*args, **kwargs)
        raise RuntimeError("killed")
    monkeypatch.setattr(train, "save_checkpoint", save_then_crash)


def test_a_mixture_run_stopped_dead_and_resumed_ends_with_the_same_weights(tmp_path, monkeypatch):
    mixture, flags = two_source_mixture(tmp_path), ["--max-steps", "40", "--checkpoint-steps", "10"]
    run_mixture(mixture, tmp_path / "cache", tmp_path / "straight", *flags)
    crash_after_the_first_checkpoint(monkeypatch)
    with pytest.raises(RuntimeError, match="killed"):
        run_mixture(mixture, tmp_path / "cache", tmp_path / "killed", *flags)
    monkeypatch.undo()
    summary = run_mixture(mixture, tmp_path / "cache", tmp_path / "killed", "--resume", *flags)
    assert summary["steps"] == 40
    a, b = weights(tmp_path / "straight" / "final"), weights(tmp_path / "killed" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- fault tolerance --------------------------------------------------------------------

def test_run_killed_and_resumed_ends_with_the_same_weights(sample_cache, tmp_path):
    # The defaults: depth growth and the value residual included.
    flags = ["--max-steps", "300", "--checkpoint-steps", "10", "--log-every", "50"]
    run(sample_cache, tmp_path / "straight", *flags)
    killed_at_its_first_checkpoint(sample_cache, tmp_path / "killed", *flags)
    assert not (tmp_path / "killed" / "summary.json").exists()
    summary = run(sample_cache, tmp_path / "killed", "--resume", "--max-steps", "300")
    assert summary["steps"] == 300
    a, b = weights(tmp_path / "straight" / "final"), weights(tmp_path / "killed" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_default_run_stopped_between_its_two_growths_resumes_to_the_same_weights(
        sample_cache, tmp_path, monkeypatch):
    # Record 8's default at four layers: 1 -> 2 at 7% and 2 -> 4 at 15% of 40 steps. The first
    # checkpoint (step 4) falls between the two, so the resumed run makes the second growth.
    flags = ["--n-layers", "4", "--max-steps", "40", "--checkpoint-steps", "4"]
    run(sample_cache, tmp_path / "straight", *flags)
    crash_after_the_first_checkpoint(monkeypatch)
    with pytest.raises(RuntimeError, match="killed"):
        run(sample_cache, tmp_path / "killed", *flags)
    monkeypatch.undo()
    saved = torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=False)["state"]

    def grown(name):  # (step, new depth) of each growth event in the run's log
        return [(g["step"], g["to"].split()[0]) for g in read_log(tmp_path / name)
                if g["kind"] == "grow"]
    assert grown("straight") == [(3, "n_layers=2"), (6, "n_layers=4")]
    assert 3 <= saved["step"] < 6 and grown("killed") == [(3, "n_layers=2")]
    summary = run(sample_cache, tmp_path / "killed", "--resume", *flags)
    assert summary["steps"] == 40 and grown("killed") == grown("straight")
    a, b = weights(tmp_path / "straight" / "final"), weights(tmp_path / "killed" / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(sample_cache, tmp_path):
    proc = spawn(sample_cache, tmp_path, "--max-steps", "100000", "--eval-every", "1")
    # The log's first line is the untrained evaluation: wait for a training step.
    log = tmp_path / "log.jsonl"
    while not (log.exists() and '"train"' in log.read_text()) and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "stopped by signal" in output
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["state"]
    assert 0 < state["step"] < 100000


def make_losses_non_finite(monkeypatch, attempts):
    """Fault injection: the step's loss is NaN on these update attempts (1-based; skipped ones
    count), as if one rank's loss had been: train_step's mean over the ranks returns NaN."""
    real, calls = train.train_step, []

    def faulty(*args, mean_over_ranks, **kwargs):
        calls.append(1)
        if len(calls) in attempts:
            return real(*args, mean_over_ranks=lambda loss: mean_over_ranks(loss) * float("nan"),
                        **kwargs)
        return real(*args, mean_over_ranks=mean_over_ranks, **kwargs)
    monkeypatch.setattr(train, "train_step", faulty)


def test_non_finite_losses_are_skipped_and_logged(sample_cache, tmp_path, monkeypatch):
    make_losses_non_finite(monkeypatch, {4})
    summary = run(sample_cache, tmp_path, "--max-steps", "10")
    skips = [r for r in read_log(tmp_path) if r["kind"] == "skip"]
    assert len(skips) == 1 and summary["skipped_steps"] == 1 and summary["steps"] == 10


def test_repeated_non_finite_losses_stop_and_restore_the_last_good_checkpoint(
        sample_cache, tmp_path, capsys, monkeypatch):
    make_losses_non_finite(monkeypatch, {5, 6, 7})
    with pytest.raises(SystemExit) as stop:
        run(sample_cache, tmp_path, "--max-steps", "20", "--checkpoint-steps", "3",
            "--max-bad-steps", "3")
    assert stop.value.code == 1
    assert "3 non-finite losses in a row" in capsys.readouterr().out
    good = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert good["state"]["step"] == 3
    restored, scored = weights(tmp_path / "final"), checkpoint.scored_model(good).state_dict()
    assert all(torch.equal(restored[k], scored[k]) for k in restored)    # the average, as scored
    assert not all(torch.equal(restored[k], good["model"][k]) for k in restored)


# --- distributed ------------------------------------------------------------------------

def test_two_process_ddp_equals_one_process_with_the_same_global_batch(sample_cache, tmp_path):
    # Five steps of the defaults, depth growth (at step 2) and the value residual included.
    flags = ["--max-steps", "5", "--batch-ramp", "0", "--batch-tokens", "256", "--eval-every", "1"]
    run(sample_cache, tmp_path / "single", *flags, "--micro-batch", "8")
    proc = spawn(sample_cache, tmp_path / "ddp", *flags, "--micro-batch", "4",
                 launcher=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"))
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-2000:]
    summary = json.load(open(tmp_path / "ddp" / "summary.json"))
    assert summary["world_size"] == 2 and summary["tokens"] == 5 * 256
    a, b = weights(tmp_path / "single" / "final"), weights(tmp_path / "ddp" / "final")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


def test_two_process_ddp_on_a_mixture_equals_one_process(sample_cache, tmp_path):
    mixture = ["--data", two_source_mixture(tmp_path), "--cache", str(tmp_path / "cache")]
    flags = [*mixture, "--max-steps", "5", "--batch-ramp", "0", "--batch-tokens", "256",
             "--eval-every", "1"]
    single = run(sample_cache, tmp_path / "single", *flags, "--micro-batch", "8")
    proc = spawn(sample_cache, tmp_path / "ddp", *flags, "--micro-batch", "4",
                 launcher=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"))
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-2000:]
    ddp = json.load(open(tmp_path / "ddp" / "summary.json"))
    a, b = weights(tmp_path / "single" / "final"), weights(tmp_path / "ddp" / "final")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert ddp["epochs_by_source"] == single["epochs_by_source"]  # the same global stream
    for name, loss in single["val_loss_by_source"].items():       # each rank held out its slice
        assert ddp["val_loss_by_source"][name] == pytest.approx(loss, abs=1e-4)


# --- command line -----------------------------------------------------------------------

@pytest.mark.parametrize("argv,message", [
    ([], "give a budget"),
    (["--hours", "-1"], "--hours must be positive"),
    (["--max-steps", "3", "--model", "huge"], "--model must be auto or one of"),
    (["--max-steps", "3", "--schedule", "square"], "invalid choice: 'square'"),
    (["--max-steps", "3", "--batch-ramp", "1.5"], "--batch-ramp and --warmup must be in"),
    (["--max-steps", "3", "--schedule", "wsd", "--decay", "0.99"], "--decay must be in (0, 1 - "),
    (["--max-steps", "3", "--optimizer", "muon", "--momentum", "1"], "--momentum must be in [0"),
])
def test_bad_flags_give_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        flags.parse_args(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("train.py: error:") and message in err


def test_missing_data_path_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match="data path not found: .*nowhere.*--data sample"):
        train.main(["--data", str(tmp_path / "nowhere"), "--max-steps", "1",
                    "--out", str(tmp_path / "out")])


def test_existing_run_is_not_overwritten_without_resume(sample_cache, tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "2")
    message = "checkpoint.pt exists: pass --resume to continue it, --force to replace"
    with pytest.raises(SystemExit, match=message):
        run(sample_cache, tmp_path, "--max-steps", "2")


def test_a_finished_run_without_its_checkpoint_is_still_not_replaced_silently(sample_cache,
                                                                              tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "2")
    os.remove(tmp_path / "checkpoint.pt")
    message = r"log.jsonl exists: it is from an earlier run, --force to replace it"
    with pytest.raises(SystemExit, match=message):
        run(sample_cache, tmp_path, "--max-steps", "3")
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 2       # untouched
    assert run(sample_cache, tmp_path, "--max-steps", "3", "--force")["steps"] == 3
    # The log holds only the new run.
    assert [r["step"] for r in read_log(tmp_path) if r["kind"] == "train"] == [1, 2, 3]


def test_resume_after_a_kill_logs_every_step_once(sample_cache, tmp_path):
    flags = ["--max-steps", "300", "--checkpoint-steps", "100"]
    run(sample_cache, tmp_path / "straight", *flags)
    command = [sys.executable, os.path.join(ROOT, "train.py"), *TINY,
               "--cache", sample_cache, "--out", str(tmp_path / "killed"), *flags]
    # The output goes to DEVNULL, not a pipe: nobody reads it while we wait.
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "killed" / "log.jsonl"
    while proc.poll() is None and not (log.exists() and '"step": 105,' in log.read_text()):
        time.sleep(0.005)                  # steps past the checkpoint at 100 are in the log
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    run(sample_cache, tmp_path / "killed", "--resume")
    steps = lambda name: [(r["kind"], r["step"]) for r in read_log(tmp_path / name)]  # noqa: E731
    assert steps("killed") == steps("straight")


def test_resume_with_a_larger_budget_extends_a_finished_run(sample_cache, tmp_path, capsys):
    run(sample_cache, tmp_path, "--max-steps", "4")
    summary = run(sample_cache, tmp_path, "--resume", "--max-steps", "6")
    assert summary["steps"] == 6
    out = capsys.readouterr().out
    assert "resume: budget max_steps 4 -> max_steps 6; progress is now 66.7%" in out
    saved = json.loads((tmp_path / "args.json").read_text())
    assert saved["max_steps"] == 6  # a later resume keeps it
    assert [r["step"] for r in read_log(tmp_path) if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]


def test_a_run_saved_before_the_optimizer_flag_resumes_with_adamw_as_it_ran(sample_cache,
                                                                            tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "2", *CRAMMING_ADAMW)
    saved = json.loads((tmp_path / "args.json").read_text())
    del saved["optimizer"]                                 # as train.py wrote it before the flag
    (tmp_path / "args.json").write_text(json.dumps(saved))
    summary = run(sample_cache, tmp_path, "--resume", "--max-steps", "3")
    assert summary["steps"] == 3
    assert json.loads((tmp_path / "args.json").read_text())["optimizer"] == "adamw"


def test_a_muon_run_saved_before_normuon_resumes_as_plain_muon(sample_cache, tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "2", "--optimizer", "muon", "--neuron-beta2", "0")
    saved = json.loads((tmp_path / "args.json").read_text())
    del saved["neuron_beta2"]                              # as train.py wrote it before the flag
    (tmp_path / "args.json").write_text(json.dumps(saved))
    summary = run(sample_cache, tmp_path, "--resume", "--max-steps", "3")
    assert summary["steps"] == 3
    assert json.loads((tmp_path / "args.json").read_text())["neuron_beta2"] == 0.0
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["optimizer"]["state"]
    assert not any("neuron_second_moment" in s for s in state.values())


def test_resuming_a_finished_run_without_a_larger_budget_says_so(sample_cache, tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "3")
    message = r"checkpoint.pt has spent its budget \(0 steps left\); give a larger one"
    with pytest.raises(SystemExit, match=message):
        run(sample_cache, tmp_path, "--resume")


def test_sigterm_during_data_preparation_exits_cleanly_and_leaves_nothing(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "run"
    command = [sys.executable, os.path.join(ROOT, "train.py"), *TINY, "--vocab-size", "8192",
               "--cache", str(cache), "--max-steps", "1", "--out", str(out)]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    while proc.poll() is None and not (
            cache.exists() and any(p.name.endswith(".tmp") for p in cache.iterdir())):
        time.sleep(0.01)                   # the preparation has started
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: stopped by a signal during data preparation")
    assert not out.exists() and not any(p.name.endswith(".tmp") for p in cache.iterdir())


@pytest.mark.parametrize("when", ["fractions", "auto"])
def test_run_killed_after_a_growth_stage_resumes_to_the_same_weights(sample_cache, tmp_path, when):
    flags = ["--max-steps", "300", "--checkpoint-steps", "10", "--log-every", "50",
             "--eval-every", "0.25", "--grow", "0:layers=1,ffn=64; 0.5:layers=2,ffn=128",
             "--grow-when", when]
    run(sample_cache, tmp_path / "straight", *flags)
    proc = spawn(sample_cache, tmp_path / "killed", *flags)
    log, ckpt = tmp_path / "killed" / "log.jsonl", tmp_path / "killed" / "checkpoint.pt"
    while proc.poll() is None and not (log.exists() and '"kind": "grow"' in log.read_text()):
        time.sleep(0.01)
    grown_at = ckpt.stat().st_mtime_ns if ckpt.exists() else 0
    while proc.poll() is None and (not ckpt.exists() or ckpt.stat().st_mtime_ns == grown_at):
        time.sleep(0.005)                  # the first checkpoint written after the growth
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    assert torch.load(ckpt, weights_only=False)["config"]["n_layers"] == 2
    summary = run(sample_cache, tmp_path / "killed", "--resume")
    assert summary["steps"] == 300
    a, b = weights(tmp_path / "straight" / "final"), weights(tmp_path / "killed" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_grow_auto_grows_when_the_held_out_loss_flattens_and_logs_why(sample_cache, tmp_path):
    # --grow-slope -0.5 is a steep threshold: any slowing-down counts as flat.
    run(sample_cache, tmp_path, "--max-steps", "100", "--grow", "auto",
        "--grow-check-every", "0.05", "--grow-slope", "-0.5")
    log = read_log(tmp_path)
    grows = [r for r in log if r["kind"] == "grow"]
    checks = [r for r in log if r.get("growth_check")]
    # compound has three stages: both of its growths came early, on the slope.
    assert [g["reason"] for g in grows] == ["slope", "slope"]
    assert grows[0]["progress"] < 0.3 and grows[1]["progress"] < 0.6  # before the deadlines
    assert len(checks) >= 2 * grow.AUTO_WINDOW - 1  # the new stage's first point is its growth
    assert json.loads((tmp_path / "args.json").read_text())["grow_when"] == "auto"


def test_grow_auto_with_a_flat_threshold_waits_for_the_deadlines(sample_cache, tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "100", "--grow", "auto",
        "--grow-check-every", "0.05", "--grow-slope", "10")  # no curve is ever that flat
    grows = [r for r in read_log(tmp_path) if r["kind"] == "grow"]
    assert [g["reason"] for g in grows] == ["deadline", "deadline"]
    assert [round(g["progress"], 2) for g in grows] == [0.3, 0.6]


def test_embedding_norm_can_be_switched_off(sample_cache, tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "1", "--embedding-norm", "off")
    assert json.loads((tmp_path / "final" / "config.json").read_text())["embedding_norm"] is False


def test_the_speedrun_architecture_options_reach_the_saved_config(sample_cache, tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "1", "--tie-embeddings", "off", "--qk-norm", "on",
        "--zero-init", "on", "--activation", "relu2", "--value-residual", "on")
    cfg = json.loads((tmp_path / "final" / "config.json").read_text())
    assert (cfg["tie_embeddings"], cfg["qk_norm"], cfg["zero_init"], cfg["activation"],
            cfg["value_residual"]) == (False, True, True, "relu2", True)


# --- starting a new run from old weights (--init-from) ---------------------------------------

def test_init_from_a_finished_run_starts_where_it_ended(sample_cache, tmp_path):
    first = run(sample_cache, tmp_path / "first", "--max-steps", "20")
    for source in (tmp_path / "first" / "final", tmp_path / "first" / "checkpoint.pt"):
        out = tmp_path / f"from_{source.name}"
        second = run(sample_cache, out, "--max-steps", "5", "--init-from", str(source))
        start = read_log(out)[0]
        # the same weights on the same held-out batches: the new run starts at the old one's loss
        assert start["kind"] == "eval" and start["step"] == 0
        assert start["val_loss"] == pytest.approx(first["final_val_loss"], abs=1e-6)
        assert second["steps"] == 5 and second["final_val_loss"] < start["val_loss"] + 0.05
        saved = json.loads((out / "args.json").read_text())
        assert saved["init_from"] == str(source) and saved["tokenizer"].endswith("tokenizer.json")


@pytest.mark.parametrize("argv,message", [
    (["--n-layers", "3"], "--n-layers 3 does not fit --init-from"),
    (["--vocab-size", "1024"], "--vocab-size 1024 does not fit --init-from"),
    (["--resume"], "--init-from starts a new run; --resume continues"),
    (["--grow", "compound"], "--init-from takes its shape from PATH"),
])
def test_init_from_refuses_what_does_not_fit_in_one_line(sample_cache, tmp_path, capsys, argv,
                                                         message):
    run(sample_cache, tmp_path / "first", "--max-steps", "2")
    capsys.readouterr()  # the first run's output
    with pytest.raises(SystemExit) as stop:
        run(sample_cache, tmp_path / "second", "--max-steps", "2", "--init-from",
            str(tmp_path / "first" / "final"), *argv)
    said = capsys.readouterr().err.strip().splitlines() or [str(stop.value.code)]
    assert message in said[-1]  # one line: the parser's (exit 2) or an error: line (exit text)
    assert not (tmp_path / "second" / "log.jsonl").exists()


def test_init_from_a_path_that_is_not_there_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        flags.parse_args(["--max-steps", "1", "--init-from", str(tmp_path / "nope")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--init-from" in err and "no such file or folder" in err

