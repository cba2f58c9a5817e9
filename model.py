"""model.py: one readable Transformer for cramming: a masked-LM encoder or a causal decoder.

The default is the crammed-BERT recipe (Geiping & Goldstein 2022, "Cramming: Training a Language
Model on a Single GPU in One Day", arXiv 2212.14034). Every choice that the BigScience ablations
(Le Scao et al. 2022, "What Language Model to Train if You Have One Million GPU Hours?") compare is
one config value.

Notable features (config key and default in brackets; each is explained again where it is built):
- pre-LN blocks [norm_position="pre"]: stable at high learning rates, no long warm-up
  (Xiong et al. 2020); post = BERT
- no biases in the linear layers [bias=False]: faster per token at about the same size (cramming)
- gated-GELU feed-forward [activation="geglu"]
  (Shazeer 2020, "GLU Variants Improve Transformer", Eq. 5-6)
- embedding norm [embedding_norm=True]
  (cramming; BLOOM's, which Le Scao et al. 2022 found to cost zero-shot accuracy)
- scaled sinusoidal positions [positions="sinusoidal"]
  (cramming; the sinusoids of Vaswani et al. 2017, Sec. 3.5)
- or learned, rotary (Su et al. 2021, RoFormer), alibi (Press et al. 2022, Sec. 3), none:
  the four BigScience compares
- LayerNorm [norm="layernorm"] or RMSNorm (Zhang & Sennrich 2019); gelu or swiglu feed-forwards
  (BigScience has both)
- tied input and output embeddings [tie_embeddings=True] (Press & Wolf 2017)
- vocabulary padded to a multiple of 64, so the embedding and output matmuls fill whole GPU tiles
  (nanoGPT: 50304)
- no dropout in pretraining [dropout=0.0] (cramming); evaluate_glue.py sets 0.1 for fine-tuning
- sparse MLM prediction: only the k masked positions reach the output head and the loss
  (cramming; 1/4 of the rows)
- attention through F.scaled_dot_product_attention: a fused flash kernel on a GPU when unmasked
  (Dao et al. 2022)
- causal LM option [objective="clm"]: the GPT-style decoder that BigScience's ablations use
  (Le Scao et al. 2022)
- ModernBERT's two differences [first_attention_norm=True, head_transform=False]: no attention
  norm in the first block, and dense -> GELU -> norm before the MLM decoder (Warner et al. 2024);
  make_config(arch="modernbert") sets both and is transformers' ModernBertForMaskedLM exactly

    import model
    cfg = model.make_config("base", vocab_size=32768)            # a plain dict, validated
    net = model.build_model(cfg)
    out = net(input_ids, labels=labels, label_positions=positions)  # {"loss": ..., "logits": ...}
    model.save_model(net, "out/final"); net = model.load_model("out/final")

Shapes: B batch, T sequence length, d = d_model, H heads, hd = d / H head size, f = ffn_dim,
V the padded vocab, k masked positions per sequence (sparse MLM prediction).
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# Configuration: one dict, defaults = the crammed-BERT base model.
# A plain dict rather than a dataclass because it travels: save_model writes it as config.json
# beside the weights, train.py, grow.py and the evaluation scripts pass it between them, and
# scaling.py and grow.py build and compare configs key by key ({**cfg, "n_layers": 8}).
# validate_config is the one place that checks it.

DEFAULTS = {
    "vocab_size": 32768,        # tokenizer size; the embedding is padded up to a multiple of 64
    "n_layers": 16,             # blocks (cramming: 16 at BERT-base width; BERT-base has 12)
    "d_model": 768,             # d, the width of the residual stream
    "n_heads": 12,              # H attention heads; head size hd = d / H = 64
    "ffn_dim": 1536,            # f, after gating: cramming's 3072-wide projection in two halves
    "max_seq_len": 128,         # T: cramming trains on packed 128-token sequences
    "objective": "mlm",         # "mlm": bidirectional encoder, masked LM; "clm": causal decoder
    "positions": "sinusoidal",  # learned | sinusoidal (scaled) | rotary | alibi | none
    "norm": "layernorm",        # layernorm | rmsnorm
    "norm_position": "pre",     # pre | post (BERT's; pre-LN trains stably at high learning rates)
    "activation": "geglu",      # the feed-forward's: gelu | relu2 | geglu | swiglu (last two gated)
    "bias": False,              # biases in the linear layers of the blocks
    "embedding_norm": True,     # a norm right after the embedding (BLOOM's "embedding LayerNorm")
    "tie_embeddings": True,     # the output projection reuses the token embedding matrix
    "qk_norm": False,           # RMS-normalize each head's queries and keys before their product
    "first_attention_norm": True,  # False: block 0 reads the embedding norm's output as it is
    "head_transform": False,    # dense -> GELU -> norm between the final norm and the LM decoder
    "zero_init": False,         # the blocks' output projections (out, down) start at zero
    "value_residual": False,    # every block after the first mixes the first block's values in
    "dropout": 0.0,             # off in pretraining (cramming); evaluate_glue.py fine-tunes at 0.1
    "mask_rate": 0.25,          # share of tokens MLM predicts (cramming: 25%); in FLOP accounting
    "num_labels": 0,            # > 0 adds a sequence classification head (1 = regression)
    "pooling": "cls",           # the head reads: "cls", the first position; "mean", all positions
    "init_std": 0.02,           # std of every Linear and Embedding weight's normal init (BERT's)
    "norm_eps": 1e-12,          # epsilon inside every norm (BERT's and cramming's value)
}

# Presets from a test-sized model to the crammed base and a large model; each lists what differs.
PRESETS = {
    "tiny": {"vocab_size": 512, "n_layers": 2, "d_model": 64, "n_heads": 4, "ffn_dim": 128,
             "max_seq_len": 64},
    # the speedrun's depth, width and vocabulary (docs/records.md): what 10 CPU minutes buy
    "micro": {"vocab_size": 4096, "n_layers": 4, "d_model": 128, "n_heads": 4, "ffn_dim": 256},
    "mini": {"n_layers": 4, "d_model": 256, "n_heads": 4, "ffn_dim": 512},
    "small": {"n_layers": 8, "d_model": 512, "n_heads": 8, "ffn_dim": 1024},
    "base": {},
    "large": {"n_layers": 24, "d_model": 1024, "n_heads": 16, "ffn_dim": 2048},
}

# Architectures: the keys that make a family, applied on top of a size preset (make_config's arch).
# "modernbert" computes exactly what transformers' ModernBertForMaskedLM computes with every layer
# global (Warner et al. 2024): rotary positions, no attention norm in the first block, and the MLM
# head transform; export.py writes such a checkpoint as a stock "modernbert" model.
ARCHITECTURES = {
    "crammed": {},
    "modernbert": {"positions": "rotary", "norm": "layernorm", "norm_position": "pre",
                   "activation": "geglu", "bias": False, "embedding_norm": True,
                   "tie_embeddings": True, "qk_norm": False, "first_attention_norm": False,
                   "head_transform": True, "value_residual": False},
}

# Allowed values of the string-valued keys (train.py's flags offer the same lists).
CHOICES = {
    "objective": ("mlm", "clm"),
    "positions": ("learned", "sinusoidal", "rotary", "alibi", "none"),
    "norm": ("layernorm", "rmsnorm"),
    "norm_position": ("pre", "post"),
    "activation": ("gelu", "relu2", "geglu", "swiglu"),
    "pooling": ("cls", "mean"),
}
POSITIVE_INTS = ("vocab_size", "n_layers", "d_model", "n_heads", "ffn_dim", "max_seq_len")
VOCAB_MULTIPLE = 64


def validate_config(cfg):
    """Return a complete copy of cfg (defaults filled in); raise ValueError naming the first bad
    key."""
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown config key {unknown[0]!r}; valid keys: {', '.join(DEFAULTS)}")
    cfg = {**DEFAULTS, **cfg}
    # Types and ranges, key by key (bool is an int in Python, so it is refused explicitly).
    for key in POSITIVE_INTS:
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] <= 0:
            raise ValueError(f"config key {key!r} must be a positive integer, got {cfg[key]!r}")
    for key, allowed in CHOICES.items():
        if cfg[key] not in allowed:
            raise ValueError(f"config key {key!r} must be one of {allowed}, got {cfg[key]!r}")
    for key in ("bias", "embedding_norm", "tie_embeddings", "qk_norm", "zero_init",
                "first_attention_norm", "head_transform", "value_residual"):
        if not isinstance(cfg[key], bool):
            raise ValueError(f"config key {key!r} must be true or false, got {cfg[key]!r}")
    if not isinstance(cfg["num_labels"], int) or cfg["num_labels"] < 0:
        raise ValueError("config key 'num_labels' must be an integer >= 0, got "
                         f"{cfg['num_labels']!r}")
    if not 0.0 <= cfg["dropout"] < 1.0:
        raise ValueError(f"config key 'dropout' must be in [0, 1), got {cfg['dropout']!r}")
    if not 0.0 < cfg["mask_rate"] < 1.0:
        raise ValueError(f"config key 'mask_rate' must be in (0, 1), got {cfg['mask_rate']!r}")
    for key in ("init_std", "norm_eps"):
        if not cfg[key] > 0:
            raise ValueError(f"config key {key!r} must be positive, got {cfg[key]!r}")
    # Constraints between keys: whole heads, and rotary rotates pairs of head dimensions.
    if cfg["d_model"] % cfg["n_heads"]:
        raise ValueError(f"config key 'n_heads' ({cfg['n_heads']}) must divide 'd_model' "
                         f"({cfg['d_model']})")
    if not cfg["first_attention_norm"] and cfg["norm_position"] != "pre":
        raise ValueError("config key 'first_attention_norm': false needs norm_position 'pre' (a "
                         "post-LN block's first norm sits on the residual stream)")
    if cfg["positions"] == "rotary" and (cfg["d_model"] // cfg["n_heads"]) % 2:
        raise ValueError("config key 'positions': rotary needs an even head size (d_model / "
                         "n_heads)")
    return cfg


def make_config(preset="base", arch="crammed", **overrides):
    """A validated config dict: the named size preset, the architecture's keys, then the
    overrides on top."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose from {', '.join(PRESETS)}")
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHITECTURES)}")
    return validate_config({**PRESETS[preset], **ARCHITECTURES[arch], **overrides})


