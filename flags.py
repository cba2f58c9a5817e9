"""flags.py: the command line of train.py. Every flag with its default and why, the checks that
run before any work, and the settings a resumed run takes from its folder.

    args = flags.parse_args(["--data", "sample", "--minutes", "2"])   # an argparse.Namespace
    args, budget_was = flags.resume_settings(args)                     # with --resume

Defaults reproduce cramming's recipe (Geiping & Goldstein 2022, train/bert-o4.yaml and
arch/crammed-bert.yaml) except where docs/train.md shows a measured change (rotary positions), and
--model auto, which picks the preset, vocabulary, batch and rate that the device and budget can
train (planning.py). Parsed flags are never changed afterwards: train.py derives its settings from
them as a new Namespace.
"""
import argparse
import json
import math
import os

import torch

import data
import grow
import model
import muon
import planning

BUDGET_KEYS = ("hours", "minutes", "max_steps", "max_tokens")
# Defaults that changed: a run whose args.json lacks the key (the flag is newer than the run) or
# saved it as null (left unset when unset meant none of it) ran with this value, and resumes with
# it. Muon became the default with the flag's second version; depth growth and the value residual
# later, NorMuon (record 9) and the weights' average (record 10) with their flags' first.
BEFORE_THE_FLAG = {"optimizer": "adamw", "value_residual": "off", "grow": "none",
                   "eval_mask_rate": None,  # None: the held-out loss at the run's own rate
                   "neuron_beta2": 0.0, "ema": 0.0}


