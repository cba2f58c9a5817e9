"""Specification of grow.py: python -m pytest -q tests/test_grow.py"""
import re

import pytest
import torch

import conftest
import grow
import model
import train
from conftest import CRAMMING_ADAMW, POSITIONS, read_log, seeded_model


def tiny(**overrides):
    """conftest's tiny config with max_seq_len 16 instead of 32, so that tests can grow it to 32."""
    return conftest.tiny(**{"max_seq_len": 16, **overrides})


def perturbed_model(cfg, seed=0):
    """seeded_model with norm affines and biases moved away from 1/0.

    Copies that forget to scale them then show."""
    net = seeded_model(cfg, seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return net


def batch(B=2, T=12, vocab=100, seed=1):
    ids = torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, T - 3:] = 0                                            # right padding in the second row
    return ids, mask


def logit_change(cfg, growth, **options):
    """max |delta logits| between a model and its grown copy on the same padded batch.

    In fp32, in eval mode, on the CPU."""
    net = perturbed_model(cfg)
    grown, _ = grow.grow_model(net, {**cfg, **growth}, **options)
    ids, mask = batch()
    with torch.no_grad():
        before = net(ids, attention_mask=mask)["logits"]
        after = grown(ids, attention_mask=mask)["logits"]
        return (before - after).abs().max().item()


def adamw(net):
    return torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)


def train_steps(net, optimizer, steps, seed=1):
    """A few steps on one fixed batch; returns the losses."""
    ids, _ = batch(seed=seed)
    net.train()
    losses = []
    for _ in range(steps):
        loss = net(ids, labels=ids)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# --- schedules ------------------------------------------------------------------------

def test_schedule_example_parses_into_full_configs():
    stages = grow.parse_schedule("0:n_layers=4,d_model=384,max_seq_len=64; "
                                 "0.25:n_layers=8,max_seq_len=128; 0.5:n_layers=16,d_model=768",
                                 model.make_config("base"))
    shapes = [(s["at"], s["config"]["n_layers"], s["config"]["d_model"], s["config"]["n_heads"],
               s["config"]["max_seq_len"]) for s in stages]
    # The heads follow the hidden size.
    assert shapes == [(0.0, 4, 384, 6, 64), (0.25, 8, 384, 6, 128), (0.5, 16, 768, 12, 128)]
    assert stages[-1]["config"] == model.make_config("base")


@pytest.mark.parametrize("preset", ["compound", "gstack"])
def test_presets_start_small_and_end_at_the_target(preset):
    target = model.make_config("base")
    stages = grow.parse_schedule(preset, target)
    assert stages[0]["at"] == 0.0 and len(stages) >= 2
    assert stages[-1]["config"] == target
    assert model.count_params(stages[0]["config"]) < 0.5 * model.count_params(target)
    assert stages[0]["config"]["n_layers"] == 4                   # L/4 in both presets


def test_depth_doubles_a_quarter_of_the_layers_at_7_and_15_percent_or_where_at_says():
    def depths(text, n_layers=16):
        target = dict(model.make_config("base"), n_layers=n_layers)
        return [(s["at"], s["config"]["n_layers"]) for s in grow.parse_schedule(text, target)]
    assert depths("depth") == [(0.0, 4), (0.07, 8), (0.15, 16)]      # record 8
    # One fraction doubles once: what record 7's runs saved (depth@0.15) keeps its meaning.
    for text, at in (("depth@0.15", 0.15), ("depth@0.2", 0.2), ("depth@0.3", 0.3)):
        assert depths(text) == [(0.0, 8), (at, 16)]
    assert depths("depth@0.1,0.2,0.3") == [(0.0, 2), (0.1, 4), (0.2, 8), (0.3, 16)]
    # A doubling that would start below one layer is left out; the full depth keeps its fraction.
    assert depths("depth", 4) == [(0.0, 1), (0.07, 2), (0.15, 4)]
    assert depths("depth", 3) == [(0.0, 1), (0.15, 3)]
    assert depths("depth", 2) == [(0.0, 1), (0.15, 2)]
    assert depths("depth", 6) == [(0.0, 1), (0.07, 3), (0.15, 6)]
    target = model.make_config("base")
    for bad, words in (("depth@1.5", "with 0 <= AT < 1"), ("depth@soon", "AT a fraction"),
                       ("depth@0", "increasing order of AT"),
                       ("depth@0.15,0.07", "increasing order of AT"),
                       ("compound@0.3", "only the depth preset takes @AT")):
        with pytest.raises(ValueError, match=re.escape(words)):
            grow.parse_schedule(bad, target)


