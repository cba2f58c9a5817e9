"""What a real machine does to a run: python -m pytest -q tests/test_faults.py

Out of memory, a full disk, a busy machine, an evaluation that dies. Each fault is injected in the
test (an out-of-memory error at chosen micro-batch sizes, a write that fails with ENOSPC, a slowed
evaluation), and each test fails without the behaviour it checks.
"""
import errno
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

import checkpoint
import held_out
import model
import train
from conftest import ROOT, read_log
from test_train import TINY, run, weights

# --- out of memory: halve the micro-batch, keep the global batch, retry the step ---------------

def out_of_memory_above(monkeypatch, limit):
    """train_step raises CUDA's out-of-memory error for micro-batches of more than limit
    sequences, after reading one micro-batch, as a real step that dies halfway has."""
    real = train.train_step

    def step(net, optimizer, micro_batches, **options):
        batches = iter(micro_batches)
        first = next(batches)
        B = first["input_ids"].shape[0]
        if B > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB "
                                         f"(micro-batch {B})")
        return real(net, optimizer, itertools.chain([first], batches), **options)
    monkeypatch.setattr(train, "train_step", step)


def test_out_of_memory_backs_off_to_the_weights_of_the_smaller_micro_batch(sample_cache, tmp_path,
                                                                          monkeypatch):
    flags = ["--max-steps", "12", "--batch-ramp", "0", "--checkpoint-steps", "6"]
    run(sample_cache, tmp_path / "small", *flags, "--micro-batch", "1")
    out_of_memory_above(monkeypatch, 1)
    summary = run(sample_cache, tmp_path / "big", *flags, "--micro-batch", "4")
    assert summary["steps"] == 12 and summary["tokens"] == 12 * 256  # the global batch kept
    backs = [r for r in read_log(tmp_path / "big") if r["kind"] == "back_off"]
    assert [(r["step"], r["micro_batch"]) for r in backs] == [(0, 2), (0, 1)]
    a, b = weights(tmp_path / "small" / "final"), weights(tmp_path / "big" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)  # bitwise: the same steps on the same data
    # the micro-batch it settled on is saved: a resume starts there, not at --micro-batch 4
    saved = torch.load(tmp_path / "big" / "checkpoint.pt", weights_only=False)["state"]
    assert saved["micro_batch"] == 1