def parse_args(argv=None):
    usage = "%(prog)s --data DATA --minutes N [flags]  (--help lists them)"
    p = argparse.ArgumentParser(prog="train.py", usage=usage,
                                description="Budgeted language-model pretraining (cramming).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_budget_and_data_flags(p)
    add_model_flags(p)
    add_optimization_flags(p)
    add_system_and_output_flags(p)
    args = p.parse_args(argv)
    check_args(p, args)
    return args


def add_budget_and_data_flags(p):
    # The budget is wall-clock first (cramming's one day on one GPU): every schedule reads progress
    # against it. Steps and tokens give a deterministic clock for the tests and for comparing runs
    # across machines (scaling.py fits runs by tokens, not seconds)
    g = p.add_argument_group("budget (the run ends at the first one reached; give at least one)")
    g.add_argument("--hours", type=float, default=None, help="wall-clock budget in hours")
    g.add_argument("--minutes", type=float, default=None, help="wall-clock budget in minutes")
    g.add_argument("--max-steps", type=int, default=None, help="budget in optimizer steps")
    g.add_argument("--max-tokens", type=float, default=None,
                   help="budget in training tokens (all ranks)")
    # The data: one corpus or a weighted mixture (data.py), tokenized once into a cache keyed by its
    # settings, so a second run with the same flags reads the shards instead of preparing again
    g = p.add_argument_group("data")
    g.add_argument("--data", default="fineweb", help=data.DATA_HELP)
    g.add_argument("--mix-temperature", type=float, default=None, metavar="T",
                   help=data.MIX_TEMPERATURE_HELP)
    g.add_argument("--cache", default="cache", help="folder for downloads, tokenizer and token "
                   "shards")
    g.add_argument("--vocab-size", type=int, default=None, help="tokenizer vocabulary (default: by "
                   "model, 512 for tiny up to cramming's 32768 for base)")
    # cramming trains its own 32768-token WordPiece; a BPE of our own (rustbpe) plays that part, and
    # stock tiktoken vocabularies are there for comparisons
    g.add_argument("--tokenizer", default="train",
                   help="'train' (own BPE), 'gpt2', 'cl100k_base' or a tokenizer.json")
    g.add_argument("--lowercase", action="store_true", help="lowercase and strip accents before "
                   "tokenizing (English-centric: other languages lose distinctions)")
    g.add_argument("--fineweb-shards", type=int, default=None, help="FineWeb-Edu shards to "
                   "download (default: as many as the budget should consume)")


def add_model_flags(p):
    # The shape comes from a preset of model.py (cramming's base: 16 layers of width 768, 12 heads,
    # feed-forward 3072, sequences of 128) with any key overridden by the flag of the same name
    g = p.add_argument_group("model")
    g.add_argument("--model", default="auto",
                   help=f"preset of model.py: {', '.join(model.PRESETS)}; auto: chosen from the "
                   "device and the budget (cramming's base for a GPU day, tiny for CPU minutes)")
    g.add_argument("--arch", choices=list(model.ARCHITECTURES), default="crammed",
                   help="architecture family: crammed (cramming's, with rotary positions) or "
                   "modernbert (exactly transformers' ModernBertForMaskedLM, all layers global; "
                   "export.py writes it as a stock model); the flags below override its keys")
    g.add_argument("--objective", choices=["mlm", "clm"], default="mlm",
                   help="masked LM encoder or causal LM decoder")
    for key in planning.SIZE_KEYS:
        g.add_argument("--" + key.replace("_", "-"), type=int, default=None,
                       help=f"override the preset's {key}")
    # cramming keeps scaled sinusoidal positions; rotary is our one measured change (docs/train.md)
    g.add_argument("--positions", choices=model.CHOICES["positions"], default="rotary",
                   help="position scheme (cramming: sinusoidal; rotary leaves the unigram plateau "
                   "far sooner, see docs/train.md: the recipe)")
    for key in ("norm", "norm_position", "activation"):
        g.add_argument("--" + key.replace("_", "-"), choices=model.CHOICES[key], default=None,
                       help=f"override the preset's {key}")
    g.add_argument("--embedding-norm", choices=["on", "off"], default=None,
                   help="a norm right after the embedding (BLOOM's embedding LayerNorm; default: "
                   "the preset's, on)")
    g.add_argument("--tie-embeddings", choices=["on", "off"], default=None,
                   help="the output projection reuses the token embedding (default: on); off "
                   "gives the head a matrix of its own")
    g.add_argument("--qk-norm", choices=["on", "off"], default=None,
                   help="RMS-normalize each head's queries and keys (default: off)")
    g.add_argument("--zero-init", choices=["on", "off"], default=None,
                   help="start the blocks' output projections at zero (default: off)")
    g.add_argument("--value-residual", choices=["on", "off"], default=None,
                   help="every block after the first also attends over the first block's values "
                   "(ResFormer; default: on, off with --arch modernbert)")
    g.add_argument("--first-attention-norm", choices=["on", "off"], default=None,
                   help="the first block normalizes its attention input (default: on; "
                   "--arch modernbert: off)")
    g.add_argument("--head-transform", choices=["on", "off"], default=None,
                   help="dense -> GELU -> norm before the MLM decoder, as BERT and ModernBERT "
                   "(default: off, as cramming; --arch modernbert: on)")
    g.add_argument("--max-seq-len", type=int, default=None,
                   help="tokens per sequence (default: the preset's; cramming: 128)")
    # 40%, not cramming's 25% nor BERT's 15% (Devlin et al. 2019, Sec. 3.1): Wettig et al. 2023
    # ("Should You Mask 15% in Masked Language Modeling?") found 40% better; the speedrun measured
    # it (docs/records.md, record 5). round(0.4 x 128) = 51 positions in every sequence, so every
    # batch has one static shape.
    g.add_argument("--mask-rate", type=float, default=0.4,
                   help="fraction of tokens masked for MLM (cramming: 0.25; Wettig et al. "
                   "2023: 0.4)")
    # Ankner et al. 2023 ("Dynamic Masking Rate Schedules for MLM Pretraining") fall linearly from
    # 30% to 15% over the run: many predictions per token early, more context to each one late.
    g.add_argument("--mask-rate-end", type=float, default=None,
                   help="the masking rate at the end of the budget, reached linearly from "
                   "--mask-rate (Ankner et al. 2023; default: none, a constant rate)")
    # A held-out loss at another rate is another task (fewer masks leave more context to each
    # prediction), so it stays at cramming's 25% whatever the training rate: runs compare.
    g.add_argument("--eval-mask-rate", type=float, default=0.25,
                   help="fraction of tokens masked in the held-out loss, whatever --mask-rate "
                   "trains at, so that runs at different rates compare")
    # Growth (grow.py): a schedule of shapes by budget fraction (CompoundGrow, Gu et al. 2021, grows
    # depth, width and length together), the optimizer carried over (as bert2BERT) or restarted
    g = p.add_argument_group("growth (grow.py)")
    g.add_argument("--grow", default=None, help="growth schedule, e.g. "
                   "'0:n_layers=4,max_seq_len=64; 0.25:n_layers=8; 0.5:n_layers=16', a preset "
                   "name (depth, compound, gstack; depth@0.3 doubles the depth once, at 30%%), "
                   "auto, or none (default: depth, a quarter of the layers, their depth doubled "
                   "at 7%% and again at 15%% of the budget; none with --init-from, --shard fsdp "
                   "or one layer)")
    g.add_argument("--grow-optimizer", choices=["carry", "fresh"], default="carry",
                   help="at growth, carry AdamW moments of old coordinates over, or start a fresh "
                   "optimizer")
    g.add_argument("--grow-moments", choices=["zero", "scaled"], default="zero", help="with carry: "
                   "moments of copied coordinates start at zero or scaled from their source")
    g.add_argument("--grow-noise", type=float, default=0.0,
                   help="std of noise added to copied weights at growth")
    g.add_argument("--grow-rewarm", type=float, default=0.0, help="after each growth, re-warm the "
                   "learning rate linearly over this fraction of the budget")
    g.add_argument("--grow-when", choices=["fractions", "auto"], default="fractions",
                   help="fractions: each stage starts at its budget fraction; auto: when the "
                   "stage's held-out loss flattens (slope of log loss against log FLOPs above "
                   "--grow-slope; the fractions become deadlines). --grow auto is compound's "
                   "stages with auto")
    g.add_argument("--grow-slope", type=float, default=grow.AUTO_THRESHOLD, help="auto: grow once "
                   "d log(loss) / d log(FLOPs) over the stage's last evaluations is above this")
    g.add_argument("--grow-check-every", type=float, default=0.02, help="auto: held-out evaluation "
                   "for the growth decision every this fraction of the budget")


def add_optimization_flags(p):
    # Cramming ramps the batch to 8192 x 128 tokens over 60% of the budget; a CPU budget buys far
    # fewer tokens, so planning.choose_defaults shrinks the target until the run gets ~2000 steps
    g = p.add_argument_group("optimization (defaults: cramming's, with Muon and "
                             "a linear decay from the speedrun, docs/records.md)")
    g.add_argument("--batch-tokens", type=int, default=None, help="target global batch in tokens, "
                   "reached by gradient accumulation (default: chosen from the budget, at most "
                   "cramming's 8192 x 128)")
    g.add_argument("--micro-batch", type=int, default=None, help="sequences per forward pass on "
                   "each device (default: 128 on a GPU, at most 32 elsewhere)")
    g.add_argument("--batch-ramp", type=float, default=0.6, help="fraction of the budget over "
                   "which the batch grows linearly to its target (0 = off)")
    # cramming's bert-o4 (train/bert-o4.yaml): AdamW lr 1e-3 at width 768, betas (0.9, 0.98), eps
    # 1e-12, weight decay 0.01, global-norm clipping at 0.5, the budget triangle schedule
    # The speedrun's record 2 (docs/records.md): Muon at four times AdamW's lr with momentum 0.7,
    # warmup-stable-decay
    g.add_argument("--optimizer", choices=["adamw", "muon"], default="muon",
                   help="muon (default): Muon on the blocks' matrices and AdamW on the rest, one "
                   "learning rate (muon.py; AdamW under --shard fsdp); adamw: AdamW on every "
                   "tensor (cramming)")
    g.add_argument("--momentum", type=float, default=muon.RECIPE_MOMENTUM,
                   help="Muon's Nesterov momentum (with --optimizer muon; default 0.7, measured "
                   "against 0.6-0.95 in docs/records.md; Jordan et al.: 0.95)")
    g.add_argument("--muon-rms", type=float, default=0.2,
                   help="the RMS of Muon's update per unit of lr (with --optimizer muon; 0.2 "
                   "matches AdamW's, Liu et al. 2025; larger moves the blocks' matrices faster "
                   "than the embedding)")
    g.add_argument("--neuron-beta2", type=float, default=muon.RECIPE_NEURON_BETA2,
                   help="with --optimizer muon: NorMuon (Li et al. 2025), each output neuron's "
                   "step evened out by a running mean of its square, this its decay (default "
                   "0.95, the speedrun's record 9); 0: plain Muon")
    g.add_argument("--ns-steps", type=int, default=muon.NS_STEPS,
                   help="with --optimizer muon: Newton-Schulz iterations per step (default 5, "
                   "Jordan et al. 2024)")
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (default: cramming's "
                   "1e-3 at width 768, scaled as 1/d-model for narrower models; four times "
                   "that with Muon)")
    g.add_argument("--schedule", choices=["triangle", "one-cycle", "linear", "cosine", "constant",
                                          "wsd", "trapezoid"],
                   default="linear", help="learning-rate shape as a function of budget progress "
                   "(default: warm-up, then linearly to zero, record 6 of docs/records.md; "
                   "ModernBERT: wsd; cramming: triangle)")
    g.add_argument("--warmup", type=float, default=0.06,
                   help="warm-up fraction of the budget (all but triangle and one-cycle)")
    g.add_argument("--decay", type=float, default=0.2, help="wsd and trapezoid: the last "
                   "fraction of the budget, over which the rate falls to zero (default: 0.2)")
    g.add_argument("--weight-decay", type=float, default=0.01,
                   help="AdamW decoupled weight decay (not on norms/biases)")
    g.add_argument("--betas", type=float, nargs=2, default=[0.9, 0.98], help="AdamW betas")
    g.add_argument("--eps", type=float, default=1e-12, help="AdamW epsilon")
    g.add_argument("--clip", type=float, default=0.5, help="gradient clipping L2 norm (0 = off)")
    g.add_argument("--ema", type=float, default=None,
                   help="decay of the weights' moving average (ema.py), the model every held-out "
                   "loss scores and final/ holds; 0: the trained weights themselves (default: "
                   "0.99, the speedrun's record 10)")


def add_system_and_output_flags(p):
    # How the run uses the machine: none of these change what is computed, except bf16 (rounding)
    # and the seed; DDP and FSDP give the same weights as one process (tests/test_fsdp.py)
    g = p.add_argument_group("system")
    g.add_argument("--device", choices=["auto", "cuda", "mps", "cpu"], default="auto",
                   help="where to train")
    g.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="autocast dtype: auto = bf16 on a CUDA GPU that supports it or a CPU "
                   "with bf16 matmul instructions (AVX512-BF16, AMX), fp32 elsewhere")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile each block; its compile time counts against the budget. "
                   "Default: on for a time budget of 10 minutes or more on a CUDA GPU or on a "
                   "CPU with a C++ compiler, where it has paid for itself (docs/train.md), off "
                   "otherwise")
    g.add_argument("--shard", choices=["ddp", "fsdp"], default="ddp", help="ddp: every rank holds "
                   "all parameters, gradients and AdamW moments; fsdp: each holds 1/world of them "
                   "(FSDP2), checkpoints go to OUT/checkpoint.dcp/ (docs/train.md: sharding)")
    g.add_argument("--checkpoint-activations", action="store_true", help="keep only each block's "
                   "input for the backward pass and recompute the rest: less activation memory for "
                   "~1/3 more compute (one extra forward)")
    g.add_argument("--seed", type=int, default=0, help="seed for initialization and the batch "
                   "stream")
    # Evaluation and checkpoints are scheduled on budget progress too; a checkpoint holds everything
    # a bitwise-exact resume needs (checkpoint.py)
    g = p.add_argument_group("output, evaluation and checkpoints")
    g.add_argument("--out", default="runs/cram", help="output folder")
    g.add_argument("--init-from", default=None, metavar="PATH",
                   help="start a new run (new budget, new optimizer) from these weights: a run's "
                   "final/ folder, a checkpoint.pt, or a folder export.py wrote; the shape and the "
                   "tokenizer come from PATH")
    g.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt with the "
                   "saved settings (a budget flag given now replaces the saved budget: that "
                   "extends a finished run)")
    g.add_argument("--force", action="store_true", help="replace an earlier run in OUT (its log, "
                   "summary, checkpoint and final/) instead of refusing")
    g.add_argument("--eval-every", type=float, default=0.1,
                   help="held-out evaluation every this fraction of the budget")
    g.add_argument("--eval-batches", type=int, default=20, help="held-out batches per evaluation")
    g.add_argument("--log-every", type=int, default=10, help="write a log line every N optimizer "
                   "steps")
    g.add_argument("--sample-text", default=None, help="text shown at every evaluation: its "
                   "[MASK]s filled (mlm) or continued (clm); default: a line of Hamlet")
    g.add_argument("--checkpoint-minutes", type=float, default=30.0,
                   help="save a resumable checkpoint every N minutes")
    g.add_argument("--checkpoint-steps", type=int, default=0,
                   help="also save one every N optimizer steps (0 = off)")
    # a few non-finite losses are skipped (a bad batch); many in a row mean the run diverged
    g.add_argument("--max-bad-steps", type=int, default=5, help="consecutive non-finite losses "
                   "before the run stops and restores the last good checkpoint")


