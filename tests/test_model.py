"""Specification of model.py: python -m pytest -q tests/test_model.py"""
import itertools
import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import model
from conftest import POSITIONS, SENTENCE, save_checkpoint, seeded_model, tiny


def tokens(B=2, T=12, vocab=100, seed=1):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# --- shapes, losses, gradients ------------------------------------------------------

OPTION_GRID = list(itertools.product(
    POSITIONS, ["layernorm", "rmsnorm"], ["pre", "post"], ["gelu", "geglu", "swiglu"],
    [False, True], [False, True], ["mlm", "clm"]))


@pytest.mark.parametrize("positions,norm,norm_position,activation,bias,embedding_norm,objective",
                         OPTION_GRID)
def test_every_option_combination_trains(positions, norm, norm_position, activation, bias,
                                         embedding_norm, objective):
    cfg = tiny(positions=positions, norm=norm, norm_position=norm_position, activation=activation,
               bias=bias, embedding_norm=embedding_norm, objective=objective, n_layers=1,
               d_model=16, ffn_dim=16)
    net = seeded_model(cfg).train()
    x = tokens(T=8)
    out = net(x, labels=x)
    assert out["logits"].shape == (2, 8, 128)                      # vocab 100 padded to 128
    assert torch.isfinite(out["loss"]) and 3.0 < out["loss"].item() < 6.0
    out["loss"].backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"


@pytest.mark.parametrize("option", [{"activation": "relu2"}, {"qk_norm": True},
                                    {"zero_init": True}, {"tie_embeddings": False},
                                    {"value_residual": True}])
def test_each_speedrun_option_trains_every_parameter(option):
    net = seeded_model(tiny(positions="rotary", **option)).train()
    x = tokens(T=8)
    out = net(x, labels=x)
    assert torch.isfinite(out["loss"]) and 3.0 < out["loss"].item() < 6.0
    out["loss"].backward()
    # zero_init: the first step's gradient reaches the zeroed output projections themselves,
    # though not yet what feeds them (their output is zero whatever the input)
    feeds_zeroed = ("qkv.", "up.", "norm1.", "norm2.")
    for name, p in net.named_parameters():
        if option.get("zero_init") and name.startswith("blocks.") and any(
                k in name for k in feeds_zeroed):
            continue
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"


def test_relu2_is_an_ungated_squared_relu():
    cfg = tiny(activation="relu2")
    block = seeded_model(cfg).blocks[0]
    assert block.up.weight.shape == (cfg["ffn_dim"], cfg["d_model"])      # one half: not gated
    x = torch.randn(2, 5, cfg["d_model"])
    expected = block.down(torch.relu(block.up(x)) ** 2)
    assert torch.allclose(block.feed_forward(x), expected, atol=1e-6)


def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys():
    def output_after_scaling_qk(qk_norm, factor):
        cfg = tiny(positions="rotary", qk_norm=qk_norm)
        block = seeded_model(cfg).blocks[0]
        with torch.no_grad():
            block.qkv.weight[: 2 * cfg["d_model"]] *= factor     # the q and k rows of [q; k; v]
        x = torch.randn(2, 6, cfg["d_model"], generator=torch.Generator().manual_seed(0))
        return block.attend(x, None, model.rotary_cos_sin(torch.arange(6), 8), False)[0]
    with torch.no_grad():
        assert torch.allclose(output_after_scaling_qk(True, 1.0),
                              output_after_scaling_qk(True, 30.0), atol=1e-5)
        assert not torch.allclose(output_after_scaling_qk(False, 1.0),
                                  output_after_scaling_qk(False, 30.0), atol=1e-3)


def test_zero_init_starts_every_block_as_the_identity():
    net = seeded_model(tiny(positions="rotary", zero_init=True))
    for block in net.blocks:
        assert block.out.weight.abs().sum() == 0 and block.down.weight.abs().sum() == 0
        assert block.qkv.weight.std() > 0.01 and block.up.weight.std() > 0.01
        x = torch.randn(2, 5, 32)
        assert torch.equal(block(x, None, model.rotary_cos_sin(torch.arange(5), 8), False)[0], x)