# GLU variants (Shazeer 2020): the up-projection makes a gate and a value
GATED = ("geglu", "swiglu")


def up_width(cfg):
    """Output width of the feed-forward's up-projection: ffn_dim, or 2 * ffn_dim when gated (gate
    and value)."""
    return 2 * cfg["ffn_dim"] if cfg["activation"] in GATED else cfg["ffn_dim"]


def round_up(n, multiple):
    return -(-n // multiple) * multiple  # -(-a // b) is ceil(a / b) in integer arithmetic


def padded_vocab_size(cfg):
    """Vocabulary rounded up to a multiple of 64, so the embedding and output matmuls align with GPU
    tiles."""
    return round_up(cfg["vocab_size"], VOCAB_MULTIPLE)


# -----------------------------------------------------------------------------
# Building blocks: norms, positions (sinusoidal, rotary, ALiBi), the block (attention, feed-forward)

def make_norm(cfg):
    # RMSNorm (Zhang & Sennrich 2019) rescales by the root mean square only:
    # no mean subtraction, no bias.
    if cfg["norm"] == "rmsnorm":
        return nn.RMSNorm(cfg["d_model"], eps=cfg["norm_eps"])
    return nn.LayerNorm(cfg["d_model"], eps=cfg["norm_eps"])


def sinusoid_table(n_positions, dim):
    """(n_positions, dim) fixed sinusoids of Vaswani et al. 2017, Sec. 3.5."""
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]               # (n_positions, 1)
    # Wavelengths from 2*pi to 10000 * 2*pi in a geometric progression, one per pair of columns:
    # inv_freq is (ceil(dim/2),).
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    # For an odd dim the cosine columns are one fewer than the sine columns.
    table[:, 1::2] = torch.cos(pos * inv_freq[: dim // 2])
    return table


def rotary_cos_sin(position_ids, head_dim):
    """cos, sin of shape (..., T, hd/2) for rotary embeddings (Su et al. 2021, RoFormer, Eq. 34)."""
    # theta_i = 10000^(-2i/hd): the angle of pair i at position m is m * theta_i.
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2,
                                               device=position_ids.device).float() / head_dim))
    angles = position_ids.float()[..., None] * inv_freq                        # (..., T, hd/2)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """Rotate pairs (x1, x2) of the two halves of the head dimension. x: (..., B, H, T, hd);
    cos/sin: (B|1, 1, T, hd/2)."""
    # Pairs are (x_i, x_{i + hd/2}) rather than RoFormer's neighbours (x_2i, x_2i+1): the same
    # rotation up to a fixed permutation of the head dimensions, without interleaving. Rotating q
    # and k by their positions makes q.k depend only on the offset between them. Computed in
    # float32, returned in x's dtype.
    x1, x2 = x.float().chunk(2, dim=-1)                                  # 2 x (..., B, H, T, hd/2)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


def alibi_slopes(n_heads):
    """Head-specific slopes m_h = 2^(-8h/H) (Press et al. 2022, ALiBi, Sec. 3); for H not a power of
    two the paper's recipe takes the power-of-two set and interleaves slopes from the next one."""
    def power_of_two(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    # H = 8 gives 1/2, 1/4, ..., 1/256: low slopes let some heads look far, high ones stay local.
    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    if closest < n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)                                                          # (H,)


