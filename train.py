"""train.py: the best model a wall-clock budget allows (cramming), on one CPU, one GPU or many.

    python train.py --data sample --minutes 2                    # offline, the bundled Shakespeare
    python train.py --hours 24                                   # FineWeb-Edu, crammed BERT, 1 GPU
    torchrun --nproc_per_node=8 train.py --hours 3               # data parallel on 8 GPUs (DDP)
    torchrun --nproc_per_node=8 train.py --hours 3 --shard fsdp  # weights and AdamW sharded (FSDP2)
    python train.py --resume --out runs/cram                     # continue a stopped run

How to read it: train() is the loop and train_step() the step; the helpers follow in the order the
loop calls them, and the command line comes last. train_step uses nothing from this project: copy
its text beside model.py and loader.py and it trains (tests/test_step.py does exactly that).

Everything that changes during a run is a function of progress p = elapsed / budget in [0, 1]
(Geiping & Goldstein 2022, Sec. 3): the learning rate (the budget triangle: 25% of the peak rising
to the peak at p = 0.75, then linearly to 0), the batch-size ramp (the target batch at p = 0.6), the
growth stages (grow.py) and when the run stops. A step or token budget (--max-steps, --max-tokens)
gives the same schedules on a deterministic clock, which the tests use. The clock starts once the
data is prepared, the model built and its step-0 loss measured (as cramming's timer starts after
loading); from then on it counts everything: compilation, evaluations, growth and checkpoints.

Other files do the rest: flags.py reads the command line, planning.py chooses the defaults, data.py
prepares the corpus, loader.py serves batches, model.py is the network, parallel.py the ranks,
budget.py the clock, held_out.py measures the held-out loss, ema.py keeps the moving average of
the weights that every evaluation scores and final/ holds, and checkpoint.py saves and resumes.

Output in --out: log.jsonl (one line per logged step, evaluation and growth), checkpoint.pt (or the
folder checkpoint.dcp/ under FSDP), final/ (model.py's folder with tokenizer.json and meta.json),
loss.png and summary.json (also printed).
"""
import argparse
import contextlib
import errno
import functools
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field

import torch
from tqdm import tqdm

import budget
import checkpoint
import data
import ema
import files
import flags
import grow
import model
import muon
import parallel
import planning
import scaling
import tokenizer
from held_out import HeldOut, eval_mask_rate, log_eval, samples, val_text  # instance: held_out
from loader import make_loader  # a function: train.py calls its Loader `loader`

# -----------------------------------------------------------------------------
# The run: set-up, the loop, the finish


def train(args, budget_was=None):
    """One run; each pass of the loop is one optimizer step. budget_was: the budget a resumed run
    had before this command extended it (None: not extended)."""
    # ---- set up: the hardware, the settings, the data, the model and optimizer, then the clock
    device, rank, world = parallel.setup_device(args.device, args.shard)  # then only as hw.*
    args, ckpt, init = resolve_settings(args, device=device, rank=rank, world=world)
    hw = Hardware(device, rank, world, dtype=parallel.autocast_dtype(args.dtype, device),
                  peak=planning.gpu_peak_flops(device))
    out, clock = Output(args.out, args.shard, rank), budget.Budget(args)
    meta, enc, stages = start_run(args, hw, out, ckpt=ckpt, budget_was=budget_was)
    net, optimizer, loader, state, average = build(args, hw, out, meta, stages, ckpt=ckpt,
                                                   init=init)
    held_out = HeldOut(args, hw, meta, clock, out)
    start_clock(clock, state, net, held_out, out, args, resumed=ckpt is not None,
                budget_was=budget_was)
    describe_run(net, args, hw, clock, out, stages)
    amp = parallel.autocast(hw.device, hw.dtype)  # bf16 where the hardware has it, off in fp32
    handlers = budget.catch_stop_signals(clock)  # preemption and Ctrl-C only set a flag
    progress = Progress(state, clock, hw, out, resumed=ckpt is not None)
    last_ckpt = state.elapsed
    while True:
        # ---- stop: the budget is spent or a signal came, by the clock all ranks agree on
        state.elapsed, stop = parallel.agree_on_clock(clock.elapsed(), clock.signals, hw.device,
                                                      hw.world)
        p = clock.progress(state.step, state.tokens, state.elapsed)
        if p >= 1.0 or stop:
            status = "budget spent" if p >= 1.0 else "preempted"
            break
        # ---- grow: the next stage starts at its budget fraction, or when the loss flattens
        why = growth_due(net, average, p, state, stages, args, held_out, out)
        if why:
            net, optimizer, average = grow_now(net, optimizer, average, p, why, state=state,
                                               stages=stages, args=args, hw=hw,
                                               held_out=held_out, out=out)
        # ---- one optimizer step: the learning rate at p, the micro-batches cut at the deadline
        T, B = model.unwrap(net).config["max_seq_len"], state.micro_batch  # the stage's length
        accum = accumulation_steps(p, target_accumulation(args.batch_tokens, B * T * hw.world),
                                   args.batch_ramp)
        lr = learning_rate(args, state, p)
        rate = masking_rate(args, p)
        position = loader.state_dict()  # where a retry of this step starts reading
        had_state = set(optimizer.state)  # a retry drops the optimizer state this step made
        try:
            step = train_step(
                net, optimizer, (loader.next_batch(B, T, rate) for _ in range(accum)),
                accumulation=accum, lr=lr, clip=args.clip,
                autocast=amp, gradient_sync=functools.partial(parallel.gradient_sync, net),
                mean_over_ranks=functools.partial(parallel.mean_over_ranks, world=hw.world),
                stop_early=functools.partial(budget.ends_past_deadline, clock, state,
                                             hw.device, hw.world))
        except RuntimeError as error:  # out of memory: halve the micro-batch, retry the step
            back_off(error, net, optimizer, loader, position, had_state, state=state, args=args,
                     hw=hw, out=out)  # or re-raise
            continue
        # ---- a non-finite loss made no update; too many in a row end the run
        if step["skipped"]:
            state.bad_steps, state.skipped_steps = state.bad_steps + 1, state.skipped_steps + 1
            out.log({"kind": "skip", "step": state.step, "loss": step["loss"]})
            if state.bad_steps >= args.max_bad_steps:
                status = "diverged"
                break
            continue  # the data position moved on: the next step sees other batches
        # ---- the average of the weights (the model every evaluation scores) takes the step in
        ema.update(average, model.unwrap(net), rate=lr / args.lr)
        # ---- count what the step consumed, and log
        batch_tokens = step["micro_batches"] * B * T * hw.world
        state.count_step(batch_tokens, model.flops_per_token(model.unwrap(net).config))
        progress.update(p, state)
        if state.step % args.log_every == 0:
            progress.log_step(state, p, step, lr, batch_tokens)
        # ---- checkpoint every --checkpoint-minutes (and --checkpoint-steps), before an
        # evaluation that might die (nanochat's lesson)
        if checkpoint_due(args, state, last_ckpt):
            last_ckpt = state.elapsed
            save_checkpoint(net, optimizer, loader, state, average=average, clock=clock, out=out)
        # ---- evaluate on held-out data (the batches the budget has time for), and a sample
        if p >= state.next_eval:
            state.next_eval += args.eval_every
            with ema.swapped_in(model.unwrap(net), average):
                evaluate_and_show(net, p, state, held_out, enc, args, out)
    progress.close()
    budget.restore_signal_handlers(handlers)
    # ---- the end: the checkpoint first (a later --resume with a larger budget extends the run,
    # and an evaluation that dies loses nothing), then the final evaluation, export and summary
    if status == "diverged":
        stop_diverged(net, optimizer, state, args, meta, out)  # exits with status 1
    saved = save_checkpoint(net, optimizer, loader, state, average=average, clock=clock, out=out,
                            then=f"the run {'stops' if status == 'preempted' else 'finishes'}")
    if status == "preempted":
        if saved:
            out.say(f"stopped by signal at step {state.step}: checkpoint saved to "
                    f"{out.ckpt_path}; continue with --resume")
        return {"status": status, **asdict(state)}
    with ema.swapped_in(model.unwrap(net), average):  # the final model is the average
        return finish(net, loader, state, status, args=args, hw=hw, held_out=held_out, meta=meta,
                      enc=enc, out=out)