def test_value_residual_attends_over_the_mean_of_own_and_first_values():
    first, second = seeded_model(tiny(n_layers=2, positions="rotary", value_residual=True)).blocks
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(0))
    rope = model.rotary_cos_sin(torch.arange(6), 8)
    zeros = torch.zeros(2, 4, 6, 8)                                           # (B, H, T, hd)
    with torch.no_grad():
        # The first block keeps its own values whole: the zeros it mixes in weigh nothing.
        y, v = first.attend(x, None, rope, False, v_first=zeros)
        noise = torch.randn(2, 4, 6, 8)
        assert torch.equal(first.attend(x, None, rope, False, v_first=noise)[0], y)
        # A later block attends over the mean: with itself, its own values; with zeros, half of
        # them, and so (no biases: attention is linear in the values) half the output.
        second.load_state_dict(first.state_dict())
        y2, own = second.attend(x, None, rope, False, v_first=v)
        assert torch.allclose(y2, y, atol=1e-6)
        assert torch.allclose(second.attend(x, None, rope, False, v_first=zeros)[0], 0.5 * y,
                              atol=1e-6)
        assert torch.equal(own, v)               # every block hands its own values on, unmixed


def test_value_residual_changes_only_the_blocks_after_the_first():
    def logits(n_layers, value_residual):
        net = seeded_model(tiny(n_layers=n_layers, value_residual=value_residual)).eval()
        with torch.no_grad():
            return net(tokens(T=8))["logits"]
    assert torch.equal(logits(1, True), logits(1, False))      # one block: nothing to mix in
    assert (logits(2, True) - logits(2, False)).abs().max() > 1e-3


def test_vocab_is_padded_to_a_multiple_of_64():
    assert model.padded_vocab_size(tiny(vocab_size=30522)) == 30528
    assert model.padded_vocab_size(tiny(vocab_size=32768)) == 32768
    assert seeded_model(tiny(vocab_size=65)).tok_emb.weight.shape[0] == 128


def test_base_preset_is_the_crammed_bert_shape():
    cfg = model.make_config("base")
    assert (cfg["n_layers"], cfg["d_model"], cfg["n_heads"], cfg["max_seq_len"],
            cfg["vocab_size"]) == (16, 768, 12, 128, 32768)
    assert (cfg["norm_position"], cfg["activation"], cfg["bias"], cfg["embedding_norm"],
            cfg["tie_embeddings"]) == ("pre", "geglu", False, True, True)
    assert cfg["positions"] == "sinusoidal" and cfg["dropout"] == 0.0
    # 119.6 M parameters, 94.4 M without embeddings, and 623 MFLOP per token
    # (cramming.md's accounting).
    assert round(model.count_params(cfg) / 1e6, 1) == 119.6
    assert round(model.count_params(cfg, embeddings=False) / 1e6, 1) == 94.4
    assert round(model.flops_per_token(cfg) / 1e6) == 623


def test_presets_grow_in_size():
    presets = ["tiny", "micro", "mini", "small", "base", "large"]
    assert list(model.PRESETS) == presets
    sizes = [model.count_params(model.make_config(p)) for p in presets]
    assert sizes == sorted(sizes) and len(set(sizes)) == 6


# --- attention masks ----------------------------------------------------------------

@pytest.mark.parametrize("positions", POSITIONS)
def test_causal_decoder_ignores_future_tokens(positions):
    net = seeded_model(tiny(objective="clm", positions=positions))
    x = tokens(B=1, T=12)
    y = x.clone()
    y[0, 7] = (y[0, 7] + 1) % 100
    a, b = net(x)["logits"], net(y)["logits"]
    assert torch.equal(a[:, :7], b[:, :7])  # positions before the change are bitwise unchanged
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("positions", POSITIONS)
def test_encoder_sees_future_tokens(positions):
    net = seeded_model(tiny(positions=positions))
    x = tokens(B=1, T=12)
    y = x.clone()
    y[0, 7] = (y[0, 7] + 1) % 100
    assert not torch.allclose(net(x)["logits"][:, :7], net(y)["logits"][:, :7])