def matmul_attention(q, k, v, mask, is_causal, dropout):
    """What F.scaled_dot_product_attention computes, as two batched matmuls around a softmax.
    q, k, v (B, H, T, hd) -> (B, H, T, hd); mask as for SDPA (bool: True = attend). In bf16 on a
    CPU, PyTorch's fused attention kernel is 3-6x slower than this at T = 128 (forward +
    backward, B 32, H 4, hd 32 and 64, PyTorch 2.13: 30-39 against 6-11 ms), because the two
    matmuls run at bf16 speed; on a GPU the fused kernel wins and is used. The scores stay in
    q's dtype: PyTorch's softmax sums in float32 inside, and an upcast copy of the (B, H, T, T)
    scores would double this function's time."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5                # (B, H, T, T)
    if is_causal:
        T = q.shape[-2]
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask
    return F.dropout(scores.softmax(dim=-1), dropout) @ v


class Block(nn.Module):
    """One Transformer layer: self-attention, then a feed-forward network, each inside a residual
    connection, normalized before (pre-LN, Xiong et al. 2020) or after (post-LN, the original BERT)
    the residual add."""

    def __init__(self, cfg, first=False):
        super().__init__()
        d, f, bias = cfg["d_model"], cfg["ffn_dim"], cfg["bias"]
        self.n_heads, self.pre_norm = cfg["n_heads"], cfg["norm_position"] == "pre"
        self.activation, self.dropout = cfg["activation"], cfg["dropout"]
        self.qk_norm, self.value_residual = cfg["qk_norm"], cfg["value_residual"]
        # ModernBERT's first block has no attention norm (an identity): its input is the embedding
        # norm's output, already normalized (config first_attention_norm=False).
        self.norm1 = make_norm(cfg) if cfg["first_attention_norm"] or not first else nn.Identity()
        self.norm2 = make_norm(cfg)
        self.qkv = nn.Linear(d, 3 * d, bias=bias)      # one matmul for queries, keys and values
        self.out = nn.Linear(d, d, bias=bias)
        # up makes f features, or 2f when gated (a gate and a value);
        # down always reads f, the width after gating.
        self.up = nn.Linear(d, up_width(cfg), bias=bias)
        self.down = nn.Linear(f, d, bias=bias)
        # The value residual's share of this block's own values in the ones it attends over (the
        # rest are the first block's): all for the first block, which mixes in zeros, half for the
        # others. A buffer rather than a branch on the block's index, so that every block runs the
        # same code and torch.compile makes one graph for all of them (a second graph cost about
        # 6 s of a cold compile on 2 CPU cores). Made from `first`, so not in the state dict.
        self.first = first
        self.register_buffer("own_values", torch.empty(()), persistent=False)
        self.fill_buffers()

    def fill_buffers(self):
        """own_values, in place: again for a model made without data, as transformers'
        from_pretrained makes one (export.py's modeling code)."""
        self.own_values.fill_(1.0 if self.first else 0.5)

    def attend(self, x, mask, rope, is_causal, v_first=None):
        """x (B, T, d) -> (B, T, d), and this block's own values (B, H, T, hd) in a value_residual
        model, else None. mask: None, or bool/float (B|1, 1|H, T, T) added to the scores.
        v_first: a value_residual model's first block's values, to mix in (zeros for the first)."""
        B, T, d = x.shape
        # (B, T, 3d) -> (B, T, 3, H, hd) -> (3, B, H, T, hd): heads become a batch dimension (SDPA).
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        qk, v = qkv[:2], qkv[2]                                  # (2, B, H, T, hd), (B, H, T, hd)
        # The trunk keeps only the first block's values; every block hands its own on, so that
        # all run the same code. A copy, not a view of qkv, so that FSDP's hooks on a block's
        # outputs see a tensor of its own.
        own_v = v.contiguous() if self.value_residual else None
        # Value residual (Zhou et al. 2024, "Value Residual Learning", ResFormer; the
        # modded-nanogpt speedrun): attend over the mean of this block's values and the first
        # block's, so every layer can still reach the token-level values that deep layers'
        # attention otherwise washes out. The first block keeps its own: 1 v + 0 zeros is v exactly,
        # as 0.5 v + 0.5 v_first is 0.5 (v + v_first). No parameters, so growth has nothing to map.
        if self.value_residual:
            v = self.own_values * v + (1.0 - self.own_values) * v_first
        # QK-norm (Dehghani et al. 2023, ViT-22B; the modded-nanogpt speedrun): each query and key
        # scaled to unit RMS, so no score can grow past sqrt(hd) however large the weights get.
        # No gain parameters, so growth (grow.py) has nothing new to map.
        if self.qk_norm:
            qk = F.rms_norm(qk, (qk.shape[-1],))
        # Rotary rotates queries and keys only, both in one call:
        # the scores see positions, the values stay pure content.
        if rope is not None:
            qk = apply_rotary(qk, *rope)
        q, k = qk                                                         # 2 x (B, H, T, hd)
        if mask is not None and mask.dtype != torch.bool:
            # SDPA wants a float mask in the query's dtype (bf16 under autocast)
            mask = mask.to(q.dtype)
        # y = softmax(q k^T / sqrt(hd) + mask) v, (B, H, T, hd).
        # Dropout on the attention weights only while fine-tuning.
        dropout = self.dropout if self.training else 0.0
        if q.device.type == "cpu" and q.dtype == torch.bfloat16:
            y = matmul_attention(q, k, v, mask, is_causal, dropout)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                               dropout_p=dropout)
        # (B, H, T, hd) -> (B, T, H, hd) -> (B, T, d): concatenate the heads, then mix them.
        return self.out(y.transpose(1, 2).reshape(B, T, d)), own_v

    def feed_forward(self, x):
        """x (B, T, d) -> (B, T, d). Gated variants (Shazeer 2020, "GLU Variants Improve
        Transformer", Eq. 5-6) multiply the activated half of the up-projection by the other
        half."""
        h = self.up(x)                                     # (B, T, f), or (B, T, 2f) when gated
        if self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "relu2":
            # ReLU squared (So et al. 2021, "Primer", Sec. 4): sparse like ReLU, smooth at 0
            h = F.relu(h).square()
        else:
            gate, value = h.chunk(2, dim=-1)                             # 2 x (B, T, f)
            h = (F.gelu(gate) if self.activation == "geglu" else F.silu(gate)) * value
        return self.down(h)

    def forward(self, x, mask, rope, is_causal, v_first=None):
        """x (B, T, d) -> (B, T, d), and attend's values (B, H, T, hd) when the config's
        value_residual is on (the trunk hands the first block's to the later ones as v_first),
        else None."""
        # Residual dropout on each sublayer's output before the add; p = 0 while pretraining.
        drop = lambda y: F.dropout(y, self.dropout, self.training)  # noqa: E731
        # Pre-LN: x + f(norm(x)). The residual stream is a plain sum that no norm rescales, so
        # gradients stay well scaled at initialization and no long warm-up is needed
        # (Xiong et al. 2020).
        if self.pre_norm:
            y, v = self.attend(self.norm1(x), mask, rope, is_causal, v_first)
            x = x + drop(y)
            return x + drop(self.feed_forward(self.norm2(x))), v
        # Post-LN (BERT): norm(x + f(x)), the norm sits on the residual stream after each sublayer.
        y, v = self.attend(x, mask, rope, is_causal, v_first)
        x = self.norm1(x + drop(y))
        return self.norm2(x + drop(self.feed_forward(x))), v


