"""planning.py: what should this budget train, on this machine? (BigScience's question, asked per
run.)

    speed = lambda cfg: planning.sustained_flops(cfg, device, dtype)  # FLOP/s of a model here
    chosen, why = planning.choose_defaults(args, speed, world, device.type)
    cfg = planning.model_config(args, vocab_size)        # the preset, with the flags' overrides
    tokens = planning.budget_tokens(args, device)        # how much FineWeb-Edu to download

train.py asks it once, before any data is read, for the flags the user left unset (--model auto, the
vocabulary, the sequence length, the batch, the micro-batch, the learning rate). Every choice is
printed with its reason, and a flag given on the command line always wins. scaling.py fits and plans
sweeps across runs; this file only plans one run from the compute the budget buys.
"""
import argparse
import math
import os
import shutil
import time

import torch

import budget
import checkpoint
import ema
import grow
import model
import scaling

# "large" only when asked for: a GPU day buys base
AUTO_PRESETS = ("tiny", "micro", "mini", "small", "base")
# Vocabulary by preset: cramming's 32768 (2^15) for base; a small model spends too much of itself
# on embeddings with a large vocabulary, and a CPU minute cannot learn 32768 rows anyway. micro's
# 4096 is the speedrun's (docs/records.md).
PRESET_VOCAB = {"tiny": 512, "micro": 4096, "mini": 8192, "small": 16384, "base": 32768,
                "large": 32768}
# Optimizer steps a run aims for, measured (docs/train.md, the recipe and the defaults): far fewer,
# larger steps lose; far more, smaller ones too. 1,000 until the sixteenth session, when the plan
# began to time each model and the fp32 quick start at that rule's batch fell behind.
STEPS_WANTED = 2000
# Muon's best learning rate over AdamW's 1/width rule, with Muon's update RMS-matched to AdamW's
# (muon.py) and momentum 0.7: 4 at width 128 (2 at momentum 0.95), measured against ModernBERT
# (docs/records.md)
MUON_LR_FACTOR = 4.0
# torch.compile by default from this budget on (docs/train.md). A cold compile paid for itself
# after about 2.4 minutes on one H200 (the whole model: 45 s, then 1.46x the tokens/s) and after
# about 1.3 minutes on 2 CPU cores (each block: 19 s, then 1.33x); 10 minutes leaves room for
# slower compiles and smaller gains elsewhere.
COMPILE_FROM_SECONDS = 600
# A CPU micro-batch of about this many tokens (128 x 64 at tiny, 64 x 128 at micro): each
# micro-batch pays a fixed cost in Python and small kernels, so a small model runs faster per
# token in fewer, larger ones (twenty-second session, Intel AMX, bf16, tiny at a batch of 8,192:
# 61 k tokens/s at 32 rows, 96 k at 128; micro at 16,384: 23 k at 32 rows, 26 k at 128).
# Activations at base are about 4 GB at this size; a GPU takes cramming's 128 rows.
CPU_MICRO_TOKENS = 8192
CRAMMING_BATCH = 8192 * 128  # cramming's final batch, 8192 x 128 tokens (train/bert-o4.yaml)
# Model config keys that a flag of the same name (--n-layers for n_layers) overrides on the preset
SIZE_KEYS = ("n_layers", "d_model", "n_heads", "ffn_dim")
CHOICE_KEYS = ("positions", "norm", "norm_position", "activation")
# Model config keys that are true or false, each set by an on|off flag (--qk-norm on)
ON_OFF_KEYS = ("embedding_norm", "tie_embeddings", "qk_norm", "zero_init", "first_attention_norm",
               "head_transform", "value_residual")


def model_config(args, vocab_size):
    """The model config of the run (before any growth stage): preset, then the flags that override
    it; with --init-from, the weights' own config."""
    if args.init_from:  # continued pretraining: the shape is the weights', the masking the run's
        base = checkpoint.init_config(args.init_from)
        return model.validate_config({**base, "mask_rate": args.mask_rate, "dropout": 0.0})
    keys = SIZE_KEYS + CHOICE_KEYS
    overrides = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    overrides.update({k: getattr(args, k) == "on" for k in ON_OFF_KEYS if getattr(args, k)})
    # train.py's crammed family has the value residual unless --value-residual off (the speedrun's
    # record 4, docs/records.md); --arch modernbert stays ModernBERT's function exactly
    if args.value_residual is None and args.arch == "crammed":
        overrides["value_residual"] = True
    return model.make_config(args.model, arch=args.arch, **overrides, vocab_size=vocab_size,
                             max_seq_len=args.max_seq_len, objective=args.objective,
                             mask_rate=args.mask_rate, dropout=0.0)