# -----------------------------------------------------------------------------
# The step: forward and backward over the micro-batches, clip, update

def train_step(net, optimizer, micro_batches, *, accumulation=None, lr=None, clip=0.0,
               autocast=contextlib.nullcontext, gradient_sync=None, mean_over_ranks=None,
               stop_early=None):
    """One optimizer step. Returns {"loss": the mean loss over the micro-batches (a float),
    "micro_batches": how many ran, "grad_norm": the norm before clipping (a tensor on the device,
    so reading it waits; None without clipping), "skipped": True if the loss was not finite, and
    then no update was made}.

    net(**batch)["loss"] is a micro-batch's loss. micro_batches: batches to take `accumulation`
    of (a list, then all of it by default; or a generator that reads each when it is needed).
    This function uses nothing but torch, so it can be copied alone. The keywords default to
    one process and nothing extra:
      lr               set on every parameter group first (None: leave the optimizer's)
      clip             clip the global L2 norm of the gradients to this (cramming: 0.5); 0: off
      autocast         the context of every forward and backward, e.g.
                       functools.partial(torch.autocast, "cuda", dtype=torch.bfloat16)
      gradient_sync    gradient_sync(last): the context of a micro-batch's backward; under DDP or
                       FSDP it reduces the gradients across ranks on the last micro-batch only
      mean_over_ranks  mean_over_ranks(loss): the summed loss averaged over ranks, so that every
                       rank takes the same skip-or-update decision
      stop_early       stop_early(seconds): asked before every micro-batch after the first, with
                       the seconds the previous one took; True makes it the step's last (a hard
                       wall-clock deadline ends at most one micro-batch late)
    """
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    accumulation = len(micro_batches) if accumulation is None else accumulation
    batches = iter(micro_batches)
    loss_sum, done, seconds = 0.0, 0, 0.0
    for micro in range(accumulation):
        last = micro == accumulation - 1 or (micro > 0 and stop_early is not None
                                             and stop_early(seconds))
        started = time.time()
        batch = next(batches)  # input_ids (B, T); MLM: labels and label_positions (B, k)
        sync = gradient_sync(last) if gradient_sync else contextlib.nullcontext()
        with sync, autocast():
            loss = net(**batch)["loss"]  # MLM: cross-entropy on the masked positions only (sparse)
            (loss / accumulation).backward()  # gradients add up to the mean over micro-batches
        loss_sum = loss_sum + loss.detach().float()
        done += 1
        seconds = time.time() - started
        if last:
            break
    # A step cut short divided each micro-batch's loss by accumulation, not by done: rescale its
    # gradients to the mean over the micro-batches it has.
    if done < accumulation:
        for param in net.parameters():
            if param.grad is not None:
                param.grad.mul_(accumulation / done)
    if mean_over_ranks is not None:
        loss_sum = mean_over_ranks(loss_sum)
    grad_norm = None
    if clip > 0:  # queued before .item() below, the step's one wait for the device
        grad_norm = torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        # Under FSDP the norm is a DTensor of each rank's shards; full_tensor() is the whole norm.
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    loss = loss_sum.item() / done
    # One inf or NaN in AdamW's moments would stay there for good: skip the update instead.
    skipped = not math.isfinite(loss)
    if not skipped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss, "micro_batches": done, "grad_norm": grad_norm, "skipped": skipped}


# -----------------------------------------------------------------------------
# Schedules: pure functions of budget progress p in [0, 1]