def test_the_older_short_schedule_keys_still_work_as_aliases():
    base = model.make_config("base")
    old_keys = "0:layers=4,hidden=384,heads=6,ffn=768,seq=64; 0.5:layers=16,hidden=768"
    new_keys = ("0:n_layers=4,d_model=384,n_heads=6,ffn_dim=768,max_seq_len=64; "
                "0.5:n_layers=16,d_model=768")
    assert grow.parse_schedule(old_keys, base) == grow.parse_schedule(new_keys, base)


def test_describe_prints_a_shape_in_the_config_names_as_a_valid_schedule_stage():
    cfg = model.make_config("mini")
    assert grow.describe(cfg) == "n_layers=4 d_model=256 n_heads=4 ffn_dim=512 max_seq_len=128"
    stage = grow.parse_schedule("0:" + grow.describe(cfg).replace(" ", ","), cfg)[0]
    assert stage["config"] == cfg


@pytest.mark.parametrize("text,message", [
    ("0.1:layers=2", "must start at 0"),
    ("0:layers=2; 0.5:layers=4; 0.3:layers=8", "increasing order"),
    ("0:layers=4; 0.5:layers=2", "shrinks"),
    ("0:depth=4", "bad item"),
    ("0:layers=two", "bad item"),
    ("0:layers=2; 1.5:layers=4", "0 <= AT < 1"),
    ("0:hidden=32; 0.5:hidden=64,heads=4", "head size"),
    ("0:hidden=30", "multiple of the head size"),
])
def test_bad_schedules_raise_one_line_errors_naming_the_stage(text, message):
    with pytest.raises(ValueError, match=message) as info:
        grow.parse_schedule(text, tiny())
    assert "grow schedule" in str(info.value) and "\n" not in str(info.value)


def test_rewarm_factor_ramps_linearly_from_the_growth():
    assert grow.rewarm_factor(0.50, 0.5, 0.02) == 0.0
    assert grow.rewarm_factor(0.51, 0.5, 0.02) == pytest.approx(0.5)
    assert grow.rewarm_factor(0.60, 0.5, 0.02) == 1.0
    assert grow.rewarm_factor(0.50, 0.5, 0.0) == 1.0


# --- function preservation: exactly what grow.preserves_function claims ----------------

@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_ffn_growth_preserves_logits(positions, objective):
    cfg = tiny(positions=positions, objective=objective)
    assert grow.preserves_function(cfg, {**cfg, "ffn_dim": 80})
    # 48 -> 80: a non-integer factor is still exact.
    assert logit_change(cfg, {"ffn_dim": 80}) <= 1e-5


@pytest.mark.parametrize("norm,norm_position,activation,bias,tie", [
    ("layernorm", "post", "gelu", True, True), ("rmsnorm", "pre", "swiglu", False, False),
    ("layernorm", "pre", "gelu", True, False), ("rmsnorm", "post", "geglu", True, True),
    ("layernorm", "pre", "relu2", False, True)])
def test_ffn_growth_preserves_logits_for_every_block_option(norm, norm_position, activation, bias,
                                                            tie):
    cfg = tiny(norm=norm, norm_position=norm_position, activation=activation, bias=bias,
               tie_embeddings=tie)
    assert logit_change(cfg, {"ffn_dim": 96}) <= 1e-5


@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_zero_output_layers_preserve_logits(positions, objective):
    cfg = tiny(positions=positions, objective=objective)
    assert logit_change(cfg, {"n_layers": 5}, method="zero") <= 1e-5


