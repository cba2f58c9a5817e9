"""grow.py: grow a Transformer while it trains (depth, width, heads, feed-forward width, sequence
length), and carry the AdamW state across each growth event.

Why: a small model learns faster per second early on, so training a shrunk model first and growing
it toward the target can reach the target's loss sooner. CompoundGrow (Gu et al. 2021) reports 73.6%
(BERT-base) and 82.2% (BERT-large) faster pretraining by growing depth, FFN width and input length
together; StackBERT (Gong et al. 2019), bert2BERT (Chen et al. 2022), staged training (Shen et al.
2022), LiGO (Wang et al. 2023), MSG (Yao et al. 2024) and G_stack (Du et al. 2024) report 20-120%.
No Train No Gain (Kaddour et al. 2023) found no gain from stacking once the learning rate is fully
decayed within a fixed budget, so measure it on your budget: bench/bench_grow.py.

How train.py uses it (`--grow SCHEDULE`):

    stages = grow.parse_schedule("0:n_layers=4,d_model=384; 0.25:n_layers=8; "
                                 "0.5:n_layers=16,d_model=768", cfg)
    net = model.build_model(stages[0]["config"])   # the first stage (at 0) is the starting model
    ...  # at the first step whose progress = elapsed / budget passes stages[i]["at"], i >= 1:
    net, optimizer, event = grow.apply_stage(net, optimizer, stages[i], make_optimizer,
                                             {"noise": 0.0, "policy": "carry"})  # GROW_OPTIONS
    # then rebuild torch.compile / DDP wrappers, set the loader's sequence length to
    # net.config["max_seq_len"], log `event` (plus the loss just before and after), and, for a
    # short re-warmup, optionally scale the learning rate by
    # grow.rewarm_factor(progress, stages[i]["at"], rewarm).

apply_stage = grow_model (weights) + grow_optimizer (AdamW state); both are public:
    grow_model(model, new_cfg, method="stack", noise=0.0, seed=0, ramp=100) -> (new_model, mapping)
    grow_optimizer(old_opt, old_model, new_model, mapping, make_optimizer,
                   {"policy": "carry", "new_moments": "zero"})
The grown model is model.build_model(new_cfg) with its state dict filled in, so its config is
exactly that of a fresh model of the new size: it saves, loads and fine-tunes like any other.

Operators, and when each preserves the function (max |delta logits| <= 1e-5 in fp32, eval mode;
tests/test_grow.py):
  depth  method="stack"      new layer i copies old layer i mod L (StackBERT, CompoundGrow,
                             G_stack). Not preserving.
         method="interleave" new layer i copies old layer floor(i L / L')
                             (StackBERT/staged training "alternate"). Not preserving.
         method="zero"       interleave, and each inserted copy gets zero output projections (out,
                             down): a pre-LN block x + F(LN(x)) with F's last matmul zero is the
                             identity. Preserving; pre-LN only.
         method="msg"        copies appended on top behind a gate x <- c Block(x) + (1 - c) x,
                             c ramping 0 -> 1 over `ramp` training forward passes (MSG). Preserving
                             at c = 0; pre- and post-LN.
  ffn    f -> f' (any f' >= f): unit j copies unit j mod f, the down-projection columns of the
         copies divided by the copy count (Net2Net, CompoundGrow's FFN sharing). Preserving for
         every model option.
  hidden d -> d' with the head size fixed, so heads H -> H' = d'/hd: residual coordinate i copies
         i mod d, head j copies head j mod H, the matmuls reading copies divided by the copy count
         (Net2Net / bert2BERT FPI), and the final norm divided too so the tied decoder sums the
         copies back (staged training). LayerNorm and RMSNorm statistics are unchanged only if every
         coordinate has the same number of copies, so it preserves the function when d'/d is an
         integer and positions are learned, rotary or none. Not with scaled sinusoidal positions (a
         fresh model of width d' has different sinusoids, sized by d) nor ALiBi (slopes depend on
         the head count). Non-integer factors are approximate (bert2BERT's "almost the same").
         Pre-LN only.
  seq    T -> T': learned position rows >= T copy row i mod T (old rows bitwise); sinusoidal tables
         are rebuilt (identical first rows); rotary, ALiBi and none need nothing. Preserving for
         inputs of length <= T.
  noise  > 0 adds N(0, noise^2) to the input weights of copied units (token/position embedding
         columns, q/k/v rows of new heads, up-projection rows of new FFN units): exact copies get
         identical gradients and stay copies forever (staged training's symmetry caveat), the noise
         breaks that at an O(noise) change.
Classification heads are not grown (growth is for pretraining); attach them after.

Optimizer (grow_optimizer): policy="fresh" builds a new optimizer (StackBERT, CompoundGrow,
G_stack). policy="carry" maps AdamW moments through the same index maps as the weights and keeps the
step count (MSG); untouched tensors keep bitwise-equal moments. new_moments="zero": copied
coordinates start at zero moments, whole new tensors start a fresh Adam state; new_moments="scaled":
copies inherit their source's moments scaled the way their gradients scale (duplicated units share
the gradient: m / c, v / c^2; units whose weights were divided keep it; staged training). Rebuilding
parameters invalidates the old optimizer's references, which is why a new optimizer is always built.

Shapes: L layers, d hidden, H heads, hd = d / H head size, f FFN width, T max sequence length,
V padded vocab. Primes mark the grown sizes.
"""
import time