def check_args(parser, args):
    """One-line errors for flags that parse but make no sense, before anything is read."""
    # need() names the flag, the rule and the value: "--clip must be >= 0 (0 = off) (got -1.0)"
    def need(ok, flag, rule):
        if not ok:
            value = getattr(args, flag[2:].replace('-', '_'))
            parser.error(f"{flag} must be {rule} (got {value!r})")

    # Every check here runs before data preparation, which can take hours on a real corpus: a typo
    # must not cost that. Checks that need the data or the model's shape run in resolve_settings
    if not budget_given(args) and not args.resume:  # a resumed run takes its budget from args.json
        parser.error("give a budget: --hours, --minutes, --max-steps or --max-tokens")
    for name in BUDGET_KEYS:  # NaN and inf parse as floats: refuse them here, not mid-run
        v = getattr(args, name)
        if v is not None and not (v > 0 and math.isfinite(v)):
            parser.error(f"--{name.replace('_', '-')} must be positive, got {v}")
    lowest = (("micro_batch", 1), ("max_seq_len", 4), ("batch_tokens", 1), ("vocab_size", 1))
    for name, low in lowest:
        v = getattr(args, name)
        if v is not None and v < low:
            parser.error(f"--{name.replace('_', '-')} must be >= {low}, got {v}")
    for name in (*planning.SIZE_KEYS, "fineweb_shards"):
        v = getattr(args, name)
        need(v is None or v >= 1, "--" + name.replace("_", "-"), ">= 1")
    if not 0 <= args.batch_ramp < 1 or not 0 <= args.warmup < 1 or not 0 < args.eval_every <= 1:
        parser.error("--batch-ramp and --warmup must be in [0, 1), --eval-every in (0, 1]")
    need(0 < args.decay <= 1 - args.warmup, "--decay", "in (0, 1 - warmup]")
    if args.lr is not None and not (args.lr > 0 and math.isfinite(args.lr)):
        parser.error(f"--lr must be positive, got {args.lr}")
    if args.model != "auto" and args.model not in model.PRESETS:
        parser.error(f"--model must be auto or one of {', '.join(model.PRESETS)}, "
                     f"got {args.model!r}")
    need(args.objective == "clm" or 0 < args.mask_rate < 1, "--mask-rate", "in (0, 1)")
    need(0 < args.eval_mask_rate < 1, "--eval-mask-rate", "in (0, 1)")
    need(args.mask_rate_end is None or 0 < args.mask_rate_end < 1, "--mask-rate-end", "in (0, 1)")
    need(args.clip >= 0, "--clip", ">= 0 (0 = off)")
    need(args.weight_decay >= 0, "--weight-decay", ">= 0")
    need(args.eps > 0, "--eps", "> 0")
    need(all(0 <= b < 1 for b in args.betas), "--betas", "two numbers in [0, 1)")
    need(0 <= args.momentum < 1, "--momentum", "in [0, 1)")
    need(args.muon_rms > 0, "--muon-rms", "positive")
    need(0 <= args.neuron_beta2 < 1, "--neuron-beta2", "in [0, 1) (0 = plain Muon)")
    need(args.ns_steps >= 1, "--ns-steps", ">= 1")
    need(args.ema is None or 0 <= args.ema < 1, "--ema", "in [0, 1) (0 = off)")
    need(args.grow_noise >= 0, "--grow-noise", ">= 0")
    need(0 <= args.grow_rewarm < 1, "--grow-rewarm", "in [0, 1)")
    need(args.grow is None or args.grow.strip(), "--grow",
         "a schedule, a preset name, auto, or none (no growth)")
    need(0 < args.grow_check_every <= 0.5, "--grow-check-every", "in (0, 0.5]")
    need(math.isfinite(args.grow_slope), "--grow-slope", "a finite number")
    check_system_args(parser, args)
    need(args.eval_batches >= 1, "--eval-batches", ">= 1")
    need(args.log_every >= 1, "--log-every", ">= 1")
    need(args.checkpoint_minutes > 0, "--checkpoint-minutes", "> 0")
    need(args.checkpoint_steps >= 0, "--checkpoint-steps", ">= 0 (0 = off)")
    need(args.max_bad_steps >= 1, "--max-bad-steps", ">= 1")
    need(args.seed >= 0, "--seed", ">= 0")