@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_msg_gated_layers_preserve_logits_before_training(norm_position, objective):
    cfg = tiny(objective=objective, norm_position=norm_position)
    assert logit_change(cfg, {"n_layers": 4}, method="msg") <= 1e-5


@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("positions", ["learned", "rotary", "none"])
@pytest.mark.parametrize("norm,tie", [("layernorm", True), ("rmsnorm", True), ("layernorm", False)])
def test_hidden_growth_by_an_integer_factor_preserves_logits(positions, objective, norm, tie):
    cfg = tiny(positions=positions, objective=objective, norm=norm, tie_embeddings=tie, bias=True)
    for d, heads in [(64, 8), (96, 12)]:                          # x2 and x3, head size 8 kept
        assert grow.preserves_function(cfg, {**cfg, "d_model": d, "n_heads": heads})
        assert logit_change(cfg, {"d_model": d, "n_heads": heads}) <= 1e-5


def test_qk_norm_survives_every_kind_of_growth():
    # QK-norm has no parameters and normalizes each head over its size, which growth keeps.
    cfg = tiny(positions="rotary", qk_norm=True, activation="relu2")
    growth = {"n_layers": 4, "d_model": 64, "n_heads": 8, "ffn_dim": 100, "max_seq_len": 32}
    assert grow.preserves_function(cfg, {**cfg, **growth}, method="zero")
    assert logit_change(cfg, growth, method="zero") <= 1e-5


def test_value_residual_survives_function_preserving_growth():
    # No parameters; inserted identity blocks leave the first block first, and new heads' values
    # are copies like their first-block counterparts'.
    cfg = tiny(positions="rotary", value_residual=True)
    growth = {"n_layers": 4, "d_model": 64, "n_heads": 8, "ffn_dim": 100}
    assert logit_change(cfg, growth, method="zero") <= 1e-5
    assert logit_change(cfg, {"n_layers": 4}, method="msg") <= 1e-5


@pytest.mark.parametrize("positions,reason", [
    ("sinusoidal", "a width-64 model has other sinusoids"),
    ("alibi", "ALiBi slopes depend on the head count")])
def test_hidden_growth_is_not_preserving_with_sinusoidal_or_alibi_positions(positions, reason):
    cfg = tiny(positions=positions)
    assert not grow.preserves_function(cfg, {**cfg, "d_model": 64, "n_heads": 8})
    # Far above the 1e-5 tolerance.
    assert logit_change(cfg, {"d_model": 64, "n_heads": 8}) > 1e-4, reason


def test_hidden_growth_by_a_non_integer_factor_is_only_approximate():
    cfg = tiny(positions="rotary")  # 32 -> 48: half the coordinates get 2 copies
    assert not grow.preserves_function(cfg, {**cfg, "d_model": 48, "n_heads": 6})
    # LayerNorm statistics shift.
    assert 1e-3 < logit_change(cfg, {"d_model": 48, "n_heads": 6}) < 1.0


@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_sequence_length_growth_preserves_logits_on_short_inputs(positions, objective):
    cfg = tiny(positions=positions, objective=objective)
    assert logit_change(cfg, {"max_seq_len": 64}) <= 1e-5


def test_compound_growth_of_every_dimension_at_once_preserves_logits():
    cfg = tiny(positions="learned")
    growth = {"n_layers": 4, "d_model": 64, "n_heads": 8, "ffn_dim": 100, "max_seq_len": 32}
    assert grow.preserves_function(cfg, {**cfg, **growth}, method="zero")
    assert logit_change(cfg, growth, method="zero") <= 1e-5


def test_learned_position_rows_are_kept_and_new_rows_copy_old_ones():
    net = perturbed_model(tiny(positions="learned"))
    grown, _ = grow.grow_model(net, {**net.config, "max_seq_len": 40})
    old, new = net.pos_emb.weight, grown.pos_emb.weight
    assert (torch.equal(new[:16], old) and torch.equal(new[16:32], old)
            and torch.equal(new[32:], old[:8]))