def fused_loss_pays(h):
    """Whether FusedCrossEntropy replaces logits + F.cross_entropy: in bf16 on a CPU, with a
    backward to follow. There it is 2x faster (1,024 rows, d 256, vocabulary 32,768, forward +
    backward: 151 against 302 ms), because the logits never travel through memory in float32. In
    fp32 on a CPU the two are equally fast (453 against 466 ms); on GPUs it is not measured."""
    # Under torch.compile inductor fuses the plain projection and loss itself, and faster: at mini,
    # bf16, 1.12-1.17x the step with this loss (docs/records.md, fourteenth session).
    return (h.device.type == "cpu" and torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") == torch.bfloat16)


def compute_dtype(x):
    """The dtype of what a matmul of x gives: autocast's where it is on for x's device, else x's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


class FusedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of h @ weight.T against labels (-100 = ignore), computed ROWS rows at a
    time, with its gradient, in the forward pass. h (N, d), weight (V, d), labels (N,) -> ().
    Unfused, the (N, V) logits are written, cast to float32, log-softmaxed, zero-filled for the
    gradient, back-propagated and cast back: six trips through memory of up to 134 MB each
    (N = 1,024, V = 32,768). Here each (ROWS, V) block stays in the CPU's cache from its matmul to
    its gradient, softmax(z) - onehot(y), which is stored once in h's dtype; the backward is then
    two matmuls with it. The same idea as Liger Kernel's fused linear cross-entropy."""
    ROWS = 64  # a (64, V) float32 block: 8 MB at V = 32,768, inside a 32 MB L3 cache

    @staticmethod
    def forward(ctx, h, weight, labels):
        N = h.shape[0]
        grad_logits = torch.empty(N, weight.shape[0], dtype=h.dtype, device=h.device)  # (N, V)
        losses = torch.empty(N, dtype=torch.float32, device=h.device)
        valid = labels != -100
        targets = labels.masked_fill(~valid, 0)[:, None]                              # (N, 1)
        for i in range(0, N, FusedCrossEntropy.ROWS):
            rows = slice(i, i + FusedCrossEntropy.ROWS)
            z = (h[rows] @ weight.T).float()                                          # (R, V)
            lse = torch.logsumexp(z, dim=-1, keepdim=True)                            # (R, 1)
            losses[rows] = (lse - z.gather(1, targets[rows])).squeeze(1)
            # d loss_i / d z_i = softmax(z_i) - onehot(y_i), in place; ignored rows get 0
            z.sub_(lse).exp_().scatter_add_(1, targets[rows], -torch.ones_like(z[:, :1]))
            grad_logits[rows] = z * valid[rows, None]
        n = valid.sum().clamp(min=1)
        ctx.save_for_backward(h, weight, grad_logits, n)
        return (losses * valid).sum() / n

    @staticmethod
    def backward(ctx, grad):
        h, weight, grad_logits, n = ctx.saved_tensors
        scale = (grad / n).to(h.dtype)                     # d mean / d loss_i = 1 / n
        return (grad_logits @ weight) * scale, (grad_logits.T @ h) * scale, None


# -----------------------------------------------------------------------------
# The Transformer: embedding -> n_layers blocks -> final norm, then the heads (LM, classification)

class Transformer(nn.Module):
    """Embedding -> n_layers blocks -> final norm -> tied output projection (and an optional
    classifier)."""

    def __init__(self, cfg):
        super().__init__()
        cfg = validate_config(cfg)
        self.config = cfg
        d, V = cfg["d_model"], padded_vocab_size(cfg)
        # V rows, vocab_size of them real tokens: the padding rows are never inputs, and the softmax
        # pushes their scores down in training (fill_mask and generate leave them out explicitly).
        self.tok_emb = nn.Embedding(V, d)
        if cfg["positions"] == "learned":
            self.pos_emb = nn.Embedding(cfg["max_seq_len"], d)
        if cfg["positions"] == "sinusoidal":
            # Scaled sinusoidal (cramming): fixed sinusoids times a learned scalar, from 1/sqrt(d).
            self.pos_scale = nn.Parameter(torch.tensor(1.0 / math.sqrt(d)))
            # persistent=False: rebuilt from the config (fill_buffers, below), so not in the state
            # dict (nor in model.pt). ALiBi's slopes are the same.
            self.register_buffer("sinusoids", torch.empty(cfg["max_seq_len"], d), persistent=False)
        # Rotary needs no parameters or buffers: trunk() computes its angles from position_ids.
        if cfg["positions"] == "alibi":
            self.register_buffer("slopes", torch.empty(cfg["n_heads"]), persistent=False)
        self.emb_norm = make_norm(cfg) if cfg["embedding_norm"] else None
        self.blocks = nn.ModuleList(Block(cfg, first=i == 0) for i in range(cfg["n_layers"]))
        # A final norm after pre-LN blocks only: post-LN blocks end normalized.
        self.final_norm = make_norm(cfg) if cfg["norm_position"] == "pre" else None
        # BERT's and ModernBERT's MLM head transform, dense -> GELU -> norm, before the decoder
        # (config head_transform). cramming drops it (skip_head_transform), and so do we by default.
        self.head_dense = self.head_norm = None
        if cfg["head_transform"]:
            self.head_dense, self.head_norm = nn.Linear(d, d, bias=cfg["bias"]), make_norm(cfg)
        # Tied (the default): no output matrix of its own, logits() multiplies by tok_emb.weight.
        self.lm_head = None if cfg["tie_embeddings"] else nn.Linear(d, V, bias=False)
        # The classification head exists only for fine-tuning (num_labels > 0), with BERT's biases.
        self.pooler = self.classifier = None
        if cfg["num_labels"]:
            self.pooler, self.classifier = nn.Linear(d, d), nn.Linear(d, cfg["num_labels"])
        self.apply(self._init_weights)
        self.fill_buffers()

    def fill_buffers(self):
        """The sinusoid table and ALiBi's slopes, in place from the config: at construction, and
        again for a model made without data, as transformers' from_pretrained makes one (export.py's
        modeling code). Each Block fills its own."""
        cfg = self.config
        if cfg["positions"] == "sinusoidal":
            self.sinusoids.copy_(sinusoid_table(cfg["max_seq_len"], cfg["d_model"]))
        if cfg["positions"] == "alibi":
            self.slopes.copy_(alibi_slopes(cfg["n_heads"]))

    def _init_weights(self, module):
        # BERT-style init (cramming's too): every matrix ~ N(0, init_std), biases zero;
        # norms keep weight 1, bias 0.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config["init_std"])
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        # zero_init (the modded-nanogpt speedrun): every block starts as the identity, its
        # sublayers' outputs zero, so the first steps train the embedding and head through a
        # clean residual stream. Muon's first orthogonalized step makes them non-zero at once.
        if isinstance(module, Block) and self.config["zero_init"]:
            nn.init.zeros_(module.out.weight)
            nn.init.zeros_(module.down.weight)

    # --- pieces of the forward pass -------------------------------------------------

    def embed(self, input_ids, position_ids):
        """input_ids (B, T), position_ids (B|1, T) -> (B, T, d)."""
        x = self.tok_emb(input_ids)
        if self.config["positions"] == "learned":
            x = x + self.pos_emb(position_ids)
        elif self.config["positions"] == "sinusoidal":
            x = x + self.pos_scale * self.sinusoids[position_ids]  # (B|1, T, d): broadcast over B
        # Rotary and ALiBi add nothing here: they act inside attention, on q and k or on the scores.
        if self.emb_norm is not None:
            x = self.emb_norm(x)
        return F.dropout(x, self.config["dropout"], self.training)

    def attention_mask(self, attention_mask, position_ids, T, device):
        """Returns (mask, is_causal) for SDPA. With no padding and no ALiBi the mask is None, so
        SDPA can pick the flash kernel (is_causal for the decoder). Otherwise a (B|1, 1|H, T, T)
        mask: bool (True = attend) or float (ALiBi's -m_h |i - j| plus -inf on masked keys)."""
        causal = self.config["objective"] == "clm"
        alibi = self.config["positions"] == "alibi"
        if attention_mask is None and not alibi:
            return None, causal
        # allowed[b, 0, i, j]: may query i attend to key j? Padding and causality combined.
        allowed = torch.ones(1, 1, T, T, dtype=torch.bool, device=device)
        if attention_mask is not None:
            # Padded keys are hidden: (B, 1, 1, T).
            allowed = allowed & attention_mask[:, None, None, :].bool()
        if causal:
            # Query i sees keys j <= i: the lower triangle.
            allowed = allowed & torch.ones(T, T, dtype=torch.bool, device=device).tril()
        if not alibi:
            return allowed, False
        # ALiBi (Press et al. 2022): no position embedding; each head's score falls linearly with
        # the distance between query and key, at its own slope. |i - j| makes the bias symmetric for
        # the bidirectional encoder. distance is (B|1, 1, T, T).
        distance = (position_ids[:, None, :, None] - position_ids[:, None, None, :]).abs().float()
        bias = -self.slopes.to(device)[None, :, None, None] * distance            # (B|1, H, T, T)
        return bias.masked_fill(~allowed, float("-inf")), False

    def trunk(self, input_ids, attention_mask=None, position_ids=None):
        """(B, T) token ids -> (B, T, d) hidden states before the final norm."""
        B, T = input_ids.shape
        # Learned and sinusoidal positions are a table of max_seq_len rows;
        # rotary and ALiBi extend to any T.
        if T > self.config["max_seq_len"] and self.config["positions"] in ("learned", "sinusoidal"):
            raise ValueError(f"sequence length {T} exceeds max_seq_len "
                             f"{self.config['max_seq_len']}")
        # Positions 0..T-1 for every row unless given (B, T): one (1, T) row broadcasts over B.
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)[None]  # (1, T)
        # The rotary angles and the mask are the same in every layer, so they are made once, here.
        rope = None
        if self.config["positions"] == "rotary":
            cos, sin = rotary_cos_sin(position_ids,
                                      self.config["d_model"] // self.config["n_heads"])
            rope = (cos[:, None], sin[:, None])                              # (B|1, 1, T, hd/2)
        mask, is_causal = self.attention_mask(attention_mask, position_ids, T, input_ids.device)
        x = self.embed(input_ids, position_ids)
        # (B, H, T, hd): the values the first block mixes in at weight 0 (Block.own_values), then
        # the first block's own, for the others. To a compiled block's guards the zeros must look
        # like those values: in their dtype (autocast's), and requiring a gradient where they will,
        # except inside a whole-model compile (one graph anyway), where dynamo cannot make such a
        # leaf.
        v_first = None
        if self.config["value_residual"]:
            H = self.config["n_heads"]
            grad = torch.is_grad_enabled() and not torch.compiler.is_compiling()
            v_first = torch.zeros(B, H, T, self.config["d_model"] // H, device=x.device,
                                  dtype=compute_dtype(x), requires_grad=grad)
        for i, block in enumerate(self.blocks):
            x, v = block(x, mask, rope, is_causal, v_first)
            v_first = v if i == 0 else v_first
        return x

    def finish(self, h):
        # Pre-LN blocks leave the residual stream unnormalized: one last norm comes before a head.
        return self.final_norm(h) if self.final_norm is not None else h

    def encode(self, input_ids, attention_mask=None, position_ids=None):
        """(B, T) -> (B, T, d) contextual representations after the final norm."""
        return self.finish(self.trunk(input_ids, attention_mask, position_ids))

    # -------------------------------------------------------------------------------
    # Heads: the language-model head (sparse for MLM) and the classification head.
    # cramming drops BERT's dense + GELU + LayerNorm transform before the output projection: the
    # final norm's output goes straight into the tied projection, with no decoder bias.
    # head_transform=True keeps it (ModernBERT's); the decoder has no bias either way.

    def transform(self, h):
        """(..., d) -> (..., d): the MLM head transform, dense -> GELU -> norm, when the config has
        one (head_transform); the identity otherwise."""
        if self.head_dense is None:
            return h
        return self.head_norm(F.gelu(self.head_dense(h)))

    def logits(self, h):
        """(..., d) normalized hidden states -> (..., V) scores over the padded vocabulary."""
        weight = self.tok_emb.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.transform(h), weight)                  # h @ weight.T, weight: (V, d)

    def forward(self, input_ids, attention_mask=None, labels=None, label_positions=None,
                position_ids=None):
        """Language-model scores and loss.

        Sparse MLM prediction (cramming): with label_positions (B, k), only those k positions per
        sequence go through the final norm, the output projection and the loss, so a 25% masking
        rate cuts the largest matmul of the model by 4x; k is fixed by the data loader so shapes
        stay static for torch.compile. logits: (B, k, V) with label_positions, else (B, T, V).
        labels: same leading shape, -100 = ignore. For the causal decoder, labels are the next
        tokens (the data loader shifts them). logits is None when the fused loss computed the
        loss (fused_loss_pays: training in bf16 on a CPU).
        """
        h = self.trunk(input_ids, attention_mask, position_ids)             # (B, T, d)
        if label_positions is not None:
            # gather picks along T, and needs the index repeated across the d features.
            index = label_positions[..., None].expand(-1, -1, h.shape[-1])  # (B, k, d)
            h = h.gather(1, index)                                          # (B, k, d): masked rows
        return self.head_and_loss(h, labels)

    def head_and_loss(self, h, labels=None):
        """(B, k or T, d) final states of the predicted positions -> {"loss", "logits"}: the final
        norm, the output projection and the loss. A method of its own so that torch.compile can
        compile it as one region beside the blocks (parallel.compile_blocks)."""
        # The final norm is per position, so it commutes with the gather and runs on k rows only.
        h = self.finish(h)
        if labels is not None and fused_loss_pays(h):
            # Training in bf16 on a CPU: the loss and its gradients without the (B*k, V) logits.
            weight = self.tok_emb.weight if self.lm_head is None else self.lm_head.weight
            dtype = torch.get_autocast_dtype("cpu")
            loss = FusedCrossEntropy.apply(self.transform(h).flatten(0, -2).to(dtype),
                                           weight.to(dtype), labels.flatten())
            return {"loss": loss, "logits": None}
        logits = self.logits(h)                                             # (B, k or T, V)
        loss = None
        if labels is not None:
            # Flatten to (B*k or B*T, V); the loss in float32, since logits are bf16 under autocast.
            loss = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(),
                                   ignore_index=-100)
        return {"loss": loss, "logits": logits}

    def classify(self, input_ids, attention_mask=None, labels=None):
        """Sequence classification on the [CLS] position (BERT, Devlin et al. 2019, Sec. 3) or on
        the mean of all positions (config "pooling"): (B, T) -> logits (B, num_labels).
        num_labels == 1 is regression trained with mean squared error."""
        if self.classifier is None:
            raise ValueError("this model has no classification head; call add_classifier(model, "
                             "num_labels)")
        h = self.encode(input_ids, attention_mask)                        # (B, T, d)
        if self.config["pooling"] == "cls":
            # [CLS] is the first token of every input (data.py, evaluate_glue.py); attention lets
            # it see the whole text. MLM never trains its output, though: [CLS] is never masked.
            h = h[:, 0]                                                   # (B, d)
        else:
            # The mean over the real tokens (ModernBERT's classifier_pooling="mean"): every one
            # of them is an output MLM trained. Padding is left out of the sum and the count.
            keep = (torch.ones_like(input_ids) if attention_mask is None else attention_mask)
            keep = keep.unsqueeze(-1).to(h.dtype)                         # (B, T, 1)
            h = (h * keep).sum(1) / keep.sum(1).clamp(min=1)              # (B, d)
        # Pooler: dense + GELU (BERT's pooler uses tanh), then dropout, which fine-tuning turns on.
        h = F.dropout(F.gelu(self.pooler(h)), self.config["dropout"], self.training)
        logits = self.classifier(h).float()                               # (B, num_labels)
        loss = None
        if labels is not None:
            # One output is a regression (STS-B's similarity score); more are classes.
            if self.config["num_labels"] == 1:
                loss = F.mse_loss(logits.squeeze(-1), labels.float())
            else:
                loss = F.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


