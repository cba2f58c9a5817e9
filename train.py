"""train.py: turn a corpus into the best model a wall-clock budget allows (cramming), on one CPU or many GPUs.

    python train.py --hours 24                                   # FineWeb-Edu, crammed-BERT base, one GPU
    python train.py --data sample --model tiny --minutes 2       # offline, on the bundled Shakespeare
    torchrun --nproc_per_node=8 train.py --hours 3               # data parallel on 8 GPUs (DDP)
    torchrun --nproc_per_node=8 train.py --hours 3 --shard fsdp  # parameters, gradients, AdamW sharded (FSDP2)
    python train.py --resume --out runs/bert                     # continue a stopped run, same budget

Everything that changes during the run is a function of progress p = elapsed / budget in [0, 1] (Geiping &
Goldstein 2022, Sec. 3): the learning rate (default: the budget triangle, 25% of peak rising to the peak at
p = 0.75, then linearly to 0), the batch-size ramp (the target batch reached at p = 0.6), growth stages (grow.py),
and when the run stops. Step or token budgets (--max-steps, --max-tokens) give the same schedules on a
deterministic clock, which is what the tests use. The wall clock starts once the data is prepared, the model
built and its step-0 loss measured (as cramming's timer starts after model and data are loaded); from then on it
counts everything: torch.compile (at the first forward), evaluations, growth and checkpoints.

Output in --out: log.jsonl (one line per logged step, evaluation and growth event), checkpoint.pt (everything
needed to resume: weights, optimizer, progress, RNG and loader state; with --shard fsdp the folder
checkpoint.dcp/ instead, one file of shards per rank, resumable on any number of ranks), final/ (model.py's
checkpoint folder with tokenizer.json and the data's meta.json beside it), summary.json (also printed).
"""
import argparse
import functools
import json
import math
import os
import shutil
import signal
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.utils.checkpoint
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import data
import grow
import model
import tokenizer
from loader import make_loader

# -----------------------------------------------------------------------------
# Command line

# Model config keys that a flag of the same name (--n-layers for n_layers) overrides on top of the preset
SIZE_KEYS = ("n_layers", "d_model", "n_heads", "ffn_dim")
CHOICE_KEYS = ("positions", "norm", "norm_position", "activation")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="train.py", description="Budgeted language-model pretraining (cramming).",
                                usage="%(prog)s --data DATA --minutes N [flags]  (--help lists them)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # Defaults reproduce cramming's recipe (Geiping & Goldstein 2022, train/bert-o4.yaml and arch/crammed-bert.yaml)
    # except where docs/train.md shows a measured change (rotary positions), and --model auto, which picks the
    # preset, vocabulary, batch and rate that the device and budget can train (choose_defaults below).
    g = p.add_argument_group("budget (the run ends at the first one reached; give at least one)")
    g.add_argument("--hours", type=float, default=None, help="wall-clock budget in hours")
    g.add_argument("--minutes", type=float, default=None, help="wall-clock budget in minutes")
    g.add_argument("--max-steps", type=int, default=None, help="budget in optimizer steps")
    g.add_argument("--max-tokens", type=float, default=None, help="budget in training tokens (all ranks)")
    g = p.add_argument_group("data")
    g.add_argument("--data", default="fineweb", help=data.DATA_HELP)
    g.add_argument("--mix-temperature", type=float, default=None, metavar="T", help=data.MIX_TEMPERATURE_HELP)
    g.add_argument("--cache", default="cache", help="folder for downloads, tokenizer and token shards")
    g.add_argument("--vocab-size", type=int, default=None,
                   help="tokenizer vocabulary (default: by model, 512 for tiny up to cramming's 32768 for base)")
    g.add_argument("--tokenizer", default="train", help="'train' (own BPE), 'gpt2', 'cl100k_base' or a tokenizer.json")
    g.add_argument("--lowercase", action="store_true", help="lowercase and strip accents before tokenizing "
                   "(English-centric: other languages lose distinctions)")
    g.add_argument("--fineweb-shards", type=int, default=None,
                   help="FineWeb-Edu shards to download (default: as many as the budget should consume)")
    g = p.add_argument_group("model")
    g.add_argument("--model", default="auto", help=f"preset of model.py: {', '.join(model.PRESETS)}; auto: chosen "
                   "from the device and the budget (cramming's base for a GPU day, tiny for CPU minutes)")
    g.add_argument("--objective", choices=["mlm", "clm"], default="mlm", help="masked LM encoder or causal LM decoder")
    for key in SIZE_KEYS:
        g.add_argument("--" + key.replace("_", "-"), type=int, default=None, help=f"override the preset's {key}")
    g.add_argument("--positions", choices=model.CHOICES["positions"], default="rotary",
                   help="position scheme (cramming: sinusoidal; rotary leaves the unigram plateau far sooner, "
                   "see docs/train.md: the recipe)")
    for key in ("norm", "norm_position"):
        g.add_argument("--" + key.replace("_", "-"), choices=model.CHOICES[key], default=None,
                       help=f"override the preset's {key}")
    g.add_argument("--activation", "--ffn", choices=model.CHOICES["activation"], default=None,
                   help="override the preset's feed-forward activation (gated: geglu, swiglu; alias --ffn)")
    g.add_argument("--embedding-norm", choices=["on", "off"], default=None,
                   help="a norm right after the embedding (BLOOM's embedding LayerNorm; default: the preset's, on)")
    g.add_argument("--max-seq-len", "--seq-len", type=int, default=None,
                   help="tokens per sequence (default: the preset's; cramming: 128; alias --seq-len)")
    g.add_argument("--mask-rate", type=float, default=0.25, help="fraction of tokens masked for MLM (cramming: 0.25)")
    g.add_argument("--grow", default=None, help="growth schedule (grow.py), e.g. "
                   "'0:n_layers=4,max_seq_len=64; 0.25:n_layers=8; 0.5:n_layers=16' or a preset name")
    g.add_argument("--grow-optimizer", choices=["carry", "fresh"], default="carry",
                   help="at growth, carry AdamW moments of old coordinates over, or start a fresh optimizer")
    g.add_argument("--grow-moments", choices=["zero", "scaled"], default="zero",
                   help="with carry: moments of copied coordinates start at zero or scaled from their source")
    g.add_argument("--grow-noise", type=float, default=0.0, help="std of noise added to copied weights at growth")
    g.add_argument("--grow-rewarm", type=float, default=0.0,
                   help="after each growth, re-warm the learning rate linearly over this fraction of the budget")
    g.add_argument("--grow-when", choices=["fractions", "auto"], default="fractions",
                   help="fractions: each stage starts at its budget fraction; auto: when the current stage's held-out "
                   "loss flattens (slope of log loss against log FLOPs above --grow-slope; the fractions become "
                   "deadlines). --grow auto is compound's stages with auto")
    g.add_argument("--grow-slope", type=float, default=grow.AUTO_THRESHOLD,
                   help="auto: grow once d log(loss) / d log(FLOPs) over the stage's last evaluations is above this")
    g.add_argument("--grow-check-every", type=float, default=0.02,
                   help="auto: held-out evaluation for the growth decision every this fraction of the budget")
    # Cramming ramps the batch to 8192 x 128 tokens over 60% of the budget; a CPU budget buys far fewer tokens,
    # so choose_defaults shrinks the target until the run gets ~1000 steps.
    g = p.add_argument_group("optimization (defaults: cramming's recipe)")
    g.add_argument("--batch-tokens", type=int, default=None,
                   help="target global batch in tokens, reached by gradient accumulation (default: chosen from the "
                   "budget, at most cramming's 8192 x 128)")
    g.add_argument("--micro-batch", type=int, default=None,
                   help="sequences per forward pass on each device (default: 128 on a GPU, at most 32 elsewhere)")
    g.add_argument("--batch-ramp", type=float, default=0.6,
                   help="fraction of the budget over which the batch grows linearly to its target (0 = off)")
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (default: cramming's 1e-3 at width 768, "
                   "scaled as 1/d-model for narrower models)")
    g.add_argument("--schedule", choices=["triangle", "one-cycle", "linear", "cosine", "constant"], default="triangle",
                   help="learning-rate shape as a function of budget progress")
    g.add_argument("--warmup", type=float, default=0.06, help="warm-up fraction of the budget (linear, cosine)")
    g.add_argument("--weight-decay", type=float, default=0.01, help="AdamW decoupled weight decay (not on norms/biases)")
    g.add_argument("--betas", type=float, nargs=2, default=[0.9, 0.98], help="AdamW betas")
    g.add_argument("--eps", type=float, default=1e-12, help="AdamW epsilon")
    g.add_argument("--clip", type=float, default=0.5, help="gradient clipping L2 norm (0 = off)")
    g = p.add_argument_group("system")
    g.add_argument("--device", choices=["auto", "cuda", "mps", "cpu"], default="auto", help="where to train")
    g.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="autocast dtype: auto = bf16 on a CUDA GPU that supports it, fp32 elsewhere")
    g.add_argument("--compile", action="store_true", help="torch.compile the model (compile time counts)")
    g.add_argument("--shard", choices=["ddp", "fsdp"], default="ddp",
                   help="ddp: every rank holds all parameters, gradients and AdamW moments; fsdp: each holds "
                   "1/world of them (FSDP2), checkpoints go to OUT/checkpoint.dcp/ (docs/train.md: sharding)")
    g.add_argument("--checkpoint-activations", action="store_true",
                   help="keep only each block's input for the backward pass and recompute the rest: less "
                   "activation memory for ~1/3 more compute (one extra forward)")
    g.add_argument("--seed", type=int, default=0, help="seed for initialization and the batch stream")
    g = p.add_argument_group("output, evaluation and checkpoints")
    g.add_argument("--out", default="runs/cram", help="output folder")
    g.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt with the saved settings "
                   "(a budget flag given now replaces the saved budget: that extends a finished run)")
    g.add_argument("--force", action="store_true", help="replace an earlier run in OUT (its log, summary, "
                   "checkpoint and final/) instead of refusing")
    g.add_argument("--eval-every", type=float, default=0.1, help="held-out evaluation every this fraction of the budget")
    g.add_argument("--eval-batches", type=int, default=20, help="held-out batches per evaluation")
    g.add_argument("--log-every", type=int, default=10, help="write a log line every N optimizer steps")
    g.add_argument("--sample-text", default=None, help="text shown at every evaluation: its [MASK]s filled (mlm) or "
                   "continued (clm); default: a line of Hamlet")
    g.add_argument("--checkpoint-minutes", type=float, default=30.0, help="save a resumable checkpoint every N minutes")
    g.add_argument("--checkpoint-steps", type=int, default=0, help="also save one every N optimizer steps (0 = off)")
    g.add_argument("--max-bad-steps", type=int, default=5,
                   help="consecutive non-finite losses before the run stops and restores the last good checkpoint")
    args = p.parse_args(argv)
    check_args(p, args)
    return args