def gpu_peak_flops(device):
    """Peak bf16 FLOP/s of this GPU from scaling.py's table, or None (CPU, unknown GPU): no MFU."""
    if device.type != "cuda":
        return None
    try:
        return scaling.peak_flops(torch.cuda.get_device_name(device))
    except ValueError:
        return None


def sustained_flops(cfg, device, dtype):
    """Training FLOP/s to plan the model cfg with: scaling.PLANNING_MFU of a known GPU's peak,
    whatever the model; on a CPU, cfg's own step, measured now (cpu_step_flops); else a
    conservative guess for the device."""
    peak = gpu_peak_flops(device)
    if peak:
        return scaling.PLANNING_MFU * peak
    if device.type == "cuda":
        return 50e12  # an unknown GPU: about 40% of an A100's bf16 peak (312 TFLOP/s dense)
    if device.type == "mps":
        return 5e12  # Apple's GPUs: a guess of a few TFLOP/s sustained
    # CPUs differ by 10x and more (cores, AVX512-BF16, AMX), and on one CPU a small model's step
    # keeps a far smaller share of the matmul speed than a large one's (2 AVX512-BF16 cores: tiny
    # 14-19%, micro 36-39%, mini 56-59%, small 66-71%; docs/train.md), so the plan times the model
    return cpu_step_flops(cfg, dtype)