def check_system_args(parser, args):
    """--init-from, sharding, device and output-folder checks: what this machine can do."""
    # --init-from is a new run from old weights: a resume continues the old run instead, and a
    # growth schedule starts from its own first shape
    if args.init_from and args.resume:
        parser.error("--init-from starts a new run; --resume continues the one in --out: give one")
    grows = args.grow not in (None, "none")  # None: train.py chooses (planning.choose_defaults)
    if args.init_from and grows:
        parser.error("--init-from takes its shape from PATH; --grow starts from the schedule's "
                     "first stage: give one")
    if args.init_from and not os.path.exists(args.init_from):
        parser.error(f"--init-from {args.init_from}: no such file or folder")
    if args.shard == "fsdp" and grows:
        parser.error("--grow needs --shard ddp: the grow operators read and write full weight "
                     "tensors, and unshard-grow-reshard is not implemented")
    if args.shard == "fsdp" and args.positions == "sinusoidal":
        parser.error("--positions sinusoidal needs --shard ddp: its learned scale is a scalar "
                     "parameter, which fully_shard cannot shard")
    # a CPU-only torch wheel is the most common reason for "no GPU" (pip's default on some systems)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: no CUDA GPU visible to this torch {torch.__version__}"
                     + (" (a CPU-only build)" if torch.version.cuda is None else ""))
    if args.device == "mps" and not torch.backends.mps.is_available():
        parser.error("--device mps: Apple's Metal backend is not available here")
    # os.makedirs would fail much later, after hours of data preparation
    if os.path.isfile(args.out):
        parser.error(f"--out {args.out} is a file; give a folder")