def build_model(cfg):
    """A freshly initialized model for a config dict (validated here)."""
    return Transformer(cfg)


# Fine-tuning on a pretrained model: a fresh classification head, and dropout switched on.

def add_classifier(model, num_labels, pooling="cls"):
    """Attach a fresh pooler + classifier with num_labels outputs (1 = regression) to a pretrained
    model; pooling: what the head reads, "cls" (the first position) or "mean" (all positions)."""
    # The config is updated in place, so save_model records the head and load_model rebuilds it.
    cfg = model.config
    checked = validate_config({**cfg, "num_labels": num_labels, "pooling": pooling})
    cfg["num_labels"], cfg["pooling"] = checked["num_labels"], checked["pooling"]
    device = model.tok_emb.weight.device
    model.pooler = nn.Linear(cfg["d_model"], cfg["d_model"]).to(device)
    model.classifier = nn.Linear(cfg["d_model"], num_labels).to(device)
    for layer in (model.pooler, model.classifier):
        model._init_weights(layer)
    return model


def set_dropout(model, p):
    """Change the dropout probability everywhere (0 for pretraining, 0.1 for GLUE fine-tuning)."""
    # embed() and classify() read config["dropout"]; blocks copied it when built, so each is told.
    model.config["dropout"] = validate_config({**model.config, "dropout": p})["dropout"]
    for block in model.blocks:
        block.dropout = p
    return model