@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_padding_changes_no_real_token_output(positions, objective):
    net = seeded_model(tiny(positions=positions, objective=objective))
    short = tokens(B=1, T=7)
    # 5 pad slots, holding arbitrary ids.
    padded = torch.cat([short, torch.randint(0, 100, (1, 5))], dim=1)
    mask = torch.tensor([[1] * 7 + [0] * 5])
    alone = net.encode(short)
    with_pad = net.encode(padded, attention_mask=mask)[:, :7]
    assert (alone - with_pad).abs().max() < 1e-5
    other_pad = padded.clone()
    other_pad[0, 7:] = 3
    assert (net.encode(other_pad, attention_mask=mask)[:, :7] - with_pad).abs().max() < 1e-5


def test_padding_mask_is_per_sequence():
    net = seeded_model(tiny(positions="alibi"))
    x = tokens(B=2, T=10)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    both = net.encode(x, attention_mask=mask)
    assert (both[0] - net.encode(x[:1])[0]).abs().max() < 1e-5
    assert (both[1, :6] - net.encode(x[1:, :6])[0]).abs().max() < 1e-5


# --- bf16 autocast: the GPU's mixed precision, checked on the CPU -------------------

@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_bf16_autocast_gives_the_fp32_loss_and_finite_fp32_gradients(positions, objective):
    """train.py runs the model under torch.autocast(bf16) on GPUs; CPU autocast takes the same code
    paths (float masks cast to the query dtype, the loss computed in fp32, the weights and their
    gradients kept fp32)."""
    net = seeded_model(tiny(positions=positions, objective=objective)).train()
    x = tokens(B=2, T=12)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0                                                # one padded sequence
    positions_ = torch.tensor([[1, 4, 7], [0, 3, 8]]) if objective == "mlm" else None
    labels = x.gather(1, positions_) if objective == "mlm" else x
    fp32 = net(x, attention_mask=mask, labels=labels, label_positions=positions_)
    reference = fp32["loss"].item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x, attention_mask=mask, labels=labels, label_positions=positions_)
        with torch.no_grad():  # with a backward to follow, the fused loss returns no logits
            logits = net(x, attention_mask=mask, label_positions=positions_)["logits"]
    assert logits.dtype == torch.bfloat16 and out["loss"].dtype == torch.float32
    assert out["logits"] is None                                   # model.FusedCrossEntropy
    # bf16 keeps ~3 significant digits.
    assert abs(out["loss"].item() - reference) < 0.02 * reference
    out["loss"].backward()
    for name, p in net.named_parameters():
        assert p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all(), name