CONFIG_FLAGS = {key: "--" + key.replace("_", "-")  # each config key's flag has the key's own name
                for key in (*planning.SIZE_KEYS, "max_seq_len", "vocab_size", "mask_rate")}


def config_error_in_flags(error):
    """model.validate_config's message in the command line's words: 'n_heads' (5)
    -> --n-heads (5)."""
    text = str(error).replace("config key ", "")
    for key, flag in CONFIG_FLAGS.items():
        text = text.replace(f"'{key}'", flag)
    return text


def settings_from_init(args, init):
    """--init-from: the weights' shape, vocabulary, objective and positions, and the tokenizer they
    were trained with (unless --tokenizer names one). A shape flag that contradicts them is a
    one-line error: the weights could not be loaded into that model."""
    cfg = init["config"]
    for key in (*planning.SIZE_KEYS, "max_seq_len", "vocab_size"):
        given = getattr(args, key)
        if given is not None and given != cfg[key]:
            raise SystemExit(f"error: --{key.replace('_', '-')} {given} does not fit --init-from "
                             f"{args.init_from}: its {key} is {cfg[key]}")
    if args.tokenizer == "train" and init["tokenizer"] is None:
        raise SystemExit(f"error: --init-from {args.init_from}: no growcram tokenizer.json beside "
                         "the weights; give the one they were trained with as --tokenizer FILE")
    tokenizer_file = init["tokenizer"] if args.tokenizer == "train" else args.tokenizer
    return argparse.Namespace(**{**vars(args), "tokenizer": tokenizer_file,
                                 **{k: cfg[k] for k in ("vocab_size", "max_seq_len",
                                                        "objective", "positions")}})