def test_noise_changes_the_logits_in_proportion_to_its_size():
    cfg, growth = tiny(positions="rotary"), {"ffn_dim": 96, "d_model": 64, "n_heads": 8}
    assert not grow.preserves_function(cfg, cfg, noise=1e-3)
    small, large = logit_change(cfg, growth, noise=1e-4), logit_change(cfg, growth, noise=1e-3)
    assert 1e-5 < small and 5 < large / small < 20                # O(noise), no longer exact


# --- stacking -------------------------------------------------------------------------

@pytest.mark.parametrize("method,sources", [("stack", [0, 1, 0, 1, 0]),
                                            ("interleave", [0, 0, 0, 1, 1])])
def test_stacking_copies_layers_bitwise(method, sources):
    net = perturbed_model(tiny())
    grown, _ = grow.grow_model(net, {**net.config, "n_layers": 5}, method=method)
    old = net.state_dict()
    for name, t in grown.state_dict().items():
        if name.startswith("blocks."):
            i, rest = name.split(".", 2)[1:]
            src = old[f"blocks.{sources[int(i)]}.{rest}"]
        else:
            src = old[name]
        assert torch.equal(t, src), name
        assert t.data_ptr() != src.data_ptr(), f"{name} aliases the old tensor"
    assert model.count_params(grown.config) == model.count_params(net.config) + 3 * (
        model.count_params(tiny(n_layers=2)) - model.count_params(tiny(n_layers=1)))


def test_stacking_is_not_function_preserving():
    cfg = tiny()
    assert not grow.preserves_function(cfg, {**cfg, "n_layers": 4}, method="stack")
    assert logit_change(cfg, {"n_layers": 4}, method="stack") > 1e-3


def test_zero_insertion_refuses_post_ln():
    with pytest.raises(ValueError, match="pre-LN"):
        grow.grow_model(perturbed_model(tiny(norm_position="post")),
                        tiny(norm_position="post", n_layers=4), method="zero")


def test_hidden_growth_refuses_post_ln():
    with pytest.raises(ValueError, match="norm_position 'pre'"):
        grow.grow_model(perturbed_model(tiny(norm_position="post")),
                        tiny(norm_position="post", d_model=64, n_heads=8), method="zero")


def test_growth_refuses_to_change_anything_but_sizes():
    with pytest.raises(ValueError, match="'positions'"):
        grow.grow_model(perturbed_model(tiny()), tiny(positions="rotary", n_layers=4))


@pytest.mark.parametrize("family", [{"first_attention_norm": False}, {"head_transform": True}])
def test_growth_refuses_the_modernbert_family_it_has_no_rule_for(family):
    with pytest.raises(ValueError, match="no growth rule for ModernBERT"):
        grow.grow_model(perturbed_model(tiny(**family)), tiny(**family, n_layers=4))


# --- the grown model is an ordinary model -----------------------------------------------

def test_grown_config_is_that_of_a_fresh_model_and_round_trips(tmp_path):
    net = perturbed_model(tiny())
    new_cfg = tiny(n_layers=3, d_model=64, n_heads=8, ffn_dim=64, max_seq_len=32)
    grown, _ = grow.grow_model(net, new_cfg, method="msg", ramp=2)
    assert grown.config == model.build_model(new_cfg).config
    with torch.enable_grad():
        for _ in range(2):                                         # open the msg gate fully: c = 1
            grown.train()(batch()[0])
    assert grown.blocks[2].grow_gate.item() == 1.0
    grown.eval()
    model.save_model(grown, str(tmp_path / "grown"))
    loaded = model.load_model(str(tmp_path / "grown"))
    ids, _ = batch()
    with torch.no_grad():
        assert torch.allclose(grown(ids)["logits"], loaded(ids)["logits"], atol=1e-6)


# --- new parts learn ------------------------------------------------------------------