def attention_inputs(B=2, H=3, T=10, hd=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, hd, generator=g, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("kind", ["none", "padding", "causal", "float"])
def test_matmul_attention_computes_what_sdpa_computes(kind):
    """model.matmul_attention (bf16 on a CPU) against F.scaled_dot_product_attention.

    Outputs and gradients are equal in fp32, for no mask, a padding mask, causality and an
    ALiBi-style float mask."""
    q, k, v = attention_inputs()
    mask, causal = None, kind == "causal"
    if kind == "padding":
        mask = torch.ones(2, 1, 1, 10, dtype=torch.bool)
        mask[1, ..., 7:] = False                                          # three padded keys
    if kind == "float":
        mask = -0.5 * torch.arange(10.0)[None, None, None, :].expand(2, 3, 10, 10)
    ours = model.matmul_attention(q, k, v, mask, causal, 0.0)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    assert (ours - ref).abs().max() < 1e-5
    g = torch.randn_like(ref)
    grads = torch.autograd.grad(ours, (q, k, v), g)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    assert max((a - b).abs().max() for a, b in zip(grads, ref_grads)) < 1e-5


def test_blocks_use_matmul_attention_in_bf16_on_a_cpu_and_sdpa_in_fp32(monkeypatch):
    calls = []
    plain = model.matmul_attention
    monkeypatch.setattr(model, "matmul_attention", lambda *a: calls.append(a[0].dtype) or plain(*a))
    net = seeded_model(tiny(n_layers=2))
    x = tokens()
    net(x)
    assert calls == []                                                   # fp32: SDPA
    with torch.autocast("cpu", dtype=torch.bfloat16):
        net(x)
    assert calls == [torch.bfloat16] * 2                                 # one call per block


@pytest.mark.parametrize("N", [5, 64, 150])  # under, at and over FusedCrossEntropy.ROWS
def test_fused_cross_entropy_gives_the_loss_and_gradients_of_logits_plus_cross_entropy(N):
    g = torch.Generator().manual_seed(N)
    h = torch.randn(N, 16, generator=g, requires_grad=True)
    w = (0.3 * torch.randn(70, 16, generator=g)).requires_grad_()
    labels = torch.randint(0, 70, (N,), generator=g)
    labels[::4] = -100                                                    # ignored rows
    loss = model.FusedCrossEntropy.apply(h, w, labels)
    ref = F.cross_entropy(h @ w.T, labels, ignore_index=-100)
    assert abs(loss.item() - ref.item()) < 1e-5
    grads = torch.autograd.grad(2.5 * loss, (h, w))  # the upstream gradient scales
    ref_grads = torch.autograd.grad(2.5 * ref, (h, w))
    assert max((a - b).abs().max() for a, b in zip(grads, ref_grads)) < 1e-5


@pytest.mark.parametrize("arch", ["crammed", "modernbert"])
def test_training_in_bf16_on_a_cpu_takes_the_fused_loss_and_matches_the_unfused_one(arch):
    net = seeded_model(tiny(**model.ARCHITECTURES[arch])).train()
    x = tokens(B=4, T=16)
    positions = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(i))[:4]
                             for i in range(4)])
    labels = x.gather(1, positions)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.fused_loss_pays(torch.zeros(1))
        fused = net(x, labels=labels, label_positions=positions)
        fused["loss"].backward()
        fused_grads = {n: p.grad.clone() for n, p in net.named_parameters()}
        net.zero_grad()
        with torch.no_grad():
            logits = net(x, label_positions=positions)["logits"]
    assert not model.fused_loss_pays(torch.zeros(1))                      # fp32: unfused
    unfused = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    assert fused["logits"] is None and abs(fused["loss"].item() - unfused.item()) < 1e-3
    with torch.autocast("cpu", dtype=torch.bfloat16):                     # the unfused backward
        hidden = net.trunk(x)                                                # (B, T, d)
        h = net.finish(hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1])))
        F.cross_entropy(net.logits(h).flatten(0, 1).float(), labels.flatten()).backward()
    for n, p in net.named_parameters():  # bf16 rounding apart: ~3 significant digits
        assert (fused_grads[n] - p.grad).abs().max() <= 0.02 * p.grad.abs().max() + 1e-6, n


# --- sparse MLM prediction ----------------------------------------------------------

def test_sparse_mlm_loss_equals_dense_loss_on_masked_positions():
    net = seeded_model(tiny())
    x = tokens(B=3, T=16)
    positions = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(s))[:4]
                             for s in range(3)])
    targets = torch.randint(0, 100, (3, 4))
    targets[2, 1] = -100                                        # an ignored slot stays ignored
    dense_labels = torch.full((3, 16), -100).scatter(1, positions, targets)
    sparse, dense = net(x, labels=targets, label_positions=positions), net(x, labels=dense_labels)
    assert sparse["logits"].shape == (3, 4, 128)
    assert abs(sparse["loss"].item() - dense["loss"].item()) < 1e-6
    gathered = dense["logits"].gather(1, positions[..., None].expand(-1, -1, 128))
    assert (gathered - sparse["logits"]).abs().max() < 1e-5


# --- positions ----------------------------------------------------------------------

@pytest.mark.parametrize("positions", ["rotary", "alibi"])
@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_relative_positions_depend_only_on_offsets(positions, objective):
    net = seeded_model(tiny(positions=positions, objective=objective))
    x = tokens(B=2, T=10)
    shifted = torch.arange(10)[None] + 13
    assert (net.encode(x) - net.encode(x, position_ids=shifted)).abs().max() < 1e-5


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_absolute_positions_change_with_offsets(positions):
    net = seeded_model(tiny(positions=positions))
    x = tokens(B=2, T=10)
    shifted = torch.arange(10)[None] + 13
    assert (net.encode(x) - net.encode(x, position_ids=shifted)).abs().max() > 1e-3