def budget_given(args):
    return any(v is not None for v in (args.hours, args.minutes, args.max_steps, args.max_tokens))


BUDGET_KEYS = ("hours", "minutes", "max_steps", "max_tokens")


def budget_text(args):
    """'max_steps 60' or 'minutes 2, max_tokens 1e+06': the budget flags that are set."""
    return ", ".join(f"{k} {getattr(args, k):g}" for k in BUDGET_KEYS if getattr(args, k) is not None)


def budget_seconds(args):
    """The wall-clock budget in seconds (--hours plus --minutes), or None when only steps or tokens bound the run."""
    return ((args.hours or 0) * 3600 + (args.minutes or 0) * 60) or None


def check_args(parser, args):
    """One-line errors for flags that parse but make no sense, before anything is read or written."""
    def need(ok, flag, rule):
        if not ok:
            parser.error(f"{flag} must be {rule} (got {getattr(args, flag[2:].replace('-', '_'))!r})")

    # Every check here runs before data preparation, which can take hours on a real corpus: a typo must not
    # cost that. Checks that need the prepared data or the model's shape run in resolve_settings.
    if not budget_given(args) and not args.resume:  # a resumed run takes its budget from OUT/args.json
        parser.error("give a budget: --hours, --minutes, --max-steps or --max-tokens")
    for name in ("hours", "minutes", "max_steps", "max_tokens"):
        v = getattr(args, name)
        if v is not None and not (v > 0 and math.isfinite(v)):
            parser.error(f"--{name.replace('_', '-')} must be positive, got {v}")
    for name, low in (("micro_batch", 1), ("max_seq_len", 4), ("batch_tokens", 1), ("vocab_size", 1)):
        v = getattr(args, name)
        if v is not None and v < low:
            parser.error(f"--{name.replace('_', '-')} must be >= {low}, got {v}")
    for name in (*SIZE_KEYS, "fineweb_shards"):
        v = getattr(args, name)
        need(v is None or v >= 1, "--" + name.replace("_", "-"), ">= 1")
    if not 0 <= args.batch_ramp < 1 or not 0 <= args.warmup < 1 or not 0 < args.eval_every <= 1:
        parser.error("--batch-ramp and --warmup must be in [0, 1), --eval-every in (0, 1]")
    if args.lr is not None and not (args.lr > 0 and math.isfinite(args.lr)):
        parser.error(f"--lr must be positive, got {args.lr}")
    if args.model != "auto" and args.model not in model.PRESETS:
        parser.error(f"--model must be auto or one of {', '.join(model.PRESETS)}, got {args.model!r}")
    need(args.objective == "clm" or 0 < args.mask_rate < 1, "--mask-rate", "in (0, 1)")
    need(args.clip >= 0, "--clip", ">= 0 (0 = off)")
    need(args.weight_decay >= 0, "--weight-decay", ">= 0")
    need(args.eps > 0, "--eps", "> 0")
    need(all(0 <= b < 1 for b in args.betas), "--betas", "two numbers in [0, 1)")
    need(args.grow_noise >= 0, "--grow-noise", ">= 0")
    need(0 <= args.grow_rewarm < 1, "--grow-rewarm", "in [0, 1)")
    need(args.grow is None or args.grow.strip(), "--grow", "a schedule or a preset name (leave it out for no growth)")
    need(0 < args.grow_check_every <= 0.5, "--grow-check-every", "in (0, 0.5]")
    need(math.isfinite(args.grow_slope), "--grow-slope", "a finite number")
    if args.grow == "auto":  # shorthand: compound's stages, grown when the loss says so
        args.grow, args.grow_when = "compound", "auto"
    if args.shard == "fsdp" and args.grow:
        parser.error("--grow needs --shard ddp: the grow operators read and write full weight tensors, and "
                     "unshard-grow-reshard is not implemented")
    if args.shard == "fsdp" and args.positions == "sinusoidal":
        parser.error("--positions sinusoidal needs --shard ddp: its learned scale is a scalar parameter, which "
                     "fully_shard cannot shard")
    need(args.eval_batches >= 1, "--eval-batches", ">= 1")
    need(args.log_every >= 1, "--log-every", ">= 1")
    need(args.checkpoint_minutes > 0, "--checkpoint-minutes", "> 0")
    need(args.checkpoint_steps >= 0, "--checkpoint-steps", ">= 0 (0 = off)")
    need(args.max_bad_steps >= 1, "--max-bad-steps", ">= 1")
    need(args.seed >= 0, "--seed", ">= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: no CUDA GPU visible to this torch {torch.__version__}"
                     + (" (a CPU-only build)" if torch.version.cuda is None else ""))
    if args.device == "mps" and not torch.backends.mps.is_available():
        parser.error("--device mps: Apple's Metal backend is not available here")
    if os.path.isfile(args.out):
        parser.error(f"--out {args.out} is a file; give a folder")


def model_config(args, vocab_size):
    """The model config of the run (before any growth stage): preset, then the flags that override it."""
    overrides = {k: getattr(args, k) for k in SIZE_KEYS + CHOICE_KEYS if getattr(args, k) is not None}
    if args.embedding_norm:
        overrides["embedding_norm"] = args.embedding_norm == "on"
    return model.make_config(args.model, **overrides, vocab_size=vocab_size, max_seq_len=args.max_seq_len,
                             objective=args.objective, mask_rate=args.mask_rate, dropout=0.0)


# -----------------------------------------------------------------------------
# Defaults chosen from the device and the budget: what should this budget train? (BigScience's question)

AUTO_PRESETS = ("tiny", "mini", "small", "base")  # "large" only when asked for: a GPU day buys cramming's base
PRESET_VOCAB = {"tiny": 512, "mini": 8192, "small": 16384, "base": 32768, "large": 32768}
CPU_FLOPS_PER_THREAD = 1.5e10  # training FLOP/s of one core, fp32: 15-20 G measured on the tiny models here
STEPS_WANTED = 1000  # measured (docs/train.md, the recipe): fewer, larger steps lose; more, smaller ones too
CRAMMING_BATCH = 8192 * 128


def sustained_flops(device, peak):
    """Training FLOP/s to plan with: 40% of a known GPU's peak, else a conservative guess for the device."""
    if peak:
        return 0.4 * peak
    if device.type == "cuda":
        return 50e12  # an unknown GPU: about 40% of an A100's bf16 peak
    return 5e12 if device.type == "mps" else CPU_FLOPS_PER_THREAD * torch.get_num_threads()