def lr_multiplier(p, schedule="triangle", warmup=0.06, decay=0.2):
    """Learning rate as a fraction of the peak at progress p. decay: the last fraction of the
    budget over which "wsd" and "trapezoid" fall to zero."""
    if schedule == "triangle":      # cramming's budget-triangle2: min(0.25 + p, 4 (1 - p))
        return max(0.0, min(0.25 + p, 4.0 * (1.0 - p)))
    if schedule == "one-cycle":     # Smith & Topin 2019: up to the peak at p = 0.5, then down
        return max(0.0, 1.0 - abs(2.0 * p - 1.0))
    if warmup > 0 and p < warmup:   # the others warm up linearly from 0
        return p / warmup
    if schedule == "constant":
        return 1.0
    if schedule in ("wsd", "trapezoid"):  # warmup-stable-decay (Hu et al. 2024, MiniCPM)
        q = (p - (1.0 - decay)) / decay   # progress through the decay, < 0 before it starts
        if q <= 0:
            return 1.0
        # ModernBERT decays as 1 - sqrt (Haegele et al. 2024, Section 3); the trapezoid linearly
        q = min(q, 1.0)
        return 1.0 - (math.sqrt(q) if schedule == "wsd" else q)
    q = (p - warmup) / (1.0 - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - q)
    return 0.5 * (1.0 + math.cos(math.pi * min(q, 1.0)))  # cosine (Loshchilov & Hutter 2017)


def learning_rate(args, state, p):
    """The peak rate times the schedule at progress p, re-warmed after growth with --grow-rewarm."""
    lr = args.lr * lr_multiplier(p, args.schedule, args.warmup, args.decay)
    if state.stage > 0 and args.grow_rewarm > 0:
        lr *= grow.rewarm_factor(p, state.stage_at, args.grow_rewarm)
    return lr


def masking_rate(args, p):
    """The MLM masking rate at progress p: --mask-rate, or falling linearly from it to
    --mask-rate-end (Ankner et al. 2023: 30% to 15%, many predictions per token early, more context
    to each late). The model's FLOP count keeps --mask-rate; the held-out loss its own rate."""
    if args.mask_rate_end is None:
        return args.mask_rate
    return args.mask_rate + (args.mask_rate_end - args.mask_rate) * min(1.0, p)


def accumulation_steps(p, target, ramp=0.6):
    """Micro-batches per optimizer step: from 1 up to target, linearly over the first `ramp` of the
    budget (cramming's batch_size_ramp 0.6 in train/bert-o4.yaml)."""
    # Early steps are small and many, when the loss falls fastest. The ramp goes through the
    # number of micro-batches, so every forward keeps one static shape (no recompilation under
    # torch.compile).
    if ramp <= 0 or p >= ramp:
        return target
    return max(1, min(target, int(p / ramp * target) + 1))


def target_accumulation(batch_tokens, micro_tokens):
    """Micro-batches per step that make --batch-tokens from micro-batches of micro_tokens (all
    ranks): a growth stage with shorter sequences, or a micro-batch halved after running out of
    memory, accumulates more of them, so every optimizer step sees the same number of tokens."""
    return max(1, round(batch_tokens / micro_tokens))


# -----------------------------------------------------------------------------
# The loop's decisions: growth, running out of memory, checkpoints, evaluations

def growth_due(net, average, p, state, stages, args, held_out, out):
    """Why the next growth stage starts now: "fraction" (its budget fraction is reached), the
    reason grow.auto_should_grow gives (--grow-when auto: this stage's held-out loss flattened),
    or None: not now, or no stage is left."""
    if state.stage + 1 >= len(stages):
        return None
    if args.grow_when != "auto":
        return "fraction" if p >= stages[state.stage + 1]["at"] else None
    if p >= state.next_check:  # one held-out point on this stage's curve, every --grow-check-every
        every = args.grow_check_every
        state.next_check = (math.floor(p / every) + 1) * every
        with ema.swapped_in(model.unwrap(net), average):
            losses = held_out.evaluate(net)
        state.auto_points.append([state.flops, losses["val_loss"]])
        log_eval(out, state, p, losses, elapsed=held_out.clock.elapsed(), growth_check=True)
    due, why = grow.auto_should_grow(state.auto_points, p, state.stage + 1, len(stages),
                                     args.grow_slope)
    return why if due else None


def grow_now(net, optimizer, average, p, why, *, state, stages, args, hw, held_out, out):
    """Grow the model and optimizer to the next stage (grow.apply_stage), and log the event with
    the held-out loss just before (the average's) and just after. The grown model starts a new
    average (the old one has the old shapes). Returns (net, optimizer, average)."""
    state.stage += 1
    # The loss just before and after shows what the operator cost: a function-preserving one
    # (Net2Net, bert2BERT) changes it by float noise only, while a sequence-length step also
    # changes the task.
    with ema.swapped_in(model.unwrap(net), average):
        loss_before = held_out.evaluate(net)["val_loss"]
    try:  # while it grows, both models and both optimizers are in memory
        plain, optimizer, event = grow.apply_stage(
            model.unwrap(net), optimizer, stages[state.stage],
            lambda m: make_optimizer(m, args, hw),
            {"noise": args.grow_noise, "seed": args.seed, "policy": args.grow_optimizer,
             "new_moments": args.grow_moments})
    except RuntimeError as error:
        if not parallel.is_out_of_memory(error):
            raise
        # A smaller micro-batch frees nothing here (no activation is held): a new run must
        # make room. The last checkpoint is from before this stage.
        raise parallel.out_of_memory_exit(
            f"growing to {grow.describe(stages[state.stage]['config'])} at step {state.step} "
            f"(the last checkpoint, {out.ckpt_path}, is from before it)",
            stages[state.stage]["config"], device=hw.device, world=hw.world,
            args=args) from None
    # compile and DDP must see the new shapes: wrap the grown model again
    net = parallel.wrap(plain.to(hw.device).train(), args, hw.device, hw.world)
    average = ema.start(model.unwrap(net), args.ema)
    loss_after = held_out.evaluate(net)["val_loss"]
    state.stage_at, state.auto_points = p, [[state.flops, loss_after]]  # the new stage's curve
    event = {"kind": "grow", "step": state.step, "tokens": state.tokens, "elapsed": state.elapsed,
             "progress": p, **event, "val_loss_before": loss_before, "val_loss_after": loss_after,
             "reason": why}
    out.log(event)
    out.say(f"grow at {p:.1%}: {event}")
    return net, optimizer, average


