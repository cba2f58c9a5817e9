"""Specification of train.py's sharding (--shard fsdp) and activation checkpointing:
python -m pytest -q tests/test_fsdp.py

Two gloo processes on the CPU stand in for two GPUs. They are started the way torchrun starts them
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment) but without the launcher, whose
workers run in their own sessions, so that a test can SIGKILL every rank. One uninterrupted 2-rank
run and one killed 2-rank run (module fixtures) serve all the comparisons.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import flags
import model
import parallel
import train
from test_train import ROOT, TINY, run, weights

FSDP = ["--shard", "fsdp", "--checkpoint-activations", "--max-steps", "12", "--batch-ramp", "0",
        "--eval-every", "0.5", "--checkpoint-steps", "3", "--log-every", "4"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The sample corpus prepared once: tokenizer + shards shared by every run of this file."""
    folder = str(tmp_path_factory.mktemp("cache"))
    train.main(TINY + ["--cache", folder, "--max-steps", "1",
                       "--out", os.path.join(folder, "warmup")])
    return folder


def launch(cache, out, world, *flags):
    """`world` processes of train.py, one per rank; each one's output goes to OUT.rank<r>.log."""
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        with open(f"{out}.rank{rank}.log", "w") as log:
            cmd = [sys.executable, os.path.join(ROOT, "train.py"), *TINY, "--cache", cache,
                   "--out", str(out), *flags]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
    return procs


def wait(procs, out, timeout=300):
    """Rank 0's output, once every rank has exited with status 0."""
    codes = [p.wait(timeout=timeout) for p in procs]
    logs = [open(f"{out}.rank{rank}.log").read() for rank in range(len(procs))]
    assert codes == [0] * len(procs), "\n".join(log[-1500:] for log in logs)
    return logs[0]


@pytest.fixture(scope="module")
def straight(cache, tmp_path_factory):
    """(folder, rank 0's output) of the uninterrupted 2-rank FSDP run."""
    out = tmp_path_factory.mktemp("fsdp") / "straight"
    return out, wait(launch(cache, out, 2, *FSDP), out)


@pytest.fixture(scope="module")
def killed(cache, tmp_path_factory):
    """The same run SIGKILLed on both ranks once its first checkpoint is complete.

    Returns a pristine copy of its folder."""
    out = tmp_path_factory.mktemp("fsdp") / "killed"
    procs = launch(cache, out, 2, *FSDP)
    while not (out / "checkpoint.dcp").exists() and all(p.poll() is None for p in procs):
        time.sleep(0.005)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    codes = [p.wait() for p in procs]
    assert codes == [-signal.SIGKILL] * 2, "the run finished before it could be killed"
    assert not (out / "summary.json").exists()
    shutil.copytree(out, out.with_name("killed-copy"))
    return out.with_name("killed-copy")


def resumable_copy(killed, folder):
    shutil.copytree(killed, folder)
    return folder