# -----------------------------------------------------------------------------
# Accounting: parameters and training FLOPs, pure functions of the config (scaling.py, train.py).
# count_params(cfg) equals the parameter count of build_model(cfg), without building it.

def _norm_params(cfg):  # weight (+ bias for LayerNorm)
    return 2 * cfg["d_model"] if cfg["norm"] == "layernorm" else cfg["d_model"]


def _block_linear_weights(cfg):
    """Weights of the matmuls in one block: qkv (d x 3d), out (d x d), up (d x f or d x 2f when
    gated), down (f x d)."""
    d, f = cfg["d_model"], cfg["ffn_dim"]
    return 4 * d * d + d * up_width(cfg) + f * d


def count_params(cfg, embeddings=True):
    """Number of parameters of build_model(cfg). embeddings=False leaves out the token embedding, a
    learned position table and an untied output matrix (Kaplan et al. 2020 count N without them)."""
    cfg = validate_config(cfg)
    d, L, V = cfg["d_model"], cfg["n_layers"], padded_vocab_size(cfg)
    # Per block: the four matmuls and two norms (attention's and the feed-forward's).
    block = _block_linear_weights(cfg) + 2 * _norm_params(cfg)
    if cfg["bias"]:
        block += 3 * d + d + up_width(cfg) + d                         # qkv, out, up, down
    n = L * block
    n -= 0 if cfg["first_attention_norm"] else _norm_params(cfg)      # ModernBERT's first block
    if cfg["head_transform"]:                                         # dense (+ bias) and norm
        n += d * d + (d if cfg["bias"] else 0) + _norm_params(cfg)
    # Outside the blocks: the embedding norm, the final norm (pre-LN only) and the sinusoids' scale.
    n += _norm_params(cfg) if cfg["embedding_norm"] else 0
    n += _norm_params(cfg) if cfg["norm_position"] == "pre" else 0     # the final norm
    n += 1 if cfg["positions"] == "sinusoidal" else 0                 # the sinusoids' scale
    if cfg["num_labels"]:
        n += d * d + d + d * cfg["num_labels"] + cfg["num_labels"]     # pooler + classifier
    # Embeddings: V x d once when tied, twice with an untied output matrix, plus a position table.
    if embeddings:
        n += V * d
        n += cfg["max_seq_len"] * d if cfg["positions"] == "learned" else 0
        n += 0 if cfg["tie_embeddings"] else V * d
    return n