def budget_given(args):
    return any(getattr(args, k) is not None for k in BUDGET_KEYS)


def budget_text(args):
    """'max_steps 60' or 'minutes 2, max_tokens 1e+06': the budget flags that are set."""
    given = [k for k in BUDGET_KEYS if getattr(args, k) is not None]
    return ", ".join(f"{k} {getattr(args, k):g}" for k in given)


# A resumed run must train the same model on the same data with the same schedule: its settings come
# from OUT/args.json, written before the first step, and today's command line adds only the output
# flags and, if given, a new budget (which extends the run: docs/train.md, extending a run)
def resume_settings(args):
    """(settings, the budget before this command extended it or None) for --resume: a resumed run
    trains the same model on the same data with the same schedule, so its settings come from
    OUT/args.json, not from today's command line; only the output flags and a new budget given
    now are taken."""
    saved = os.path.join(args.out, "args.json")
    if not os.path.isfile(saved):
        if not budget_given(args):
            raise SystemExit(f"error: {saved} is missing; give the budget again (--hours, "
                             "--max-steps, ...)")
        return args, None
    given = {k: getattr(args, k) for k in BUDGET_KEYS} if budget_given(args) else None
    with open(saved) as f:  # other flags a newer train.py added keep their defaults
        settings = json.load(f)
    settings.update({k: v for k, v in BEFORE_THE_FLAG.items() if settings.get(k) is None})
    if settings.get("grow") == "depth":  # saved before record 6 moved the preset to 0.2
        settings["grow"] = "depth@0.3"
    resumed = argparse.Namespace(**{**vars(args), **settings, "resume": True, "out": args.out})
    if given and given != {k: getattr(resumed, k) for k in BUDGET_KEYS}:
        return argparse.Namespace(**{**vars(resumed), **given}), budget_text(resumed)
    return resumed, None
