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
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import checkpoint
import ema
import flags
import model
import muon
import parallel
import train
from conftest import read_log
from test_train import ROOT, TINY, make_losses_non_finite, run, weights

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


def held_out_losses(folder):
    """The held-out losses in folder's log before training and halfway (--eval-every 0.5): the
    second one is the weights' average's (ema.py)."""
    return [r["val_loss"] for r in read_log(folder) if r["kind"] == "eval" and r["progress"] < 1]


def saved_shards(folder, tmp_path):
    """A Distributed Checkpoint folder as one plain dict ("model", "optimizer", "average")."""
    whole = tmp_path / "whole.pt"
    dcp_to_torch_save(folder, whole)
    return torch.load(whole, weights_only=False)


# --- FSDP against one process, and against itself after a kill ---------------------------

def test_fsdp_on_two_ranks_equals_one_process_with_the_same_global_batch(cache, straight, tmp_path):
    out, output = straight
    # under --shard fsdp the default Muon becomes AdamW and the default depth growth none
    # (planning.choose_defaults), so the one process it is compared with runs the same; both keep
    # the weights' average (ema.py), which every held-out loss scores
    single = run(cache, tmp_path / "single", "--max-steps", "12", "--batch-ramp", "0",
                 "--eval-every", "0.5", "--micro-batch", "8", "--optimizer", "adamw",
                 "--grow", "none")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["tokens"] == single["tokens"] == 12 * 256
    assert "this run: fsdp, activations checkpointed" in output
    assert json.loads((out / "args.json").read_text())["ema"] == 0.99
    assert max_difference(weights(tmp_path / "single" / "final"), weights(out / "final")) < 1e-5
    # halfway, the average (the 2 ranks' shards of it) scores as one process's does
    fsdp_losses, single_losses = held_out_losses(out), held_out_losses(tmp_path / "single")
    assert len(fsdp_losses) == 2 and abs(fsdp_losses[1] - single_losses[1]) < 1e-5
    # final/ is model.py's plain format.
    assert model.load_model(out / "final").config["n_layers"] == 2