def back_off(error, net, optimizer, loader, position, had_state, *, state, args, hw, out):
    """Out of memory anywhere in a step (forward, backward, clipping, the optimizer's update;
    CUDA's, MPS's or the CPU allocator's error): free what the step held, halve the micro-batch (the
    accumulation doubles, so the global batch stays), rewind the loader to position (where the
    step started reading), drop the optimizer state the step created (had_state: the parameters
    that had state before it), log it, and let the loop retry the same step: the run goes on as
    if it had started with the smaller micro-batch. Any other error is raised again."""
    if not parallel.is_out_of_memory(error):
        raise error
    optimizer.zero_grad(set_to_none=True)  # the half-accumulated gradients of the failed step
    parallel.free_memory(hw.device)
    for p in set(optimizer.state) - had_state:  # created by the failed step: made anew
        del optimizer.state[p]
    B = state.micro_batch
    # One sequence that does not fit has nothing left to halve. Several ranks would have to agree
    # on the retry inside their collectives: there the error ends the run too.
    if B == 1 or hw.world > 1:
        raise parallel.out_of_memory_exit(f"at micro-batch {B}", model.unwrap(net).config,
                                          device=hw.device, world=hw.world,
                                          args=args) from None
    state.micro_batch = B // 2
    loader.load_state_dict(position)
    out.log({"kind": "back_off", "step": state.step, "micro_batch": state.micro_batch,
             "error": str(error).splitlines()[0][:200]})
    out.say(f"out of memory at step {state.step + 1}: micro-batch {B} -> {state.micro_batch} "
            "sequences, twice the accumulation: the same global batch; retrying the step")


def checkpoint_due(args, state, last_ckpt):
    """Every --checkpoint-minutes on the agreed clock, and every --checkpoint-steps if set."""
    by_steps = args.checkpoint_steps and state.step % args.checkpoint_steps == 0
    return bool(by_steps) or state.elapsed - last_ckpt > args.checkpoint_minutes * 60


def evaluate_and_show(net, p, state, held_out, enc, args, out):
    """The held-out loss within what is left of the budget, logged, and printed with a sample."""
    losses = held_out.evaluate(net, within_budget=True)
    if losses:
        log_eval(out, state, p, losses, elapsed=held_out.clock.elapsed())
        out.say(f"{p:4.0%} held-out loss {val_text(losses)}; "
                f"{samples(net, enc, args, out.rank)}")


# -----------------------------------------------------------------------------
# Set-up, in the order train() calls it

@dataclass(frozen=True)
class Hardware:
    """Where the run computes, fixed at start-up."""
    device: torch.device
    rank: int                     # this process, 0 to world - 1; rank 0 prints, logs and exports
    world: int                    # processes training together (torchrun's WORLD_SIZE)
    dtype: torch.dtype            # autocast dtype: bf16 where the hardware has it, else fp32
    peak: float = None            # this GPU's peak FLOP/s, or None (no MFU)


class Output:
    """What the run writes in --out and prints: log.jsonl and the printed lines come from rank 0
    only; the checkpoint's path is every rank's (under FSDP each writes its shards)."""

    def __init__(self, folder, shard, rank):
        self.folder, self.rank = folder, rank
        self.log_path = os.path.join(folder, "log.jsonl")
        self.ckpt_path = checkpoint.path_in(folder, shard)
        self.lost = 0  # log records a full disk did not take

    def say(self, *text):
        """Print on rank 0 only, through tqdm so that a line never breaks the progress bar."""
        if self.rank == 0:
            tqdm.write(" ".join(map(str, text)))

    def log(self, record):
        """Append one record (a dict) to log.jsonl. A full disk loses the record, not the run:
        the first says so, and summary.json counts them (log_records_lost)."""
        if self.rank != 0:
            return
        try:
            checkpoint.append_log(self.log_path, record)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            self.lost += 1
            if self.lost == 1:
                self.say(f"warning: {self.log_path}: no space left on device: this record and "
                         "any other the full disk refuses are not logged (summary.json counts "
                         "them); training goes on")


@dataclass
class RunState:
    """Everything the loop changes. A checkpoint saves it; a resumed run continues from these
    values."""
    step: int = 0                 # optimizer steps taken
    tokens: int = 0               # training tokens fed, all ranks
    flops: float = 0.0            # training FLOPs spent (model.flops_per_token of each stage)
    elapsed: float = 0.0          # seconds on the budget's clock
    stage: int = 0                # index of the current growth stage
    stage_at: float = 0.0         # progress at which that stage started
    auto_points: list = field(default_factory=list)  # [[flops, held-out loss]] of this stage (auto)
    next_eval: float = 0.0        # progress of the next held-out evaluation
    next_check: float = 0.0       # progress of the next growth check (--grow-when auto)
    bad_steps: int = 0            # non-finite losses in a row
    skipped_steps: int = 0        # non-finite losses in all
    log_bytes: int = None         # log.jsonl's size at the last checkpoint: resume cuts it there
    micro_batch: int = None       # sequences per forward: --micro-batch, halved on out of memory

    def count_step(self, tokens, flops_per_token):
        """An optimizer step was taken: it fed tokens (all ranks) at flops_per_token."""
        self.bad_steps, self.step = 0, self.step + 1
        self.tokens += tokens
        self.flops += tokens * flops_per_token