def test_alibi_slopes_follow_the_paper():
    assert torch.allclose(model.alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    twelve = model.alibi_slopes(12)    # 8 geometric slopes, then 4 interleaved from the 16-head set
    interleaved = torch.tensor([2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5])
    assert torch.allclose(twelve[8:], interleaved)


# --- accounting ---------------------------------------------------------------------

ACCOUNTING_CASES = [
    {}, {"bias": True}, {"norm": "rmsnorm"}, {"activation": "gelu"}, {"positions": "learned"},
    {"tie_embeddings": False}, {"norm_position": "post", "embedding_norm": False},
    {"num_labels": 3}, {"objective": "clm", "positions": "rotary"},
    {"first_attention_norm": False, "head_transform": True, "bias": True},
]


@pytest.mark.parametrize("overrides", ACCOUNTING_CASES)
def test_parameter_count_matches_the_module(overrides):
    cfg = tiny(**overrides)
    net = model.build_model(cfg)
    assert model.count_params(cfg) == sum(p.numel() for p in net.parameters())
    positional = net.pos_emb.weight.numel() if cfg["positions"] == "learned" else 0
    embedding = net.tok_emb.weight.numel() + positional
    embedding += 0 if cfg["tie_embeddings"] else net.lm_head.weight.numel()
    assert model.count_params(cfg, embeddings=False) == model.count_params(cfg) - embedding


def math_attention(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0):
    """Attention written as two matmuls, so that the FLOP counter sees them.

    CPU SDPA kernels are not counted."""
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    T = q.shape[-2]
    if is_causal:
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None:
        scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                  else scores + attn_mask)
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("overrides", [{}, {"activation": "gelu", "bias": True},
                                       {"objective": "clm"}, {"tie_embeddings": False}])
def test_flops_per_token_equals_a_count_of_the_matmuls(overrides, monkeypatch):
    cfg = tiny(**overrides)
    net = model.build_model(cfg)
    monkeypatch.setattr(model.F, "scaled_dot_product_attention", math_attention)
    B, T = 2, 16
    x = tokens(B=B, T=T)
    k = round(cfg["mask_rate"] * T)
    with FlopCounterMode(display=False) as counter:
        if cfg["objective"] == "mlm":
            positions = torch.arange(k)[None].expand(B, -1)
            loss = net(x, labels=x[:, :k], label_positions=positions)["loss"]
        else:
            loss = net(x, labels=x)["loss"]
        loss.backward()
    assert counter.get_total_flops() == model.flops_per_token(cfg, seq_len=T) * B * T


# --- heads --------------------------------------------------------------------------

def test_classification_head_gives_one_score_per_class():
    net = model.add_classifier(seeded_model(tiny()), 3)
    out = net.classify(tokens(B=4), labels=torch.tensor([0, 1, 2, 1]))
    assert out["logits"].shape == (4, 3)
    assert abs(out["loss"].item() - torch.log(torch.tensor(3.0)).item()) < 0.2
    assert net.config["num_labels"] == 3


def test_regression_head_uses_mean_squared_error():
    net = model.add_classifier(seeded_model(tiny()), 1)
    labels = torch.tensor([0.5, 4.0])
    out = net.classify(tokens(B=2), labels=labels)
    assert out["logits"].shape == (2, 1)
    assert torch.allclose(out["loss"], F.mse_loss(out["logits"].squeeze(-1), labels))


def test_mean_pooling_averages_the_real_tokens_and_ignores_padding():
    net = model.add_classifier(seeded_model(tiny()), 2, pooling="mean").eval()
    assert net.config["pooling"] == "mean"
    x = tokens(B=2, T=8)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0  # the second row has 5 real tokens, then padding
    seen = {}
    net.pooler.register_forward_hook(lambda m, inp, out: seen.update(pooled=inp[0]))
    net.classify(x, mask)
    h = net.encode(x, mask)                                           # (2, 8, d)
    assert seen["pooled"].shape == (2, net.config["d_model"])
    assert torch.allclose(seen["pooled"][0], h[0].mean(0), atol=1e-6)
    assert torch.allclose(seen["pooled"][1], h[1, :5].mean(0), atol=1e-6)
    # what stands in the padding changes nothing
    padded = x.clone()
    padded[1, 5:] = 7
    assert torch.allclose(net.classify(padded, mask)["logits"][1],
                          net.classify(x, mask)["logits"][1], atol=1e-6)


