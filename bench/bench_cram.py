"""Mini-cram, side by side: our recipe (train.py) against a Hugging Face baseline (ModernBERT by
default, or BERT) with a tuned learning rate, each given the same wall clock on the same data.

    python bench/bench_cram.py                      # sample corpus, 4 x 128, 3 CPU minutes per run
    python bench/bench_cram.py --minutes 10 --seeds 3 --out runs/bench_cram
    python bench/bench_cram.py --baseline bert      # against BertForMaskedLM, BERT's own sweep
    python bench/bench_cram.py --hf-schedule linear # ModernBERT with BERT's linear decay instead
    python bench/bench_cram.py --seeds 3 --hf-from runs/bench_cram --ours-flags "--optimizer muon" \
        --out runs/muon                             # one lever against the same baseline runs
    python bench/bench_cram.py --data corpus.jsonl --ours-flags "--lr 2e-3 --schedule one-cycle"
    python bench/bench_cram.py --analyze-only --out runs/bench_cram  # re-read our logs, report
    python bench/bench_cram.py --minutes 0.15 --vocab-size 512 --n-layers 2 --d-model 64 \
        --ffn-dim 256 --max-seq-len 64 --micro-batch 8 --batch-tokens 1024 \
        --eval-batches 4 --hf-lrs 1e-3,3e-3 --threads 1 --no-downstream \
        --out runs/bench_smoke                      # a smoke run: ~35 s on a busy 2-core CPU

What is compared. (1) Ours: train.main with the shape flags, --minutes and --ours-flags;
everything else is train.py's default recipe (pre-LN crammed-BERT block, sparse MLM, budget
triangle, batch ramp).
(2) The baseline (--baseline): `ModernBertForMaskedLM` (default; bench_model.hf_modernbert:
pre-LN, GeGLU of our gated width, rotary, every layer global, sparse prediction, no biases) or
`BertForMaskedLM` (bench_model.hf_bert: post-LN, learned positions, GELU feed-forward, dense MLM
head), of the same depth, width, heads and vocabulary, trained once per learning rate in --hf-lrs
(default per baseline, DEFAULT_HF_LRS: ModernBERT's 5e-4 to 4e-3). Every run gets --minutes of
wall clock (or --tokens: the same training tokens for every run, a race a slow or busy machine
cannot tilt); the best HF learning rate by final held-out loss is the baseline.

Why it is fair (a comparison counts only if the baseline had a fair chance):
  - data: the same tokenizer, the same training stream (loader.make_loader, train split, same
    seed) and the same masks at the same rate: HF gets dense labels (-100 elsewhere) scattered
    from the loader's sparse labels, so at equal rates both predict the same tokens at the same
    positions (ModernBERT's sparse head keeps exactly the positions whose label is not -100). HF
    trains at --hf-mask-rate (25%), ours at train.py's --mask-rate (40% since record 5), and both
    are scored at --eval-mask-rate (25%). Held-out loss is measured the same way for both
    (held_out.HeldOut's batches: the val split in order, seed 1234, --eval-batches x
    --micro-batch sequences) at the same fractions of the budget (every 10%), and evaluation time
    counts against both clocks; the step-0 evaluation and the final one are outside both. Each
    side evaluates with the model it trains (compiled or not), so under --compile both pay their
    evaluation graphs and inductor's one-time start-up at step 0, before their clocks start, and
    every run compiles its training graphs cold on its own clock (compile_cold).
  - recipe: HF gets its own published recipe, not a strawman: AdamW betas (0.9, 0.98), eps 1e-6,
    weight decay 0.01 except on biases and norms, clipping at 1.0, ModernBERT's warmup-stable-decay
    (6% warm-up, constant, 1-sqrt decay to zero over the last 20% of elapsed / budget: fully
    decayed at the deadline, as ours is), a fixed batch of --batch-tokens by accumulation, and a
    sweep over learning rates. --hf-schedule linear swaps in the BERT/RoBERTa schedule (6%
    warm-up, then linear decay to zero); the optimizer and weight decay stay. Dropout is 0 for
    both (cramming pretrains without it). Like train.py, HF checks the clock before every
    micro-batch, so neither runs past the deadline by more than one micro-batch.
  - size: --ffn-dim is a GELU FFN's width, BERT's intermediate width. Our gated FFN (geglu) has
    3 d f weights against BERT's 2 d I, so ours gets f = 2 I / 3 rounded to a multiple of 32
    (I = 512 -> f = 352): 1.33 M parameters against BERT's 1.36 M at the default shape
    (model.count_params; BERT additionally has biases, a learned position table and an MLM
    transform). ModernBERT's GeGLU gets our f (its Wi is d x 2f): 1.34 M (its MLM transform's
    d x d, less our norms' biases). Give --ours-flags "--ffn-dim N" to choose ours yourself.
  - machine: runs execute one at a time in one process, alternating per seed (ours, HF lr 1, HF
    lr 2, ...), on the same device and autocast dtype and the same torch thread count
    (--threads). Load from other processes still adds noise: compare tokens/s across the HF runs,
    which train the same model.
--ours-flags that change data, shape, batch or evaluation (--max-seq-len, --micro-batch,
--batch-tokens, --eval-mask-rate, --eval-batches, --device, --dtype, --compile) apply to HF too,
so both always see the same batches; recipe flags (--lr, --schedule, --batch-ramp, --clip,
--mask-rate, ...) apply to ours only.

What is reported: loss at equal time (each run's final held-out loss, all with the same budget);
the time-to-loss speedup, (best HF run's seconds to reach its own final loss) / (our seconds to
reach that loss), with linear interpolation between evaluations ("not reached" if ours never gets
there); and the same in tokens, so throughput (tokens/s; BERT's dense MLM head scores all T
positions, ours and ModernBERT's only the masked ones) and recipe (loss per token) can be told
apart. Output in --out: results.json, curves.png (if matplotlib is installed), ours_seed*/
(train.py's run folders).

Downstream check (skip with --no-downstream; --downstream-only reruns it on OUT's checkpoint):
seed 0's pretrained model against the same network from random initialization
(evaluate_glue.py --control random-init), both fine-tuned with evaluate_glue.py's protocol except
3 epochs, lr 1e-3, [CLS] pooling, one lr for every tensor and the median of 3 seeds
(--downstream-epochs/-lr/-seeds), on two tasks built from the bundled
corpus, lines of at least 6 spoken words, train and dev lines from disjoint contiguous blocks of
each play (3,000 train / 600 dev rows, balanced classes):
  - "word order" (CoLA-like): a line as written, or its words shuffled. Lines from the three plays
    data.py holds out of pretraining (HELD_OUT_PLAYS), so pretraining on --data sample saw neither
    version. Both classes have the same words: a bag-of-words model is at chance (50%) by
    construction.
  - "plays": which of six plays a line is from (chance 17%). A lexical task: a bag-of-words
    logistic regression (bag_of_words_accuracy, printed beside the two networks) gets about 29%;
    with --data sample the pretraining text contains these lines (unlabelled).

    python evaluate_glue.py --checkpoint OUT/ours_seed0/final \
        --task-file "OUT/downstream/word order/train.tsv" \
        --task-dev-file "OUT/downstream/word order/dev.tsv" --seeds 3 --epochs 3 --lr 1e-3 \
        --pooling cls --lr-scaling none --control random-init --no-progress \
        --out "OUT/downstream/word order"
    (and the same with the plays task)

The tasks always use the bundled Shakespeare corpus and the run's own tokenizer, so they work
after pretraining on any corpus.
Needs `pip install transformers` (benchmark only; not with --skip-hf).
"""
import argparse
import collections
import gc
import gzip
import json
import math
import os
import random
import re
import shlex
import statistics
import sys
import time