import torch

import model as M

# -----------------------------------------------------------------------------
# Schedules: stages at fractions of the time budget

GROWN_KEYS = ("n_layers", "d_model", "n_heads", "ffn_dim", "max_seq_len")  # what a schedule grows
KEY_ALIASES = {"layers": "n_layers", "hidden": "d_model", "heads": "n_heads", "ffn": "ffn_dim",
               "seq": "max_seq_len"}
METHODS = ("stack", "interleave", "zero", "msg")

SCHEDULE_HELP = """\
growth schedule: 'AT:KEY=VALUE,...; AT:KEY=VALUE,...' with AT the fraction of the time budget at
which the stage starts (the first stage is at 0 and gives the starting model), KEY one of the config
keys n_layers, d_model, n_heads, ffn_dim, max_seq_len (integers; the older short names layers,
hidden, heads, ffn, seq still work) or method (stack|interleave|zero|msg, how depth grows; default
stack). Keys left out keep the previous stage's value; in the first stage, the target model's.
n_heads follows d_model at a fixed head size unless given.
Example: '0:n_layers=4,d_model=384,max_seq_len=64; 0.25:n_layers=8,max_seq_len=128;
0.5:n_layers=16,d_model=768'.
Presets: 'depth' (a quarter of the layers, their depth doubled by stacking at 0.07 and again at
0.15: train.py's default, records 3, 6, 7 and 8 of docs/records.md; 'depth@AT,AT,...' doubles once
at each AT, the last reaching full depth, so 'depth@0.15' stacks half the layers at 0.15),
'compound' (CompoundGrow-style: depth, FFN width and length at 1/4 then 1/2 of the target, full size
at 0.4) and 'gstack' (G_stack-style: a quarter of the layers, stacked 4x at 0.25).
'none' is no growth."""
PRESETS = ("depth", "compound", "gstack")
DEPTH_AT = "0.07,0.15"  # where 'depth' doubles the depth (record 8); 'depth@0.2' doubles once