def planning_speed(device, dtype, world):
    """planning.sustained_flops as a function of the model config, for choose_defaults: each config
    timed once (on a CPU: forward and backward passes of it, 0.2-0.6 s for the presets a budget
    of minutes tries), and every rank plans with the slowest rank's figure, or ranks would build
    different models. Only a wall-clock budget asks."""
    measured = {}

    def speed(cfg):
        key = json.dumps(cfg, sort_keys=True)
        if key not in measured:
            measured[key] = parallel.slowest_over_ranks(
                planning.sustained_flops(cfg, device, dtype), device, world)
        return measured[key]
    return speed


def resolve_settings(args, *, device, rank, world):
    """(the settings, the checkpoint to resume or None, --init-from's weights or None): the flags
    with the defaults chosen for this machine and budget, checked before any work (shape, growth
    schedule, masking at every length)."""
    init = None
    if args.init_from:
        init = checkpoint.load_init(args.init_from)  # read once: build() loads its weights
        args = flags.settings_from_init(args, init)
    try:
        speed = planning_speed(device, parallel.autocast_dtype(args.dtype, device), world)
        chosen, why = planning.choose_defaults(args, speed, world, device.type)
    except ValueError as e:  # a shape that makes no valid model, e.g. an odd head size with rotary
        raise SystemExit(f"error: {flags.config_error_in_flags(e)}") from None
    if args.grow == "auto":  # shorthand: compound's stages, grown when the loss says so
        chosen.update(grow="compound", grow_when="auto")
    if chosen.get("grow", args.grow) == "depth":  # saved with its fractions: a resume keeps them
        chosen["grow"] = f"depth@{grow.DEPTH_AT}"
    # A new Namespace: the parsed flags stay as given. args.json saves these, so --resume reuses
    # them.
    args = argparse.Namespace(**{**vars(args), **chosen})
    if why and rank == 0:
        print(f"defaults: {why} (flags given on the command line always win)")
    if chosen.get("optimizer") == "adamw" and rank == 0:
        print("note: --optimizer muon runs AdamW under --shard fsdp (Newton-Schulz needs whole "
              "matrices, and a rank holds a shard of each)")
    path = checkpoint.path_in(args.out, args.shard)
    ckpt = checkpoint.load(path) if args.resume and checkpoint.exists(path) else None
    if args.resume and ckpt is None and rank == 0:  # killed before its first checkpoint
        print(f"{path} does not exist yet: the run starts again from step 0")
    stages = growth_stages(args, planning.model_config(args, args.vocab_size))  # fails before work
    lengths = {args.max_seq_len, *(s["config"]["max_seq_len"] for s in stages)}
    rates = {"--mask-rate": args.mask_rate, "--mask-rate-end": args.mask_rate_end,
             "--eval-mask-rate": eval_mask_rate(args)}
    for T in lengths if args.objective == "mlm" else ():
        for flag, rate in rates.items():
            if rate is not None and not 1 <= round(rate * T) <= T - 2:
                raise SystemExit(f"error: {flag} {rate} masks {round(rate * T)} of {T} tokens "
                                 f"per sequence; it must mask 1 to {T - 2}")
    if ckpt is None:  # --resume replaces what the same run wrote before its first checkpoint
        checkpoint.check_out_is_free(args.out, args.force or args.resume, remove=rank == 0)
    return args, ckpt, init


def growth_stages(args, cfg):
    """grow.parse_schedule of --grow toward cfg ([] without growth), as a one-line error if
    invalid."""
    try:
        return grow.parse_schedule(args.grow, cfg) if args.grow != "none" else []
    except ValueError as e:
        raise SystemExit(f"error: --grow: {e}") from None


def start_run(args, hw, out, *, ckpt, budget_was):
    """Prepare the data and write args.json (the first file written: every check has passed).
    Returns (meta: data.prepare_data's description of the token shards, the tokenizer (only to
    show samples), the growth stages ([] without growth))."""
    meta = prepare_interruptible(args, hw)
    cfg = planning.model_config(args, meta["n_vocab"])  # the model the run trains toward
    if args.init_from and cfg["vocab_size"] != meta["n_vocab"]:  # another tokenizer was given
        raise SystemExit(f"error: --tokenizer {args.tokenizer} has {meta['n_vocab']} tokens; the "
                         f"weights of --init-from {args.init_from} have {cfg['vocab_size']}")
    stages = growth_stages(args, cfg)
    if stages and any(stages[-1]["config"][k] != cfg[k] for k in grow.GROWN_KEYS):
        out.say(f"--grow: the schedule ends at {grow.describe(stages[-1]['config'])}, not the "
                f"model's {grow.describe(cfg)}; the run trains toward the schedule's last stage")
    if hw.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        if ckpt is None or budget_was:  # a resume saves its extended budget
            write_args(args, os.path.join(args.out, "args.json"))
        checkpoint.remove_stale_temporaries(args.out)  # of a run a kill -9 stopped
        if ckpt is not None:
            checkpoint.truncate_log(out.log_path, ckpt["state"]["log_bytes"])
    return meta, tokenizer.load_tokenizer(meta["tokenizer"]), stages


def write_args(args, path):
    """args.json: the settings --resume reads back. A full disk here is one line, before any
    training."""
    with one_line_if_the_disk_is_full(path, "nothing was trained"):
        files.atomic_write(path, lambda f: f.write(json.dumps(vars(args), indent=2).encode()))


def prepare_interruptible(args, hw):
    """prepare() where SIGTERM exits at once with one line: data.py's temporary folder is
    removed."""
    message = ("error: stopped by a signal during data preparation; nothing was written (the cache "
               "keeps only finished entries)")
    with data.exit_cleanly_on_sigterm(args.cache, message):
        return prepare(args, hw.device, hw.rank, hw.world)