def test_mean_pooling_sends_gradient_to_every_real_position_and_cls_only_through_attention():
    for pooling in ("cls", "mean"):
        net = model.add_classifier(seeded_model(tiny()), 2, pooling=pooling)
        # the last block's feed-forward acts per position: its gradient shows which positions
        # the head read directly (with cls, only position 0 reaches it without attention)
        seen = {}
        net.blocks[-1].down.register_forward_hook(lambda m, inp, out: seen.update(h=out))
        x = tokens(B=1, T=6)
        mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
        out = net.classify(x, mask, labels=torch.tensor([1]))
        grad = torch.autograd.grad(out["loss"], seen["h"])[0][0]      # (T, d)
        per_position = grad.abs().sum(-1)                             # (T,)
        if pooling == "cls":
            assert per_position[0] > 0 and torch.all(per_position[1:] == 0)
        else:
            assert torch.all(per_position[:4] > 0) and torch.all(per_position[4:] == 0)


def test_pooling_is_checked_and_saved_with_the_head(tmp_path):
    with pytest.raises(ValueError, match="pooling"):
        model.add_classifier(seeded_model(tiny()), 2, pooling="max")
    net = model.add_classifier(seeded_model(tiny()), 2, pooling="mean")
    model.save_model(net, str(tmp_path))
    back = model.load_model(str(tmp_path)).eval()
    assert back.config["pooling"] == "mean"
    x = tokens(B=2)
    assert torch.equal(back.classify(x)["logits"], net.eval().classify(x)["logits"])


def test_classify_without_a_head_is_a_clear_error():
    with pytest.raises(ValueError, match="add_classifier"):
        seeded_model(tiny()).classify(tokens())


def test_dropout_is_off_by_default_and_settable():
    net = seeded_model(tiny()).train()
    x = tokens()
    assert torch.equal(net.encode(x), net.encode(x))
    model.set_dropout(net, 0.1)
    assert net.config["dropout"] == 0.1 and not torch.equal(net.encode(x), net.encode(x))
    assert torch.equal(net.eval().encode(x), net.encode(x))


# --- checkpoints and validation -----------------------------------------------------

@pytest.mark.parametrize("overrides", [{}, {"positions": "learned", "num_labels": 2},
                                       {"positions": "alibi", "objective": "clm"}])
def test_save_then_load_gives_bitwise_equal_outputs(tmp_path, overrides):
    net = seeded_model(tiny(**overrides))
    model.save_model(net, tmp_path / "ckpt")
    again = model.load_model(tmp_path / "ckpt")
    x = tokens()
    assert torch.equal(net(x)["logits"], again.eval()(x)["logits"])
    # No temporary files left.
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["config.json", "model.pt"]


def test_loading_a_folder_without_weights_names_the_file(tmp_path):
    with pytest.raises(ValueError, match="model.pt: missing"):
        model.save_model(seeded_model(tiny()), tmp_path)
        os.remove(tmp_path / "model.pt")
        model.load_model(tmp_path)


@pytest.mark.parametrize("overrides,message", [
    ({"positons": "rotary"}, "unknown config key 'positons'"),
    ({"positions": "relative"}, "'positions' must be one of"),
    ({"n_heads": 5}, "'n_heads' \\(5\\) must divide 'd_model'"),
    ({"n_layers": 0}, "'n_layers' must be a positive integer"),
    ({"d_model": 32.0}, "'d_model' must be a positive integer"),
    ({"bias": "no"}, "'bias' must be true or false"),
    ({"dropout": 1.5}, "'dropout' must be in"),
    ({"mask_rate": 0.0}, "'mask_rate' must be in"),
    ({"positions": "rotary", "d_model": 36, "n_heads": 12}, "rotary needs an even head size"),
])
def test_bad_config_values_raise_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny(**overrides)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(ValueError, match="tiny, micro, mini, small, base, large"):
        model.make_config("huge")