def cpu_micro_rows(seq):
    """Sequences in a CPU micro-batch of about CPU_MICRO_TOKENS tokens: at most 128."""
    return max(1, min(128, CPU_MICRO_TOKENS // seq))


def cpu_step_flops(cfg, dtype, rows=None, seconds=0.2, passes=3):
    """Training FLOP/s of the model cfg on this process's CPU threads: the forward and backward
    pass of a micro-batch of `rows` random sequences (by default the micro-batch a run of cfg
    takes, cpu_micro_rows; mask_rate of each masked), eager, under autocast in dtype; the fastest
    of the passes timed in about `seconds` (at least `passes`), after a warm-up pass: one pass
    alone once read micro at half its speed and planned it a preset too small. Optimizer, loader
    and evaluations are left out, and nothing is compiled: the quick start's loop ran at
    0.7-0.85x this (tiny), the 10-minute micro run (compiled) at 1.07x."""
    net = model.build_model(cfg).train()
    T, V = cfg["max_seq_len"], cfg["vocab_size"]
    rows = rows or cpu_micro_rows(T)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(V, (rows, T), generator=g)                                   # (rows, T)
    positions, labels = None, ids  # the causal decoder predicts every position
    if cfg["objective"] == "mlm":  # sparse MLM predicts k positions per sequence, as data.py's
        k = max(1, round(cfg["mask_rate"] * T))
        positions = torch.rand(rows, T, generator=g).argsort(dim=1)[:, :k]          # (rows, k)
        labels = ids.gather(1, positions)

    def forward_backward():
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = net(ids, labels=labels, label_positions=positions)["loss"]
        loss.backward()
        return time.perf_counter() - start

    forward_backward()
    timings = []
    while len(timings) < passes or sum(timings) < seconds:
        timings.append(forward_backward())
    return rows * T * model.flops_per_token(cfg, T) / min(timings)


def budget_tokens(args, device):
    """Tokens the run should consume, to download only that much FineWeb-Edu: --max-tokens if
    given, else the wall-clock budget at the planning MFU of this GPU's peak (a CPU or unknown
    GPU: 2,000 tokens/s)."""
    if args.max_tokens:
        return int(args.max_tokens)
    seconds = budget.budget_seconds(args)
    if args.max_steps and not seconds:
        return args.max_steps * args.batch_tokens
    peak = gpu_peak_flops(device)
    # A download sized for the planning MFU is rarely too small, and a run that is faster simply
    # repeats data (the loader counts epochs)
    cfg = model_config(args, args.vocab_size)
    rate = peak * scaling.PLANNING_MFU / model.flops_per_token(cfg) if peak else 2000.0
    return int(seconds * rate * world_size())


def world_size():
    """Processes in the run, from torchrun's environment (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", 1))


# -----------------------------------------------------------------------------
# The defaults: preset, vocabulary, sequence length, batch, micro-batch, learning rate

def choose_defaults(args, speed, world, device_type):
    """({flag: value} for --model, --vocab-size, --max-seq-len, --batch-tokens, --micro-batch,
    --grow, --value-residual, --lr and --compile left unset, the sentence saying why). args is not
    changed. speed: a function from a model config to the training FLOP/s the device sustains on
    it (sustained_flops; called only for a wall-clock budget). device_type: "cuda", "cpu" or
    "mps"."""
    on_gpu = device_type == "cuda"
    chosen = {}
    # --init-from has its shape
    if args.model == "auto" and not args.init_from:
        chosen["model"] = auto_preset(args, speed, world, on_gpu)
    name = chosen.get("model", args.model)
    chosen.update(preset_shape(args, name))
    seq = chosen.get("max_seq_len", args.max_seq_len)
    cfg = planned_config(args, name)
    n_star, basis, compute = optimal_params(
        args, speed(cfg) if budget.budget_seconds(args) else None, world)
    tokens = None
    if args.batch_tokens is None:
        # tokens the budget buys at the planned FLOP/s, or --max-tokens if smaller; the batch is the
        # largest power of two that still gives the run ~STEPS_WANTED optimizer steps
        bought = compute / model.flops_per_token(cfg, seq) if compute else None
        estimates = [bought, args.max_tokens]
        tokens = min([t for t in estimates if t], default=None)
        batch = (2 ** int(math.log2(max(1.0, tokens / STEPS_WANTED))) if tokens
                 else CRAMMING_BATCH if on_gpu else 16 * seq)
        chosen["batch_tokens"] = int(min(CRAMMING_BATCH, max(seq * world, batch)))
    if args.micro_batch is None:
        # as large as memory allows (cramming: 128 on a GPU), never more than the batch
        batch_tokens = chosen.get("batch_tokens", args.batch_tokens)
        chosen["micro_batch"] = max(1, min(128 if on_gpu else cpu_micro_rows(seq),
                                           batch_tokens // (seq * world)))
    optimizer = args.optimizer
    if optimizer == "muon" and args.shard == "fsdp":
        # Newton-Schulz needs whole matrices, and an FSDP rank holds a shard of each (muon.py)
        chosen["optimizer"] = optimizer = "adamw"
    if args.grow is None:
        # Depth growth is the speedrun's record 3 (docs/records.md). It needs whole weight tensors
        # (not FSDP's shards), a shape of its own (not --init-from's) and a model grow.py can stack
        # (two layers or more, and not ModernBERT's first block).
        grows = args.shard == "ddp" and not args.init_from and can_grow_depth(cfg)
        chosen["grow"] = "depth" if grows else "none"
    if args.value_residual is None and not args.init_from:  # saved in args.json as chosen
        chosen["value_residual"] = "on" if cfg["value_residual"] else "off"
    if args.ema is None:  # the speedrun's record 10 (docs/records.md)
        chosen["ema"] = ema.RECIPE_DECAY
    if args.lr is None:
        # Adam's best rate falls about as 1/width (Yang et al. 2021, muP); measured: docs/train.md.
        # Muon's is four times that (docs/records.md).
        factor = MUON_LR_FACTOR if optimizer == "muon" else 1.0
        chosen["lr"] = round(1e-3 * 768 / cfg["d_model"] * factor, 6)
    if args.compile is None:
        chosen["compile"] = compile_pays(device_type, budget.budget_seconds(args))
    return chosen, why_chosen(chosen, basis, n_star, tokens)


def compile_pays(device_type, seconds):
    """Whether torch.compile is the default: with a time budget long enough to pay for the compile
    (COMPILE_FROM_SECONDS), on a CUDA GPU, or on a CPU with a C++ compiler for inductor's kernels.
    A token or step budget has no clock to weigh it against, and Apple's GPUs were never
    measured: both run eager unless --compile asks."""
    if not seconds or seconds < COMPILE_FROM_SECONDS:
        return False
    return device_type == "cuda" or (device_type == "cpu" and cpp_compiler_found())


def cpp_compiler_found():
    """Whether a C++ compiler that inductor's CPU backend can use is on the PATH ($CXX, g++ or
    clang++)."""
    names = [os.environ.get("CXX"), "g++", "clang++"]
    return any(shutil.which(name) for name in names if name)


def can_grow_depth(cfg):
    """Whether grow.py's depth preset can grow toward cfg."""
    try:
        grow.parse_schedule("depth", cfg)
        return True
    except ValueError:
        return False


def optimal_params(args, flops_per_s, world):
    """(N*, what it was computed from, the budget's FLOPs or None): the compute-optimal parameter
    count (scaling.compute_optimal with Besiroglu et al. 2024's constants, ~25 tokens per
    parameter)."""
    seconds, constants = budget.budget_seconds(args), scaling.PUBLISHED["epoch"]
    compute = seconds * flops_per_s * world if seconds else None
    if compute:
        basis = f"{seconds:,.0f} s x {flops_per_s * world / 1e9:,.0f} GFLOP/s = {compute:.1e} FLOPs"
        return float(scaling.compute_optimal(compute, constants)["N"]), basis, compute
    # a token budget: the N whose compute-optimal token count D*(N) is that budget (D* grows as
    # N^(b/a) in the fitted law, so N follows as D^(a/b))
    if args.max_tokens:
        opt = scaling.compute_optimal(1.0, constants)
        per_param = args.max_tokens / scaling.tokens_for_params(1.0, constants)
        return float(per_param ** (opt["a"] / opt["b"])), f"{args.max_tokens:,.0f} tokens", None
    return None, "a step budget", None


def preset_shape(args, name):
    """{"vocab_size", "max_seq_len"} of preset name for those flags left unset: each preset is
    planned at its own vocabulary (PRESET_VOCAB) and its own sequence length."""
    shape = {}
    if args.vocab_size is None:
        shape["vocab_size"] = PRESET_VOCAB[name]
    if args.max_seq_len is None:
        shape["max_seq_len"] = model.make_config(name)["max_seq_len"]
    return shape


def planned_config(args, name):
    """The model config a run of preset name trains: the preset's vocabulary and length for the
    flags left unset (preset_shape), with the flags' overrides."""
    resolved = {**vars(args), "model": name, **preset_shape(args, name)}
    return model_config(argparse.Namespace(**resolved), resolved["vocab_size"])


def auto_preset(args, speed, world, on_gpu):
    """The preset --model auto trains. A wall-clock budget: from the smallest up, the first whose
    own compute-optimal size (N* at the FLOP/s the device trains it at, speed(cfg)) is not nearer a
    larger preset; larger presets train faster per parameter on a CPU, so each is timed only if
    the one below falls short. A token budget: the one nearest N*(tokens). Neither: base on a
    GPU, tiny on a CPU."""
    if not budget.budget_seconds(args):
        n_star = optimal_params(args, None, world)[0]
        return nearest_preset(n_star) if n_star else "base" if on_gpu else "tiny"
    for name in AUTO_PRESETS:
        n_star = optimal_params(args, speed(planned_config(args, name)), world)[0]
        if AUTO_PRESETS.index(nearest_preset(n_star)) <= AUTO_PRESETS.index(name):
            return name
    return AUTO_PRESETS[-1]


def preset_params(name):
    """Total parameters of a preset at its own vocabulary, embeddings included: at these sizes the
    embedding is a large share of the model (tiny: most of it), and the fitted constants count all
    parameters."""
    return model.count_params(model.make_config(name, vocab_size=PRESET_VOCAB[name]))


def nearest_preset(n_star):
    """The auto preset whose total parameter count (preset_params) is nearest N* in log scale.
    Past base (120 M, cramming's model for a GPU day) auto does not go: a larger model takes fewer
    steps in the same hours."""
    return min(AUTO_PRESETS, key=lambda n: abs(math.log(preset_params(n) / n_star)))


def why_chosen(chosen, basis, n_star, tokens):
    """'chose model tiny, vocab-size 512, ... for 120 s x 30 GFLOP/s = ...': the start-up line."""
    if not chosen:
        return ""
    words = [k.replace("_", "-") + " " + (("on" if v else "off") if isinstance(v, bool) else
                                           f"{v:,}" if isinstance(v, int) else
                                           f"{v:g}" if isinstance(v, float) else v)
             for k, v in chosen.items()]
    why = f"for {basis}"
    if n_star:
        why += f" (compute-optimal N* = {n_star / 1e6:,.3g} M params)"
    if tokens:
        why += (f", ~{tokens / chosen['batch_tokens']:,.0f} steps of the ~{tokens:,.0f} tokens "
                "it should buy")
    return f"chose {', '.join(words)} {why}"