def prepare(args, device, rank, world):
    """Rank 0 prepares (downloads, cleans, tokenizes); the others wait, then read the same cache."""
    tokens = planning.budget_tokens(args, device) if data.downloads(args.data) else None
    settings = {"vocab_size": args.vocab_size, "tokenizer": args.tokenizer,
                "lowercase": args.lowercase, "strip_accents": args.lowercase,
                "fineweb_shards": args.fineweb_shards, "max_tokens": tokens,
                "mix_temperature": args.mix_temperature}  # data.DEFAULTS for the rest
    meta = None
    # One process downloads and tokenizes, so ranks never race on the cache; the others then find
    # the finished entry under the same settings key and only read its meta.json.
    if rank == 0:
        try:
            meta = data.prepare_data(args.data, args.cache, settings, progress=True)
        except (ValueError, OSError) as e:
            raise SystemExit(f"error: {e}") from None
        for line in data.source_lines(meta):  # a mixture: each source's fertility, as data.py's
            print(line)
    if world > 1:
        torch.distributed.barrier()
        if rank != 0:
            meta = data.prepare_data(args.data, args.cache, settings, progress=False)
    try:  # every shard's header and size, now: a damaged cache is a one-line error, not a traceback
        for split in ("train", "val"):
            make_loader(meta, split, {"objective": args.objective, "rank": rank,
                                      "world_size": world, "mask_rate": args.mask_rate},
                        prefetch=False)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    return meta


def build(args, hw, out, meta, stages, *, ckpt=None, init=None):
    """(net, optimizer, loader, state, average): fresh from the seed (at the first growth stage),
    as saved (ckpt), or from --init-from's weights (init) with a fresh optimizer. average: the
    weights' moving average (ema.py), None under --ema 0."""
    torch.manual_seed(args.seed)  # the same weights on every rank: FSDP keeps each rank's slice
    if ckpt:
        first = ckpt["config"]
    else:
        first = stages[0]["config"] if stages else planning.model_config(args, meta["n_vocab"])
    net = model.build_model(first).to(hw.device)
    # The order matters: weights go in before wrapping (DDP broadcasts them, FSDP keeps a slice),
    # and the optimizer is made after (under FSDP its moments are shaped like the shards).
    if ckpt:
        checkpoint.load_weights(net, ckpt)
    elif init:  # a new run from old weights: new optimizer, new budget, new data order
        net.load_state_dict(init["weights"])
        out.say(f"starting from the weights of {args.init_from}")
    net = parallel.wrap(net.train(), args, hw.device, hw.world)
    optimizer = make_optimizer(model.unwrap(net), args, hw)
    average = ema.start(model.unwrap(net), args.ema)
    settings = {"objective": args.objective, "seed": args.seed, "rank": hw.rank,
                "world_size": hw.world, "mask_rate": args.mask_rate}
    loader = make_loader(meta, "train", settings, device=hw.device)
    state = RunState(next_eval=args.eval_every, next_check=args.grow_check_every)
    if ckpt:
        state = RunState(**checkpoint.restore(ckpt, net, optimizer, loader, average))
        out.say(f"resuming {out.ckpt_path} at step {state.step}, {state.tokens:,} tokens, "
                f"{state.elapsed:.0f} s used")
    # a run that backed off after running out of memory resumes at the micro-batch it settled on
    state.micro_batch = state.micro_batch or args.micro_batch
    return net, optimizer, loader, state, average


def make_optimizer(net, args, hw):
    """AdamW (decoupled weight decay, Loshchilov & Hutter 2019) as cramming's bert-o4 sets it: lr
    1e-3 at width 768, betas (0.9, 0.98), eps 1e-12, weight decay 0.01. --optimizer muon: Muon on
    the blocks' matrices (with NorMuon's rows evened out: --neuron-beta2) and the same AdamW on the
    rest, at the same lr (muon.py; under --shard fsdp planning.choose_defaults made it adamw)."""
    if args.optimizer == "muon":
        return muon.MuonAdamW(muon.param_groups(net, args.weight_decay), lr=args.lr,
                              momentum=args.momentum, betas=args.betas, eps=args.eps,
                              ns_dtype=hw.dtype, update_rms=args.muon_rms,
                              neuron_beta2=args.neuron_beta2, ns_steps=args.ns_steps)
    params = [p for p in net.parameters() if p.requires_grad]
    # no decay on norms, biases and scalars (cramming's limited_decay_keys; here: tensors under 2-D)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # on a GPU the fused kernel updates all parameters in one launch instead of several per tensor
    return torch.optim.AdamW(groups, lr=args.lr, betas=tuple(args.betas), eps=args.eps,
                             fused=hw.device.type == "cuda")


def start_clock(clock, state, net, held_out, out, args, *, resumed, budget_was):
    """The step-0 evaluation (off the clock: where the curve starts, about ln V nats), then the
    clock starts (a resumed run's continues from its saved time). A resumed run checks that
    budget is left."""
    if not resumed:
        losses = held_out.evaluate(net)
        log_eval(out, state, 0.0, losses, elapsed=0.0)
        out.say(f"held-out loss before training: {val_text(losses)}")
    clock.start_clock(state.elapsed)
    if not resumed:
        return
    p = clock.progress(state.step, state.tokens, state.elapsed)
    if p >= 1.0 and not os.path.exists(os.path.join(out.folder, "summary.json")):
        out.say("the budget is spent but the run did not finish (summary.json, written last, is "
                "missing): the final evaluation, final/ and summary.json are written now")
        return
    if p >= 1.0:
        raise SystemExit(f"error: {out.ckpt_path} has spent its budget "
                         f"({clock.left(state.step, state.tokens, state.elapsed)} left); give a "
                         "larger one with --resume to extend the run")
    if budget_was:  # extended: the schedules read progress, which just went down
        state.next_eval = (math.floor(p / args.eval_every) + 1) * args.eval_every
        out.say(f"resume: budget {budget_was} -> {flags.budget_text(args)}; progress is now "
                f"{p:.1%}, so the learning rate, batch ramp and growth stages continue from there "
                "(docs/train.md: extending a run)")