def max_difference(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


# --- FSDP against one process, and against itself after a kill ---------------------------

def test_fsdp_on_two_ranks_equals_one_process_with_the_same_global_batch(cache, straight, tmp_path):
    out, output = straight
    # under --shard fsdp the default Muon becomes AdamW, the default depth growth none and the
    # weights' average off (planning.choose_defaults), so the one process it is compared with
    # runs the same
    single = run(cache, tmp_path / "single", "--max-steps", "12", "--batch-ramp", "0",
                 "--eval-every", "0.5", "--micro-batch", "8", "--optimizer", "adamw",
                 "--grow", "none", "--ema", "0")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["tokens"] == single["tokens"] == 12 * 256
    assert "this run: fsdp, activations checkpointed" in output
    assert max_difference(weights(tmp_path / "single" / "final"), weights(out / "final")) < 1e-5
    # final/ is model.py's plain format.
    assert model.load_model(out / "final").config["n_layers"] == 2


def test_an_fsdp_run_killed_and_resumed_ends_with_the_same_weights(cache, straight, killed,
                                                                   tmp_path):
    out = resumable_copy(killed, tmp_path / "run")
    dcp = out / "checkpoint.dcp"
    assert (dcp / "run.pt").exists() and (dcp / ".metadata").exists()
    wait(launch(cache, out, 2, "--resume"), out)
    assert json.loads((out / "summary.json").read_text())["steps"] == 12
    a, b = weights(straight[0] / "final"), weights(out / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)

    def steps(folder):
        return [(r["kind"], r["step"]) for r in map(json.loads, open(folder / "log.jsonl"))]
    assert steps(out) == steps(straight[0])  # every step logged once


def test_a_checkpoint_written_by_two_ranks_resumes_on_one(cache, straight, killed, tmp_path,
                                                          capsys):
    out = resumable_copy(killed, tmp_path / "run")
    summary = run(cache, out, "--resume")  # this process alone: FSDP over a group of one rank
    assert summary["world_size"] == 1 and summary["steps"] == 12 and summary["tokens"] == 12 * 256
    assert "resuming" in capsys.readouterr().out
    assert max_difference(weights(straight[0] / "final"), weights(out / "final")) < 1e-5


def test_fsdp_shards_hold_what_memory_per_rank_says(straight):
    out, output = straight
    line = next(line for line in output.splitlines()
                if line.startswith("parameter bytes held by each rank"))
    held = json.loads(line.split(": ", 1)[1])  # [rank 0's bytes, rank 1's]
    cfg = json.loads((out / "final" / "config.json").read_text())
    ddp, fsdp = parallel.memory_per_rank(cfg, 2, "ddp"), parallel.memory_per_rank(cfg, 2, "fsdp")
    # The slices add up to the model.
    assert sum(held) == ddp["params"] == 4 * model.count_params(cfg)
    # The allowance for padding: one dim-0 row of each parameter.
    padding = sum(4 * p.numel() // p.shape[0] for p in model.build_model(cfg).parameters())
    assert len(held) == 2 and all(abs(h - fsdp["params"]) <= padding for h in held)


# --- the arithmetic, activation checkpointing and the flags ------------------------------

def test_memory_per_rank_divides_parameters_gradients_and_adam_by_the_world_under_fsdp():
    cfg = model.make_config("base", vocab_size=32768)
    n = model.count_params(cfg)
    assert parallel.memory_per_rank(cfg, 8, "ddp") == {"params": 4 * n, "grads": 4 * n,
                                                       "adam": 8 * n, "total": 16 * n}
    fsdp = parallel.memory_per_rank(cfg, 8, "fsdp")
    assert fsdp["params"] == -(-4 * n // 8) and fsdp["adam"] == -(-8 * n // 8)
    assert fsdp["total"] == pytest.approx(16 * n / 8, abs=3)


def test_activation_checkpointing_changes_no_gradient_and_saves_fewer_tensors():
    torch.manual_seed(0)
    cfg = model.make_config("tiny", vocab_size=512, max_seq_len=32)
    plain, recomputed = model.build_model(cfg), model.build_model(cfg)
    recomputed.load_state_dict(plain.state_dict())
    args = flags.parse_args(["--max-steps", "1", "--checkpoint-activations"])
    recomputed = parallel.wrap(recomputed, args, torch.device("cpu"), world=1)
    ids = torch.randint(0, 500, (4, 32))
    # (B, k) masked positions
    positions = torch.sort(torch.randperm(30)[:8] + 1).values.expand(4, -1)
    saved = []
    for net in (plain, recomputed):
        count = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: count.append(1) or t, lambda t: t):
            loss = net(ids, labels=ids.gather(1, positions), label_positions=positions)["loss"]
        loss.backward()
        saved.append(len(count))
    assert saved[1] < saved[0]  # the blocks' activations are not kept for the backward
    for (name, a), b in zip(plain.named_parameters(), recomputed.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7), name
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in recomputed.named_parameters()]


@pytest.mark.parametrize("argv,message", [
    (["--grow", "compound"],
     "--grow needs --shard ddp: the grow operators read and write full weight tensors"),
    (["--positions", "sinusoidal"],
     "--positions sinusoidal needs --shard ddp: its learned scale is a scalar"),
])
def test_fsdp_refuses_what_it_cannot_shard_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        flags.parse_args(["--max-steps", "3", "--shard", "fsdp", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("train.py: error:") and message in err
