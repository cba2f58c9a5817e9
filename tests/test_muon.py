"""Specification of muon.py and --optimizer muon: python -m pytest -q tests/test_muon.py

Muon on the blocks' matrices, AdamW on the rest, in one optimizer: the same step as torch's own
Muon and AdamW, a state that round-trips, resumes bit-exactly, grows with the model, and gives
the same weights under DDP on two ranks as in one process.
"""
import argparse
import copy
import functools
import json

import pytest
import torch

import conftest
import grow
import muon
import test_train
import train
from conftest import seeded_model
from test_grow import train_steps  # a few steps on one fixed batch; returns the losses
from test_train import killed_at_its_first_checkpoint, run, spawn, weights


def tiny_muon(net, lr=1e-2, weight_decay=0.01, neuron_beta2=0.0):
    return muon.MuonAdamW(muon.param_groups(net, weight_decay), lr=lr, neuron_beta2=neuron_beta2)


# --- the update -------------------------------------------------------------------------

def test_newton_schulz_brings_every_singular_value_near_one():
    g = torch.randn(48, 32, generator=torch.Generator().manual_seed(0))
    g = g * torch.logspace(-1, 1, 32)  # columns scaled over two decades
    s_g = torch.linalg.svdvals(g)
    assert s_g.min() < 0.005 * s_g.max()  # a condition number over 200
    s = torch.linalg.svdvals(muon.orthogonalize(g))
    assert s.min() > 0.6 and s.max() < 1.25  # about U V^T: Jordan et al.'s quintic gives 0.7-1.2
    u, _, vt = torch.linalg.svd(g, full_matrices=False)
    cosine = (muon.orthogonalize(g) * (u @ vt)).sum() / (u @ vt).norm() ** 2
    assert cosine > 0.85  # and it points where U V^T does


def test_fewer_newton_schulz_iterations_orthogonalize_less_and_the_optimizer_uses_its_count():
    """ns_steps (train.py's --ns-steps) is the number of iterations MuonAdamW runs: each one pulls
    the singular values further toward one, and the step moves the weights by exactly what
    orthogonalize gives at that count."""
    g = torch.randn(48, 32, generator=torch.Generator().manual_seed(0))
    g = g * torch.logspace(-1, 1, 32)
    smallest = [torch.linalg.svdvals(muon.orthogonalize(g, steps=n)).min() for n in (1, 3, 5)]
    assert smallest[0] < smallest[1] < smallest[2]  # the small directions grow with each iteration
    for steps in (3, 5):
        w = torch.zeros(48, 32, requires_grad=True)
        w.grad = g.clone()
        opt = muon.MuonAdamW([{"params": [w], "use_muon": True, "weight_decay": 0.0}], lr=0.1,
                             momentum=0.0, ns_steps=steps)
        opt.step()
        expected = -0.1 * 0.2 * 48 ** 0.5 * muon.orthogonalize(g, steps=steps)
        torch.testing.assert_close(w.detach(), expected)


def test_matrices_of_one_shape_step_together_as_each_would_alone():
    """MuonAdamW orthogonalizes the matrices of one shape in one batch: every matrix moves as it
    would in an optimizer of its own, and matrices of other shapes step beside them."""
    torch.manual_seed(0)
    weights = [torch.randn(48, 32), torch.randn(48, 32), torch.randn(32, 16)]
    alone = [w.clone() for w in weights]
    together = muon.MuonAdamW([{"params": weights, "use_muon": True, "weight_decay": 0.1}],
                              lr=0.02, momentum=0.7)
    each = [muon.MuonAdamW([{"params": [w], "use_muon": True, "weight_decay": 0.1}], lr=0.02,
                           momentum=0.7) for w in alone]
    for _ in range(3):
        for w, w_alone in zip(weights, alone):
            w.grad = torch.randn_like(w)
            w_alone.grad = w.grad.clone()
        together.step()
        for optimizer in each:
            optimizer.step()
    for w, w_alone in zip(weights, alone):
        assert torch.allclose(w, w_alone, atol=1e-6)
    g = torch.randn(3, 48, 32)
    batched = muon.orthogonalize(g)                               # (3, 48, 32): each on its own
    assert torch.allclose(batched, torch.stack([muon.orthogonalize(m) for m in g]), atol=1e-5)