def describe_run(net, args, hw, clock, out, stages):
    """The start-up lines: the model, the device, parameters and FLOPs, the batch, the memory."""
    now = model.unwrap(net).config
    flops_tok = model.flops_per_token(now)
    growing = ""
    if stages:
        final = stages[-1]["config"]
        growing = (f"; growing to {model.count_params(final) / 1e6:.1f} M in {len(stages) - 1} "
                   "stage(s)")
    out.say(json.dumps({"model": now}, indent=None))
    dtype = str(hw.dtype).replace("torch.", "")
    n, n_body = model.count_params(now), model.count_params(now, False)
    out.say(f"device {hw.device} ({dtype}), {hw.world} process(es); {n / 1e6:.1f} M parameters "
            f"({n_body / 1e6:.1f} M without embeddings), {flops_tok / 1e6:.0f} MFLOP per token"
            f"{growing}")
    B, T = args.micro_batch, args.max_seq_len
    accum = target_accumulation(args.batch_tokens, B * T * hw.world)
    out.say(f"global batch {accum * B * T * hw.world:,} tokens = {B} sequences x {T} tokens x "
            f"{hw.world} rank(s) x {accum} accumulation steps (ramped over {args.batch_ramp:.0%} "
            "of the budget)")
    if hw.peak and clock.seconds:
        tokens = clock.seconds * hw.peak * planning.scaling.PLANNING_MFU / flops_tok
        out.say(f"the budget should buy ~{tokens / 1e9:.2f} B tokens at "
                f"{planning.scaling.PLANNING_MFU:.0%} MFU (peak {hw.peak / 1e12:.0f} TFLOP/s)")
    # A growing run's state peaks at the last stage's size: the memory it must find room for.
    out.say(parallel.memory_text(stages[-1]["config"] if stages else now, hw.world, args))
    if args.shard == "fsdp":  # a collective: every rank reports what it holds
        out.say(f"parameter bytes held by each rank after fully_shard: "
                f"{parallel.bytes_per_rank(net, hw.world)}")


# -----------------------------------------------------------------------------
# Progress, checkpoints and the finish

class Progress:
    """The progress bar (% of the budget, on rank 0), the 'train' records of log.jsonl, tokens and
    FLOPs per second since the last of them, and once, ten steps after the first (which compiles
    and warms up), the tokens the whole budget should buy at the measured rate."""

    def __init__(self, state, clock, hw, out, resumed):
        self.clock, self.hw, self.out = clock, hw, out
        self.bar = tqdm(total=100, disable=hw.rank != 0, unit="%", desc="budget",
                        dynamic_ncols=True,
                        bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}{postfix}]")
        self.last = (time.time(), state.tokens, state.flops)
        self.first_step, self.warm, self.estimated = state.step + 1, None, resumed

    def update(self, p, state):
        """After every step: the bar moves to p, and the budget's estimate is said once."""
        self.bar.update(round(100 * p, 1) - self.bar.n)
        if self.estimated or not self.clock.seconds:
            return
        if state.step == self.first_step:
            self.warm = (time.time(), state.tokens)
        elif state.step >= self.first_step + 10:
            rate = (state.tokens - self.warm[1]) / (time.time() - self.warm[0])
            left = max(self.clock.seconds - self.clock.elapsed(), 0.0)
            self.out.say(f"measured {rate:,.0f} tokens/s: the budget should buy "
                         f"~{state.tokens + rate * left:,.0f} tokens in all")
            self.estimated = True

    def log_step(self, state, p, step, lr, batch_tokens):
        """A 'train' record in log.jsonl and the bar's text. step: train_step's result (its
        grad_norm is read here, so only logged steps wait for the device for it)."""
        (then, tokens, flops), now = self.last, time.time()
        self.last, seconds = (now, state.tokens, state.flops), max(now - then, 1e-9)
        tok_s, flop_s = (state.tokens - tokens) / seconds, (state.flops - flops) / seconds
        grad_norm = step["grad_norm"].item() if step["grad_norm"] is not None else None
        record = {"kind": "train", "step": state.step, "tokens": state.tokens,
                  "elapsed": round(self.clock.elapsed(), 3),
                  # rounded down: a step begun 4 µs before the deadline must not read as past it
                  "progress": math.floor(p * 1e5) / 1e5,
                  "loss": step["loss"], "lr": lr, "batch_tokens": batch_tokens,
                  "flops": state.flops, "tokens_per_s": round(tok_s), "grad_norm": grad_norm}
        # MFU: model FLOPs per second over the peak (Chowdhery et al. 2022, App. B)
        if self.hw.peak:
            record["mfu"] = round(flop_s / (self.hw.peak * self.hw.world), 4)
        self.out.log(record)
        left = self.clock.left(state.step, state.tokens, self.clock.elapsed())
        self.bar.set_postfix_str(f"loss {step['loss']:.3f}, lr {lr:.2e}, {tok_s:,.0f} tokens/s, "
                                 f"{left} left")

    def close(self):
        self.bar.close()


def save_checkpoint(net, optimizer, loader, state, *, average, clock, out,
                    then="training goes on"):
    """Save the run with rank 0's state; True if it was saved. Every rank calls it: under FSDP
    every rank writes its shards. A full disk costs this checkpoint, not the run: the previous
    one stays whole (each is written beside it and renamed over it), a warning says so and what
    happens `then`, and training goes on, since stopping would lose the steps since the last
    checkpoint just the same."""
    state.elapsed = clock.elapsed()
    if out.rank == 0:  # resume cuts log.jsonl back to this size
        state.log_bytes = os.path.getsize(out.log_path) if os.path.exists(out.log_path) else 0
    try:
        checkpoint.save(out.ckpt_path, net, optimizer, loader, asdict(state), out.rank,
                        average=ema.state_dict(average))
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        out.say(f"warning: {out.ckpt_path}: no space left on device at step {state.step}: this "
                f"checkpoint is not saved, the previous one is intact; {then}")
        return False
    return True