def test_zeroed_output_projections_receive_gradients_and_training_lowers_the_loss():
    net = perturbed_model(tiny())
    grown, mapping = grow.grow_model(net, tiny(n_layers=4), method="zero")
    ids, _ = batch()
    grown.train()(ids, labels=ids)["loss"].backward()
    for i in (1, 3):  # interleave: layers 1 and 3 are the new ones
        block = grown.blocks[i]
        assert (torch.count_nonzero(block.out.weight) == 0
                and torch.count_nonzero(block.down.weight) == 0)
        assert block.out.weight.grad.abs().sum() > 0 and block.down.weight.grad.abs().sum() > 0
    losses = train_steps(grown, adamw(grown), 8)
    assert losses[-1] < losses[0] - 0.1


def test_msg_gate_opens_during_training_and_gated_blocks_learn():
    net = perturbed_model(tiny())
    grown, _ = grow.grow_model(net, tiny(n_layers=4), method="msg", ramp=4)
    gates = [b.grow_gate for b in grown.blocks[2:]]
    assert all(g.item() == 0.0 for g in gates) and not hasattr(grown.blocks[0], "grow_gate")
    ids, _ = batch()
    grown.train()(ids, labels=ids)["loss"].backward()             # first training pass: c = 1/4
    assert all(g.item() == pytest.approx(0.25) for g in gates)
    assert all(p.grad.abs().sum() > 0 for p in grown.blocks[3].parameters())
    with torch.no_grad():
        grown.eval()(ids)  # eval passes do not move the gate
    assert gates[0].item() == pytest.approx(0.25)
    losses = train_steps(grown, adamw(grown), 8)
    assert gates[0].item() == 1.0 and losses[-1] < losses[0] - 0.1


def test_exact_copies_stay_copies_without_noise_and_diverge_with_it():
    cfg = tiny(positions="rotary")
    spread = {}
    for noise in (0.0, 1e-3):
        grown, _ = grow.grow_model(perturbed_model(cfg), {**cfg, "ffn_dim": 96}, noise=noise)
        train_steps(grown, adamw(grown), 3)
        # Gated: rows [gate 0..95; value 0..95].
        up = grown.blocks[0].up.weight
        spread[noise] = (up[:48] - up[48:96]).abs().max().item()  # a unit and its copy
    assert spread[0.0] < 1e-6 < 1e-4 < spread[1e-3]


# --- optimizer state --------------------------------------------------------------------

def trained_pair(growth, method="stack", steps=2):
    """A briefly trained tiny model with its AdamW, and its grown copy."""
    net = perturbed_model(tiny(positions="learned"))
    optimizer = adamw(net)
    train_steps(net, optimizer, steps)
    grown, mapping = grow.grow_model(net, {**net.config, **growth}, method=method)
    return net, optimizer, grown, mapping


def test_carry_keeps_untouched_moments_bitwise_and_the_step_count():
    net, optimizer, grown, mapping = trained_pair({"ffn_dim": 64})
    new_opt = grow.grow_optimizer(optimizer, net, grown, mapping, adamw)
    old_params = dict(net.named_parameters())
    for name in ("tok_emb.weight", "pos_emb.weight", "blocks.0.qkv.weight", "blocks.1.norm2.weight",
                 "final_norm.bias"):
        old = optimizer.state[old_params[name]]
        new = new_opt.state[dict(grown.named_parameters())[name]]
        assert (torch.equal(old["exp_avg"], new["exp_avg"])
                and torch.equal(old["exp_avg_sq"], new["exp_avg_sq"]))
        assert new["step"].item() == 2.0


def test_carry_zero_keeps_old_slices_and_zeroes_copied_units():
    net, optimizer, grown, mapping = trained_pair({"ffn_dim": 64})
    new_opt = grow.grow_optimizer(optimizer, net, grown, mapping, adamw, {"new_moments": "zero"})
    old = optimizer.state[net.blocks[0].down.weight]["exp_avg"]   # (d, f) = (32, 48)
    new = new_opt.state[grown.blocks[0].down.weight]["exp_avg"]   # (32, 64)
    assert torch.equal(new[:, :48], old) and torch.count_nonzero(new[:, 48:]) == 0