import torch

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
# The project's modules and bench_model.py, also when imported from tests.
sys.path[:0] = [ROOT, BENCH]
import bench_model  # noqa: E402
import budget  # noqa: E402
import files  # noqa: E402
import flags  # noqa: E402
import model  # noqa: E402
import parallel  # noqa: E402
import planning  # noqa: E402
import train  # noqa: E402
from bench_model import BASELINES, hf_attention, hf_baseline, modernbert_intermediate  # noqa: E402
from held_out import eval_mask_rate  # noqa: E402
from loader import make_loader  # noqa: E402

EVAL_EVERY = 0.1          # held-out evaluations at every tenth of the budget, for both models
HF_WARMUP = 0.06          # fraction of the budget
# The default HF learning-rate sweep per baseline. Post-LN BERT diverges above a few 1e-3; pre-LN
# ModernBERT trains at high rates at small width (its base model's peak is 8e-4 at width 768 with
# batches of millions of tokens: Warner et al. 2024, repo yamls/modernbert): at 4 x 128 its best
# was 2e-3 at 4,096 tokens a step and 1e-3 at 2,048 (docs/records.md), so the sweep brackets both.
DEFAULT_HF_LRS = {"bert": "1e-4,3e-4,1e-3,2e-3,4e-3", "modernbert": "5e-4,1e-3,2e-3,4e-3"}
# --hf-schedule wsd: ModernBERT's warmup-stable-decay, a 1-sqrt decay at the end (Warner et al.
# 2024, repo yamls/modernbert). The decay takes the last 20% of the budget: the cooldown that
# Haegele et al. 2024 ("Scaling Laws and Compute-Optimal Training Beyond Fixed Training
# Durations") find to match a cosine schedule.
WSD_DECAY = 0.2
HF_SCHEDULES = {"linear": f"{HF_WARMUP:.0%} warm-up, then linear to 0 at the deadline",
                "wsd": f"{HF_WARMUP:.0%} warm-up, constant, 1-sqrt decay to 0 over the last "
                       f"{WSD_DECAY:.0%}",
                # the recipe lever: our own schedule given to the baseline
                "triangle": "train.py's budget triangle, min(0.25 + p, 4 (1 - p)) of the peak"}
CORPUS = os.path.join(ROOT, "corpora", "shakespeare.jsonl.gz")
PLAYS = ("hamlet", "macbeth", "romeo and juliet", "tempest", "midsummer nights dream",
         "julius caesar")
# data.py sends every round(1 / val_fraction)-th document to the validation split; at the default
# val_fraction of 0.05 these are documents 0, 20 and 40 of the bundled corpus, which pretraining
# on --data sample never sees.
HELD_OUT_PLAYS = ("alls well that ends well", "measure for measure", "two gentlemen of verona")

# -----------------------------------------------------------------------------
# Shared settings: what our run will actually use, read back through train.py's own parser


def ours_ffn_dim(ffn_dim, activation, baseline="bert"):
    """Our FFN width, with about the weights (and FLOPs) of the baseline's FFN. BERT's is a GELU
    FFN of width ffn_dim (2 d ffn_dim weights): a gated FFN of ours (3 d f) gets f = 2/3 ffn_dim.
    ModernBERT's is a GeGLU of that gated width I whatever our activation, so one baseline run
    serves every activation of ours: an ungated FFN of ours (2 d f) gets f = 3/2 I."""
    gated = max(32, round(2 * ffn_dim / 3 / 32) * 32)
    if activation in model.GATED:
        return gated
    return ffn_dim if baseline == "bert" else 3 * gated // 2


def ours_argv(args, seed, out):
    """train.py's command line for our run: the base preset's block (train.py's "auto" would pick
    a preset by budget) at the bench's shape. --ours-flags come last, so they win over everything
    before them."""
    extra = shlex.split(args.ours_flags)
    probe = flags.parse_args(["--max-steps", "1", "--model", "base",
                              "--max-seq-len", str(args.max_seq_len), *extra])
    activation = planning.model_config(probe, args.vocab_size)["activation"]
    return ["--data", args.data, "--cache", args.cache,
            "--vocab-size", str(args.vocab_size), "--model", "base",
            "--n-layers", str(args.n_layers), "--d-model", str(args.d_model),
            "--n-heads", str(args.n_heads),
            "--ffn-dim", str(ours_ffn_dim(args.ffn_dim, activation, args.baseline)),
            "--max-seq-len", str(args.max_seq_len),
            "--micro-batch", str(args.micro_batch), "--batch-tokens", str(args.batch_tokens),
            "--eval-batches", str(args.eval_batches), *budget_flags(args),
            "--eval-every", str(EVAL_EVERY), "--seed", str(seed), "--out", out,
            "--log-every", "10", "--checkpoint-minutes", "1e9",
            "--force",  # a fresh run, never a resume
            "--no-compile",  # eager unless --ours-flags says --compile: HF makes the same choice
            *extra]


def budget_flags(args):
    """train.py's budget for every run: --minutes of wall clock, or --tokens (its --max-tokens)."""
    if args.tokens:
        return ["--max-tokens", str(int(args.tokens))]
    return ["--minutes", str(args.minutes)]


def budget_words(settings):
    """'3 min per run' or '2,000,000 tokens per run'."""
    if settings.get("tokens"):
        return f"{settings['tokens']:,.0f} tokens per run"
    return f"{settings['minutes']:g} min per run"


# -----------------------------------------------------------------------------
# The two kinds of run.
# A curve is a list of {"elapsed", "tokens", "val_loss"}, one per held-out evaluation.