def test_an_fsdp_run_killed_and_resumed_ends_with_the_same_weights(cache, straight, killed,
                                                                   tmp_path):
    out = resumable_copy(killed, tmp_path / "run")
    dcp = out / "checkpoint.dcp"
    assert (dcp / "run.pt").exists() and (dcp / ".metadata").exists()
    # the checkpoint holds the weights' average beside the weights, by name, and its count
    saved = saved_shards(dcp, tmp_path)
    assert saved["average"].keys() == saved["model"].keys()
    assert any(not torch.equal(saved["average"][k], saved["model"][k]) for k in saved["model"])
    assert checkpoint.load(str(dcp))["average"] == {"decay": 0.99, "updates": 3}
    wait(launch(cache, out, 2, "--resume"), out)
    assert json.loads((out / "summary.json").read_text())["steps"] == 12
    a, b = weights(straight[0] / "final"), weights(out / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert held_out_losses(out) == held_out_losses(straight[0])  # the same average at step 6

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
    # The average was resharded too: halfway it scores as in one process that trained from the
    # start. (One rank evaluates micro-batch x --eval-batches sequences, two ranks twice that:
    # the one process evaluates at the resumed run's micro-batch.)
    micro_batch = json.loads((out / "args.json").read_text())["micro_batch"]
    one = run(cache, tmp_path / "one", "--max-steps", "12", "--batch-ramp", "0", "--eval-every",
              "0.5", "--micro-batch", str(micro_batch), "--optimizer", "adamw", "--grow", "none")
    assert one["steps"] == 12
    assert abs(held_out_losses(out)[1] - held_out_losses(tmp_path / "one")[1]) < 1e-5


def test_an_fsdp_run_that_diverges_saves_the_last_good_checkpoints_average(cache, tmp_path,
                                                                          monkeypatch, capsys):
    make_losses_non_finite(monkeypatch, {5, 6, 7})
    with pytest.raises(SystemExit) as stop:  # FSDP over a group of one rank, in this process
        run(cache, tmp_path, "--shard", "fsdp", "--max-steps", "20", "--checkpoint-steps", "3",
            "--max-bad-steps", "3")
    assert stop.value.code == 1 and "restored the last good checkpoint" in capsys.readouterr().out
    good = saved_shards(tmp_path / "checkpoint.dcp", tmp_path)
    restored = weights(tmp_path / "final")
    assert all(torch.equal(restored[k], good["average"][k]) for k in restored)  # as it scored
    assert not all(torch.equal(restored[k], good["model"][k]) for k in restored)


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


# --- the weights' average on sharded weights ------------------------------------------------

# On each rank: a two-layer net sharded as train.py shards it (the first layer a unit of its own,
# the second in the root unit, as the embedding is), one step and one update of the average, then
# evaluations with the average swapped in and out; the same on an unsharded copy. Rank 0 prints
# the outputs.
AVERAGE_ON_TWO_RANKS = """
import json, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
import ema
dist.init_process_group("gloo")
torch.manual_seed(0)
sharded = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 3))
plain = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 3))
plain.load_state_dict(sharded.state_dict())
fully_shard(sharded[0]); fully_shard(sharded)
x, outputs = torch.randn(2, 8, generator=torch.Generator().manual_seed(1)), {}
for name, net in (("sharded", sharded), ("plain", plain)):
    average = ema.start(net, 0.9)
    with torch.no_grad():
        for p in ema.parameters(net):
            p.mul_(2.0)                                     # a step: the weights move
        ema.update(average, net)                            # average = 0.1 old + 0.9 new
        trained = net(x)
        with ema.swapped_in(net, average):
            first = net(x)
        after = net(x)
        with ema.swapped_in(net, average):
            second = net(x)
    outputs[name] = [t.tolist() for t in (trained, first, after, second)]
if dist.get_rank() == 0:
    print(json.dumps(outputs))
# Both ranks leave the group together: a rank that exits while gloo's threads still talk to the
# other can abort ("terminate called without an active exception", exit -6).
dist.barrier()
dist.destroy_process_group()
"""


def test_the_average_of_sharded_weights_evaluates_as_an_unsharded_ones(tmp_path):
    # FSDP keeps the root unit's weights gathered after a forward with no backward: swapping the
    # average in and out must let them go, or the next forward reuses the average's
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", AVERAGE_ON_TWO_RANKS], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    logs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    outputs = json.loads(logs[0].strip().splitlines()[-1])
    trained, first, after, second = (torch.tensor(t) for t in outputs["sharded"])
    assert not torch.allclose(first, trained, atol=1e-3)        # the average is another model
    assert torch.equal(first, second) and torch.equal(after, trained)
    for sharded, plain in zip(outputs["sharded"], outputs["plain"], strict=True):
        assert torch.allclose(torch.tensor(sharded), torch.tensor(plain), atol=1e-6)


# --- the arithmetic, activation checkpointing and the flags ------------------------------

def test_memory_per_rank_divides_parameters_gradients_and_adam_by_the_world_under_fsdp():
    cfg = model.make_config("base", vocab_size=32768)
    n = model.count_params(cfg)
    assert parallel.memory_per_rank(cfg, 8, "ddp") == {"params": 4 * n, "grads": 4 * n,
                                                       "optimizer": 8 * n, "average": 0,
                                                       "total": 16 * n}
    fsdp = parallel.memory_per_rank(cfg, 8, "fsdp", ema=0.99)
    assert fsdp["params"] == -(-4 * n // 8) and fsdp["optimizer"] == -(-8 * n // 8)
    assert fsdp["average"] == -(-4 * n // 8)
    assert fsdp["total"] == pytest.approx(20 * n / 8, abs=4)


@pytest.mark.parametrize("neuron_beta2", [0.0, 0.95])
def test_memory_per_rank_is_the_bytes_a_muon_step_and_the_average_hold(neuron_beta2):
    """Counted from the real thing: after one MuonAdamW step (NorMuon's rows or not) on a model with
    biases and a head transform, its optimizer state and the weights' average hold exactly the
    bytes memory_per_rank says (AdamW's step counters aside)."""
    cfg = model.make_config("tiny", vocab_size=512, max_seq_len=32, bias=True,
                            head_transform=True)
    net = model.build_model(cfg)
    optimizer = muon.MuonAdamW(muon.param_groups(net, 0.01), lr=1e-3,
                               neuron_beta2=neuron_beta2)
    ids = torch.randint(0, 500, (2, 32))
    net(ids, labels=ids)["loss"].backward()
    optimizer.step()
    average = ema.start(net, 0.99)

    def held(tensors):
        return sum(t.numel() * t.element_size() for t in tensors)
    state = held(t for s in optimizer.state.values() for key, t in s.items() if key != "step")
    memory = parallel.memory_per_rank(cfg, 1, "ddp", optimizer="muon",
                                      neuron_beta2=neuron_beta2, ema=0.99)
    assert memory["optimizer"] == state
    assert memory["average"] == held(average["weights"]) == 4 * model.count_params(cfg)
    assert memory["params"] == held(net.parameters()) == memory["grads"]
    # Muon's single momentum makes its state smaller than AdamW's two moments.
    assert state < parallel.memory_per_rank(cfg, 1, "ddp")["optimizer"]


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