def save_final(net, meta, out):
    """OUT/final: model.py's folder with the tokenizer, the data's meta.json and the run's
    args.json beside the weights, so the folder says how it was trained wherever it is copied
    (evaluate_glue.py fine-tunes with the optimizer args.json names). A full disk here is one
    line: the checkpoint saved just before holds the weights."""
    extra = {"tokenizer.json": meta["tokenizer"],
             "meta.json": os.path.join(meta["dir"], "meta.json"),
             "args.json": os.path.join(out.folder, "args.json")}
    folder = os.path.join(out.folder, "final")
    with one_line_if_the_disk_is_full(folder, f"the trained weights are in {out.ckpt_path}: free "
                                      f"some space, then `python train.py --resume --out "
                                      f"{out.folder}` writes final/ from it"):
        return checkpoint.save_final(folder, net, out.rank, extra)


@contextlib.contextmanager
def one_line_if_the_disk_is_full(path, kept):
    """A full disk (ENOSPC) writing path ends the run with one line that says what is kept."""
    try:
        yield
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        raise SystemExit(f"error: {path}: no space left on device; {kept}") from None


def stop_diverged(net, optimizer, state, args, meta, out):
    """--max-bad-steps non-finite losses in a row: the weights in memory may hold NaN, so final/
    gets the last good checkpoint's (its average, as the run scored it), and the run exits with
    status 1."""
    out.say(f"error: {args.max_bad_steps} non-finite losses in a row at step {state.step}")
    if os.path.exists(out.ckpt_path):
        good = checkpoint.load(out.ckpt_path)
        save_final(checkpoint.restored_model(good, net, optimizer), meta, out)
        out.say(f"restored the last good checkpoint (step {good['state']['step']}) into "
                f"{out.folder}/final; lower --lr or raise --clip, then --resume")
    raise SystemExit(1)


def finish(net, loader, state, status, *, args, hw, held_out, meta, enc, out):
    """The budget is spent (the checkpoint is saved): one last evaluation, final/ for
    evaluate_glue.py and evaluate_lm.py, loss.png and summary.json (also printed). Every rank
    calls it: under FSDP each takes part in gathering the weights."""
    losses = held_out.evaluate(net)
    summary = run_summary(state, status, losses["val_loss"], model.unwrap(net).config,
                          args=args, hw=hw, meta=meta)
    if "val_loss_by_source" in losses:  # a mixture: each source's loss, and how often it was read
        summary.update(val_loss_by_source=losses["val_loss_by_source"],
                       epochs_by_source=loader.epochs())
    if hw.peak:  # as Progress.log_step's
        summary["mfu"] = round(state.flops / max(state.elapsed, 1e-9) / (hw.peak * hw.world), 4)
    log_eval(out, state, 1.0, losses, elapsed=state.elapsed)
    summary["final"] = save_final(net, meta, out)
    sample = samples(net, enc, args, hw.rank)
    if out.lost:
        summary["log_records_lost"] = out.lost
    if hw.rank == 0:
        summary["plot"] = plot_losses(out)
        print(sample)
        print(summary_text(summary))
        path = os.path.join(args.out, "summary.json")
        with one_line_if_the_disk_is_full(path, f"the summary is printed above, final/ and "
                                          f"{out.ckpt_path} are whole: free some space, then "
                                          f"`python train.py --resume --out {out.folder}` "
                                          "writes it"):
            files.atomic_write(path, lambda f: f.write(json.dumps(summary, indent=2).encode()))
    return summary


def plot_losses(out):
    """OUT/loss.png (scaling.plot_losses), or None: a full disk costs the plot and a warning."""
    path = os.path.join(out.folder, "loss.png")
    try:
        return scaling.plot_losses(out.log_path, path)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        out.say(f"warning: {path}: no space left on device; the plot is not saved")
        return None


def run_summary(state, status, val, cfg, *, args, hw, meta):
    """summary.json's numbers: what was trained (cfg: the final shape), how long, how fast, and the
    final held-out loss."""
    seconds = max(state.elapsed, 1e-9)
    return {"status": status, "steps": state.step, "tokens": state.tokens, "model": args.model,
            "batch_tokens": args.batch_tokens, "elapsed_s": round(state.elapsed, 2),
            "flops": state.flops, "tokens_per_s": round(state.tokens / seconds),
            "final_val_loss": val, "params": model.count_params(cfg, embeddings=False),
            "params_total": model.count_params(cfg),
            "flops_per_token": model.flops_per_token(cfg), "skipped_steps": state.skipped_steps,
            "world_size": hw.world, "device": str(hw.device),
            "dtype": str(hw.dtype).replace("torch.", ""), "out": args.out,
            # what the held-out loss depends on besides N and D: scaling.py fits only runs that
            # agree
            "comparable": {"data": os.path.basename(meta["dir"]),
                           "vocab_size": cfg["vocab_size"], "objective": args.objective,
                           "seq_len": cfg["max_seq_len"], "mask_rate": eval_mask_rate(args)}}


def summary_text(summary):
    """The printed summary: 'key: value' lines, floats to 4 significant digits (the JSON keeps
    all)."""
    def shown(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {shown(x)}" for k, x in v.items()) + "}"
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    width = max(map(len, summary))
    return "\n".join(f"{k:>{width}}: {shown(v)}" for k, v in summary.items())


# -----------------------------------------------------------------------------
# The command line: flags.py defines and checks every flag

def main(argv=None):
    args = flags.parse_args(argv)
    # --resume: the saved settings, so the run continues the same model, data and schedule
    args, budget_was = flags.resume_settings(args) if args.resume else (args, None)
    try:
        result = train(args, budget_was)
        # leave together: a rank tearing down gloo while rank 0 still saves aborts the run
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        return result
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