def read_curve(log_path):
    """The held-out evaluations of a train.py log; a repeated token count (the final evaluation
    right after the last periodic one) keeps the later point. Each growth adds its two held-out
    losses, measured on the same batches just before and just after it (a stacked copy's jump
    shows as a step up at one token count). Evaluations made while a growth stage trained on
    shorter sequences are left out: train.py evaluates at the model's own length, and a loss on
    32-token sequences is another task than ModernBERT's on 128 (so a run that grows its length is
    scored from its first evaluation at full length on)."""
    with open(log_path) as f:
        records = [json.loads(line) for line in f]
    grows = [r for r in records if r["kind"] == "grow"]

    def length(shape):  # a grow record's "n_layers=4 ... max_seq_len=128" -> 128
        return int(re.search(r"max_seq_len=(\d+)", shape).group(1))
    current = length(grows[0]["from"]) if grows else None
    full = length(grows[-1]["to"]) if grows else None
    curve = []
    for r in records:
        if r["kind"] == "grow":
            if current == full and length(r["to"]) == full and "val_loss_before" in r:
                # the model before growth had its loss at the step's start; the grown one
                # exists grow_seconds later
                after = r["elapsed"] + r.get("grow_seconds", 0.0)
                curve += [{"elapsed": r["elapsed"], "tokens": r["tokens"],
                           "val_loss": r["val_loss_before"], "growth": "before"},
                          {"elapsed": after, "tokens": r["tokens"],
                           "val_loss": r["val_loss_after"], "growth": "after"}]
            current = length(r["to"])
        elif r["kind"] == "eval" and current == full:
            curve.append({"elapsed": r["elapsed"], "tokens": r["tokens"],
                          "val_loss": r["val_loss"]})
    return [p for i, p in enumerate(curve)
            if i + 1 == len(curve) or curve[i + 1]["tokens"] > p["tokens"] or "growth" in p]


def compile_cold():
    """Forget every graph compiled so far, so that a run under --compile compiles its own on its
    clock, as a fresh `python train.py --compile` does with inductor's caches off. In one process
    dynamo hands a new model of the same code the graphs compiled for the last one: a race's later
    runs then started where the first had paid a cold compile (on the sample at 4 x 128, bf16,
    seed 1's first 10 steps took 0.6 s against seed 0's 14 s; docs/records.md, twenty-fourth
    session)."""
    torch.compiler.reset()


def run_ours(args, seed):
    out = os.path.join(args.out, f"ours_seed{seed}")
    compile_cold()
    summary = train.main(ours_argv(args, seed, out))
    return {"model": "ours", "seed": seed, "lr": None, "status": summary["status"],
            "curve": read_curve(os.path.join(out, "log.jsonl")),
            "final_loss": summary["final_val_loss"],
            "tokens": summary["tokens"], "elapsed": summary["elapsed_s"],
            "tokens_per_s": summary["tokens_per_s"],
            "params": summary["params_total"], "out": out}


def hf_intermediate(baseline, cfg, bert_ffn_dim):
    """The HF baseline's FFN width: --ffn-dim for BERT (ours gets the same weights, ours_ffn_dim);
    our own gated width for ModernBERT, whose GeGLU has the same 3 d f weights
    (bench_model.modernbert_intermediate)."""
    return bert_ffn_dim if baseline == "bert" else modernbert_intermediate(cfg)


def hf_lr_multiplier(p, schedule):
    """The HF learning rate as a fraction of its peak at budget progress p: "wsd" (ModernBERT's:
    warm-up, constant, then 1 - sqrt over the last WSD_DECAY of the budget), "linear" (the
    BERT/RoBERTa recipe: warm-up, then linear decay to 0 at the deadline) or "triangle" (ours).
    The same function as train.py's schedules, with the baseline's warm-up."""
    if schedule not in HF_SCHEDULES:
        raise ValueError(f"unknown HF schedule {schedule!r}; choose from {', '.join(HF_SCHEDULES)}")
    return train.lr_multiplier(p, schedule, HF_WARMUP, WSD_DECAY)


def dense_labels(batch):
    """Our sparse (B, k) labels at (B, k) positions -> HF's dense (B, T) labels, -100 elsewhere."""
    labels = torch.full_like(batch["input_ids"], -100)
    return labels.scatter(1, batch["label_positions"], batch["labels"])


def hf_loss(net, batch, dtype):
    device_type = batch["input_ids"].device.type
    with torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32):
        return net(input_ids=batch["input_ids"], labels=dense_labels(batch)).loss.float()


@torch.no_grad()
def hf_evaluate(net, meta, s, device, dtype):
    """The held-out loss on held_out.HeldOut's batches: the val split in order, seed 1234."""
    loader = make_loader(meta, "val", {"seed": 1234, "mask_rate": eval_mask_rate(s)}, device=device,
                         prefetch=False)
    net.eval()
    total = sum(hf_loss(net, loader.next_batch(s.micro_batch, s.max_seq_len), dtype).item()
                for _ in range(s.eval_batches))
    net.train()
    return total / s.eval_batches