def test_carry_scaled_splits_moments_of_duplicated_units():
    net, optimizer, grown, mapping = trained_pair({"ffn_dim": 64})
    new_opt = grow.grow_optimizer(optimizer, net, grown, mapping, adamw, {"new_moments": "scaled"})
    old, new = optimizer.state[net.blocks[0].up.weight], new_opt.state[grown.blocks[0].up.weight]
    # In the gelu half of the gated up-projection, units 0..15 have 2 copies (j and 48 + j) and
    # units 16..47 have one.
    assert torch.allclose(new["exp_avg"][:16], old["exp_avg"][:16] / 2)
    assert torch.allclose(new["exp_avg"][48:64], old["exp_avg"][:16] / 2)
    assert torch.allclose(new["exp_avg_sq"][48:64], old["exp_avg_sq"][:16] / 4)
    assert torch.equal(new["exp_avg"][16:48], old["exp_avg"][16:48])
    # down reads the copies: its weights were halved, its gradient is unchanged,
    # so its moments are copied.
    assert torch.equal(new_opt.state[grown.blocks[0].down.weight]["exp_avg"][:, 48:],
                       optimizer.state[net.blocks[0].down.weight]["exp_avg"][:, :16])


@pytest.mark.parametrize("policy,new_moments",
                         [("carry", "zero"), ("carry", "scaled"), ("fresh", "zero")])
def test_every_parameter_of_the_grown_model_updates(policy, new_moments):
    growth = {"n_layers": 4, "d_model": 64, "n_heads": 8, "ffn_dim": 64, "max_seq_len": 32}
    net, optimizer, grown, mapping = trained_pair(growth, method="zero")
    new_opt = grow.grow_optimizer(optimizer, net, grown, mapping, adamw,
                                  {"policy": policy, "new_moments": new_moments})
    owned = [p for group in new_opt.param_groups for p in group["params"]]
    assert len(owned) == len(set(map(id, owned))) == len(list(grown.parameters()))
    before = {n: p.detach().clone() for n, p in grown.named_parameters()}
    train_steps(grown, new_opt, 2)  # the first step moves out/down off zero
    for name, p in grown.named_parameters():
        assert not torch.equal(p, before[name]), f"{name} did not update"
    if policy == "fresh":
        assert all(new_opt.state[p]["step"].item() == 2.0 for p in grown.parameters())


def test_apply_stage_returns_a_loggable_event():
    net = perturbed_model(tiny())
    stages = grow.parse_schedule("0:n_layers=2; 0.5:n_layers=4,ffn_dim=96,method=zero", tiny())
    grown, new_opt, event = grow.apply_stage(net, adamw(net), stages[1], adamw)
    assert event["from"] == "n_layers=2 d_model=32 n_heads=4 ffn_dim=48 max_seq_len=16"
    assert event["to"] == "n_layers=4 d_model=32 n_heads=4 ffn_dim=96 max_seq_len=16"
    assert event["params"] > event["params_before"] and event["function_preserving"] is True
    assert event["at"] == 0.5 and event["method"] == "zero" and event["optimizer"] == "carry/zero"
    assert grown.config == stages[1]["config"]


# --- end to end through train.py ------------------------------------------------------------

def test_a_schedule_runs_end_to_end_through_train_py(sample_cache, tmp_path):
    schedule = ("0:n_layers=1,ffn_dim=32,max_seq_len=16; "
                "0.3:n_layers=2,ffn_dim=64,max_seq_len=32,method=zero; 0.6:n_layers=4")
    out = tmp_path / "run"
    summary = train.main(["--data", "sample", "--vocab-size", "512", "--model", "tiny",
                          "--max-seq-len", "32", "--micro-batch", "4", "--batch-tokens", "256",
                          "--eval-batches", "2", "--log-every", "1",
                          "--cache", sample_cache, "--out", str(out), "--max-steps", "30",
                          "--lr", "3e-3", *CRAMMING_ADAMW, "--grow", schedule])
    records = read_log(out)
    events = [r for r in records if r["kind"] == "grow"]
    assert [(e["from"], e["to"]) for e in events] == [
        ("n_layers=1 d_model=64 n_heads=4 ffn_dim=32 max_seq_len=16",
         "n_layers=2 d_model=64 n_heads=4 ffn_dim=64 max_seq_len=32"),
        ("n_layers=2 d_model=64 n_heads=4 ffn_dim=64 max_seq_len=32",
         "n_layers=4 d_model=64 n_heads=4 ffn_dim=64 max_seq_len=32")]
    assert [e["step"] for e in events] == [9, 18]  # the first steps past 30% and 60% of 30 steps
    assert [e["method"] for e in events] == ["zero", "stack"]
    assert [e["at"] for e in events] == [0.3, 0.6]
    for e in events:
        assert e["params"] > e["params_before"]
        assert all(key in e for key in ("val_loss_before", "val_loss_after", "elapsed"))
    final = model.load_model(str(out / "final"))
    assert final.config == grow.parse_schedule(schedule, final.config)[-1]["config"]
    first_loss = next(r["loss"] for r in records if r["kind"] == "train")
    assert summary["final_val_loss"] < first_loss