def flops_per_token(cfg, seq_len=None):
    """Training FLOPs (forward + backward) per input token, counting matmuls only (PaLM, Chowdhery
    et al. 2022, App. B): 6 * block weights + 12 * n_layers * T * d for attention scores and values,
    + 6 * d * V for the output projection on the predicted fraction of tokens (mask_rate for sparse
    MLM, all tokens for CLM)."""
    cfg = validate_config(cfg)
    T = seq_len or cfg["max_seq_len"]
    predicted = cfg["mask_rate"] if cfg["objective"] == "mlm" else 1.0
    # 6 = 2 FLOPs per multiply-add x (1 forward + 2 backward matmuls: input and weight gradients).
    blocks = 6 * cfg["n_layers"] * _block_linear_weights(cfg)
    # Per token and layer, q k^T and (weights) v are T * d multiply-adds each:
    # 4 T d forward FLOPs, x3 in training.
    attention = 12 * cfg["n_layers"] * T * cfg["d_model"]
    # The output projection runs only on the predicted rows: sparse MLM's payoff, in one factor
    # (and so does the head transform's d x d matmul, when the config has one).
    head_width = padded_vocab_size(cfg) + (cfg["d_model"] if cfg["head_transform"] else 0)
    head = 6 * cfg["d_model"] * head_width * predicted
    return float(blocks + attention + head)


# -----------------------------------------------------------------------------
# Checkpoint folder: config.json + model.pt (weights only, loadable without unpickling code)

def unwrap(model):
    """The plain Transformer inside a DistributedDataParallel and/or torch.compile wrapper."""
    model = getattr(model, "module", model)          # DDP keeps the model in .module
    return getattr(model, "_orig_mod", model)        # torch.compile keeps it in ._orig_mod


def save_model(model, folder):
    """Write folder/model.pt (state dict) and folder/config.json, each atomically."""
    model = unwrap(model)   # so the keys carry no "module." or "_orig_mod." prefix
    os.makedirs(folder, exist_ok=True)
    # Tensors on the CPU, so the file loads on a machine without the GPU it was trained on.
    state = {name: t.detach().cpu() for name, t in model.state_dict().items()}
    # Each file is written under a temporary name in the folder, then renamed into place (a rename
    # within one folder is atomic), so a crash never leaves half a file. The rest of the project
    # uses files.atomic_write for this; model.py imports nothing of the project, so that it can be
    # copied out alone, and does the same here in a few lines.
    tmp = os.path.join(folder, f"save_model.{os.getpid()}.tmp")
    try:
        # an unbuffered file: a full disk then raises its own OSError (ENOSPC) from torch.save
        with open(tmp, "wb", buffering=0) as f:
            torch.save(state, f)
        os.replace(tmp, os.path.join(folder, "model.pt"))
        with open(tmp, "wb") as f:
            f.write(json.dumps(model.config, indent=2).encode())
        os.replace(tmp, os.path.join(folder, "config.json"))
    finally:
        if os.path.exists(tmp):  # a failed write (a full disk) leaves no temporary file behind
            os.remove(tmp)


def load_model(folder, device="cpu"):
    """The model saved by save_model: `net = load_model("out/final")`."""
    config_path = os.path.join(folder, "config.json")
    weights_path = os.path.join(folder, "model.pt")
    for path in (config_path, weights_path):
        if not os.path.isfile(path):
            raise ValueError(f"{path}: missing; a checkpoint folder holds config.json and model.pt")
    try:
        with open(config_path) as f:
            cfg = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_path}: not valid JSON ({e})") from None
    # Errors name the file they come from: a user is looking at a folder, not at this code.
    try:
        cfg = validate_config(cfg)
    except ValueError as e:
        raise ValueError(f"{config_path}: {e}") from None
    model = build_model(cfg)
    # weights_only=True: torch.load reads only tensors and plain containers, never pickled code.
    try:
        model.load_state_dict(torch.load(weights_path, map_location="cpu", weights_only=True))
    except Exception as e:  # truncated, foreign or from another config: name the file, no traceback
        first_line = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"{weights_path}: not loadable as this config's weights "
                         f"({type(e).__name__}: {first_line})") from None
    return model.to(device)


# -----------------------------------------------------------------------------
# Using a trained model: fill in [MASK]s (encoder) or continue a prompt (decoder)

def _ready(net, enc, objective, hint):
    """The plain model in eval mode, after checking its objective and that enc fits its
    vocabulary."""
    net = unwrap(net).eval()
    if net.config["objective"] != objective:
        raise ValueError(f"{hint}; this model's objective is {net.config['objective']!r}")
    if enc.n_vocab > net.config["vocab_size"]:
        raise ValueError(f"tokenizer has {enc.n_vocab} tokens, the model only "
                         f"{net.config['vocab_size']}: not the tokenizer it was trained with")
    # Ordinary (byte/merge) ids come first, specials after them (tokenizer.n_ordinary): scoring only
    # the ids below the first special leaves out [CLS] [SEP] [MASK] ..., the reserved ids and the
    # padding rows of the embedding.
    return net, min(enc.encode_single_token(s) for s in enc.special_tokens_set)