def test_muon_half_takes_torch_optim_muons_step_and_adamw_half_takes_adamws():
    torch.manual_seed(0)
    w, e = torch.randn(48, 32), torch.randn(10, 8)
    w_ref, e_ref = w.clone(), e.clone()
    ours = muon.MuonAdamW([{"params": [w], "use_muon": True, "weight_decay": 0.1},
                           {"params": [e], "use_muon": False, "weight_decay": 0.01}],
                          lr=0.02, ns_dtype=torch.bfloat16)  # torch's Newton-Schulz runs in bf16
    muon_ref = torch.optim.Muon([w_ref], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    adamw_ref = torch.optim.AdamW([e_ref], lr=0.02, betas=(0.9, 0.98), eps=1e-12,
                                  weight_decay=0.01)
    start = w.clone()
    for _ in range(5):
        g, ge = torch.randn(48, 32), torch.randn(10, 8)
        w.grad, w_ref.grad, e.grad, e_ref.grad = g, g.clone(), ge, ge.clone()
        for optimizer in (ours, muon_ref, adamw_ref):
            optimizer.step()
    moved = (w_ref - start).abs().max().item()
    assert moved > 0.05
    assert (w - w_ref).abs().max().item() < 0.02 * moved  # bf16 rounds in another order
    assert torch.equal(e, e_ref)


def test_muons_update_has_adamws_rms_so_one_learning_rate_serves_both():
    w = torch.zeros(64, 256, requires_grad=True)
    optimizer = muon.MuonAdamW([{"params": [w], "use_muon": True}], lr=1e-2)
    w.grad = torch.randn(64, 256)
    optimizer.step()
    rms = w.detach().pow(2).mean().sqrt().item() / 1e-2
    assert 0.12 < rms < 0.28  # Liu et al. 2025 match AdamW's typical update RMS of 0.2-0.4 x lr


def test_update_rms_scales_muons_step_and_leaves_adamws_alone():
    def steps(update_rms):
        torch.manual_seed(0)
        w, b = torch.zeros(64, 256, requires_grad=True), torch.zeros(64, requires_grad=True)
        optimizer = muon.MuonAdamW([{"params": [w], "use_muon": True}, {"params": [b]}], lr=1e-2,
                                   update_rms=update_rms)
        w.grad, b.grad = torch.randn(64, 256), torch.randn(64)
        optimizer.step()
        return w.detach(), b.detach()
    (w1, b1), (w2, b2) = steps(0.2), steps(0.5)
    assert torch.allclose(w2, 2.5 * w1, rtol=1e-5) and torch.equal(b1, b2)


# --- NorMuon: each output row's step evened out -----------------------------------------

def test_normuon_gives_every_row_the_same_step_and_keeps_the_updates_norm():
    rows = torch.linspace(0.2, 2.0, 48).view(48, 1)                  # rows ten times apart
    g = torch.randn(1, 48, 32, generator=torch.Generator().manual_seed(0)) * rows
    direction = muon.orthogonalize(g)                                 # (1, 48, 32)
    row_rms = direction[0].square().mean(dim=-1).sqrt()
    assert row_rms.max() > 3 * row_rms.min()  # orthogonalizing a tall matrix leaves rows unequal
    state = {}
    evened = muon.normalize_neurons(direction, [state], beta2=0.95)
    row_rms = evened[0].square().mean(dim=-1).sqrt()
    assert row_rms.max() < 1.001 * row_rms.min()  # the first step: one RMS for every row
    assert torch.allclose(evened.norm(), direction.norm(), rtol=1e-5)  # lr means what it meant
    first = direction[0].square().mean(dim=-1, keepdim=True)          # (48, 1)
    assert torch.allclose(state["neuron_second_moment"], 0.05 * first)
    second = muon.orthogonalize(torch.randn(1, 48, 32))
    muon.normalize_neurons(second, [state], beta2=0.95)
    expected = 0.95 * 0.05 * first + 0.05 * second[0].square().mean(dim=-1, keepdim=True)
    assert torch.allclose(state["neuron_second_moment"], expected)    # a running mean, no reset


def test_normuon_off_is_plain_muon_and_on_moves_the_weights_otherwise():
    def step(neuron_beta2):
        torch.manual_seed(0)
        w = torch.randn(48, 32)
        optimizer = muon.MuonAdamW([{"params": [w], "use_muon": True}], lr=1e-2,
                                   neuron_beta2=neuron_beta2)
        for _ in range(2):
            w.grad = torch.randn(48, 32) * torch.linspace(0.2, 2.0, 48).view(48, 1)
            optimizer.step()
        return w, optimizer
    (plain, plain_opt), (normuon, normuon_opt) = step(0.0), step(0.95)
    assert "neuron_second_moment" not in plain_opt.state[plain]
    assert normuon_opt.state[normuon]["neuron_second_moment"].shape == (48, 1)
    assert not torch.allclose(plain, normuon, atol=1e-4)


def test_the_blocks_matrices_go_to_muon_and_everything_else_to_adamw():
    net = seeded_model(conftest.tiny(positions="learned"))
    groups = muon.param_groups(net, weight_decay=0.01)
    names = {id(p): n for n, p in net.named_parameters()}
    on_muon = {names[id(p)] for p in groups[0]["params"]}
    assert on_muon == {n for n, p in net.named_parameters() if n.startswith("blocks.")
                       and p.dim() == 2}
    assert {names[id(p)] for p in groups[1]["params"]} == {"tok_emb.weight", "pos_emb.weight"}
    assert all(p.dim() < 2 for p in groups[2]["params"]) and groups[2]["weight_decay"] == 0.0
    owned = [id(p) for g in groups for p in g["params"]]
    assert sorted(owned) == sorted(names) and len(set(owned)) == len(owned)


@pytest.mark.parametrize("neuron_beta2", [0.0, 0.95])
def test_a_tiny_model_learns_and_the_state_dict_round_trips(neuron_beta2):
    net, twin = seeded_model(conftest.tiny()), seeded_model(conftest.tiny())
    optimizer = tiny_muon(net, neuron_beta2=neuron_beta2)
    losses = train_steps(net, optimizer, 20)
    assert losses[-1] < 0.5 * losses[0]
    twin.load_state_dict(net.state_dict())
    restored = tiny_muon(twin, neuron_beta2=neuron_beta2)
    restored.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # as if read from disk
    assert train_steps(net, optimizer, 3, seed=2) == train_steps(twin, restored, 3, seed=2)
    assert torch.equal(net.blocks[0].qkv.weight, twin.blocks[0].qkv.weight)


def test_an_optimizer_state_saved_before_normuon_loads_and_steps_as_plain_muon():
    net, twin = seeded_model(conftest.tiny()), seeded_model(conftest.tiny())
    optimizer = tiny_muon(net)
    train_steps(net, optimizer, 2)
    saved = copy.deepcopy(optimizer.state_dict())
    for group in saved["param_groups"]:
        del group["neuron_beta2"]  # as a checkpoint of the eighteenth session holds them
    twin.load_state_dict(net.state_dict())
    restored = tiny_muon(twin)
    restored.load_state_dict(saved)
    assert train_steps(net, optimizer, 2, seed=2) == train_steps(twin, restored, 2, seed=2)


def test_growth_carries_muons_momentum_and_preserves_the_function():
    net = seeded_model(conftest.tiny(max_seq_len=16))
    optimizer = tiny_muon(net)
    train_steps(net, optimizer, 2)
    grown, mapping = grow.grow_model(net, {**net.config, "ffn_dim": 64})
    new_opt = grow.grow_optimizer(optimizer, net, grown, mapping, tiny_muon)
    assert isinstance(new_opt, muon.MuonAdamW)
    old = optimizer.state[net.blocks[0].down.weight]["momentum_buffer"]  # (d, f) = (32, 48)
    new = new_opt.state[grown.blocks[0].down.weight]["momentum_buffer"]  # (32, 64)
    assert torch.equal(new[:, :48], old) and torch.count_nonzero(new[:, 48:]) == 0
    assert_grown_model_computes_the_same_and_trains(net, grown, new_opt)


def neuron_moment(optimizer, net, name):
    """NorMuon's second moment of one parameter's rows, (rows, 1)."""
    return optimizer.state[net.get_parameter(name)]["neuron_second_moment"]


def test_growth_carries_normuons_row_moments_with_the_rows():
    net = seeded_model(conftest.tiny(max_seq_len=16))
    normuon = functools.partial(tiny_muon, neuron_beta2=0.95)
    optimizer = normuon(net)
    train_steps(net, optimizer, 2)
    grown, mapping = grow.grow_model(net, {**net.config, "ffn_dim": 64})
    new_opt = grow.grow_optimizer(optimizer, net, grown, mapping, normuon)
    up = "blocks.0.up.weight"  # (2 f, d): the FFN's units are its rows, 2 x 48 -> 2 x 64
    rows = mapping[up]["dims"][0]["index"]  # (128,) the old row each new row copies
    assert torch.equal(neuron_moment(new_opt, grown, up), neuron_moment(optimizer, net, up)[rows])
    assert rows.numel() == 128 and not torch.equal(rows, torch.arange(128))
    down = "blocks.0.down.weight"  # (d, f): its rows, the residual stream's, did not grow
    assert torch.equal(neuron_moment(new_opt, grown, down), neuron_moment(optimizer, net, down))
    assert_grown_model_computes_the_same_and_trains(net, grown, new_opt)


def assert_grown_model_computes_the_same_and_trains(net, grown, new_opt):
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    net.eval(), grown.eval()
    with torch.no_grad():
        assert torch.allclose(net(ids)["logits"], grown(ids)["logits"], atol=1e-5)
    grown.train()
    assert all(torch.isfinite(torch.tensor(train_steps(grown, new_opt, 2))))


# --- train.py --optimizer muon -----------------------------------------------------------

def settings(**overrides):
    return argparse.Namespace(**{"optimizer": "muon", "shard": "none", "lr": 1e-3,
                                 "momentum": 0.95, "muon_rms": 0.2, "neuron_beta2": 0.0,
                                 "ns_steps": 5, "betas": [0.9, 0.98], "eps": 1e-12,
                                 "weight_decay": 0.01,
                                 **overrides})


def test_train_py_builds_the_optimizer_it_is_asked_for():
    net, cpu = seeded_model(conftest.tiny()), torch.device("cpu")
    hw = train.Hardware(cpu, rank=0, world=1, dtype=torch.float32)
    assert isinstance(train.make_optimizer(net, settings(), hw), muon.MuonAdamW)
    assert isinstance(train.make_optimizer(net, settings(optimizer="adamw"), hw),
                      torch.optim.AdamW)
    assert train.make_optimizer(net, settings(), hw).ns_steps == muon.NS_STEPS == 5
    assert train.make_optimizer(net, settings(ns_steps=3), hw).ns_steps == 3


def test_muon_gets_four_times_adamws_learning_rate_and_becomes_adamw_under_fsdp():
    def chosen(*argv):
        return test_train.chosen(["--max-steps", "1", "--model", "mini", *argv],
                                 flops_per_s=1e10, on_gpu=False)
    adamw_lr = 1e-3 * 768 / 256                                   # the 1/width rule at mini
    assert chosen("--optimizer", "adamw")["lr"] == adamw_lr
    assert chosen("--optimizer", "muon")["lr"] == 4 * adamw_lr
    assert "optimizer" not in chosen("--optimizer", "muon")
    under_fsdp = chosen("--optimizer", "muon", "--shard", "fsdp")
    assert under_fsdp["optimizer"] == "adamw" and under_fsdp["lr"] == adamw_lr
    assert "lr" not in chosen("--optimizer", "muon", "--lr", "3e-3")          # a given lr wins


def neuron_flag(normuon):
    """train.py's flag for NorMuon (its default) or plain Muon."""
    return ["--neuron-beta2", "0.95" if normuon else "0"]


@pytest.mark.parametrize("normuon", [False, True], ids=["muon", "normuon"])
def test_a_muon_run_killed_and_resumed_ends_with_the_same_weights(sample_cache, tmp_path, normuon):
    flags = ["--optimizer", "muon", "--max-steps", "200", "--checkpoint-steps", "10",
             "--log-every", "50", *neuron_flag(normuon)]
    straight = run(sample_cache, tmp_path / "straight", *flags)
    assert straight["final_val_loss"] < 5.9  # from ln 512 = 6.2
    killed_at_its_first_checkpoint(sample_cache, tmp_path / "killed", *flags)
    summary = run(sample_cache, tmp_path / "killed", "--resume")
    assert summary["steps"] == 200
    a, b = weights(tmp_path / "straight" / "final"), weights(tmp_path / "killed" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("normuon", [False, True], ids=["muon", "normuon"])
def test_a_muon_run_grows_and_keeps_muon(sample_cache, tmp_path, normuon):
    run(sample_cache, tmp_path / "grown", "--optimizer", "muon", "--max-steps", "40",
        "--grow", "0:layers=1; 0.5:layers=2", *neuron_flag(normuon))
    events = [e for e in conftest.read_log(tmp_path / "grown") if e.get("kind") == "grow"]
    assert len(events) == 1 and events[0]["optimizer"] == "carry/zero"
    saved = torch.load(tmp_path / "grown" / "checkpoint.pt", weights_only=False)["optimizer"]
    hidden = saved["param_groups"][0]
    assert hidden["use_muon"] and len(hidden["params"]) == 2 * 4  # 2 layers x qkv, out, up, down
    assert all("momentum_buffer" in saved["state"][i] for i in hidden["params"])
    rows = [saved["state"][i].get("neuron_second_moment") for i in hidden["params"]]
    assert all(r is not None for r in rows) if normuon else all(r is None for r in rows)


@pytest.mark.parametrize("normuon", [False, True], ids=["muon", "normuon"])
def test_muon_under_ddp_on_two_ranks_equals_one_process(sample_cache, tmp_path, normuon):
    flags = ["--optimizer", "muon", "--max-steps", "5", "--batch-ramp", "0",
             "--batch-tokens", "256", "--eval-every", "1",
             *neuron_flag(normuon)]
    run(sample_cache, tmp_path / "single", *flags, "--micro-batch", "8")
    proc = spawn(sample_cache, tmp_path / "ddp", *flags, "--micro-batch", "4",
                 launcher=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"))
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-2000:]
    assert json.load(open(tmp_path / "ddp" / "summary.json"))["world_size"] == 2
    a, b = weights(tmp_path / "single" / "final"), weights(tmp_path / "ddp" / "final")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5