def test_sequence_longer_than_the_position_table_is_an_error():
    with pytest.raises(ValueError, match="exceeds max_seq_len 32"):
        seeded_model(tiny(positions="learned"))(tokens(T=40))


# --- using a trained model: fill_mask, generate and the command line ----------------

def overfit(cfg, batch, steps=150):
    """A tiny model trained on batch(step) until it has memorized SENTENCE.

    batch(step) -> dict of forward() arguments."""
    net = seeded_model(cfg).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    # Ops this small gain nothing from threads, which stall for seconds on a busy CPU.
    torch.set_num_threads(1)
    try:
        for step in range(steps):
            loss = net(**batch(step))["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return net.eval()


@pytest.fixture(scope="module")
def mlm(enc):
    """Masked LM on [CLS] SENTENCE [SEP] (loader.Loader's layout).

    One random word is masked per sequence."""
    import tokenizer
    special = tokenizer.special_ids(enc)
    ids = torch.tensor([special["cls"]] + enc.encode_ordinary(SENTENCE) + [special["sep"]])
    g = torch.Generator().manual_seed(0)

    def batch(step):
        positions = torch.randint(1, len(ids) - 1, (16, 1), generator=g)               # (B, 1)
        input_ids = ids.repeat(16, 1).scatter(1, positions, special["mask"])
        return {"input_ids": input_ids, "labels": ids[positions], "label_positions": positions}
    return overfit(tiny(vocab_size=enc.n_vocab), batch)


@pytest.fixture(scope="module")
def clm(enc):
    """Causal LM on a stream of SENTENCE documents, each followed by [SEP], read at random offsets
    (rotary positions, which see the sentence the same at every offset, memorize it fastest)."""
    import tokenizer
    doc = enc.encode_ordinary(SENTENCE) + [tokenizer.special_ids(enc)["sep"]]
    stream = torch.tensor(doc * 20)
    g = torch.Generator().manual_seed(0)

    def batch(step):
        starts = torch.randint(0, len(stream) - 17, (16, 1), generator=g)
        window = stream[starts + torch.arange(17)]                                     # (B, T + 1)
        return {"input_ids": window[:, :-1], "labels": window[:, 1:]}
    return overfit(tiny(vocab_size=enc.n_vocab, objective="clm", positions="rotary"), batch)


def test_fill_mask_predicts_the_memorized_word(mlm, enc):
    guesses = model.fill_mask(mlm, enc, "the [MASK] sat on the [MASK].", top_k=3)
    assert [g[0][0] for g in guesses] == [" cat", " mat"]
    for row in guesses:
        assert len(row) == 3 and all(isinstance(t, str) and isinstance(p, float) for t, p in row)
        probs = [p for _, p in row]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-6


def test_fill_mask_never_guesses_a_special_or_padding_id(enc, monkeypatch):
    import tokenizer
    net = seeded_model(tiny(vocab_size=enc.n_vocab + 1))  # 1 padding row per 64
    bonus = torch.zeros(model.padded_vocab_size(net.config))
    bonus[tokenizer.n_ordinary(enc):] = 100.0             # specials + padding first
    scores = net.logits
    monkeypatch.setattr(net, "logits", lambda h: scores(h) + bonus)
    (row,) = model.fill_mask(net, enc, "a [MASK]", top_k=10_000)
    assert len(row) == tokenizer.n_ordinary(enc)          # every ordinary token once
    assert not {t for t, _ in row} & enc.special_tokens_set
    assert abs(sum(p for _, p in row) - 1.0) < 1e-4


def test_generate_continues_the_memorized_sentence(clm, enc):
    assert model.generate(clm, enc, "the cat sat") == " on the mat."  # stops at [SEP]


def test_generate_is_deterministic_for_greedy_and_for_a_seed(enc):
    net = seeded_model(tiny(vocab_size=enc.n_vocab, objective="clm"))
    greedy = model.generate(net, enc, "the dog", max_new_tokens=8)
    assert isinstance(greedy, str)
    assert greedy == model.generate(net, enc, "the dog", max_new_tokens=8)
    sampled = dict(temperature=1.0, top_k=20, seed=1)
    first = model.generate(net, enc, "the dog", 8, sampled)
    assert first == model.generate(net, enc, "the dog", 8, sampled)


def test_generate_crops_a_prompt_longer_than_the_model_sees(enc):
    cfg = tiny(vocab_size=enc.n_vocab, objective="clm", positions="learned", max_seq_len=8)
    net = seeded_model(cfg)
    prompt = "the cat sat on the mat and the dog ran"
    assert isinstance(model.generate(net, enc, prompt, max_new_tokens=10), str)


def test_fill_mask_and_generate_refuse_the_other_objective(enc):
    with pytest.raises(ValueError, match="fill_mask needs a masked LM"):
        model.fill_mask(seeded_model(tiny(vocab_size=enc.n_vocab, objective="clm")), enc,
                        "a [MASK]")
    with pytest.raises(ValueError, match="generate needs a causal LM"):
        model.generate(seeded_model(tiny(vocab_size=enc.n_vocab)), enc, "a")
    with pytest.raises(ValueError, match="has no \\[MASK\\]"):
        model.fill_mask(seeded_model(tiny(vocab_size=enc.n_vocab)), enc, "no mask here")


def test_command_line_fills_masks_and_continues_prompts(tmp_path, mlm, clm, enc, capsys):
    model.main([save_checkpoint(mlm, enc, tmp_path / "mlm"), "the [MASK] sat on the [MASK].",
                "--top-k", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[MASK] 1: ' cat' ") and lines[1].startswith("[MASK] 2: ' mat' ")
    assert lines[0].count(" | ") == 1
    model.main([save_checkpoint(clm, enc, tmp_path / "clm"), "the cat sat",
                "--max-new-tokens", "3"])
    assert capsys.readouterr().out == " on the mat\n"


def test_command_line_errors_are_one_line(tmp_path, mlm, enc):
    with pytest.raises(SystemExit, match=f"error: {tmp_path / 'nope'}: no such checkpoint folder"):
        model.main([str(tmp_path / "nope"), "a [MASK]"])
    model.save_model(mlm, tmp_path / "bare")
    with pytest.raises(SystemExit, match="tokenizer.json: missing"):
        model.main([str(tmp_path / "bare"), "a [MASK]"])
    with pytest.raises(SystemExit, match="^error: text 'no mask' has no \\[MASK\\] to fill$"):
        model.main([save_checkpoint(mlm, enc, tmp_path / "final"), "no mask"])


def test_the_modernbert_architecture_is_two_config_values_on_top_of_a_size():
    cfg = model.make_config("tiny", arch="modernbert")
    assert cfg["positions"] == "rotary" and not cfg["first_attention_norm"]
    assert cfg["head_transform"] and model.make_config("tiny")["head_transform"] is False
    net = model.build_model(cfg)
    # ModernBERT's first layer reads the embedding norm's output as it is; the others normalize
    assert isinstance(net.blocks[0].norm1, torch.nn.Identity)
    assert isinstance(net.blocks[1].norm1, torch.nn.LayerNorm)
    assert "blocks.0.norm1.weight" not in net.state_dict()
    # the head transform: dense -> GELU -> norm, then the tied decoder
    h = torch.randn(3, cfg["d_model"])
    want = F.linear(net.head_norm(F.gelu(net.head_dense(h))), net.tok_emb.weight)
    assert torch.equal(net.logits(h), want)
    # the head transform runs on the predicted rows only, as the decoder does
    plain = model.flops_per_token({**cfg, "head_transform": False})
    extra = 6 * cfg["d_model"] ** 2 * cfg["mask_rate"]
    assert model.flops_per_token(cfg) == pytest.approx(plain + extra)
    with pytest.raises(ValueError, match="first_attention_norm.*norm_position 'pre'"):
        model.validate_config({**cfg, "norm_position": "post"})
    with pytest.raises(ValueError, match="unknown architecture 'bert'"):
        model.make_config("tiny", arch="bert")