@torch.no_grad()
def fill_mask(net, enc, text, top_k=5):
    """For each [MASK] in text, in order, the top_k guesses [(token string, probability), ...],
    probabilities over ordinary tokens only. enc: the model's tiktoken Encoding
    (tokenizer.load_tokenizer). Puts net in eval mode."""
    net, n_ordinary = _ready(net, enc, "mlm",
                             "fill_mask needs a masked LM (generate is for causal ones)")
    *before, last = text.split("[MASK]")
    if not before:
        raise ValueError(f"text {text!r} has no [MASK] to fill")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    # The input looks like a pretraining sequence, [CLS] text [SEP] (loader.Loader). A BPE word
    # carries its leading space, so the space before a [MASK] belongs to the masked token, not to
    # the text before it.
    special = {s: enc.encode_single_token(s) for s in ("[CLS]", "[SEP]", "[MASK]")}
    ids = [special["[CLS]"]]
    for piece in before:
        ids += enc.encode_ordinary(piece.removesuffix(" ")) + [special["[MASK]"]]
    ids += enc.encode_ordinary(last) + [special["[SEP]"]]
    if len(ids) > net.config["max_seq_len"]:
        raise ValueError(f"text is {len(ids)} tokens with [CLS] and [SEP]; the model reads "
                         f"{net.config['max_seq_len']}")
    device = net.tok_emb.weight.device
    input_ids = torch.tensor([ids], device=device)                                       # (1, T)
    # The same sparse prediction as in training: only the k [MASK] positions reach the output head.
    positions = (input_ids == special["[MASK]"]).nonzero()[:, 1][None]                   # (1, k)
    # Scores of the ordinary tokens only, (k, n_ordinary): no special token is a guess.
    logits = net(input_ids, label_positions=positions)["logits"][0, :, :n_ordinary]
    probs, top = logits.float().softmax(-1).topk(min(top_k, n_ordinary), dim=-1)  # (k, top_k) each
    return [[(enc.decode([t]), p) for t, p in zip(row_ids, row_probs)]
            for row_ids, row_probs in zip(top.tolist(), probs.tolist())]


# How generate picks each next token; pass a dict with the keys to change
SAMPLING = {
    "temperature": 0.0,  # 0: greedy (argmax); above 0, softmax(logits / temperature) is sampled
    "top_k": None,       # sample among the k likeliest only: no unreliable tail (Fan et al. 2018)
    "seed": 0,           # seeds the sampler, so one seed gives one continuation
}


@torch.no_grad()
def generate(net, enc, prompt, max_new_tokens=20, sampling=None):
    """The continuation of prompt by a causal model: greedy at temperature 0, else sampled from
    softmax(logits / temperature), among the top_k most likely tokens if top_k is set (sampling:
    the keys of SAMPLING to change). It stops early at [SEP], the end of a document. Puts net in
    eval mode."""
    sampling = {**SAMPLING, **(sampling or {})}
    temperature, top_k, seed = sampling["temperature"], sampling["top_k"], sampling["seed"]
    net, n_ordinary = _ready(net, enc, "clm",
                             "generate needs a causal LM (fill_mask is for masked ones)")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    device, sep = net.tok_emb.weight.device, enc.encode_single_token("[SEP]")
    # In the training stream every document follows a [SEP]: the prompt starts as a document does.
    ids = torch.tensor([[sep] + enc.encode_ordinary(prompt)], device=device)             # (1, T)
    allowed = torch.zeros(net.tok_emb.weight.shape[0], dtype=torch.bool, device=device)  # (V,)
    allowed[:n_ordinary] = allowed[sep] = True   # no [CLS], [MASK], reserved ids or padding rows
    generator = torch.Generator(device=device).manual_seed(seed)
    new = []
    # No KV cache: each step re-reads the whole context, which is simple and cheap at these lengths.
    for _ in range(max_new_tokens):
        context = ids[:, -net.config["max_seq_len"]:]    # the longest input it was trained on
        logits = net.logits(net.encode(context)[0, -1]).float()  # (V,) for the next token only
        logits = logits.masked_fill(~allowed, float("-inf"))
        if temperature == 0:
            next_id = logits.argmax()
        else:
            if top_k:
                # Keep the top_k scores (ties with the k-th included), -inf elsewhere.
                logits[logits < logits.topk(min(top_k, n_ordinary)).values[-1]] = float("-inf")
            next_id = torch.multinomial((logits / temperature).softmax(-1), 1,
                                        generator=generator)[0]
        if next_id.item() == sep:
            break
        new.append(next_id.item())
        ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
    return enc.decode(new)


def sample_line(net, enc, text, objective):
    """One line of what the model makes of text: the top-3 guesses per [MASK] (mlm) or a greedy
    continuation (clm). train.py prints it at every evaluation; net is put back in its mode."""
    was_training = net.training
    try:
        if objective == "clm":
            return f"sample: {text!r} -> {generate(net, enc, text, max_new_tokens=12)!r}"
        # a guess that is only whitespace is shown quoted, or it would vanish from the line
        guesses = [", ".join(f"{t.strip() or repr(t)} {p:.2f}" for t, p in g)
                   for g in fill_mask(net, enc, text, top_k=3)]
        return "sample: " + " | ".join(f"[MASK] {i + 1}: {g}" for i, g in enumerate(guesses))
    except ValueError as e:  # e.g. the text is longer than a short-sequence growth stage
        return f"sample: skipped ({e})"
    finally:
        net.train(was_training)


# -----------------------------------------------------------------------------
# Command line: python model.py CHECKPOINT "text"

def main(argv=None):
    """python model.py CHECKPOINT "text with [MASK]": print the guesses per mask (masked LM) or the
    continuation of the text (causal LM). CHECKPOINT is a folder like train.py's out/final."""
    import argparse

    import tokenizer  # here, not at the top: the model itself needs no tokenizer
    p = argparse.ArgumentParser(description="Fill in [MASK]s (masked LM) or continue a prompt "
                                            "(causal LM).")
    p.add_argument("checkpoint",
                   help="folder with config.json, model.pt and tokenizer.json (train.py's "
                        "out/final)")
    p.add_argument("text", help="text with one or more [MASK] (masked LM) or a prompt (causal LM)")
    p.add_argument("--top-k", type=int, default=5,
                   help="guesses per mask; causal LM: sample among the k most "
                   "likely tokens (0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=20, help="tokens to generate (causal LM)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature (causal LM; 0 = greedy)")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling (causal LM)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.checkpoint):
        raise SystemExit(f"error: {args.checkpoint}: no such checkpoint folder")
    tokenizer_path = os.path.join(args.checkpoint, "tokenizer.json")
    if not os.path.isfile(tokenizer_path):
        raise SystemExit(f"error: {tokenizer_path}: missing; train.py saves it beside model.pt")
    try:
        net = load_model(args.checkpoint, "cuda" if torch.cuda.is_available() else "cpu")
        enc = tokenizer.load_tokenizer(tokenizer_path)
        if net.config["objective"] == "clm":
            sampling = {"temperature": args.temperature, "top_k": args.top_k or None,
                        "seed": args.seed}
            print(generate(net, enc, args.text, args.max_new_tokens, sampling))
            return
        for i, guesses in enumerate(fill_mask(net, enc, args.text, args.top_k), start=1):
            print(f"[MASK] {i}: " + " | ".join(f"{token!r} {prob:.2f}" for token, prob in guesses))
    except ValueError as e:
        # Any bad input (folder, tokenizer, text) is a ValueError here: one line, no traceback.
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