def preset_schedule(name, cfg):
    """Schedule text of a named preset, growing toward the target config cfg.

    depth: the speedrun's records 3, 6, 7 and 8, the depth doubled by stacking at each fraction
      of DEPTH_AT (a quarter of the layers, doubled at 7% and at 15% of the budget).
    compound: CompoundGrow's finding (Gu et al. 2021) is that shrinking several dimensions at once
      beats shrinking one; it grows depth by stacking, the FFN by parameter sharing and the input
      length. The paper's exact stage split for BERT-base is not reproduced here; this preset spends
      40% of the budget on two cheap stages and 60% on the full model.
    gstack: G_stack (Du et al. 2024) stacks a model of L/4 layers 4x (growth factor g = 4 was best
      there). Their formula for when to grow is fitted at >= 1e20 FLOPs and overshoots the whole
      budget at single-GPU scale, so this preset grows at a quarter of the budget.
    """
    L, f, T = cfg["n_layers"], cfg["ffn_dim"], cfg["max_seq_len"]
    q = lambda n, k: max(1, n // k)  # noqa: E731
    name, _, at_text = name.partition("@")
    if at_text and name != "depth":
        raise ValueError(f"grow schedule: only the depth preset takes @AT, not {name!r}")
    if name == "depth":
        # The speedrun's record 3 (docs/records.md): half the layers learn almost as much per token
        # at twice the tokens per second, and stacking them (StackBERT) keeps that lead. Record 6:
        # at 20% rather than 30%, the full model reaches ModernBERT's loss on fewer tokens. Record
        # 7: at 15%, on fewer still and sooner (10% is too early: slower steps for longer).
        # Record 8: a quarter of the layers first, doubled at 7%: cheaper tokens still, each
        # teaching a little less, and a lower loss at the deadline.
        if L < 2:
            raise ValueError("grow schedule: preset 'depth' needs a target of at least 2 layers")
        ats = ["0", *(at_text or DEPTH_AT).split(",")]  # parse_schedule checks each as a stage's
        depths = [L // 2 ** k for k in reversed(range(len(ats)))]  # two doublings: [L/4, L/2, L]
        # A doubling that would start below one layer is left out (2 layers: 1 -> 2 at the last
        # fraction); the first stage kept is the starting model, at 0.
        kept = [(at, n) for at, n in zip(ats, depths) if n >= 1]
        kept[0] = ("0", kept[0][1])
        return "; ".join(f"{at.strip()}:n_layers={n}" for at, n in kept)
    if name == "compound":
        return "; ".join(f"{at}:n_layers={q(L, k)},ffn_dim={q(f, k)},max_seq_len={q(T, k)}"
                         for at, k in ((0, 4), (0.2, 2), (0.4, 1)))
    if name == "gstack":
        return f"0:n_layers={q(L, 4)},method=stack; 0.25:n_layers={L},method=stack"
    raise ValueError(f"grow schedule: unknown preset {name!r}; presets: {', '.join(PRESETS)}")


def parse_schedule(text, base_cfg):
    """'0:n_layers=4,max_seq_len=64; 0.5:n_layers=8' (or a preset name) ->
    [{"at", "config", "method"}, ...].

    Every config is a full validated model config; base_cfg (the target, e.g. make_config("base"))
    fills in what the schedule leaves out. Raises ValueError naming the stage and what is wrong."""
    base_cfg = M.validate_config(base_cfg)
    text = text.strip()
    if text.partition("@")[0] in PRESETS:
        text = preset_schedule(text, base_cfg)
    stages, prev = [], base_cfg
    for n, chunk in enumerate(s.strip() for s in text.split(";") if s.strip()):
        where = f"grow schedule stage {n + 1} ({chunk!r})"
        at_text, sep, items = chunk.partition(":")
        try:
            at = float(at_text)
        except ValueError:
            raise ValueError(f"{where}: expected 'AT:KEY=VALUE,...' with AT a fraction of the "
                             "budget") from None
        if not sep or not 0.0 <= at < 1.0:
            raise ValueError(f"{where}: expected 'AT:KEY=VALUE,...' with 0 <= AT < 1")
        if n == 0 and at != 0.0:
            raise ValueError(f"{where}: the first stage must start at 0 (it is the starting model)")
        if stages and at <= stages[-1]["at"]:
            raise ValueError(f"{where}: stages must be in increasing order of AT")
        values, method = {}, None
        for item in (i.strip() for i in items.split(",") if i.strip()):
            key, _, value = (s.strip() for s in item.partition("="))
            key = KEY_ALIASES.get(key, key)
            if key == "method" and value in METHODS:
                method = value
            elif key in GROWN_KEYS and value.isdigit() and int(value) > 0:
                values[key] = int(value)
            else:
                raise ValueError(f"{where}: bad item {item!r}; keys: {', '.join(GROWN_KEYS)} "
                                 f"(positive integers) or method ({'|'.join(METHODS)})")
        cfg = dict(prev, **values)
        # Heads follow the width at a fixed head size.
        if "d_model" in values and "n_heads" not in values:
            head = prev["d_model"] // prev["n_heads"]
            if values["d_model"] % head:
                raise ValueError(f"{where}: d_model={values['d_model']} is not a multiple of the "
                                 f"head size {head}")
            cfg["n_heads"] = values["d_model"] // head
        try:
            cfg = M.validate_config(cfg)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if stages:
            check_growth(prev, cfg, where)
        stages.append({"at": at, "config": cfg, "method": method or "stack"})
        prev = cfg
    if not stages:
        raise ValueError("grow schedule: empty; expected e.g. '0:n_layers=4; 0.5:n_layers=8' or a "
                         "preset name")
    return stages


def check_growth(old, new, where="grow.py"):
    """Raise ValueError unless new is old with some of layers/width/heads/ffn/seq grown and the
    head size kept."""
    for key in old:
        if key not in GROWN_KEYS and old[key] != new[key]:
            raise ValueError(f"{where}: growth cannot change {key!r} ({old[key]!r} -> "
                             f"{new[key]!r})")
        if key in GROWN_KEYS and new[key] < old[key]:
            raise ValueError(f"{where}: {key} shrinks from {old[key]} to {new[key]}; growth never "
                             "shrinks")
    if old["d_model"] // old["n_heads"] != new["d_model"] // new["n_heads"]:
        raise ValueError(f"{where}: the head size d_model/n_heads must stay "
                         f"{old['d_model'] // old['n_heads']} "
                         f"(got {new['d_model'] // new['n_heads']}); "
                         "widening heads changes the 1/sqrt(hd) attention scale")
    if not old["first_attention_norm"] or old["head_transform"]:
        raise ValueError(f"{where}: no growth rule for ModernBERT's first block (no attention "
                         "norm) or for the MLM head transform; grow a crammed architecture")
    if old["num_labels"]:
        raise ValueError(f"{where}: grow the pretrained model before adding a classifier "
                         "(num_labels must be 0)")
    if new["d_model"] > old["d_model"] and old["norm_position"] != "pre":
        raise ValueError(f"{where}: hidden-size growth needs norm_position 'pre' (the final norm "
                         "carries the 1/copies scale for the tied decoder)")


def rewarm_factor(progress, at, rewarm):
    """Learning-rate multiplier for a short linear re-warmup after the growth at fraction `at` of
    the budget: 0 at the growth, 1 after `rewarm` more of the budget (staged training re-warms
    150-200 steps; growth.md suggests 1-2% of the remaining steps). rewarm <= 0 disables it."""
    if rewarm <= 0:
        return 1.0
    return min(1.0, max(0.0, (progress - at) / rewarm))


# -----------------------------------------------------------------------------
# When to grow, decided from the run (--grow-when auto)
#
# Staged training (Shen et al. 2022, sec. 4) grows when the small model's training efficiency
# drops: it tracks the slope s = d log L / d log C of the held-out loss against training compute
# and grows once s rises above a threshold (-0.0575 for depth, -0.0475 for width there, found on
# GPT-2 scaling curves). Under L ~ C^s a model whose slope has flattened to s buys less loss per
# FLOP than a larger one would at the same loss, which still descends on the steeper part of its
# own curve. No paper ships a rule for a wall-clock budget, so the stages' fractions become
# deadlines instead: stage k starts at the latest at AUTO_LATEST * k / (stages - 1) of the budget.

AUTO_THRESHOLD = -0.05   # between staged training's depth and width thresholds
AUTO_WINDOW = 3          # evaluations of the current stage the slope is fitted over
AUTO_LATEST = 0.6        # the full model gets at least 40% of the budget

# How apply_stage grows (train.py fills these from --grow-noise, --seed, --grow-optimizer and
# --grow-moments); grow_model and grow_optimizer document each choice.
GROW_OPTIONS = {
    "method": None,          # depth operator; None: the stage's own, else "stack" (StackBERT)
    "noise": 0.0,            # std of noise on copied input weights: breaks the symmetry of copies
    "seed": 0,               # seeds that noise, so a grown run is reproducible
    "ramp": 100,             # forward passes over which an MSG gate opens from 0 to 1
    "policy": "carry",       # carry AdamW's moments and step count across growth (MSG) or "fresh"
    "new_moments": "zero",   # copied coordinates start at zero moments, or "scaled" ones
}


def loss_slope(points):
    """Least-squares slope of log(loss) against log(training FLOPs) over [(flops, loss), ...]."""
    x = torch.tensor([p[0] for p in points], dtype=torch.float64).log()
    y = torch.tensor([p[1] for p in points], dtype=torch.float64).log()
    x, y = x - x.mean(), y - y.mean()
    return float((x @ y) / (x @ x)) if float(x @ x) > 0 else 0.0


def auto_deadline(next_stage, n_stages, latest=AUTO_LATEST):
    """The budget fraction by which stage `next_stage` (1 .. n_stages - 1) starts at the latest."""
    return latest * next_stage / (n_stages - 1)


def auto_should_grow(points, progress, next_stage, n_stages, threshold=AUTO_THRESHOLD):
    """(grow now?, why) for the current stage, given its held-out evaluations [(flops, loss), ...]
    in order: "deadline" once progress reaches the stage's deadline, "slope" once the slope of the
    last AUTO_WINDOW evaluations is above `threshold`, else (False, None). Never past the last
    stage: next_stage must exist."""
    if next_stage >= n_stages:
        return False, None
    # the deadline first: a stage whose loss never flattens must still hand over in time
    if progress >= auto_deadline(next_stage, n_stages):
        return True, "deadline"
    # a slope above the (negative) threshold: this stage now buys little loss per FLOP
    if len(points) >= AUTO_WINDOW and loss_slope(points[-AUTO_WINDOW:]) > threshold:
        return True, "slope"
    return False, None


def preserves_function(old, new, method="stack", noise=0.0):
    """Whether growing old -> new with these options keeps logits equal (eval mode, inputs <= old
    max_seq_len). This is the claim tests/test_grow.py checks; see the module docstring for why each
    case is or is not."""
    if noise > 0:
        return False
    if new["n_layers"] > old["n_layers"] and method in ("stack", "interleave"):
        return False
    if new["d_model"] > old["d_model"]:
        integer_factor = new["d_model"] % old["d_model"] == 0
        return integer_factor and old["positions"] in ("learned", "rotary", "none")
    return True


# -----------------------------------------------------------------------------
# Index maps: which old unit each new unit copies, and how values and moments scale

def unit_map(n_old, n_new):
    """(n_new,) index: the first n_old units are the originals, unit j >= n_old copies unit
    j mod n_old (round-robin, like CompoundGrow's tiling and staged training's [W, W]; Net2Net
    samples it at random)."""
    return torch.arange(n_new) % n_old


def replicas(index):
    """(n,) bool: True where index repeats an earlier entry, i.e. the unit is a new copy rather than
    the original."""
    n = len(index)
    first = torch.full((int(index.max()) + 1,), n).scatter_reduce(0, index, torch.arange(n), "amin")
    return torch.arange(n) != first[index]


def spec(index, n_old, kind):
    """How one tensor dimension grows. index (n_new,) picks old entries; kind says how copies are
    scaled:
      "dup":    outputs duplicated (incoming weights, embedding columns, norm affines). Values
                copied. Each copy receives 1/c of the original's gradient, so carried moments scale
                by 1/c (m) and 1/c^2 (v).
      "split":  inputs duplicated (outgoing weights reading c copies of a unit): values divided by c
                so the sum over copies is the original (Net2Net's Net2WiderNet); each copy's
                gradient equals the original.
      "extend": new rows that are not symmetric copies (position rows >= T). Values copied,
                moments unscaled."""
    counts = torch.bincount(index, minlength=n_old)[index].float()  # (n_new,) copies of the source
    return {"index": index, "new": replicas(index),
            "value_scale": 1.0 / counts if kind == "split" else None,
            "moment_scale": 1.0 / counts if kind == "dup" else None}


def concat_specs(s, n_old, times):
    """The spec of a dimension made of `times` stacked blocks of size n_old that grow alike (packed
    q/k/v, the gate and value halves of a gated FFN)."""
    cat = lambda key: None if s[key] is None else torch.cat([s[key]] * times)  # noqa: E731
    return {"index": torch.cat([s["index"] + t * n_old for t in range(times)]), "new": cat("new"),
            "value_scale": cat("value_scale"), "moment_scale": cat("moment_scale")}


def expand(t, dims, scale_key="value_scale", power=1):
    """Apply one spec (or None = unchanged) per dimension of t: gather old entries, then scale
    along that dimension."""
    for d, s in enumerate(dims):
        if s is None:
            continue
        t = t.index_select(d, s["index"].to(t.device))
        if scale_key is not None and s[scale_key] is not None:
            shape = [1] * t.dim()
            shape[d] = -1
            t = t * (s[scale_key].to(t.device, t.dtype) ** power).view(shape)
    return t


def new_entries(t, dims):
    """Bool mask, shaped like the grown tensor t, of entries that are copies along any dimension."""
    mask = torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    for d, s in enumerate(dims):
        if s is not None:
            shape = [1] * t.dim()
            shape[d] = -1
            mask = mask | s["new"].to(t.device).view(shape)
    return mask


# Which spec each dimension of each parameter follows. "res": the residual stream d (outputs
# duplicated), "res_in": matmul inputs read from the residual stream (split), "res_out": the final
# norm before the decoder (split: the decoder sums the copies), "qkv": packed [q; k; v] rows (heads
# duplicated), "heads_in": the attention output read by `out` (split), "up": FFN units (both
# halves when gated), "ffn_in": read by `down`, "pos": position rows.
# PyTorch stores Linear weights as (out, in).
ROLES = {
    "tok_emb.weight": (None, "res"),                  # (V, d)
    "pos_emb.weight": ("pos", "res"),                 # (T, d)
    "pos_scale": (),                                  # scalar
    "emb_norm.weight": ("res",), "emb_norm.bias": ("res",),
    "norm1.weight": ("res",), "norm1.bias": ("res",),
    "norm2.weight": ("res",), "norm2.bias": ("res",),
    "qkv.weight": ("qkv", "res_in"), "qkv.bias": ("qkv",),          # (3d, d)
    "out.weight": ("res", "heads_in"), "out.bias": ("res",),        # (d, d)
    "up.weight": ("up", "res_in"), "up.bias": ("up",),              # (f or 2f, d)
    "down.weight": ("res", "ffn_in"), "down.bias": ("res",),        # (d, f)
    "final_norm.weight": ("res_out",), "final_norm.bias": ("res_out",),
    "lm_head.weight": (None, "res"),                  # (V, d); the final norm divides by the copies
}


def dimension_specs(old, new):
    """The spec of every role for growing config old -> new (None where that size stays)."""
    d, d2, f, f2 = old["d_model"], new["d_model"], old["ffn_dim"], new["ffn_dim"]
    hd = d // old["n_heads"]
    res, ffn = unit_map(d, d2), unit_map(f, f2)
    heads = unit_map(old["n_heads"], new["n_heads"])                    # (H',) new head -> old head
    inner = (heads[:, None] * hd + torch.arange(hd)).flatten()   # (d',) attention coords, hd kept
    gated = M.up_width(old) // f                                       # 2 halves (gate, value) or 1
    T, T2 = old["max_seq_len"], new["max_seq_len"]
    specs = {"res": spec(res, d, "dup"), "res_in": spec(res, d, "split"),
             "res_out": spec(res, d, "split"),
             "qkv": concat_specs(spec(inner, d, "dup"), d, 3), "heads_in": spec(inner, d, "split"),
             "up": concat_specs(spec(ffn, f, "dup"), f, gated), "ffn_in": spec(ffn, f, "split"),
             "pos": spec(unit_map(T, T2), T, "extend")}
    unchanged = {"res": d == d2, "res_in": d == d2, "res_out": d == d2, "qkv": d == d2,
                 "heads_in": d == d2, "up": f == f2, "ffn_in": f == f2, "pos": T == T2}
    return {k: None if unchanged[k] else s for k, s in specs.items()}


def layer_map(L, L2, method):
    """(L',) old layer of every new layer. stack/msg append copies on top (i mod L: StackBERT,
    G_stack, MSG's default); interleave/zero put each copy right after its original
    (floor(i L / L'))."""
    if method in ("stack", "msg"):
        return unit_map(L, L2)
    return torch.arange(L2) * L // L2


# -----------------------------------------------------------------------------
# Growing the model

@torch.no_grad()
def grow_model(model, new_cfg, method="stack", noise=0.0, seed=0, ramp=100):
    """(model, new config) -> (grown model, mapping). The grown model is build_model(new_cfg) with
    every tensor derived from the old one (see the module docstring), on the old model's device, in
    its train/eval mode.

    method: how depth grows (stack | interleave | zero | msg). noise: std of the symmetry-breaking
    noise added to the input weights of copied units (0 = exact copies). ramp: training forward
    passes over which an msg gate opens. mapping: {new parameter name: {"source": old name or None
    (freshly initialized), "dims": [spec or None per dimension], "copy": True if the whole tensor is
    a new layer's copy}}; it is what grow_optimizer needs."""
    model = M.unwrap(model)
    old, new_cfg = model.config, M.validate_config(new_cfg)
    check_growth(old, new_cfg)
    if method not in METHODS:
        raise ValueError(f"grow.py: unknown depth method {method!r}; choose from "
                         f"{', '.join(METHODS)}")
    deeper = new_cfg["n_layers"] > old["n_layers"]
    if deeper and method == "zero" and old["norm_position"] != "pre":
        raise ValueError("grow.py: method 'zero' is the identity only for pre-LN blocks (post-LN "
                         "renormalizes x + 0); use method 'msg' for post-LN")
    specs = dimension_specs(old, new_cfg)
    layers = layer_map(old["n_layers"], new_cfg["n_layers"], method)
    new_layer = replicas(layers)
    device = model.tok_emb.weight.device

    grown = M.build_model(new_cfg).to(device)
    old_state, state, mapping = model.state_dict(), {}, {}
    gen = torch.Generator().manual_seed(seed)
    for name in grown.state_dict():
        parts = name.split(".")
        if parts[0] == "blocks":  # blocks.{i}.{suffix}: from old layer layers[i]
            i, role = int(parts[1]), ".".join(parts[2:])
            source, copy = f"blocks.{int(layers[i])}.{role}", bool(new_layer[i])
        else:
            role, source, copy = name, name, False
        if role not in ROLES:
            raise ValueError(f"grow.py: no growth rule for parameter {name!r}")
        dims = [None if r is None else specs[r] for r in ROLES[role]]
        t = expand(old_state[source], dims)
        if noise > 0 and role in ("tok_emb.weight", "pos_emb.weight", "qkv.weight", "up.weight"):
            # Input weights of copied units: embedding columns (dim 1), q/k/v and up rows (dim 0).
            d = 1 if "emb" in role else 0
            if dims[d] is not None:
                shape = [1] * t.dim()
                shape[d] = -1
                mask = dims[d]["new"].view(shape).to(t.device)
                t = t + noise * torch.randn(t.shape, generator=gen).to(t.device, t.dtype) * mask
        zeroed = ("out.weight", "out.bias", "down.weight", "down.bias")
        if copy and method == "zero" and role in zeroed:
            # A pre-LN block x + F(LN(x)) whose last matmuls are zero is the identity
            # (Net2DeeperNet's analogue); only the outputs are zeroed, so their gradients are not:
            # d out = dy * attention output != 0.
            t = torch.zeros_like(t)
            source = None
        state[name] = t
        mapping[name] = {"source": source, "dims": dims, "copy": copy}
    grown.load_state_dict(state)
    if method == "msg":
        for i in torch.nonzero(new_layer).flatten().tolist():
            add_gate(grown.blocks[i], ramp)
    return grown.train(model.training), mapping


def add_gate(block, ramp):
    """MSG's block mask (Yao et al. 2024): the block's output becomes c Block(x) + (1 - c) x,
    exactly x at c = 0 for pre- and post-LN alike. c starts at 0 and rises by 1/ramp at every
    forward pass in training mode with gradients on, before it is used, so the first training step
    already trains the block. At c = 0 the block's weights would get exactly zero gradient. c lives
    in a non-persistent buffer (a tensor updated in place, so torch.compile need not recompile); a
    checkpoint holds the plain block weights, i.e. the c = 1 model."""
    block.register_buffer("grow_gate", torch.zeros((), device=block.norm1.weight.device),
                          persistent=False)

    def gated(module, args, output):
        if module.training and torch.is_grad_enabled():
            with torch.no_grad():
                module.grow_gate.add_(1.0 / ramp).clamp_(max=1.0)
        c = module.grow_gate
        x, v = output  # a block returns its output and its own attention values
        return c * x + (1.0 - c) * args[0], v
    block.register_forward_hook(gated)


# -----------------------------------------------------------------------------
# Growing the optimizer state

def grow_optimizer(old_optimizer, old_model, new_model, mapping, make_optimizer, options=None):
    """A new optimizer for new_model: make_optimizer(new_model) (train.py's param groups and
    hyperparameters), then, with policy="carry", every state of the old optimizer mapped onto the
    grown parameters.

    Carried: the step count (so bias correction continues, MSG), and each moment tensor expanded
    like its weight. new_moments="zero": copied coordinates start at 0 and whole new tensors start a
    fresh Adam state (step 0). Where a tensor mixes old and new coordinates, the new ones take a
    first step of about (1 - b1)/sqrt(1 - b2) times the learning rate (the kept step count makes
    bias correction ~1), one reason to re-warm. new_moments="scaled": copies inherit their source's
    moments, scaled like their gradients (spec()). options: policy and new_moments
    (GROW_OPTIONS)."""
    options = {**GROW_OPTIONS, **(options or {})}
    policy, new_moments = options["policy"], options["new_moments"]
    if policy not in ("carry", "fresh") or new_moments not in ("zero", "scaled"):
        raise ValueError(f"grow.py: policy must be carry|fresh and new_moments zero|scaled, "
                         f"got {policy!r}, {new_moments!r}")
    optimizer = make_optimizer(new_model)
    if policy == "fresh":
        return optimizer
    old_params = dict(M.unwrap(old_model).named_parameters())
    for name, p in M.unwrap(new_model).named_parameters():
        entry = mapping.get(name)
        if entry is None or entry["source"] is None or (entry["copy"] and new_moments == "zero"):
            continue  # no state: AdamW starts it fresh on the first step
        old_p = old_params[entry["source"]]
        old_state = old_optimizer.state.get(old_p, {})
        state = {}
        for key, value in old_state.items():
            if torch.is_tensor(value) and key != "step" and value.shape == old_p.shape:
                # exp_avg scales like the gradient, exp_avg_sq (and max_exp_avg_sq) like its square
                power = 2 if "sq" in key else 1
                value = expand(value, entry["dims"],
                               "moment_scale" if new_moments == "scaled" else None, power)
                if new_moments == "zero":
                    value = value.masked_fill(new_entries(value, entry["dims"]), 0.0)
                state[key] = value.clone()
            elif key == "neuron_second_moment":
                # NorMuon's second moment per output row (muon.normalize_neurons): the rows grow
                # as the weight's do, and a copied row keeps its source's, unscaled (it is the
                # mean square of an orthogonalized update, which copying does not change)
                state[key] = expand(value, [entry["dims"][0], None], None).clone()
            else:
                state[key] = value.clone() if torch.is_tensor(value) else value
        if state:
            optimizer.state[p] = state
    if len(optimizer.param_groups) == len(old_optimizer.param_groups):
        for group, old_group in zip(optimizer.param_groups, old_optimizer.param_groups):
            group["lr"] = old_group["lr"]  # the schedule's current value, until train.py sets it
    return optimizer


# -----------------------------------------------------------------------------
# One growth event, for train.py

def describe(cfg):
    """'n_layers=8 d_model=256 n_heads=4 ffn_dim=512 max_seq_len=128': the grown sizes of a config,
    in the config's own names (for logs; with commas it is a schedule stage)."""
    return " ".join(f"{key}={cfg[key]}" for key in GROWN_KEYS)


def apply_stage(model, optimizer, stage, make_optimizer, options=None):
    """Grow model and optimizer to a schedule stage (an entry of parse_schedule, or a bare config
    dict). Returns (new_model, new_optimizer, event) with event a plain dict for the log: the old
    and new shape and parameter count, the method, whether the function is preserved, and the
    seconds growth took. options: the keys of GROW_OPTIONS to override."""
    options = {**GROW_OPTIONS, **(options or {})}
    noise, policy, new_moments = options["noise"], options["policy"], options["new_moments"]
    cfg = stage["config"] if "config" in stage else stage
    # an explicit method wins, then the stage's own (from its schedule), then stacking (StackBERT)
    method = options["method"] or (stage.get("method") if "config" in stage else None) or "stack"
    start = time.perf_counter()
    old_cfg = dict(M.unwrap(model).config)
    new_model, mapping = grow_model(model, cfg, method=method, noise=noise, seed=options["seed"],
                                    ramp=options["ramp"])
    new_optimizer = grow_optimizer(optimizer, model, new_model, mapping, make_optimizer,
                                   {"policy": policy, "new_moments": new_moments})
    return new_model, new_optimizer, {
        "at": stage.get("at"), "from": describe(old_cfg), "to": describe(new_model.config),
        "params_before": M.count_params(old_cfg), "params": M.count_params(new_model.config),
        "method": method, "noise": noise,
        "optimizer": policy if policy == "fresh" else f"carry/{new_moments}",
        "function_preserving": preserves_function(old_cfg, new_model.config, method, noise),
        "grow_seconds": round(time.perf_counter() - start, 4)}


# -----------------------------------------------------------------------------
# Command line: python grow.py SCHEDULE [preset]

def main(argv=None):
    """`python grow.py "SCHEDULE" [preset]` prints the stages of a schedule grown toward a model
    preset."""
    import sys
    argv = sys.argv[1:] if argv is None else argv
    if not argv or len(argv) > 2:
        raise SystemExit("usage: python grow.py 'SCHEDULE|depth|compound|gstack' "
                         "[model preset, default base]\n\n" + SCHEDULE_HELP)
    try:
        target = M.make_config(argv[1] if len(argv) > 1 else "base")
        plan = parse_schedule(argv[0], target)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    for s in plan:
        print(f"at {s['at']:.2f}: {describe(s['config'])}  method {s['method']:<10} "
              f"params {M.count_params(s['config']) / 1e6:7.2f}M  FLOPs/token "
              f"{M.flops_per_token(s['config']):.3g}")


if __name__ == "__main__":
    main()