def test_train_py_rewarms_the_learning_rate_after_growth(sample_cache, tmp_path):
    out = tmp_path / "run"
    train.main(["--data", "sample", "--vocab-size", "512", "--model", "tiny", "--max-seq-len", "32",
                "--micro-batch", "4", "--batch-tokens", "128", "--eval-batches", "1",
                "--log-every", "1", "--cache", sample_cache, "--out", str(out), "--max-steps", "20",
                *CRAMMING_ADAMW, "--grow", "0:layers=1; 0.5:layers=2", "--grow-rewarm", "0.2",
                "--lr", "1e-3"])
    steps = {r["step"]: r for r in read_log(out) if r["kind"] == "train"}
    # Growth happens before step 11 (p = 0.5); the rate then climbs back linearly over 0.2 of the
    # budget, which is 4 steps.
    factors = [steps[s]["lr"] / (1e-3 * train.lr_multiplier(steps[s]["progress"]))
               for s in (10, 11, 12, 13, 15, 16)]
    assert factors == pytest.approx([1.0, 0.0, 0.25, 0.5, 1.0, 1.0])


# --- when to grow, from the run (--grow-when auto) ------------------------------------------------

def power_law(flops, exponent, scale=10.0):
    return [(c, scale * c ** exponent) for c in flops]


def test_loss_slope_recovers_a_power_law_exponent():
    assert grow.loss_slope(power_law([1e9, 2e9, 4e9, 8e9], -0.1)) == pytest.approx(-0.1)


def test_auto_grows_when_the_loss_flattens_not_while_it_falls_steeply():
    steep, flat = power_law([1e9, 2e9, 4e9], -0.2), power_law([1e9, 2e9, 4e9], -0.01)
    assert grow.auto_should_grow(steep, 0.1, 1, 3) == (False, None)
    assert grow.auto_should_grow(flat, 0.1, 1, 3) == (True, "slope")
    # Too few evaluations to judge.
    assert grow.auto_should_grow(flat[:2], 0.1, 1, 3) == (False, None)


def test_auto_stage_deadlines_leave_the_full_model_its_share_of_the_budget():
    assert [grow.auto_deadline(k, 3) for k in (1, 2)] == pytest.approx([0.3, 0.6])
    steep = power_law([1e9, 2e9, 4e9], -0.2)
    assert grow.auto_should_grow(steep, 0.3, 1, 3) == (True, "deadline")
    assert grow.auto_should_grow(steep, 0.99, 3, 3) == (False, None)  # never past the last stage


def test_auto_on_a_synthetic_run_grows_in_order_and_stops_at_the_last_stage():
    """Each stage's loss follows its own power law that flattens over time.

    The decision only moves forward."""
    stage, points, history = 0, [], []
    for i in range(1, 101):
        p, flops = i / 100, 1e9 * i
        # Flatter with every evaluation.
        points.append((flops, 5.0 * flops ** (-0.3 / (1 + 5 * len(points)))))
        due, _ = grow.auto_should_grow(points, p, stage + 1, 3)
        if due:
            stage, points = stage + 1, []
        history.append(stage)
    assert history == sorted(history) and history[-1] == 2  # never shrinks, ends at the target
    assert history.index(2) <= 60                            # by the last deadline