def choose_defaults(args, flops_per_s, world, on_gpu):
    """Values for --model, --vocab-size, --max-seq-len, --batch-tokens and --micro-batch left unset, and why.

    Model: the preset (tiny ... base) whose parameter count is nearest in log scale to the compute-optimal N* of
    the budget (scaling.compute_optimal, Besiroglu et al. 2024's constants: ~25 tokens per parameter). A GPU day
    asks for more than base, and base is cramming's choice for that budget, so auto stops there. Batch: the
    largest power of two that still gives the run ~STEPS_WANTED optimizer steps, capped at cramming's 8192 x 128."""
    import scaling  # numpy only; the planner is not needed anywhere else in training
    seconds, constants = budget_seconds(args), scaling.PUBLISHED["epoch"]
    compute = seconds * flops_per_s * world if seconds else None
    n_star, basis = None, "a step budget"
    if compute:
        n_star = float(scaling.compute_optimal(compute, constants)["N"])
        basis = f"{seconds:,.0f} s x {flops_per_s * world / 1e9:,.0f} GFLOP/s = {compute:.1e} FLOPs"
    elif args.max_tokens:  # invert D*(N): tokens_for_params grows as N^(b/a)
        opt = scaling.compute_optimal(1.0, constants)
        n_star = float((args.max_tokens / scaling.tokens_for_params(1.0, constants)) ** (opt["a"] / opt["b"]))
        basis = f"{args.max_tokens:,.0f} tokens"
    chosen = {}
    # The presets' total parameter counts are compared in log scale. Past base (120 M, cramming's model for a
    # GPU day) auto does not go: a larger model takes fewer steps in the same hours.
    if args.model == "auto":
        def total_params(name):
            return model.count_params(model.make_config(name, vocab_size=PRESET_VOCAB[name]))
        chosen["model"] = (min(AUTO_PRESETS, key=lambda n: abs(math.log(total_params(n) / n_star))) if n_star
                           else "base" if on_gpu else "tiny")
    name = chosen.get("model", args.model)
    if args.vocab_size is None:
        chosen["vocab_size"] = PRESET_VOCAB[name]
    if args.max_seq_len is None:
        chosen["max_seq_len"] = model.make_config(name)["max_seq_len"]
    resolved = argparse.Namespace(**{**vars(args), **chosen})
    seq, tokens, cfg = resolved.max_seq_len, None, model_config(resolved, resolved.vocab_size)
    if args.batch_tokens is None:  # tokens the budget buys at the planned FLOP/s, or --max-tokens if smaller
        estimates = [compute / model.flops_per_token(cfg, seq) if compute else None, args.max_tokens]
        tokens = min([t for t in estimates if t], default=None)
        batch = (2 ** int(math.log2(max(1.0, tokens / STEPS_WANTED))) if tokens
                 else CRAMMING_BATCH if on_gpu else 16 * seq)
        chosen["batch_tokens"] = int(min(CRAMMING_BATCH, max(seq * world, batch)))
    if args.micro_batch is None:  # as large as memory allows (cramming: 128 on a GPU), never more than the batch
        batch_tokens = chosen.get("batch_tokens", args.batch_tokens)
        chosen["micro_batch"] = max(1, min(128 if on_gpu else 32, batch_tokens // (seq * world)))
    if args.lr is None:  # Adam's best rate falls about as 1/width (Yang et al. 2021, muP); measured: docs/train.md
        chosen["lr"] = round(1e-3 * 768 / cfg["d_model"], 6)
    words = [f"{k.replace('_', '-')} {v:,}" if isinstance(v, int) else f"{k.replace('_', '-')} {v:g}"
             if isinstance(v, float) else f"{k} {v}" for k, v in chosen.items()]
    why = (f"for {basis}" + (f" (compute-optimal N* = {n_star / 1e6:,.3g} M params)" if n_star else "")
           + (f", ~{tokens / chosen['batch_tokens']:,.0f} steps of the ~{tokens:,.0f} tokens it should buy"
              if tokens else ""))
    return chosen, (f"chose {', '.join(words)} {why}" if chosen else "")


# -----------------------------------------------------------------------------
# Schedules: pure functions of budget progress p in [0, 1]


def lr_multiplier(p, schedule="triangle", warmup=0.06):
    """Learning rate as a fraction of the peak at progress p."""
    if schedule == "triangle":      # cramming's budget-triangle2: min(0.25 + p, 4 (1 - p))
        return max(0.0, min(0.25 + p, 4.0 * (1.0 - p)))
    if schedule == "one-cycle":     # Smith & Topin 2019: linearly up to the peak at half the budget, then down to 0
        return max(0.0, 1.0 - abs(2.0 * p - 1.0))
    if warmup > 0 and p < warmup:   # linear and cosine warm up linearly from 0
        return p / warmup
    if schedule == "constant":
        return 1.0
    q = (p - warmup) / (1.0 - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - q)
    return 0.5 * (1.0 + math.cos(math.pi * min(q, 1.0)))  # cosine, one half-period (Loshchilov & Hutter 2017)


def accumulation_steps(p, target, ramp=0.6):
    """Micro-batches per optimizer step: grows linearly from 1 to target over the first `ramp` of the budget
    (cramming's batch_size_ramp 0.6 in train/bert-o4.yaml). Early steps are small and many, when the loss falls
    fastest; the ramp goes through the number of micro-batches, so every forward keeps one static shape (no
    recompilation under torch.compile)."""
    if ramp <= 0 or p >= ramp:
        return target
    return max(1, min(target, int(p / ramp * target) + 1))


# -----------------------------------------------------------------------------
# Devices, distributed setup, optimizer


def setup_device(choice, shard="ddp"):
    """(device, rank, world_size). Under torchrun (RANK/WORLD_SIZE set) this also joins the process group:
    NCCL on GPUs, gloo on CPUs; multi-node works through torchrun's MASTER_ADDR/MASTER_PORT. FSDP needs a
    process group even in one process: a group of one rank, over an in-memory store."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if shard == "fsdp" and choice == "mps":
        raise SystemExit("error: --shard fsdp runs on CUDA GPUs (NCCL) or CPUs (gloo), not on mps; use --device cpu")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = torch.device(choice)
    if choice == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # fp32 matmuls outside autocast (the loss, the optimizer's norms) may use TF32 tensor cores, as cramming's
        # impl config allows: fp32's range at a 10-bit mantissa, several times faster on Ampere and later
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    backend = "nccl" if choice == "cuda" else "gloo"
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend=backend)
    elif shard == "fsdp" and not dist.is_initialized():
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    return device, rank, world


def autocast_dtype(choice, device):
    """bf16 where the GPU has it: it keeps fp32's exponent range, so no loss scaling is needed (cramming used fp16
    with a GradScaler). fp32 elsewhere unless --dtype bf16 asks: most CPUs run bf16 matmuls no faster."""
    if choice == "fp32" or (choice == "auto" and not (device.type == "cuda" and torch.cuda.is_bf16_supported())):
        return torch.float32
    return torch.bfloat16


def make_optimizer(net, args, device):
    """AdamW (decoupled weight decay, Loshchilov & Hutter 2019) as cramming's bert-o4 sets it: lr 1e-3 at width
    768, betas (0.9, 0.98), eps 1e-12, weight decay 0.01, none on norms, biases and scalars (cramming's
    limited_decay_keys; here: every tensor with fewer than 2 dimensions). On a GPU the fused kernel updates
    all parameters in one launch instead of several per tensor."""
    params = [p for p in net.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=tuple(args.betas), eps=args.eps,
                             fused=device.type == "cuda")


def wrap(net, args, device, world):
    """Activation checkpointing and FSDP (both in place), then torch.compile and DDP around the plain model;
    model.unwrap finds the plain model again (under FSDP that is the module itself)."""
    # Checkpointing rewrites each block's forward and FSDP shards the blocks, both in place; torch.compile then
    # traces the result, and DDP goes outermost, as nanoGPT does: DDP(torch.compile(model)).
    if args.checkpoint_activations:
        checkpoint_activations(net)
    if args.shard == "fsdp":
        shard_fsdp(net, device, world, autocast_dtype(args.dtype, device))
    if args.compile:
        net = torch.compile(net, dynamic=False)
    if world > 1 and args.shard == "ddp":
        net = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    return net


def shard_fsdp(net, device, world, dtype):
    """FSDP2 (torch.distributed.fsdp.fully_shard; PyTorch's FSDP2 tutorial): every rank keeps 1/world of each
    parameter (a slice along dim 0), and so 1/world of its gradient and AdamW moments; the optimizer must be
    built after this. Each block is one unit, all-gathered just before its forward and its backward and freed
    after; the root unit holds the rest (embedding, norms). All ranks built the same weights from the same
    seed, so each simply keeps its slice. On a GPU with bf16 the all-gathered copies are bf16 and gradients
    are reduced in fp32 (MixedPrecisionPolicy); the sharded weights and AdamW stay fp32. CPU: fp32 throughout."""
    mesh = init_device_mesh(device.type, (world,))
    bf16 = device.type == "cuda" and dtype == torch.bfloat16
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32 if bf16 else None)
    for block in net.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(net, mesh=mesh, mp_policy=policy)
    return net


def checkpoint_activations(net):
    """--checkpoint-activations: each block saves only its input for the backward pass and recomputes its
    activations there (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"). Each block's forward
    becomes torch.utils.checkpoint.checkpoint(forward, use_reentrant=False): the module and its parameter
    names stay the same for checkpoints and growth, FSDP's hooks stay outside the recomputed region (as with
    torchtitan's wrapper), and torch.compile traces it (PyTorch's composable checkpoint, run from hooks, does not)."""
    for block in net.blocks:
        block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)
    return net


def memory_per_rank(cfg, world, shard):
    """Bytes of training state on each rank, in fp32: parameters 4 per parameter, gradients 4, AdamW's two
    moments 8. DDP replicates all of it on every rank; FSDP shards it (ZeRO stage 3, Rajbhandari et al. 2020),
    so each rank holds 1/world, plus padding of at most one dim-0 row per tensor. Activations come on top, and
    so do FSDP's all-gathered copy of the block being computed and, between the micro-batches of one step, its
    unsharded gradients (the reduce-scatter runs on the last micro-batch only)."""
    n, share = model.count_params(cfg), world if shard == "fsdp" else 1
    per_rank = {name: -(-n * size // share) for name, size in (("params", 4), ("grads", 4), ("adam", 8))}
    return {**per_rank, "total": sum(per_rank.values())}


def gpu_peak_flops(device):
    """Peak bf16 FLOP/s of this GPU from scaling.py's table, or None (CPU, unknown GPU): MFU is then not shown."""
    if device.type != "cuda":
        return None
    import scaling
    try:
        return scaling.peak_flops(torch.cuda.get_device_name(device))
    except ValueError:
        return None


# -----------------------------------------------------------------------------
# Checkpoints: everything a bitwise-exact resume needs, written atomically. DDP and one process: one file from
# rank 0. FSDP: a folder of shards that every rank writes, with the run state beside them.


def run_state(net, loader, state):
    """What a checkpoint holds besides weights and optimizer: the config, the loader's position, the RunState
    and the RNG (rank 0's; every rank restores it)."""
    return {"config": model.unwrap(net).config, "loader": loader.state_dict(), "state": state,
            "rng": {"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}}


def save_checkpoint(path, net, optimizer, loader, state):
    """DDP and one process: rank 0 writes one file. The RNG and the loader's position are in it because the
    masks and the batch order are functions of the seed and the position: that makes resume bitwise exact."""
    ckpt = {"model": model.unwrap(net).state_dict(), "optimizer": optimizer.state_dict(),
            **run_state(net, loader, state)}
    data.atomic_write(path, lambda f: torch.save(ckpt, f))


def save_checkpoint_dcp(folder, net, optimizer, loader, state, rank):
    """FSDP: every rank writes its own shards of the weights and AdamW moments with Distributed Checkpoint
    (torch.distributed.checkpoint.save, one file per rank), and rank 0 writes run.pt (run_state) beside them.
    All of it goes to FOLDER.tmp/, which rank 0 renames to FOLDER/ once every rank is done: FOLDER is always a
    whole checkpoint. Collective: every rank calls it."""
    tmp, old = folder + ".tmp", folder + ".old"
    weights, moments = get_state_dict(model.unwrap(net), optimizer)  # DTensors: this rank's shards, by name
    if rank == 0 and os.path.exists(tmp):
        shutil.rmtree(tmp)                  # a save cut short by a kill
    dist.barrier()
    dcp.save({"model": weights, "optimizer": moments}, checkpoint_id=tmp)
    if rank == 0:
        torch.save(run_state(net, loader, state), os.path.join(tmp, "run.pt"))
    dist.barrier()                          # every rank's shards are on disk
    if rank == 0:
        if os.path.exists(folder):
            os.replace(folder, old)         # a directory cannot be renamed over a full one: move it aside first
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()                          # no rank reads or writes checkpoints before the rename


def load_checkpoint(path):
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path}: no checkpoint to resume from")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or foreign file
        raise SystemExit(f"error: {path}: not a readable checkpoint ({type(e).__name__}: {e})") from None


def load_checkpoint_dcp(folder):
    """FSDP: the run state of FOLDER (run.pt) and, as "folder", where load_shards finds weights and moments."""
    if not os.path.isdir(folder) and os.path.isdir(folder + ".old"):  # killed between save's two renames
        folder += ".old"
    if not os.path.isdir(folder):
        raise SystemExit(f"error: {folder}: no checkpoint to resume from")
    return {**load_checkpoint(os.path.join(folder, "run.pt")), "folder": folder}


def load_shards(folder, net, optimizer):
    """FSDP: weights and AdamW moments from a checkpoint folder into the sharded model and its optimizer.
    Distributed Checkpoint reads the part of every tensor this rank holds now, whatever the number of ranks that
    wrote it: that is the resharding (torch.distributed.checkpoint.load). Collective: every rank calls it."""
    weights, moments = get_state_dict(model.unwrap(net), optimizer)  # the shapes and slices to fill
    wanted = {"model": weights, "optimizer": moments}
    dcp.load(wanted, checkpoint_id=folder)
    set_state_dict(model.unwrap(net), optimizer, model_state_dict=wanted["model"], optim_state_dict=wanted["optimizer"])


def checkpoint_path(args):
    """OUT/checkpoint.pt, or the folder OUT/checkpoint.dcp/ under --shard fsdp."""
    return os.path.join(args.out, "checkpoint.dcp" if args.shard == "fsdp" else "checkpoint.pt")


def read_checkpoint(args):
    path = checkpoint_path(args)
    return load_checkpoint_dcp(path) if args.shard == "fsdp" else load_checkpoint(path)


def gathered_model(net, rank):
    """FSDP: the full weights, all-gathered into a plain model on rank 0's CPU (None on other ranks).
    Collective: every rank calls it."""
    full = get_model_state_dict(model.unwrap(net), options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return None
    plain = model.build_model(model.unwrap(net).config)
    plain.load_state_dict(full)
    return plain


def save_final(run, net):
    """OUT/final: model.py's folder (config.json, model.pt) plus tokenizer.json and the data's meta.json,
    written by rank 0. Under FSDP every rank calls it, for the gather of the full weights."""
    folder, meta = os.path.join(run.args.out, "final"), run.meta
    net = gathered_model(net, run.rank) if run.sharded else net
    if run.rank != 0:
        return folder
    model.save_model(net, folder)
    for name, src in (("tokenizer.json", meta["tokenizer"]), ("meta.json", os.path.join(meta["dir"], "meta.json"))):
        with open(src, "rb") as f:
            blob = f.read()
        data.atomic_write(os.path.join(folder, name), lambda f: f.write(blob))
    return folder


def append_log(path, record):
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


SAMPLE_TEXT = {"mlm": "To be, or not to [MASK], that is the question. I [MASK] you, my lord.",
               "clm": "To be, or not to be, that is"}


def show_samples(net, enc, args):
    """One line of what the model makes of a fixed text: top-3 guesses per [MASK] (mlm) or a greedy continuation
    (clm). Watching ' be' climb to the top is the quickest sign that a run learns more than word frequencies."""
    text = args.sample_text or SAMPLE_TEXT[args.objective]
    text = text.lower() if args.lowercase else text
    was_training = net.training
    try:
        if args.objective == "clm":
            return f"sample: {text!r} -> {model.generate(net, enc, text, max_new_tokens=12)!r}"
        guesses = model.fill_mask(net, enc, text, top_k=3)
        return "sample: " + " | ".join(f"[MASK] {i + 1}: " + ", ".join(f"{t.strip() or repr(t)} {p:.2f}" for t, p in g)
                                       for i, g in enumerate(guesses))
    except ValueError as e:  # e.g. the text is longer than a short-sequence growth stage
        return f"sample: skipped ({e})"
    finally:
        net.train(was_training)


def save_loss_plot(log_path, png_path):
    """loss.png: training and held-out loss against time, when matplotlib is installed (optional)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    with open(log_path) as f:
        records = [json.loads(line) for line in f]
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, key, label in (("train", "loss", "training loss"), ("eval", "val_loss", "held-out loss")):
        points = [(r["elapsed"], r[key]) for r in records if r["kind"] == kind and math.isfinite(r[key])]
        if points:
            ax.plot(*zip(*points), marker="o" if kind == "eval" else None, label=label)
    for r in records:
        if r["kind"] == "grow":
            ax.axvline(r["elapsed"], color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="seconds", ylabel="loss (nats per predicted token)", title=os.path.dirname(log_path))
    ax.legend()
    fig.tight_layout()
    data.atomic_write(png_path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
    return png_path


# -----------------------------------------------------------------------------
# Preparing a run: data, checks on the output folder, the budget, the run's state and evaluation


def budget_tokens(args, device):
    """Tokens the run should consume, to download only that much FineWeb-Edu: --max-tokens if given, else the
    wall-clock budget at 40% MFU of this GPU's peak (on a CPU or unknown GPU, 2,000 tokens/s per process)."""
    if args.max_tokens:
        return int(args.max_tokens)
    cfg = model_config(args, args.vocab_size)
    seconds = budget_seconds(args)
    if args.max_steps and not seconds:
        return args.max_steps * args.batch_tokens
    peak = gpu_peak_flops(device)
    # 40% MFU is what a well-tuned small-model run reaches (nanoGPT measures ~37% on an A100): a download sized
    # for it is rarely too small, and a run that is faster simply repeats data (the loader counts epochs)
    rate = peak * 0.4 / model.flops_per_token(cfg) if peak else 2000.0
    return int(seconds * rate * int(os.environ.get("WORLD_SIZE", 1)))


def prepare(args, device, rank, world):
    """Rank 0 prepares (downloads, cleans, tokenizes); the others wait and then read the same cache."""
    settings = dict(vocab_size=args.vocab_size, tokenizer=args.tokenizer, lowercase=args.lowercase,
                    strip_accents=args.lowercase, fineweb_shards=args.fineweb_shards,
                    max_tokens=budget_tokens(args, device) if data.downloads(args.data) else None,
                    mix_temperature=args.mix_temperature)
    meta = None
    # One process downloads and tokenizes, so ranks never race on the cache; the others then find the finished
    # entry under the same settings key and only read its meta.json
    if rank == 0:
        try:
            meta = data.prepare_data(args.data, args.cache, settings, progress=True)
        except (ValueError, OSError) as e:
            raise SystemExit(f"error: {e}") from None
    if world > 1:
        dist.barrier()
        if rank != 0:
            meta = data.prepare_data(args.data, args.cache, settings, progress=False)
    try:  # every shard's header and size, now: a damaged cache is a one-line error, not a traceback mid-run
        for split in ("train", "val"):
            make_loader(meta, split, {"objective": args.objective, "rank": rank, "world_size": world,
                                      "mask_rate": args.mask_rate}, prefetch=False)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    return meta


CONFIG_FLAGS = {key: "--" + key.replace("_", "-") for key in  # each config key's flag has the key's own name
                (*SIZE_KEYS, "max_seq_len", "vocab_size", "mask_rate")}


def config_error_in_flags(error):
    """model.validate_config's message in the command line's words: 'n_heads' (5) -> --n-heads (5)."""
    text = str(error).replace("config key ", "")
    for key, flag in CONFIG_FLAGS.items():
        text = text.replace(f"'{key}'", flag)
    return text


def growth_stages(args, cfg):
    """grow.parse_schedule of --grow toward cfg ([] without growth), as a one-line error if it is invalid."""
    try:
        return grow.parse_schedule(args.grow, cfg) if args.grow else []
    except ValueError as e:
        raise SystemExit(f"error: --grow: {e}") from None


KEPT_FILES = ("checkpoint.pt", "checkpoint.dcp", "log.jsonl", "summary.json", "final")  # never replaced silently
RUN_FILES = (*KEPT_FILES, "loss.png", "args.json", "checkpoint.dcp.tmp", "checkpoint.dcp.old")


def check_out_is_free(out, force, remove=True):
    """A finished or interrupted run in `out` is never replaced silently: refuse, or with --force remove it
    (remove=False: only check; every rank checks, rank 0 removes)."""
    found = [name for name in KEPT_FILES if os.path.exists(os.path.join(out, name))]
    if found and not force:
        what = "pass --resume to continue it" if found[0].startswith("checkpoint") else "it is from an earlier run"
        raise SystemExit(f"error: {os.path.join(out, found[0])} exists: {what}, --force to replace it, or choose "
                         "another --out")
    for name in RUN_FILES if force and remove else ():
        path = os.path.join(out, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


def truncate_log(path, state):
    """Resume appends to log.jsonl from the checkpoint on: drop what was logged after it was saved (steps that
    will run again), so no step appears twice."""
    if not os.path.exists(path):
        return
    if state.log_bytes is not None:  # the log's size when the checkpoint was written
        with open(path, "r+b") as f:
            f.truncate(min(state.log_bytes, os.path.getsize(path)))
        return
    with open(path) as f:  # checkpoints from before log_bytes: keep the records up to its step
        kept = [line for line in f if json.loads(line).get("step", 0) <= state.step]
    data.atomic_write(path, lambda f: f.write("".join(kept).encode()))


def prepare_interruptible(args, device, rank, world):
    """prepare() where SIGTERM exits at once with one line: data.py's temporary folder is removed, OUT stays empty."""
    with data.exit_cleanly_on_sigterm(args.cache, "error: stopped by a signal during data preparation; nothing was "
                                      "written (the cache keeps only finished entries)"):
        return prepare(args, device, rank, world)


class Budget:
    """Progress p in [0, 1]: the largest of elapsed/wall-clock budget, steps/max-steps, tokens/max-tokens.
    SIGTERM and SIGINT (preemption, Ctrl-C) only set `stopped`: the loop finishes the micro-batch, applies the
    step with what it has, then saves."""

    def __init__(self, args, elapsed=0.0, device=None, world=1):
        self.seconds = budget_seconds(args)
        self.max_steps, self.max_tokens = args.max_steps, args.max_tokens
        self.start = time.time() - elapsed   # a resumed run continues the same clock
        self.device, self.world, self.stopped = device, world, []
        self.reached = False                 # a step was cut at the deadline: that step was the run's last

    def elapsed(self):
        return time.time() - self.start

    def parts(self, step, tokens, elapsed):
        """(fraction used, what is left in its own unit) of every budget that was given."""
        parts = []
        if self.seconds:
            parts.append((elapsed / self.seconds, f"{max(0.0, self.seconds - elapsed) / 60:.1f} min"))
        if self.max_steps:
            parts.append((step / self.max_steps, f"{max(0, self.max_steps - step):,} steps"))
        if self.max_tokens:
            parts.append((tokens / self.max_tokens, f"{max(0, int(self.max_tokens - tokens)):,} tokens"))
        return parts

    def left(self, step, tokens, elapsed):
        """What is left of the budget that ends first: '1.5 min', '3,072 tokens' or '12 steps'."""
        return max(self.parts(step, tokens, elapsed))[1]

    def progress(self, step, tokens, elapsed):
        return min(1.0, max(fraction for fraction, _ in self.parts(step, tokens, elapsed)))

    def now(self, state, margin=0.0):
        """(progress, elapsed, stop signal?) with margin seconds added to the clock, the same on every rank (the
        slowest clock and any rank's signal count for all), or ranks would stop, grow or cut a step apart."""
        elapsed, stop = self.elapsed() + margin, float(bool(self.stopped))
        if self.world > 1:
            t = torch.tensor([elapsed, stop], dtype=torch.float64, device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            elapsed, stop = t.tolist()
        p = 1.0 if self.reached else self.progress(state.step, state.tokens, elapsed)
        return p, elapsed, stop > 0


@dataclass
class RunState:
    """Everything the loop changes. checkpoint.pt saves it; a resumed run continues from exactly these values."""
    step: int = 0                 # optimizer steps taken
    tokens: int = 0               # training tokens fed, all ranks
    flops: float = 0.0            # training FLOPs spent (model.flops_per_token of each stage)
    elapsed: float = 0.0          # seconds on the budget's clock
    stage: int = 0                # index of the current growth stage
    stage_at: float = 0.0         # progress at which that stage started
    auto_points: list = field(default_factory=list)  # [[flops, held-out loss]] of this stage (--grow-when auto)
    next_eval: float = 0.0        # progress of the next held-out evaluation
    next_check: float = 0.0       # progress of the next growth check (--grow-when auto)
    bad_steps: int = 0            # non-finite losses in a row
    skipped_steps: int = 0        # non-finite losses in all
    log_bytes: int = None         # log.jsonl's size when the checkpoint was written: resume truncates it there


@dataclass
class Run:
    """What the loop reads and never changes: the settings, the hardware, the data, the stages and the files
    (and the caches of evaluate)."""
    args: argparse.Namespace
    device: torch.device
    dtype: torch.dtype            # autocast dtype: bf16 on a GPU that has it, fp32 elsewhere
    rank: int
    world: int
    meta: dict                    # data.prepare_data's description of the token shards
    enc: object                   # the tokenizer, only to show samples
    stages: list                  # grow.parse_schedule's stages ([] without growth)
    log_path: str
    ckpt_path: str                # checkpoint.pt, or the folder checkpoint.dcp/ under FSDP
    peak: float                   # this GPU's peak FLOP/s, or None (no MFU)
    budget: Budget = None         # the clock: start_clock makes it once setup is done
    # evaluate's caches: the held-out batches, built once, and a mixture's losses per source at the last evaluation
    held_out: dict = field(default_factory=dict)  # {sequence length: {source: the evaluation's batches}}
    val_by_source: dict = None

    def say(self, *text):
        """Print on rank 0 only, through tqdm so that a line never breaks the progress bar."""
        if self.rank == 0:
            tqdm.write(" ".join(map(str, text)))

    def log(self, record):
        if self.rank == 0:
            append_log(self.log_path, record)

    @property
    def sharded(self):
        """FSDP: every forward pass and every save is collective (all ranks take part), not just rank 0's."""
        return self.args.shard == "fsdp"

    def samples(self, net):
        """show_samples' line on rank 0, '' on the others. Under FSDP every rank runs the forward passes, with
        the root's tensors all-gathered for the whole call (generate calls encode and logits, not forward)."""
        if not self.sharded:
            return show_samples(model.unwrap(net), self.enc, self.args) if self.rank == 0 else ""
        plain = model.unwrap(net)
        plain.unshard()
        try:
            text = show_samples(plain, self.enc, self.args)
        finally:
            plain.reshard()
        return text if self.rank == 0 else ""


@torch.no_grad()
def evaluate(run, net):
    """Mean held-out loss over the same --eval-batches batches every time, at the model's sequence length,
    averaged over ranks. The batches (the val split read in order with a fixed seed) are built once per length.
    A corpus mixture evaluates each source's own val split so; the result is their mean weighted by the mixture,
    and run.val_by_source keeps each source's loss for the log."""
    plain, args = model.unwrap(net), run.args
    T = plain.config["max_seq_len"]
    names = [s["name"] for s in run.meta.get("sources", [])] or [None]  # None: the one corpus
    if T not in run.held_out:  # a fixed seed: the same masks every time, in every run, so curves compare
        run.held_out[T] = {}
        for name in names:
            loader = make_loader(run.meta, "val", {"objective": args.objective, "seed": 1234, "rank": run.rank,
                                                   "world_size": run.world, "mask_rate": args.mask_rate},
                                 device=run.device, prefetch=False, source=name)
            run.held_out[T][name] = [loader.next_batch(args.micro_batch, T) for _ in range(args.eval_batches)]
    was_training = plain.training
    plain.eval()  # no dropout; eager and outside DDP (under FSDP the plain model is the sharded module itself)
    total = torch.zeros(len(names), device=run.device)
    for i, name in enumerate(names):
        for batch in run.held_out[T][name]:
            with torch.autocast(run.device.type, dtype=run.dtype, enabled=run.dtype != torch.float32):
                total[i] += plain(**batch)["loss"].float()
    plain.train(was_training)
    if run.world > 1:  # each rank evaluated its own slice of the held-out batches: the mean over all of them
        dist.all_reduce(total)
    losses = [t / (args.eval_batches * run.world) for t in total.tolist()]
    if names == [None]:
        return losses[0]
    run.val_by_source = dict(zip(names, losses))
    return sum(s["weight"] * loss for s, loss in zip(run.meta["sources"], losses))


def val_text(run, val):
    """'3.410', or for a mixture '3.410 (plays 3.302, sonnets 3.671)': the progress line's held-out loss."""
    each = ", ".join(f"{name} {loss:.3f}" for name, loss in (run.val_by_source or {}).items())
    return f"{val:.3f} ({each})" if each else f"{val:.3f}"


def log_eval(run, state, p, val, elapsed=None, **extra):
    """An 'eval' record in log.jsonl; elapsed defaults to the budget's clock now (the step-0 evaluation runs
    before the clock exists, the final one after it has stopped)."""
    elapsed = run.budget.elapsed() if elapsed is None else elapsed
    each = {"val_loss_by_source": run.val_by_source} if run.val_by_source else {}  # a mixture's sources
    run.log({"kind": "eval", "step": state.step, "tokens": state.tokens, "flops": state.flops,
             "elapsed": round(elapsed, 3), "progress": round(p, 5), "val_loss": val, **each, **extra})


# -----------------------------------------------------------------------------
# Setup: settings, checks, data, model and optimizer (or the checkpoint they were saved in)

def resolve_settings(args, device, rank, world):
    """Fill in the flags left unset (choose_defaults) and check everything a run needs before any work: the
    shape, the growth schedule and the masking at every length. Returns the checkpoint to resume, or None."""
    try:
        chosen, why = choose_defaults(args, sustained_flops(device, gpu_peak_flops(device)), world,
                                      device.type == "cuda")
    except ValueError as e:  # a shape flag that makes no valid model, e.g. an odd head size with rotary
        raise SystemExit(f"error: {config_error_in_flags(e)}") from None
    vars(args).update(chosen)  # resolved before args.json is written, so --resume reuses the same choice
    if why and rank == 0:
        print(f"defaults: {why} (flags given on the command line always win)")
    ckpt = read_checkpoint(args) if args.resume else None
    stages = growth_stages(args, model_config(args, args.vocab_size))  # a bad schedule fails before any work
    for T in {args.max_seq_len, *(s["config"]["max_seq_len"] for s in stages)} if args.objective == "mlm" else ():
        if not 1 <= round(args.mask_rate * T) <= T - 2:
            raise SystemExit(f"error: --mask-rate {args.mask_rate} masks {round(args.mask_rate * T)} of {T} tokens "
                             f"per sequence; it must mask 1 to {T - 2}")
    if ckpt is None:
        check_out_is_free(args.out, args.force, remove=rank == 0)
    return ckpt


def start_run(args, ckpt, device, rank, world):
    """Prepare the data, write args.json (the first file written: every check has passed) and return the Run."""
    meta = prepare_interruptible(args, device, rank, world)
    cfg = model_config(args, meta["n_vocab"])
    stages = growth_stages(args, cfg)
    run = Run(args, device, autocast_dtype(args.dtype, device), rank, world, meta,
              tokenizer.load_tokenizer(meta["tokenizer"]), stages, os.path.join(args.out, "log.jsonl"),
              checkpoint_path(args), gpu_peak_flops(device))
    if stages and any(stages[-1]["config"][k] != cfg[k] for k in grow.GROWN_KEYS):
        run.say(f"--grow: the schedule ends at {grow.describe(stages[-1]['config'])}, not the model's "
                f"{grow.describe(cfg)}; the run trains toward the schedule's last stage")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        if ckpt is None or getattr(args, "budget_was", None):  # a resume saves its extended budget
            settings = {k: v for k, v in vars(args).items() if k != "budget_was"}
            data.atomic_write(os.path.join(args.out, "args.json"),
                              lambda f: f.write(json.dumps(settings, indent=2).encode()))
        if ckpt is not None:
            truncate_log(run.log_path, RunState(**ckpt["state"]))
    return run, cfg


def build(run, cfg, ckpt):
    """(net, optimizer, loader, state): fresh from the seed (at the first growth stage), or as checkpointed."""
    args = run.args
    torch.manual_seed(args.seed)  # the same weights on every rank: FSDP keeps each rank's slice of them
    net = model.build_model(ckpt["config"] if ckpt else run.stages[0]["config"] if run.stages else cfg)
    net = net.to(run.device)
    # The order matters: weights go in before wrapping (DDP broadcasts them, FSDP keeps a slice of them), and the
    # optimizer is made after (under FSDP its moments must be shaped like the shards, not the full tensors).
    if ckpt and not run.sharded:
        net.load_state_dict(ckpt["model"])
    net = wrap(net.train(), args, run.device, run.world)
    optimizer = make_optimizer(model.unwrap(net), args, run.device)  # after sharding: AdamW holds the shards
    loader = make_loader(run.meta, "train", {"objective": args.objective, "seed": args.seed, "rank": run.rank,
                                             "world_size": run.world, "mask_rate": args.mask_rate}, device=run.device)
    state = RunState(next_eval=args.eval_every, next_check=args.grow_check_every)
    if ckpt:
        if run.sharded:
            load_shards(ckpt["folder"], net, optimizer)
        else:
            optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        state = RunState(**ckpt["state"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if ckpt["rng"]["cuda"] is not None and run.device.type == "cuda":
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        run.say(f"resuming {run.ckpt_path} at step {state.step}, {state.tokens:,} tokens, {state.elapsed:.0f} s used")
    return net, optimizer, loader, state


def start_clock(run, state, net, resumed):
    """The step-0 evaluation (off the clock: where the curve starts, about ln V nats), then the Budget, whose
    clock starts now (a resumed run's continues from its saved elapsed time). A resumed run checks that budget is
    left, and an extended one moves its next evaluation to the new progress."""
    args = run.args
    if not resumed:
        val = evaluate(run, net)
        log_eval(run, state, 0.0, val, elapsed=0.0)
        run.say(f"held-out loss before training: {val_text(run, val)}")
    budget = Budget(args, state.elapsed, run.device, run.world)
    if resumed:
        p = budget.progress(state.step, state.tokens, state.elapsed)
        if p >= 1.0:
            raise SystemExit(f"error: {run.ckpt_path} has spent its budget "
                             f"({budget.left(state.step, state.tokens, state.elapsed)} left); give a larger "
                             "one with --resume to extend the run")
        if getattr(args, "budget_was", None):  # extended: the schedules read progress, which just went down
            state.next_eval = (math.floor(p / args.eval_every) + 1) * args.eval_every
            run.say(f"resume: budget {args.budget_was} -> {budget_text(args)}; progress is now {p:.1%}, so the "
                    "learning rate, batch ramp and growth stages continue from there (docs/train.md: extending a run)")
    return budget


def describe_run(run, net, cfg):
    """The start-up lines: the model, the device, parameters and FLOPs, the global batch, what the budget buys."""
    args, now = run.args, model.unwrap(net).config
    flops_tok = model.flops_per_token(now)
    run.say(json.dumps({"model": now}, indent=None))
    run.say(f"device {run.device} ({str(run.dtype).replace('torch.', '')}), {run.world} process(es); "
            f"{model.count_params(now) / 1e6:.1f} M parameters ({model.count_params(now, False) / 1e6:.1f} M "
            f"without embeddings), {flops_tok / 1e6:.0f} MFLOP per token"
            + (f"; growing to {model.count_params(cfg) / 1e6:.1f} M in {len(run.stages) - 1} stage(s)"
               if run.stages else ""))
    accum = target_accumulation(args, args.max_seq_len, run.world)
    run.say(f"global batch {accum * args.micro_batch * args.max_seq_len * run.world:,} tokens = {args.micro_batch} "
            f"sequences x {args.max_seq_len} tokens x {run.world} rank(s) x {accum} accumulation steps "
            f"(ramped over {args.batch_ramp:.0%} of the budget)")
    if run.peak and run.budget.seconds:
        run.say(f"the budget should buy ~{run.budget.seconds * run.peak * 0.4 / flops_tok / 1e9:.2f} B tokens at "
                f"40% MFU (peak {run.peak / 1e12:.0f} TFLOP/s)")
    ddp, fsdp = (memory_per_rank(now, run.world, shard) for shard in ("ddp", "fsdp"))
    run.say(f"memory per rank for fp32 parameters + gradients + AdamW moments: DDP {memory_text(ddp)}; FSDP over "
            f"{run.world} rank(s) {memory_text(fsdp)}; this run: {args.shard}"
            + (", activations checkpointed" if args.checkpoint_activations else ""))
    if run.sharded:
        shards = [None] * run.world
        dist.all_gather_object(shards, shard_bytes(net))
        run.say(f"parameter bytes held by each rank after fully_shard: {shards}")


def memory_text(memory):
    """'0.5 MB + 0.5 MB + 0.9 MB = 1.8 MB': parameters + gradients + AdamW moments, of memory_per_rank."""
    def text(n):
        return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
    return " + ".join(text(memory[k]) for k in ("params", "grads", "adam")) + f" = {text(memory['total'])}"


def shard_bytes(net):
    """FSDP: bytes of parameters this rank holds, its slice of every tensor (what memory_per_rank predicts)."""
    plain = model.unwrap(net)
    plain.reshard()  # a forward in eval mode (the step-0 evaluation) leaves the root unit all-gathered
    return sum(p.to_local().numel() * p.to_local().element_size() for p in plain.parameters())


# -----------------------------------------------------------------------------
# The pieces of one step

def target_accumulation(args, seq_len, world):
    """Micro-batches per step that make --batch-tokens; a growth stage with shorter sequences accumulates more
    of them, so every optimizer step sees the same number of tokens."""
    return max(1, round(args.batch_tokens / (args.micro_batch * seq_len * world)))


def growth_is_due(run, state, net, p):
    """(due?, why): whether the next growth stage starts now: at its budget fraction, or (--grow-when auto) when
    grow.auto_should_grow sees this stage's held-out loss flatten, from evaluations every --grow-check-every."""
    args = run.args
    if not run.stages or state.stage + 1 >= len(run.stages):
        return False, None
    if args.grow_when != "auto":
        return p >= run.stages[state.stage + 1]["at"], "fraction"
    if p >= state.next_check:
        state.next_check = (math.floor(p / args.grow_check_every) + 1) * args.grow_check_every
        val = evaluate(run, net)
        state.auto_points.append([state.flops, val])
        log_eval(run, state, p, val, growth_check=True)
    return grow.auto_should_grow(state.auto_points, p, state.stage + 1, len(run.stages), args.grow_slope)


def grow_now(run, state, net, optimizer, p, why):
    """Grow model and optimizer to the next stage (grow.apply_stage) and log the event with the held-out loss
    just before (at the old sequence length) and just after (at the new one). Returns (net, optimizer)."""
    args = run.args
    state.stage += 1
    # The loss just before and just after shows what the operator cost: a function-preserving one (Net2Net,
    # bert2BERT) changes it by float noise only, while a sequence-length step also changes the task
    loss_before = evaluate(run, net)
    plain, optimizer, event = grow.apply_stage(
        model.unwrap(net), optimizer, run.stages[state.stage], lambda m: make_optimizer(m, args, run.device),
        noise=args.grow_noise, seed=args.seed, policy=args.grow_optimizer, new_moments=args.grow_moments)
    net = wrap(plain.to(run.device).train(), args, run.device, run.world)  # compile and DDP see the new shapes
    loss_after = evaluate(run, net)
    state.stage_at, state.auto_points = p, [[state.flops, loss_after]]    # the new stage's curve starts here
    event = {"kind": "grow", "step": state.step, "tokens": state.tokens, "elapsed": state.elapsed, "progress": p,
             **event, "val_loss_before": loss_before, "val_loss_after": loss_after, "reason": why}
    run.log(event)
    run.say(f"grow at {p:.1%}: {event}")
    return net, optimizer


def learning_rate(args, state, p):
    """The peak rate times the schedule at progress p, re-warmed after a growth event with --grow-rewarm."""
    lr = args.lr * lr_multiplier(p, args.schedule, args.warmup)
    if state.stage > 0 and args.grow_rewarm > 0:
        lr *= grow.rewarm_factor(p, state.stage_at, args.grow_rewarm)
    return lr


def forward_backward(run, state, net, loader, p):
    """One step's gradients, accumulated over micro-batches up to --batch-tokens (ramped), the all-reduce only
    on the last. Returns (mean loss, micro-batches done, gradient norm after clipping or None).

    The hard budget: before every micro-batch after the first, the clock and the stop signal are read, and the
    micro-batch that would end past the deadline becomes the step's last. The run ends at most one micro-batch
    late even when a step takes minutes, and a preempted run stops within seconds."""
    args, device, T = run.args, run.device, model.unwrap(net).config["max_seq_len"]
    accum = accumulation_steps(p, target_accumulation(args, T, run.world), args.batch_ramp)
    loss_sum, done, micro_seconds = torch.zeros((), device=device), 0, 0.0
    for micro in range(accum):
        last = micro == accum - 1 or (micro > 0 and ends_past_deadline(run.budget, state, micro_seconds))
        started = time.time()
        batch = loader.next_batch(args.micro_batch, T)
        with gradient_sync(run, net, last), torch.autocast(device.type, dtype=run.dtype,
                                                           enabled=run.dtype != torch.float32):
            loss = net(**batch)["loss"]          # MLM: cross-entropy on the masked positions only (sparse)
            (loss / accum).backward()            # gradients add up: the step's mean over its micro-batches
        loss_sum += loss.detach().float()
        done += 1
        micro_seconds = time.time() - started
        if last:
            break
    mean_over_done(net, accum, done)
    if run.world > 1:  # one loss for all ranks, so all take the same skip-or-step decision
        dist.all_reduce(loss_sum)
        loss_sum /= run.world
    # Clip the global L2 norm (cramming: 0.5), which keeps the few early spikes of a high peak rate from undoing
    # training. It is queued before .item() waits for the GPU, so little is left to launch after the wait; a
    # non-finite step discards the (clipped) gradients anyway.
    grad_norm = torch.nn.utils.clip_grad_norm_(net.parameters(), args.clip) if args.clip > 0 else None
    if isinstance(grad_norm, DTensor):  # FSDP: a norm over the shards of all ranks
        grad_norm = grad_norm.full_tensor()
    return loss_sum.item() / done, done, grad_norm


def ends_past_deadline(budget, state, micro_seconds):
    """Would one more micro-batch, as long as the last one, end past the deadline (or has a stop signal come)?
    Then it becomes the step's last, and at the deadline that step is also the run's last, even if its final
    micro-batch ran faster than the one before and the clock stops just short: a run ends within one micro-batch
    of its deadline, and never with extra steps of one or two micro-batches."""
    progress_after, _, stopped = budget.now(state, micro_seconds)
    budget.reached = budget.reached or progress_after >= 1.0
    return progress_after >= 1.0 or stopped


def mean_over_done(net, accum, done):
    """A step cut short at the deadline divided each micro-batch's loss by accum, not by done: rescale its
    gradients to the mean over the micro-batches it has."""
    if done < accum:
        for param in net.parameters():
            if param.grad is not None:
                param.grad.mul_(accum / done)


def gradient_sync(run, net, last):
    """The context of one micro-batch's backward: gradients are reduced across ranks on the step's last only.
    DDP: no_sync() skips the all-reduce. FSDP: set_requires_gradient_sync(False) skips the reduce-scatter, and
    the unsharded gradients stay until the last micro-batch (fewer collectives, more memory in between)."""
    if run.sharded:
        model.unwrap(net).set_requires_gradient_sync(last)
        return nullcontext()
    return nullcontext() if run.world == 1 or last else net.no_sync()


def checkpoint(run, state, net, optimizer, loader):
    """Save the run (rank 0's RunState). Every rank calls it: under FSDP every rank writes its shards."""
    state.elapsed = run.budget.elapsed()
    if run.rank == 0:
        state.log_bytes = os.path.getsize(run.log_path) if os.path.exists(run.log_path) else 0  # resume cuts here
    if run.sharded:
        save_checkpoint_dcp(run.ckpt_path, net, optimizer, loader, asdict(state), run.rank)
    elif run.rank == 0:
        save_checkpoint(run.ckpt_path, net, optimizer, loader, asdict(state))


class Speed:
    """Tokens and FLOPs per second since the last log line, and once, ten steps after the first (which compiles
    and warms up), the tokens the whole budget should buy at the measured rate."""

    def __init__(self, state, resumed):
        self.last = (time.time(), state.tokens, state.flops)
        self.first_step, self.warm, self.estimated = state.step + 1, None, resumed

    def since_last_log(self, state):
        """(tokens/s, FLOP/s) since the previous call; the next call measures from now."""
        (then, tokens, flops), now = self.last, time.time()
        self.last, seconds = (now, state.tokens, state.flops), max(now - then, 1e-9)
        return (state.tokens - tokens) / seconds, (state.flops - flops) / seconds

    def estimate(self, run, state):
        if self.estimated or not run.budget.seconds:
            return
        if state.step == self.first_step:
            self.warm = (time.time(), state.tokens)
        elif state.step >= self.first_step + 10:
            rate = (state.tokens - self.warm[1]) / (time.time() - self.warm[0])
            left = max(run.budget.seconds - run.budget.elapsed(), 0.0)
            run.say(f"measured {rate:,.0f} tokens/s: the budget should buy ~{state.tokens + rate * left:,.0f} "
                    "tokens in all")
            self.estimated = True


def log_step(run, state, p, speed, bar, loss, lr, batch_tokens, grad_norm):
    """A 'train' record in log.jsonl and the progress bar's text. MFU (on a GPU of known peak) is the model
    FLOPs actually spent per second over the peak of all ranks (PaLM's definition, Chowdhery et al. 2022, App. B)."""
    tok_s, flop_s = speed.since_last_log(state)
    record = {"kind": "train", "step": state.step, "tokens": state.tokens, "elapsed": round(run.budget.elapsed(), 3),
              "progress": round(p, 5), "loss": loss, "lr": lr, "batch_tokens": batch_tokens, "flops": state.flops,
              "tokens_per_s": round(tok_s), "grad_norm": grad_norm.item() if grad_norm is not None else None}
    if run.peak:
        record["mfu"] = round(flop_s / (run.peak * run.world), 4)
    run.log(record)
    bar.set_postfix_str(f"loss {loss:.3f}, lr {lr:.2e}, {tok_s:,.0f} tokens/s, "
                        f"{run.budget.left(state.step, state.tokens, run.budget.elapsed())} left")


# -----------------------------------------------------------------------------
# The run: setup, the loop, the finish

def train(args):
    """One run: setup, the loop, the finish. Each pass of the loop is one optimizer step:
      1. stop when the budget is spent (progress p = 1: time, steps or tokens) or a signal came;
      2. grow the model when the next growth stage is due (grow.py);
      3. set the learning rate from p;
      4. forward and backward over micro-batches until the step holds --batch-tokens (fewer at the deadline);
      5. skip the update if the loss is not finite, else update the weights;
      6. log; evaluate every --eval-every of the budget; checkpoint every --checkpoint-minutes.
    It ends when p reaches 1 (at most one micro-batch late), on SIGTERM/SIGINT (saved for --resume), or after
    --max-bad-steps non-finite losses in a row (the last good checkpoint is restored)."""
    # ---- setup: settings and checks, data, model and optimizer, the clock
    device, rank, world = setup_device(args.device, args.shard)
    ckpt = resolve_settings(args, device, rank, world)
    run, cfg = start_run(args, ckpt, device, rank, world)
    net, optimizer, loader, state = build(run, cfg, ckpt)
    run.budget = start_clock(run, state, net, resumed=ckpt is not None)
    describe_run(run, net, cfg)
    # preemption (SIGTERM) and Ctrl-C only set a flag: the step in flight finishes, then the run saves
    previous_handlers = {sig: signal.signal(sig, lambda s, f: run.budget.stopped.append(s))
                         for sig in (signal.SIGTERM, signal.SIGINT)}
    bar = tqdm(total=100, disable=rank != 0, unit="%", desc="budget", dynamic_ncols=True,
               bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}{postfix}]")
    speed, last_ckpt, status = Speed(state, resumed=ckpt is not None), state.elapsed, "budget spent"
    while True:
        # ---- stop: the budget is spent, or a signal asked us to
        p, state.elapsed, stopped = run.budget.now(state)
        if p >= 1.0 or stopped:
            status = "budget spent" if p >= 1.0 else "preempted"
            break

        # ---- grow: the next stage starts at its budget fraction, or when this stage's loss flattens (auto)
        due, why = growth_is_due(run, state, net, p)
        if due:
            net, optimizer = grow_now(run, state, net, optimizer, p, why)

        # ---- set the learning rate: a function of progress only (cramming's budget schedules), so a slow step,
        # an evaluation or a resume never shifts it
        lr = learning_rate(args, state, p)
        for group in optimizer.param_groups:
            group["lr"] = lr

        # ---- forward and backward over the step's micro-batches, cut at the deadline
        loss, done, grad_norm = forward_backward(run, state, net, loader, p)
        # one inf or NaN in AdamW's moments would stay there for good: skip the update instead (the data position
        # moves on, so the next step sees other batches), and give up after --max-bad-steps in a row
        if not math.isfinite(loss):
            optimizer.zero_grad(set_to_none=True)
            state.bad_steps += 1
            state.skipped_steps += 1
            run.log({"kind": "skip", "step": state.step, "loss": loss})
            if state.bad_steps >= args.max_bad_steps:
                status = "diverged"
                break
            continue

        # ---- update the weights and count what the step consumed
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        now = model.unwrap(net).config                                # the current growth stage's shape
        batch_tokens, flops_per_token = done * args.micro_batch * now["max_seq_len"] * world, model.flops_per_token(now)
        state.bad_steps, state.step = 0, state.step + 1
        state.tokens += batch_tokens
        state.flops += batch_tokens * flops_per_token
        bar.update(round(100 * p, 1) - bar.n)                          # the bar counts % of the budget

        # ---- log
        speed.estimate(run, state)
        if state.step % args.log_every == 0:
            log_step(run, state, p, speed, bar, loss, lr, batch_tokens, grad_norm)

        # ---- evaluate on held-out data, and show what the model makes of a fixed text
        if p >= state.next_eval:
            state.next_eval += args.eval_every
            val = evaluate(run, net)
            log_eval(run, state, p, val)
            run.say(f"{p:4.0%} held-out loss {val_text(run, val)}; {run.samples(net)}")

        # ---- checkpoint every --checkpoint-minutes (and --checkpoint-steps), on the clock all ranks agree on
        if (args.checkpoint_steps and state.step % args.checkpoint_steps == 0) or \
                state.elapsed - last_ckpt > args.checkpoint_minutes * 60:
            last_ckpt = state.elapsed
            checkpoint(run, state, net, optimizer, loader)
    bar.close()
    for sig, handler in previous_handlers.items():
        signal.signal(sig, handler)
    return finish(run, state, net, optimizer, loader, status)


def finish(run, state, net, optimizer, loader, status):
    """Preempted: save and say how to resume. Diverged: restore the last good checkpoint into final/ and exit 1.
    Otherwise the final evaluation, checkpoint, final/, loss.png and summary.json (also printed)."""
    args, state.elapsed = run.args, run.budget.elapsed()
    if status == "preempted":
        checkpoint(run, state, net, optimizer, loader)
        run.say(f"stopped by signal at step {state.step}: checkpoint saved to {run.ckpt_path}; continue with --resume")
        return {"status": status, **asdict(state)}
    if status == "diverged":  # the weights in memory may hold NaN: final/ gets the last checkpoint's instead
        run.say(f"error: {args.max_bad_steps} non-finite losses in a row at step {state.step}")
        if os.path.exists(run.ckpt_path):
            good = read_checkpoint(args)
            if run.sharded:  # back into the sharded model, which save_final gathers
                load_shards(good["folder"], net, optimizer)
                restored = net
            else:
                restored = model.build_model(good["config"])
                restored.load_state_dict(good["model"])
            save_final(run, restored)
            run.say(f"restored the last good checkpoint (step {good['state']['step']}) into {args.out}/final; "
                    "lower --lr or raise --clip, then --resume")
        raise SystemExit(1)

    # ---- the budget is spent: one last evaluation, the checkpoint (a later --resume with a larger budget extends
    # the run), final/ for evaluate_glue.py and evaluate_lm.py, the plot and the summary
    val = evaluate(run, net)
    final_cfg = model.unwrap(net).config
    T = final_cfg["max_seq_len"]
    summary = {"status": status, "steps": state.step, "tokens": state.tokens, "model": args.model,
               "batch_tokens": args.batch_tokens,
               "elapsed_s": round(state.elapsed, 2), "flops": state.flops,
               "tokens_per_s": round(state.tokens / max(state.elapsed, 1e-9)), "final_val_loss": val,
               "params": model.count_params(final_cfg, embeddings=False), "params_total": model.count_params(final_cfg),
               "flops_per_token": model.flops_per_token(final_cfg), "skipped_steps": state.skipped_steps,
               "world_size": run.world, "device": str(run.device), "dtype": str(run.dtype).replace("torch.", ""),
               "out": args.out,
               # what the held-out loss depends on besides N and D: scaling.py fits only runs that agree on these
               "comparable": {"data": os.path.basename(run.meta["dir"]), "vocab_size": final_cfg["vocab_size"],
                              "objective": args.objective, "seq_len": T, "mask_rate": args.mask_rate}}
    if run.val_by_source:  # a mixture: each source's final loss, and how often the run read each source
        summary.update(val_loss_by_source=run.val_by_source, epochs_by_source=loader.epochs())
    if run.peak:
        summary["mfu"] = round(state.flops / max(state.elapsed, 1e-9) / (run.peak * run.world), 4)  # as log_step
    log_eval(run, state, 1.0, val, elapsed=state.elapsed)
    checkpoint(run, state, net, optimizer, loader)   # every rank: under FSDP each writes its shards,
    summary["final"] = save_final(run, net)          # and takes part in gathering the weights
    sample = run.samples(net)
    if run.rank == 0:
        summary["plot"] = save_loss_plot(run.log_path, os.path.join(args.out, "loss.png"))
        print(sample)
        data.atomic_write(os.path.join(args.out, "summary.json"),
                          lambda f: f.write(json.dumps(summary, indent=2).encode()))
        print(summary_text(summary))
    return summary


def summary_text(summary):
    """The printed summary: one 'key: value' line each, floats to 4 significant digits (summary.json keeps all)."""
    def shown(v):
        return f"{v:.4g}" if isinstance(v, float) else \
            "{" + ", ".join(f"{k}: {shown(x)}" for k, x in v.items()) + "}" if isinstance(v, dict) else str(v)
    width = max(map(len, summary))
    return "\n".join(f"{k:>{width}}: {shown(v)}" for k, v in summary.items())


RENAMED_FLAGS = {"seq_len": "max_seq_len", "ffn": "activation"}  # in args.json of runs saved before the rename


def main(argv=None):
    args = parse_args(argv)
    # A resume must train the same model on the same data with the same schedule, so its settings come from
    # OUT/args.json and not from today's command line; only a new budget may extend the run.
    if args.resume:  # the saved settings win, except the output flags and a budget given now
        saved = os.path.join(args.out, "args.json")
        if os.path.isfile(saved):
            given = {k: getattr(args, k) for k in BUDGET_KEYS} if budget_given(args) else None
            with open(saved) as f:  # keys a newer train.py added keep their defaults
                settings = {RENAMED_FLAGS.get(k, k): v for k, v in json.load(f).items()}
            args = argparse.Namespace(**{**vars(args), **settings, "resume": True, "out": args.out})
            if given and given != {k: getattr(args, k) for k in BUDGET_KEYS}:
                was = budget_text(args)
                vars(args).update(given, budget_was=was)
        elif not budget_given(args):
            raise SystemExit(f"error: {saved} is missing; give the budget again (--hours, --max-steps, ...)")
    try:
        result = train(args)
        if dist.is_initialized():  # leave together: a rank tearing down gloo while rank 0 still saves aborts
            dist.barrier()
        return result
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