def run_hf(s, meta, arm, lr, seed):
    """Train the HF baseline for the wall-clock budget at peak learning rate lr. s: our run's
    parsed train.py args; arm: {"baseline", "cfg" (our model config), "intermediate" (its FFN
    width), "schedule" (hf_lr_multiplier's)}."""
    device, _, _ = parallel.setup_device(s.device)
    dtype = parallel.autocast_dtype(s.dtype, device)
    compile_cold()
    torch.manual_seed(seed)
    net = hf_baseline(arm["baseline"], arm["cfg"], arm["intermediate"],
                      attention=hf_attention(device, dtype)).to(device).train()
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.01},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.98), eps=1e-6, fused=device.type == "cuda")
    loader = make_loader(meta, "train", {"seed": seed, "mask_rate": arm["mask_rate"]},
                         device=device)
    run_net = torch.compile(net, dynamic=False) if s.compile else net
    # train.py's target accumulation.
    accum = max(1, round(s.batch_tokens / (s.micro_batch * s.max_seq_len)))
    # The step-0 evaluation, off the clock, as train.py's (start_clock), with the model it trains:
    # compiled, that pays the evaluation graph and inductor's one-time start-up before the clock,
    # as ours does, so neither side's first training step carries them.
    start = hf_evaluate(run_net, meta, s, device, dtype)
    curve = [{"elapsed": 0.0, "tokens": 0, "val_loss": start}]
    # train.py's clock (from after model, optimizer and loader are built): the wall clock with
    # its hard deadline, or --tokens (then progress, and the schedule, follow the tokens fed).
    clock = budget.Budget(argparse.Namespace(**{**vars(s), "max_steps": None}))
    state = train.RunState()
    status, next_eval = "budget spent", EVAL_EVERY
    while True:
        p = clock.progress(state.step, state.tokens, clock.elapsed())
        if p >= 1.0:
            break
        for group in optimizer.param_groups:
            group["lr"] = lr * hf_lr_multiplier(p, arm["schedule"])
        loss_sum, done, micro_seconds = torch.zeros((), device=device), 0, 0.0
        for micro in range(accum):
            last = micro == accum - 1 or (
                micro > 0 and budget.ends_past_deadline(clock, state, device, 1, micro_seconds))
            started = time.time()
            loss = hf_loss(run_net, loader.next_batch(s.micro_batch, s.max_seq_len), dtype)
            (loss / accum).backward()
            loss_sum, done = loss_sum + loss.detach(), done + 1
            micro_seconds = time.time() - started
            if last:
                break
        if not math.isfinite(loss_sum.item()):  # diverged (too high a rate); one GPU wait per step
            status = "diverged"
            break
        if done < accum:  # cut at the deadline: the mean over the micro-batches done, as train.py's
            for param in (q for q in net.parameters() if q.grad is not None):
                param.grad.mul_(accum / done)
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.tokens += done * s.micro_batch * s.max_seq_len
        if p >= next_eval:  # the same rule as train.py: the first step that starts past the mark
            next_eval += EVAL_EVERY
            val = hf_evaluate(run_net, meta, s, device, dtype)
            curve.append({"elapsed": round(clock.elapsed(), 3), "tokens": state.tokens,
                          "val_loss": val})
    elapsed, tokens = clock.elapsed(), state.tokens
    # The final evaluation, outside the clock, replaces an evaluation of these very weights.
    final = hf_evaluate(run_net, meta, s, device, dtype) if status != "diverged" else None
    curve = [q for q in curve if q["tokens"] < tokens]
    if final is not None:
        curve.append({"elapsed": round(elapsed, 3), "tokens": tokens, "val_loss": final})
    return {"model": "hf", "baseline": arm["baseline"], "seed": seed, "lr": lr, "status": status,
            "curve": curve, "final_loss": final,
            "tokens": tokens, "elapsed": round(elapsed, 2),
            "tokens_per_s": round(tokens / max(elapsed, 1e-9)),
            "params": sum(q.numel() for q in net.parameters()), "out": None}


def isolated_steps(s, arm, device, with_hf, steps=20):
    """Tokens/s of each model's bare training step (bench_model's: forward, backward, AdamW on one
    batch, nothing else) at the runs' shape, micro-batch, dtype, compile choice and thread count,
    the two alternating: what the loops' tokens/s are measured against (loop / step)."""
    dtype = parallel.autocast_dtype(s.dtype, device)
    batch = bench_model.make_batch(arm["cfg"], s.micro_batch, device)
    ours = bench_model.ours(arm["cfg"], device, s.compile)
    steppers = {"ours": bench_model.make_stepper(*ours, device, dtype)}
    if with_hf:
        net, step = bench_model.huggingface(arm["cfg"], device, arm["baseline"],
                                            hf_attention(device, dtype), s.compile,
                                            arm["intermediate"])
        steppers["hf"] = bench_model.make_stepper(net, step, device, dtype)
    seconds = bench_model.time_alternating(steppers, batch, steps)
    return {who: round(batch["ids"].numel() / t) for who, t in seconds.items()}


# -----------------------------------------------------------------------------
# Analysis: pure functions of the curves


def time_to_loss(curve, target, key="elapsed"):
    """The first `key` (elapsed or tokens) at which the curve reaches loss <= target, interpolating
    linearly between evaluations; the first evaluation's value if it is already below; None if
    never reached."""
    prev = None
    for q in curve:
        if q["val_loss"] is not None and q["val_loss"] <= target:
            if prev is None or prev["val_loss"] == q["val_loss"]:
                return q[key]
            frac = (prev["val_loss"] - target) / (prev["val_loss"] - q["val_loss"])
            return prev[key] + frac * (q[key] - prev[key])
        prev = q
    return None


def ratio(a, b):
    return None if a is None or b is None or b <= 0 else a / b


def compare(ours, hf):
    """Our curve against an HF curve: final losses (equal time, as both ran the same budget), and
    the seconds and tokens each needed to reach HF's own final loss, with their ratios
    (HF / ours; > 1: ours is faster)."""
    target = hf[-1]["val_loss"]
    hf_s, ours_s = time_to_loss(hf, target), time_to_loss(ours, target)
    hf_n, ours_n = time_to_loss(hf, target, "tokens"), time_to_loss(ours, target, "tokens")
    return {"target_loss": target, "ours_final_loss": ours[-1]["val_loss"], "hf_final_loss": target,
            "hf_seconds": hf_s, "ours_seconds": ours_s, "time_speedup": ratio(hf_s, ours_s),
            "hf_tokens": hf_n, "ours_tokens": ours_n, "token_speedup": ratio(hf_n, ours_n)}


def analyze(runs):
    """The HF baseline (the learning rate with the lowest mean final loss over seeds) and, per
    seed, ours against it; speedups are summarized by their median over the seeds where ours
    reached HF's loss."""
    hf_by_lr = {}
    for r in runs:
        if r["model"] == "hf":
            hf_by_lr.setdefault(r["lr"], []).append(r)
    mean_loss = {lr: statistics.mean(r["final_loss"] for r in rs) for lr, rs in hf_by_lr.items()
                 if all(r["final_loss"] is not None for r in rs)}
    best_lr = min(mean_loss, key=mean_loss.get) if mean_loss else None
    result = {"hf_mean_final_loss": {str(lr): v for lr, v in mean_loss.items()},
              "best_lr": best_lr, "per_seed": []}
    for ours in (r for r in runs if r["model"] == "ours"):
        hf = [r for r in hf_by_lr.get(best_lr, []) if r["seed"] == ours["seed"]]
        if hf:
            result["per_seed"].append({
                "seed": ours["seed"], **compare(ours["curve"], hf[0]["curve"]),
                "throughput_ratio": ratio(ours["tokens_per_s"], hf[0]["tokens_per_s"])})
    for key in ("time_speedup", "token_speedup", "throughput_ratio"):
        values = [c[key] for c in result["per_seed"] if c[key] is not None]
        result[key] = statistics.median(values) if values else None
    return result


# -----------------------------------------------------------------------------
# Downstream: which play does this line come from?


def speech_lines(text, min_words=6):
    """Spoken lines of one play, in order: after the first ACT/SCENE heading, without headings,
    speaker names (ALL CAPS or short abbreviations like "Hor."), and bracketed stage directions
    (also those spanning lines)."""
    lines, started, in_direction = [], False, False
    for raw in text.split("\n"):
        s = raw.strip()
        heading = re.match(r"(act|scene)\s+([ivxlc]+|\d+)\b", s, re.IGNORECASE)
        started = started or bool(heading)
        if not started or heading:
            continue
        if in_direction:  # inside a "[Enter ..." that began on an earlier line
            if "]" not in s:
                continue
            s, in_direction = s.split("]", 1)[1], False
        s = re.sub(r"\[[^\]]*\]", " ", s)
        if "[" in s:
            s, in_direction = s.split("[", 1)[0], True
        s = " ".join(s.split())  # also removes tabs, which the TSV must not contain
        if len(s.split()) >= min_words and s.upper() != s:
            lines.append(s)
    return lines