def test_out_of_memory_after_a_backward_pass_drops_that_steps_gradients(sample_cache, tmp_path,
                                                                         monkeypatch):
    """The error comes when the step reads its second micro-batch: the first one's forward and
    backward are done, so the failed step has gradients. The retried step must not add them in
    (back_off's zero_grad): the weights are bitwise those of a run at the smaller micro-batch."""
    real = train.train_step

    def step(net, optimizer, micro_batches, **options):
        def reading():
            for i, batch in enumerate(micro_batches):
                if i == 1 and batch["input_ids"].shape[0] > 2:
                    assert any(p.grad is not None for p in net.parameters())  # really after one
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                yield batch
        return real(net, optimizer, reading(), **options)
    flags = ["--max-steps", "6", "--batch-ramp", "0"]
    run(sample_cache, tmp_path / "small", *flags, "--micro-batch", "2")
    monkeypatch.setattr(train, "train_step", step)
    summary = run(sample_cache, tmp_path / "big", *flags, "--micro-batch", "4")
    backs = [r for r in read_log(tmp_path / "big") if r["kind"] == "back_off"]
    assert summary["steps"] == 6 and [(r["step"], r["micro_batch"]) for r in backs] == [(0, 2)]
    a, b = weights(tmp_path / "small" / "final"), weights(tmp_path / "big" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_growth_stage_that_no_longer_fits_backs_off_again(sample_cache, tmp_path, monkeypatch):
    real = train.train_step

    def step(net, optimizer, micro_batches, **options):  # only the grown 2-layer model is too big
        batches = iter(micro_batches)
        first = next(batches)
        if model.unwrap(net).config["n_layers"] == 2 and first["input_ids"].shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory.")
        return real(net, optimizer, itertools.chain([first], batches), **options)
    monkeypatch.setattr(train, "train_step", step)
    summary = run(sample_cache, tmp_path, "--max-steps", "10", "--batch-ramp", "0",
                  "--grow", "0:n_layers=1; 0.5:n_layers=2")
    log = read_log(tmp_path)
    grown = next(r["step"] for r in log if r["kind"] == "grow")
    assert [(r["step"], r["micro_batch"]) for r in log if r["kind"] == "back_off"] == [(grown, 2)]
    assert summary["steps"] == 10 and summary["tokens"] == 10 * 256


def test_out_of_memory_at_one_sequence_is_one_line_naming_the_model_and_its_memory(
        sample_cache, tmp_path, monkeypatch):
    out_of_memory_above(monkeypatch, 0)
    with pytest.raises(SystemExit) as stop:
        run(sample_cache, tmp_path, "--max-steps", "3", "--micro-batch", "2")
    line = str(stop.value.code)
    assert line.startswith("error: out of memory at micro-batch 1") and "\n" not in line
    assert "M parameters" in line and "GB per rank" in line and "--checkpoint-activations" in line


def test_other_runtime_errors_in_a_step_are_not_taken_for_out_of_memory(sample_cache, tmp_path,
                                                                        monkeypatch):
    def broken(*args, **options):
        raise RuntimeError("shape mismatch")
    monkeypatch.setattr(train, "train_step", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run(sample_cache, tmp_path, "--max-steps", "2")


def test_out_of_memory_while_the_optimizer_creates_its_moments_drops_them_and_retries(
        sample_cache, tmp_path, monkeypatch):
    """The first optimizer.step() allocates AdamW's moments, the classic place a GPU run dies.
    The error comes after some parameters have their state and before the others do: the retry
    must not find half-made state (torch would raise KeyError), and the run is bitwise the one
    that started at the smaller micro-batch."""
    real_zeros_like, calls = torch.zeros_like, []

    def dies_in_the_first_update(optimizer):
        real_step = optimizer.step

        def step(*args, **kwargs):
            def zeros_like(*a, **k):
                calls.append(1)
                if len(calls) == 5:  # two parameters' moments made, the third's half
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                return real_zeros_like(*a, **k)
            monkeypatch.setattr(torch, "zeros_like", zeros_like)
            try:
                return real_step(*args, **kwargs)
            finally:
                monkeypatch.setattr(torch, "zeros_like", real_zeros_like)
        optimizer.step = step
        return optimizer
    real_make = train.make_optimizer
    flags = ["--max-steps", "6", "--batch-ramp", "0", "--optimizer", "adamw"]
    run(sample_cache, tmp_path / "small", *flags, "--micro-batch", "2")
    monkeypatch.setattr(train, "make_optimizer",
                        lambda net, args, hw: dies_in_the_first_update(real_make(net, args, hw)))
    summary = run(sample_cache, tmp_path / "big", *flags, "--micro-batch", "4")
    backs = [r for r in read_log(tmp_path / "big") if r["kind"] == "back_off"]
    assert len(calls) > 5 and [(r["step"], r["micro_batch"]) for r in backs] == [(0, 2)]
    assert summary["steps"] == 6
    a, b = weights(tmp_path / "small" / "final"), weights(tmp_path / "big" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_out_of_memory_in_an_evaluation_halves_its_own_batch_and_gives_the_same_loss(
        sample_cache, tmp_path, monkeypatch):
    """Held-out forward passes of more than 2 sequences run out of memory: the evaluation cuts
    each held-out batch into halves, weighted by their predicted tokens, so every held-out loss
    is the one an undisturbed run logs; training keeps its micro-batch of 4."""
    flags = ["--max-steps", "6", "--batch-ramp", "0", "--eval-every", "0.5", "--eval-batches", "3"]
    run(sample_cache, tmp_path / "calm", *flags)
    real = model.Transformer.forward

    def out_of_memory_when_evaluating_more_than_2(self, input_ids, *args, **kwargs):
        if not self.training and input_ids.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, input_ids, *args, **kwargs)
    monkeypatch.setattr(model.Transformer, "forward", out_of_memory_when_evaluating_more_than_2)
    run(sample_cache, tmp_path / "tight", *flags)
    calm, tight = read_log(tmp_path / "calm"), read_log(tmp_path / "tight")
    backs = [r for r in tight if r["kind"] == "back_off"]
    assert [(r.get("evaluation"), r["micro_batch"]) for r in backs] == [(True, 2)]  # once only
    losses = [[r["val_loss"] for r in log if r["kind"] == "eval"] for log in (calm, tight)]
    assert len(losses[0]) == 3 and losses[1] == pytest.approx(losses[0], rel=1e-5)
    a, b = weights(tmp_path / "calm" / "final"), weights(tmp_path / "tight" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)  # the training steps were not touched


def test_out_of_memory_while_growing_is_one_line_naming_the_stage_and_the_checkpoint(
        sample_cache, tmp_path, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(train.grow, "grow_model", out_of_memory)
    with pytest.raises(SystemExit) as stop:
        run(sample_cache, tmp_path, "--max-steps", "10", "--batch-ramp", "0",
            "--checkpoint-steps", "4", "--grow", "0:n_layers=1; 0.5:n_layers=2")
    line = str(stop.value.code)
    assert line.startswith("error: out of memory growing to ") and "\n" not in line
    assert "at step 5" in line and "checkpoint.pt" in line and "GB per rank" in line
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["state"]["step"] == 4


def test_the_cpu_allocators_real_failure_is_recognised_as_out_of_memory():
    """Not a staged error: a child process under an address-space limit (RLIMIT_AS) asks
    torch's CPU allocator for more than the limit allows, and the RuntimeError it really raises
    ("DefaultCPUAllocator: can't allocate memory") is what parallel.is_out_of_memory sees."""
    child = (
        "import resource, torch, parallel\n"
        "resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))\n"
        "try:\n"
        "    torch.empty(4 * 2**30)  # 16 GiB of float32 under an 8 GiB address space\n"
        "except RuntimeError as e:\n"
        "    print(parallel.is_out_of_memory(e), str(e).splitlines()[0][:200])\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", child], cwd=root, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    recognised, message = done.stdout.split(" ", 1)
    assert "can't allocate memory" in message and recognised == "True"


def test_a_run_under_a_real_memory_limit_backs_off_and_keeps_its_global_batch(sample_cache,
                                                                              tmp_path):
    """Not a staged error: train.py runs in a child process whose address space is limited
    (RLIMIT_AS). The limit is 200 MB above what the same run needs at micro-batch 8 (measured
    first, as VmPeak), so micro-batch 1024 (activations of 131,072 tokens) cannot fit: the
    allocator really fails, in the step-0 evaluation and in the step, and the run halves both
    until they fit and finishes with one step of the global batch it was given."""
    child = (
        "import os, resource, sys, train\n"
        "limit = int(sys.argv[1]) * 2**20\n"
        "if limit:\n"
        "    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
        "train.main(sys.argv[2:])\n"
        "peak = [line for line in open('/proc/self/status') if line.startswith('VmPeak')]\n"
        "print('VmPeak', int(peak[0].split()[1]) // 1024)\n")
    flags = ["--data", "sample", "--vocab-size", "512", "--model", "tiny", "--max-seq-len", "128",
             "--batch-tokens", "131072", "--batch-ramp", "0", "--max-steps", "1",
             "--eval-batches", "1", "--dtype", "fp32", "--cache", sample_cache]

    def train_in_child(limit_mb, out, micro_batch):
        done = subprocess.run([sys.executable, "-c", child, str(limit_mb), *flags, "--out",
                               str(out), "--micro-batch", str(micro_batch)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-1000:]
        return int(done.stdout.split("VmPeak")[-1])
    needs = train_in_child(0, tmp_path / "small", micro_batch=8)
    train_in_child(needs + 200, tmp_path / "big", micro_batch=1024)
    log = read_log(tmp_path / "big")
    backs = [r for r in log if r["kind"] == "back_off"]
    assert any(r.get("evaluation") for r in backs) and any("step" in r for r in backs)
    assert all("can't allocate memory" in r["error"] for r in backs)  # the CPU allocator's own
    summary = json.loads((tmp_path / "big" / "summary.json").read_text())
    assert summary["status"] == "budget spent" and summary["tokens"] == 131072
    saved = torch.load(tmp_path / "big" / "checkpoint.pt", weights_only=False)["state"]
    assert 8 <= saved["micro_batch"] < 1024


# --- a full disk: each write fails with the operating system's own ENOSPC --------------------
# /dev/full takes no byte: every write to it fails with errno 28, as on a disk that is full. The
# tests choose which of the run's files is written there; the error, and how it travels through
# Python's file objects, torch.save and Distributed Checkpoint, is the real one.

def full_disk_for(monkeypatch, name, after=0):
    """files.atomic_write's temporary file for path `name` writes to /dev/full once `after` such
    files have been written: the temporary file exists (and must be removed), its bytes go to
    /dev/full."""
    real, seen = tempfile.mkstemp, []

    def mkstemp(*args, prefix="", **kwargs):
        fd, path = real(*args, prefix=prefix, **kwargs)
        if prefix == name + ".":
            seen.append(path)
            if len(seen) > after:
                os.close(fd)
                fd = os.open("/dev/full", os.O_WRONLY)
        return fd, path
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def full_disk_for_final(monkeypatch):
    """model.save_model's temporary file in final/ (save_model.<pid>.tmp) is a link to /dev/full."""
    real = checkpoint.save_final

    def save_final(folder, *args, **kwargs):
        os.makedirs(folder, exist_ok=True)
        os.symlink("/dev/full", os.path.join(folder, f"save_model.{os.getpid()}.tmp"))
        return real(folder, *args, **kwargs)
    monkeypatch.setattr(checkpoint, "save_final", save_final)


def test_dev_full_fails_a_torch_save_with_enospc():
    with pytest.raises(OSError) as failed:
        with open("/dev/full", "wb", buffering=0) as f:
            torch.save({"w": torch.zeros(1000)}, f)
    assert failed.value.errno == errno.ENOSPC  # through torch.save: unbuffered, the OS's error


def test_a_full_disk_costs_a_checkpoint_not_the_run_or_the_previous_checkpoint(
        sample_cache, tmp_path, monkeypatch, capsys):
    full_disk_for(monkeypatch, "checkpoint.pt", after=1)  # the save at step 4 works, later not
    summary = run(sample_cache, tmp_path, "--max-steps", "12", "--checkpoint-steps", "4")
    assert summary["status"] == "budget spent" and summary["steps"] == 12
    assert os.path.isfile(tmp_path / "final" / "model.pt")
    kept = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["state"]
    assert kept["step"] == 4  # whole, and the last good one
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # no half-written file
    out = capsys.readouterr().out
    assert "no space left on device at step 8" in out and "the previous one is intact" in out


def test_a_full_disk_costs_a_sharded_checkpoint_not_the_run(sample_cache, tmp_path, monkeypatch,
                                                          capsys):
    """FSDP's Distributed Checkpoint: rank 0's shard file is a link to /dev/full from the second
    save on. DCP gathers every rank's failure; the run goes on and the first save stays whole."""
    real, saves = checkpoint.dcp.save, []

    def save(state, checkpoint_id):
        saves.append(checkpoint_id)
        if len(saves) > 1:
            os.makedirs(checkpoint_id, exist_ok=True)
            os.symlink("/dev/full", os.path.join(checkpoint_id, "__0_0.distcp"))
        return real(state, checkpoint_id=checkpoint_id)
    monkeypatch.setattr(checkpoint.dcp, "save", save)
    summary = run(sample_cache, tmp_path, "--max-steps", "8", "--checkpoint-steps", "4",
                  "--shard", "fsdp", "--device", "cpu")
    assert summary["status"] == "budget spent" and len(saves) == 3  # step 4; step 8 twice
    kept = checkpoint.load(str(tmp_path / "checkpoint.dcp"))
    assert kept["state"]["step"] == 4
    assert sorted(os.listdir(tmp_path / "checkpoint.dcp")) == [
        ".metadata", "__0_0.distcp", "run.pt"]
    assert not os.path.exists(tmp_path / "checkpoint.dcp.tmp")  # the failed one is gone
    assert "checkpoint.dcp: no space left on device at step 8" in capsys.readouterr().out


def test_a_full_disk_at_preemption_says_the_checkpoint_was_not_saved_and_nothing_else(
        sample_cache, tmp_path, monkeypatch, capsys):
    real = train.parallel.agree_on_clock

    def signal_after_3_steps(elapsed, signals, device, world):
        elapsed, stop = real(elapsed, signals, device, world)
        return elapsed, stop or len([r for r in read_log(tmp_path) if r["kind"] == "train"]) >= 3
    monkeypatch.setattr(train.parallel, "agree_on_clock", signal_after_3_steps)
    full_disk_for(monkeypatch, "checkpoint.pt")
    result = run(sample_cache, tmp_path, "--max-steps", "10")
    out = capsys.readouterr().out
    assert result["status"] == "preempted" and result["step"] == 3
    assert "no space left on device at step 3" in out and "the run stops" in out
    assert "stopped by signal" not in out and "training goes on" not in out


def test_a_full_disk_when_writing_the_final_model_is_one_line_and_resume_finishes_it(
        sample_cache, tmp_path, monkeypatch):
    full_disk_for_final(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        run(sample_cache, tmp_path, "--max-steps", "3")
    line = str(stop.value.code)
    assert "final: no space left on device" in line and "checkpoint.pt" in line
    assert "--resume" in line and "\n" not in line
    assert os.listdir(tmp_path / "final") == []  # the temporary file is gone, nothing half-made
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["state"]["step"] == 3
    monkeypatch.undo()  # space was freed: the advice, followed
    summary = train.main(["--resume", "--out", str(tmp_path)])
    assert summary["steps"] == 3 and os.path.isfile(tmp_path / "final" / "model.pt")
    evals = [r["progress"] for r in read_log(tmp_path) if r["kind"] == "eval"]
    assert evals.count(1.0) == 1  # the final evaluation once: resume cut the first one's record
    with pytest.raises(SystemExit, match="has spent its budget"):  # finished now
        train.main(["--resume", "--out", str(tmp_path)])


def test_a_full_disk_for_the_log_loses_records_not_the_run(sample_cache, tmp_path, monkeypatch,
                                                           capsys):
    real = train.Output.__init__

    def log_to_dev_full(self, folder, shard, rank):
        real(self, folder, shard, rank)
        self.log_path = str(tmp_path / "full.jsonl")
        os.symlink("/dev/full", self.log_path)
    run(sample_cache, tmp_path / "calm", "--max-steps", "4")
    monkeypatch.setattr(train.Output, "__init__", log_to_dev_full)
    # /dev/full reads as endless zero bytes, a log no disk holds: the plot does not read it
    monkeypatch.setattr(train.scaling, "plot_losses", lambda log_path, png_path: None)
    summary = run(sample_cache, tmp_path / "full", "--max-steps", "4")
    assert summary["status"] == "budget spent" and os.path.isfile(tmp_path / "full" / "final" /
                                                                     "model.pt")
    assert summary["log_records_lost"] == len(read_log(tmp_path / "calm"))  # every one
    assert capsys.readouterr().out.count("full.jsonl: no space left on device") == 1


def test_a_full_disk_for_the_plot_and_the_summary(sample_cache, tmp_path, monkeypatch, capsys):
    full_disk_for(monkeypatch, "loss.png")
    summary = run(sample_cache, tmp_path / "a", "--max-steps", "3")
    assert summary["plot"] is None and not os.path.exists(tmp_path / "a" / "loss.png")
    assert "loss.png: no space left on device; the plot is not saved" in capsys.readouterr().out
    monkeypatch.undo()
    full_disk_for(monkeypatch, "summary.json")
    with pytest.raises(SystemExit) as stop:
        run(sample_cache, tmp_path / "b", "--max-steps", "3")
    line = str(stop.value.code)
    assert "summary.json: no space left on device" in line and "\n" not in line
    assert "final_val_loss" in capsys.readouterr().out  # printed before the error
    assert sorted(os.listdir(tmp_path / "b")) == ["args.json", "checkpoint.pt", "final",
                                                  "log.jsonl", "loss.png"]


def test_a_full_disk_before_training_is_one_line(sample_cache, tmp_path, monkeypatch):
    full_disk_for(monkeypatch, "args.json")
    with pytest.raises(SystemExit) as stop:
        run(sample_cache, tmp_path, "--max-steps", "3")
    assert str(stop.value.code) == (f"error: {tmp_path / 'args.json'}: no space left on device; "
                                    "nothing was trained")
    assert os.listdir(tmp_path) == []


# --- kill -9 anywhere: resume continues, the log has every step once, at most 4 steps lost -------

# 16 steps of 2 micro-batches, a checkpoint every 4, evaluations at 25/50/75%, a second layer grown
# at 50% (step 8). Each entry kills one process at a moment (tests/kill_at.py), and the next
# process is `--resume`; the data preparation's kills are in test_data_faults.py.
KILL_FLAGS = ["--max-steps", "16", "--checkpoint-steps", "4", "--batch-ramp", "0",
              "--batch-tokens", "256", "--eval-every", "0.25", "--grow",
              "0:n_layers=1; 0.5:n_layers=2"]
KILLS = [("eval", 1),        # in the step-0 evaluation: no checkpoint yet; resume starts again
         ("checkpoint", 1),  # halfway through writing the first checkpoint (step 4): still none
         ("step", 11),       # in the middle of step 6: the checkpoint of step 4 holds
         ("log", 3),         # just after step 6 is logged again
         ("eval", 2),        # in the evaluation after step 5
         ("grow", 1),        # while growing, after the checkpoint of step 8
         ("checkpoint", 1),  # halfway through the checkpoint of step 12 (step 8's stays whole)
         ("step", 3),        # in the middle of step 10, on the grown model
         ("final", 1),       # halfway through final/model.pt (the budget is spent)
         ("log", 1),         # just after the final evaluation's record
         ("summary", 1)]     # halfway through summary.json


def test_kill_9_at_eleven_moments_and_resume_gives_the_run_that_was_never_killed(sample_cache,
                                                                                 tmp_path):
    straight = run(sample_cache, tmp_path / "straight", *KILL_FLAGS)
    out = tmp_path / "killed"
    flags = [*TINY, "--cache", sample_cache, "--out", str(out), *KILL_FLAGS]
    for i, (moment, n) in enumerate(KILLS + [("never", 0)]):
        command = [sys.executable, os.path.join(ROOT, "tests", "kill_at.py"), moment, str(n),
                   *flags, *(["--resume"] if i else [])]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        if moment == "never":
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            break
        assert done.returncode == -signal.SIGKILL, f"{moment} {n} never came: {done.stderr[-500:]}"
        # no more than one checkpoint interval is lost: the steps logged past the checkpoint
        logged = [r["step"] for r in read_log(out) if r["kind"] == "train"] if (
            out / "log.jsonl").exists() else []
        kept = torch.load(out / "checkpoint.pt", weights_only=False)["state"]["step"] if (
            out / "checkpoint.pt").exists() else 0
        assert max(logged, default=0) - kept <= 4, (moment, n, logged, kept)
    steps = lambda name: [(r["kind"], r["step"]) for r in read_log(tmp_path / name)]  # noqa: E731
    assert steps("killed") == steps("straight")  # every step and evaluation once, in order
    a, b = weights(tmp_path / "straight" / "final"), weights(out / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)  # bitwise the run that was never killed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 16 and summary["final_val_loss"] == straight["final_val_loss"]
    left = [f for folder in (out, out / "final") for f in os.listdir(folder) if ".tmp" in f]
    assert left == []  # the half-written temporary files of the killed runs are gone


def test_the_checkpoint_is_written_before_an_evaluation_due_in_the_same_step(sample_cache,
                                                                            tmp_path,
                                                                            monkeypatch):
    """Step 6 is due for both (--checkpoint-steps 6; --eval-every 0.5 of 10 steps evaluates after
    the step that starts at 50%, step 6). The evaluation dies: the checkpoint of step 6 is there
    only if it was written first (swapped, there would be no checkpoint at all)."""
    real = held_out.HeldOut.evaluate

    def dies_in_the_loop(self, net, within_budget=False):
        if within_budget:
            raise RuntimeError("killed during evaluation")
        return real(self, net, within_budget)
    monkeypatch.setattr(held_out.HeldOut, "evaluate", dies_in_the_loop)
    with pytest.raises(RuntimeError, match="killed during evaluation"):
        run(sample_cache, tmp_path, "--max-steps", "10", "--eval-every", "0.5",
            "--checkpoint-steps", "6")
    assert [r["step"] for r in read_log(tmp_path) if r["kind"] == "train"][-1] == 6
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["state"]["step"] == 6


def test_resume_reads_the_checkpoint_onto_the_cpu_first(tmp_path, monkeypatch):
    torch.save({"model": {}, "config": {}}, tmp_path / "checkpoint.pt")
    real, where = torch.load, []

    def load(*args, **kwargs):
        where.append(kwargs.get("map_location"))
        return real(*args, **kwargs)
    monkeypatch.setattr(torch, "load", load)
    checkpoint.load(str(tmp_path / "checkpoint.pt"))
    assert where == ["cpu"]  # never more GPU memory than the run had


# --- a busy machine: evaluations inside the budget --------------------------------------------

def test_a_slow_evaluation_is_cut_to_the_batches_that_fit_in_the_budget(sample_cache, tmp_path,
                                                                       monkeypatch):
    real = model.Transformer.forward

    def slow_when_evaluating(self, *args, **kwargs):
        if not self.training:
            time.sleep(0.15)  # a busy machine: 20 held-out batches take 3 s, as the budget
        return real(self, *args, **kwargs)
    monkeypatch.setattr(model.Transformer, "forward", slow_when_evaluating)
    # no growth: the evaluations around a growth event run in full and would take the budget
    summary = run(sample_cache, tmp_path, "--minutes", "0.05", "--eval-every", "0.5",
                  "--eval-batches", "20", "--grow", "none")
    assert summary["status"] == "budget spent"
    # Counts, not seconds (a busy machine may run late): the evaluation in the loop ran fewer
    # batches than asked, the ones off the clock (step 0, the final one) all 20.
    evals = [r for r in read_log(tmp_path) if r["kind"] == "eval"]
    in_loop = [r for r in evals if 0 < r["progress"] < 1]
    assert in_loop and all(r["eval_batches"] < 20 for r in in_loop)
    assert "eval_batches" not in evals[0] and "eval_batches" not in evals[-1]