def spaced(xs, n):
    """n items spread evenly over xs, in order."""
    return [xs[i * len(xs) // n] for i in range(n)]


def read_plays(corpus, plays):
    """{title: spoken lines} for the given works of the corpus.

    A one-line error names a missing title."""
    with gzip.open(corpus, "rt", encoding="utf-8") as f:
        texts = {d["title"]: d["text"] for d in map(json.loads, f)}
    missing = [p for p in plays if p not in texts]
    if missing:
        raise ValueError(f"{corpus}: no work titled {missing}")
    return {p: speech_lines(texts[p]) for p in plays}


def split_lines(lines, block, dev_every):
    """{"train": {play: lines}, "dev": {...}}: each play's lines cut into contiguous blocks of
    `block` lines, every dev_every-th block dev and the rest train, so no dev line sits among
    fine-tuning lines. Lines that occur more than once anywhere are dropped."""
    counts = collections.Counter(s for ls in lines.values() for s in ls)
    splits = {"train": {}, "dev": {}}
    for p, ls in lines.items():
        unique = [(i, s) for i, s in enumerate(ls) if counts[s] == 1]
        splits["dev"][p] = [s for i, s in unique if (i // block) % dev_every == dev_every - 1]
        splits["train"][p] = [s for i, s in unique if (i // block) % dev_every != dev_every - 1]
    return splits


def write_task(out_dir, name, rows):
    """out_dir/name.tsv in evaluate_glue's --task-file format: header `sentence<TAB>label`."""
    path = os.path.join(out_dir, f"{name}.tsv")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("sentence\tlabel\n" + "".join(f"{s}\t{label}\n" for s, label in rows))
    return path


def build_play_task(out_dir, corpus=CORPUS, plays=PLAYS, train_per_play=500, dev_per_play=100,
                    block=40, dev_every=5):
    """Write out_dir/train.tsv and dev.tsv (the play's title as label) for evaluate_glue.py
    --task-file / --task-dev-file: lines split as in split_lines, every play with the same number
    of rows."""
    splits = split_lines(read_plays(corpus, plays), block, dev_every)
    os.makedirs(out_dir, exist_ok=True)
    result = {"classes": list(plays)}
    for name, wanted in (("train", train_per_play), ("dev", dev_per_play)):
        n = min(wanted, *(len(v) for v in splits[name].values()))
        rows = [(s, p) for p in plays for s in spaced(splits[name][p], n)]
        result.update({name: write_task(out_dir, name, rows), f"n_{name}": len(rows)})
    return result


def scramble(line, rng):
    """The line's words in a random order that differs from the original."""
    words = line.split()
    while True:
        shuffled = rng.sample(words, len(words))
        if shuffled != words:
            return " ".join(shuffled)


def build_order_task(out_dir, corpus=CORPUS, plays=HELD_OUT_PLAYS, train_per_play=1000,
                     dev_per_play=200, block=40, dev_every=5, seed=0):
    """Word order, CoLA-like: is this line as Shakespeare wrote it, or are its words shuffled?
    Lines come from the plays data.py holds out of pretraining (so neither version was ever
    trained on), split as in split_lines; half of each split, chosen at random, is scrambled. The
    two classes have the same words, so a bag-of-words model is at chance by construction: only
    word order tells them apart."""
    splits = split_lines(read_plays(corpus, plays), block, dev_every)
    rng = random.Random(seed)
    os.makedirs(out_dir, exist_ok=True)
    result = {"classes": ["original", "scrambled"]}
    for name, wanted in (("train", train_per_play), ("dev", dev_per_play)):
        n = min(wanted, *(len(v) for v in splits[name].values()))
        lines = [s for p in plays for s in spaced(splits[name][p], n)]
        flip = set(rng.sample(range(len(lines)), len(lines) // 2))
        rows = [(scramble(s, rng), "scrambled") if i in flip else (s, "original")
                for i, s in enumerate(lines)]
        result.update({name: write_task(out_dir, name, rows), f"n_{name}": len(rows)})
    return result


def bag_of_words_accuracy(task, l2=1e-3, steps=200):
    """Dev accuracy (percent) of a logistic regression on word counts (lowercased,
    whitespace-split) trained on the task's train rows: how far words alone get, with no order
    and no pretraining."""
    import glue_tasks
    _, spec, parsed = glue_tasks.load_task_file(task["train"], task["dev"])
    train_rows, dev_rows = parsed["train"], parsed["dev"][""]
    words = sorted({w for s in train_rows["a"] for w in s.lower().split()})
    vocab = {w: i for i, w in enumerate(words)}

    def counts(texts):  # (N, V) word counts; words unseen in training are dropped
        x = torch.zeros(len(texts), len(vocab))
        for i, s in enumerate(texts):
            for w in s.lower().split():
                if w in vocab:
                    x[i, vocab[w]] += 1
        return x
    x, y = counts(train_rows["a"]), torch.from_numpy(train_rows["labels"])
    w = torch.zeros(len(vocab), len(spec["classes"]), requires_grad=True)
    b = torch.zeros(len(spec["classes"]), requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w + b, y) + l2 * (w ** 2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    pred = (counts(dev_rows["a"]) @ w + b).argmax(-1).numpy()
    return 100.0 * float((pred == dev_rows["labels"]).mean())


def downstream(final_folder, out_dir, epochs=3, lr=1e-3, seeds=3, tasks=None):
    """Fine-tune the pretrained checkpoint and a randomly initialized copy of its network on each
    task with the same protocol. tasks: {name: builder(out_dir) -> task dict} (default
    DOWNSTREAM_TASKS). Returns {"epochs", "lr", "seeds", "tasks": {name: {"task", "chance",
    "pretrained", "random_init"}}}, accuracies in percent (median over seeds). The protocol is
    the one the README's downstream numbers were measured with: [CLS] pooling, one lr, AdamW."""
    import evaluate_glue
    result = {"epochs": epochs, "lr": lr, "seeds": seeds, "tasks": {}}
    for task_name, build in (tasks or DOWNSTREAM_TASKS).items():
        task = build(os.path.join(out_dir, task_name))
        r = {"task": task, "chance": 100.0 / len(task["classes"]),
             "bag_of_words": bag_of_words_accuracy(task)}
        glue = evaluate_glue.main(["--checkpoint", final_folder, "--task-file", task["train"],
                                   "--task-dev-file", task["dev"], "--seeds", str(seeds),
                                   "--epochs", str(epochs), "--lr", str(lr), "--pooling", "cls",
                                   "--lr-scaling", "none", "--optimizer", "adamw",
                                   "--control", "random-init",
                                   "--no-progress", "--out", os.path.join(out_dir, task_name)])
        # The task is named after train.tsv.
        r["pretrained"] = glue["tasks"]["train"]["metrics"]["accuracy"]
        r["random_init"] = glue["control"]["tasks"]["train"]["metrics"]["accuracy"]
        result["tasks"][task_name] = r
    return result


DOWNSTREAM_TASKS = {"word order": build_order_task, "plays": build_play_task}


# -----------------------------------------------------------------------------
# Report


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def run_name(r):
    if r["model"] == "ours":
        return "ours (train.py)"
    # results.json written before --baseline existed: BERT
    return f"HF {BASELINES[r.get('baseline', 'bert')]} lr {r['lr']:g}"


def curve_cell(q):
    """One point of a curve as table cells (seconds, tokens, loss); blanks for None."""
    if q is None:
        return " " * 25
    return f"{q['elapsed']:7.1f} {q['tokens']:>10,} {q['val_loss']:6.3f}"


def curve_rows(ours, hf):
    """Rows of (label, our point, HF's point): evaluation i beside evaluation i, and our losses
    just before and after a growth on rows of their own ('grow-', 'grow+')."""
    rows, evals = [], 0
    for q in ours:
        if "growth" in q:
            rows.append(("grow-" if q["growth"] == "before" else "grow+", q, None))
        else:
            rows.append((str(evals + 1), q, hf[evals] if evals < len(hf) else None))
            evals += 1
    rows += [(str(i + 1), None, hf[i]) for i in range(evals, len(hf))]
    return rows


def seed_report(c, ours, hf, best_lr):
    """Both curves side by side, then equal time, time to loss and tokens to loss for one seed."""
    lines = ["", f"held-out loss curves, seed {c['seed']} (HF lr {best_lr:g}):",
             f"{'eval':>5} | {'ours s':>7} {'tokens':>10} {'loss':>6} | "
             f"{'HF s':>7} {'tokens':>10} {'loss':>6}"]
    for label, q, h in curve_rows(ours["curve"], hf["curve"]):
        lines.append(f"{label:>5} | {curve_cell(q)} | {curve_cell(h)}")
    time_line = (f"time to reach HF's final loss {c['target_loss']:.3f}: "
                 f"HF {c['hf_seconds']:.1f} s, ours ")
    token_line = f"tokens to reach it: HF {c['hf_tokens']:,.0f}, ours "
    if c["ours_seconds"] is None:
        time_line += "not reached"
    else:
        time_line += f"{c['ours_seconds']:.1f} s -> {c['time_speedup']:.2f}x"
    if c["ours_tokens"] is None:
        token_line += "not reached"
    else:
        token_line += f"{c['ours_tokens']:,.0f} -> {c['token_speedup']:.2f}x (recipe)"
    token_line += f"; tokens/s ours / HF {fmt(c['throughput_ratio'], '.2f')}x (throughput)"
    return lines + [f"equal time: ours {c['ours_final_loss']:.3f} vs HF {c['hf_final_loss']:.3f}",
                    time_line, token_line]


def hf_description(settings):
    """The HF baseline and its recipe in words, from results.json's settings (BERT in those
    written before --baseline existed)."""
    baseline = settings.get("baseline", "bert")
    model_class = {"bert": "BertForMaskedLM", "modernbert": "ModernBertForMaskedLM"}[baseline]
    if "hf_recipe" not in settings:  # --skip-hf
        return BASELINES[baseline]
    width = settings.get("hf_intermediate", "-")
    return (f"{BASELINES[baseline]} ({model_class}, FFN width {width}), "
            f"schedule: {settings['hf_recipe']['schedule']}")


def report(results):
    """Print the run table, each seed's curves and speedups, and the downstream check.

    Returns the printed text."""
    runs, a, st = results["runs"], results["analysis"], results["settings"]
    lines = [f"\nmini-cram on {st['data']}: {st['n_layers']} x {st['d_model']}, "
             f"{st['n_heads']} heads, vocab {st['vocab_size']}, {budget_words(st)}, "
             f"{st['threads']} torch thread(s), {st['device']}",
             f"HF baseline: {hf_description(st)}", f"order: {', '.join(st['order'])}", "",
             f"{'run':<22} {'seed':>4} {'params':>8} {'final loss':>10} {'tokens':>11} "
             f"{'tokens/s':>9}  status"]
    for r in runs:
        best = "  <- baseline" if r["model"] == "hf" and r["lr"] == a["best_lr"] else ""
        lines.append(f"{run_name(r):<22} {r['seed']:>4} {r['params'] / 1e6:7.2f}M "
                     f"{fmt(r['final_loss'], '10.3f')} "
                     f"{r['tokens']:>11,} {r['tokens_per_s']:>9,}  {r['status']}{best}")
    step = results.get("step_tokens_per_s")
    if step:  # results.json written before the bare step was timed has none
        bare = ", ".join(f"{'ours' if who == 'ours' else 'HF'} {tps:,} tokens/s"
                         for who, tps in step.items())
        loops = ", ".join(
            f"{run_name(r)} seed {r['seed']} {r['tokens_per_s'] / step[r['model']]:.2f}"
            for r in runs if r["model"] in step)
        lines += ["", f"bare training step (bench_model's, same shape and micro-batch, "
                      f"{st['dtype']}): " + bare,
                  "loop / bare step, tokens/s (1.00 = the loop costs nothing around its step): "
                  + loops]
    for c in a["per_seed"]:
        ours = next(r for r in runs if r["model"] == "ours" and r["seed"] == c["seed"])
        hf = next(r for r in runs
                  if r["model"] == "hf" and r["lr"] == a["best_lr"] and r["seed"] == c["seed"])
        lines += seed_report(c, ours, hf, a["best_lr"])
    if len(a["per_seed"]) > 1:
        lines.append(f"median over seeds: time speedup {fmt(a['time_speedup'], '.2f')}x, "
                     f"token speedup {fmt(a['token_speedup'], '.2f')}x, "
                     f"throughput ratio {fmt(a['throughput_ratio'], '.2f')}x")
    d = results.get("downstream")
    if d and "tasks" in d:
        lines += ["", f"downstream, seed 0's checkpoint against the same network from random init "
                      f"({d['epochs']} epochs at lr {d['lr']:g}, median of {d['seeds']} "
                      f"fine-tuning seed(s), dev accuracy %):",
                  f"{'task':<12} {'train':>6} {'dev':>5} {'chance':>7} {'bag of words':>13} "
                  f"{'pretrained':>11} {'random init':>12}"]
        for name, r in d["tasks"].items():
            lines.append(f"{name:<12} {r['task']['n_train']:>6,} {r['task']['n_dev']:>5,} "
                         f"{r['chance']:>7.1f} {fmt(r.get('bag_of_words'), '13.1f')} "
                         f"{r['pretrained']:>11.1f} {r['random_init']:>12.1f}")
    text = "\n".join(lines)
    print(text)
    return text


def plot(results, path):
    """Held-out loss against seconds for every run; skipped when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results["runs"]:
        xs, ys = [q["elapsed"] for q in r["curve"]], [q["val_loss"] for q in r["curve"]]
        ax.plot(xs, ys, marker="o", ms=3, lw=2.5 if r["model"] == "ours" else 1.2,
                label=f"{run_name(r)}, seed {r['seed']}")
    ax.set(xlabel="wall-clock seconds (evaluations included)", ylabel="held-out MLM loss",
           title=f"mini-cram, {budget_words(results['settings'])}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# -----------------------------------------------------------------------------
# Command line


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    # Data and budget
    p.add_argument("--data", default="sample",
                   help="any --data train.py accepts (default: the bundled sample)")
    p.add_argument("--cache", default="cache", help="data cache folder (default: cache)")
    p.add_argument("--minutes", type=float, default=3.0,
                   help="wall-clock budget of every run (default: 3)")
    p.add_argument("--tokens", type=float, default=None,
                   help="a budget of training tokens instead of --minutes: every run, ours and "
                   "HF, trains on this many (train.py's --max-tokens), so a slow or busy machine "
                   "changes the times, not the race; time to loss is still reported")
    # Shape, shared by both models
    p.add_argument("--n-layers", type=int, default=4, help="layers (default: 4)")
    p.add_argument("--d-model", type=int, default=128, help="hidden size (default: 128)")
    p.add_argument("--n-heads", type=int, default=4, help="attention heads (default: 4)")
    p.add_argument("--ffn-dim", type=int, default=512,
                   help="a GELU FFN's width (default: 512 = 4 d): HF BERT's intermediate size; "
                   "ours gets the same weights, 2/3 of it for a gated FFN rounded to a multiple "
                   "of 32, and ModernBERT's GeGLU the same width as ours")
    p.add_argument("--max-seq-len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--vocab-size", type=int, default=4096,
                   help="tokenizer vocabulary (default: 4096)")
    # Batch and evaluation, shared by both models
    # 2,048 tokens a step: about 2,000 optimizer steps in 3 minutes on 2 CPU cores, what train.py's
    # own plan picks for this budget (planning.STEPS_WANTED); 4,096 until the twenty-fifth session,
    # when ModernBERT learned more at 2,048 and ours as much (docs/records.md, "Tokens per step").
    p.add_argument("--batch-tokens", type=int, default=2048,
                   help="tokens per optimizer step (default: 2048)")
    p.add_argument("--micro-batch", type=int, default=16,
                   help="sequences per forward pass (default: 16)")
    # 20 x 16 = 320 held-out sequences, the same ones (and masks) as 10 x 32 before
    p.add_argument("--eval-batches", type=int, default=20,
                   help="held-out batches per evaluation (default: 20)")
    # The runs
    p.add_argument("--baseline", choices=list(BASELINES), default="modernbert",
                   help="the HF model: modernbert (default, ModernBertForMaskedLM) or bert "
                   "(BertForMaskedLM)")
    p.add_argument("--hf-lrs", default=None, help="HF peak learning rates, one run each (default: "
                   + "; ".join(f"{b} {lrs}" for b, lrs in DEFAULT_HF_LRS.items()) + ")")
    p.add_argument("--hf-schedule", choices=list(HF_SCHEDULES), default="wsd",
                   help="HF learning-rate schedule: "
                   "wsd (default: ModernBERT's own warmup-stable-decay, 1-sqrt decay over the "
                   "last 20%%), linear (the BERT/RoBERTa recipe: 6%% warm-up, linear decay to 0) "
                   "or triangle (ours, train.py's default: "
                   "which share of the lead is the schedule)")
    p.add_argument("--hf-from", default=None, metavar="DIR",
                   help="reuse the HF runs of DIR/results.json (same settings) for every seed and "
                   "learning rate it has, and run only the missing ones: a speedrun measures each "
                   "lever of ours against one baseline")
    p.add_argument("--hf-mask-rate", type=float, default=0.25,
                   help="the masking rate HF trains at (default: 0.25, cramming's, the rate of "
                   "every baseline in docs/records.md; ModernBERT's paper: 0.3). Both models are "
                   "scored at train.py's --eval-mask-rate (0.25 unless --ours-flags sets it)")
    p.add_argument("--seeds", type=int, default=1,
                   help="seeds 0..N-1, each runs ours and every HF lr (default: 1)")
    p.add_argument("--ours-flags", default="",
                   help="extra train.py flags as one string, e.g. \"--lr 2e-3\" "
                   "(default: none, train.py's recipe)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads for every run (default: 0 = torch's count at start; "
                   "1 helps on a busy machine, where more threads than free cores crawl)")
    p.add_argument("--skip-hf", action="store_true", help="run only ours (no transformers needed)")
    p.add_argument("--analyze-only", action="store_true",
                   help="no training: re-analyze OUT/results.json, our curves read again "
                   "from the runs' logs")
    p.add_argument("--no-downstream", action="store_true", help="skip the downstream check")
    p.add_argument("--downstream-only", action="store_true",
                   help="no pretraining: run the downstream check on "
                   "OUT/results.json's seed-0 checkpoint and add it to results.json")
    p.add_argument("--downstream-epochs", type=int, default=3,
                   help="fine-tuning epochs of that check (default: 3)")
    p.add_argument("--downstream-lr", type=float, default=1e-3,
                   help="its fine-tuning learning rate (default: 1e-3, the best of 1e-4/1e-3 for "
                   "both arms; GLUE-sane's 4e-5 suits BERT-base, not minutes-old models)")
    p.add_argument("--downstream-seeds", type=int, default=3,
                   help="fine-tuning seeds per arm and task, median reported (default: 3)")
    p.add_argument("--out", default="runs/bench_cram",
                   help="output folder (default: runs/bench_cram)")
    args = p.parse_args(argv)
    if args.hf_lrs is None:  # the sweep of the chosen baseline; recorded in results.json's settings
        args.hf_lrs = DEFAULT_HF_LRS[args.baseline]
    return args


def main(argv=None):
    args = parse_args(argv)
    path = os.path.join(args.out, "results.json")
    if args.analyze_only or args.downstream_only:
        if not os.path.isfile(path):
            raise SystemExit(f"error: {path} not found; run the benchmark first")
        with open(path) as f:
            results = json.load(f)
        for r in results["runs"]:  # our curves again from the logs: old runs, today's reading
            log = os.path.join(r.get("out") or "", "log.jsonl")
            if r["model"] == "ours" and os.path.isfile(log):
                r["curve"] = read_curve(log)
        if args.downstream_only:
            results["downstream"] = run_downstream(results["runs"], args)
    else:
        results = run_all(args)
    results["analysis"] = analyze(results["runs"])
    report(results)
    os.makedirs(args.out, exist_ok=True)
    files.atomic_write(path, lambda f: f.write(json.dumps(results, indent=2).encode()))
    png = plot(results, os.path.join(args.out, "curves.png"))
    print(f"wrote {path}" + (f" and {png}" if png else " (pip install matplotlib for curves.png)"))
    return results


def run_all(args):
    """Every run, one at a time: per seed, ours and then HF at each learning rate.

    Then the downstream check."""
    threads = args.threads or torch.get_num_threads()  # the same for every run
    lrs = [] if args.skip_hf else [float(x) for x in args.hf_lrs.split(",") if x.strip()]
    s = flags.parse_args(ours_argv(args, 0, args.out))  # our settings as train.py resolves them
    if lrs and not (budget.budget_seconds(s) or s.max_tokens):
        raise SystemExit("error: HF runs need a budget of --minutes or --tokens")
    device, _, _ = parallel.setup_device(s.device)
    meta = train.prepare(s, device, 0, 1)  # the same cache entry train.py uses
    cfg = planning.model_config(s, meta["n_vocab"])
    arm = {"baseline": args.baseline, "cfg": cfg, "schedule": args.hf_schedule,
           "mask_rate": args.hf_mask_rate,
           "intermediate": hf_intermediate(args.baseline, cfg, args.ffn_dim)}
    hf_name = f"HF {BASELINES[args.baseline]}"
    dtype = parallel.autocast_dtype(s.dtype, device)
    settings = {**vars(args), "threads": threads, "device": str(device), "ours_ffn_dim": s.ffn_dim,
                "hf_intermediate": arm["intermediate"],
                "dtype": str(dtype).replace("torch.", ""),
                "hf_attention": hf_attention(device, dtype),
                "hf_sees": hf_sees(s, cfg, arm["mask_rate"]),
                "hf_recipe": {"betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": 0.01, "clip": 1.0,
                              "warmup": HF_WARMUP, "schedule": HF_SCHEDULES[args.hf_schedule],
                              "dropout": 0.0}}
    reused = earlier_hf_runs(args.hf_from, settings) if args.hf_from else {}
    order = [f"{'ours' if lr is None else f'hf lr {lr:g}'} seed {seed}"
             + (" (reused)" if (seed, lr) in reused else "")
             for seed in range(args.seeds) for lr in [None, *lrs]]
    print("runs, one at a time: " + ", ".join(order))
    runs = []
    for seed in range(args.seeds):
        for lr in [None, *lrs]:
            if (seed, lr) in reused:
                runs.append(reused[(seed, lr)])
                continue
            torch.set_num_threads(threads)
            gc.collect()
            print(f"\n=== {'ours' if lr is None else f'{hf_name} lr {lr:g}'}, seed {seed} ===")
            runs.append(run_ours(args, seed) if lr is None else run_hf(s, meta, arm, lr, seed))
            if lr is not None:
                r = runs[-1]
                print(f"{hf_name} lr {lr:g}: {r['status']}, {r['tokens']:,} tokens, "
                      f"{r['tokens_per_s']:,} tokens/s, "
                      f"final held-out loss {fmt(r['final_loss'], '.3f')}")
    torch.set_num_threads(threads)
    print("\n=== the bare training steps, off the clock: "
          "what each loop's tokens/s is measured against ===")
    step = isolated_steps(s, arm, device, with_hf=bool(lrs))
    results = {"settings": {**settings, "order": order}, "runs": runs, "step_tokens_per_s": step}
    # Saved now, so a failure in the downstream check loses no run.
    os.makedirs(args.out, exist_ok=True)
    files.atomic_write(os.path.join(args.out, "results.json"),
                       lambda f: f.write(json.dumps(results, indent=2).encode()))
    if not args.no_downstream:
        results["downstream"] = run_downstream(runs, args)
    return results


# What must match for an earlier HF run to stand for one of this benchmark's: the data, the budget,
# the machine's dtype and threads, the baseline's recipe, and what the HF run saw of our settings
# (hf_sees: its masking rate, and --ours-flags such as --micro-batch that apply to HF too).
SAME_FOR_REUSE = ("data", "minutes", "tokens", "baseline", "hf_schedule", "threads", "device",
                  "dtype", "hf_intermediate", "hf_sees")


def hf_sees(s, cfg, mask_rate):
    """The settings of ours that the HF runs share: its shape, batches, masks and compile choice.
    mask_rate: the rate HF trains at. The held-out rate is named only where it differs, so runs
    made before --eval-mask-rate existed stay reusable."""
    held_out = eval_mask_rate(s)
    named = {"eval_mask_rate": held_out} if held_out != mask_rate else {}
    return {"mask_rate": mask_rate, **named,
            "micro_batch": s.micro_batch, "max_seq_len": s.max_seq_len,
            "batch_tokens": s.batch_tokens, "eval_batches": s.eval_batches, "compile": s.compile,
            **{key: cfg[key] for key in ("n_layers", "d_model", "n_heads", "vocab_size")}}


def earlier_hf_runs(folder, settings):
    """{(seed, lr): run} of the HF runs in folder/results.json, after checking that they were made
    with the same SAME_FOR_REUSE settings (a one-line error names the first that differs)."""
    path = os.path.join(folder, "results.json")
    if not os.path.isfile(path):
        raise SystemExit(f"error: --hf-from: {path} not found")
    with open(path) as f:
        earlier = json.load(f)
    for key in SAME_FOR_REUSE:
        if earlier["settings"].get(key) != settings[key]:
            raise SystemExit(f"error: --hf-from: {path} was run with {key} "
                             f"{earlier['settings'].get(key)!r}, this run has {settings[key]!r}")
    return {(r["seed"], r["lr"]): r for r in earlier["runs"] if r["model"] == "hf"}


def run_downstream(runs, args):
    print("\n=== downstream: word order and which play, pretrained against random init ===")
    return downstream(os.path.join(runs[0]["out"], "final"), os.path.join(args.out, "downstream"),
                      args.downstream_epochs, args.downstream_lr, args.downstream_seeds)


if __name__ == "__main__":
    main()
