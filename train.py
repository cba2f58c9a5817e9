"""train.py: the best model a wall-clock budget allows (cramming), on one CPU, one GPU or many.

    python train.py --data sample --minutes 2                    # offline, the bundled Shakespeare
    python train.py --hours 24                                   # FineWeb-Edu, crammed BERT, 1 GPU
    torchrun --nproc_per_node=8 train.py --hours 3               # data parallel on 8 GPUs (DDP)
    torchrun --nproc_per_node=8 train.py --hours 3 --shard fsdp  # weights and AdamW sharded (FSDP2)
    python train.py --resume --out runs/cram                     # continue a stopped run

How to read it: train() is the loop and forward_backward() the step; the helpers follow in the order
the loop calls them, and the command line comes last. Everything that changes during a run is a
function of progress p = elapsed / budget in [0, 1] (Geiping & Goldstein 2022, Sec. 3): the learning
rate (the budget triangle: 25% of the peak rising to the peak at p = 0.75, then linearly to 0), the
batch-size ramp (the target batch at p = 0.6), the growth stages (grow.py) and when the run stops. A
step or token budget (--max-steps, --max-tokens) gives the same schedules on a deterministic clock,
which the tests use. The clock starts once the data is prepared, the model built and its step-0 loss
measured (as cramming's timer starts after loading); from then on it counts everything: compilation,
evaluations, growth and checkpoints.

Other files do the rest: flags.py reads the command line, planning.py chooses the defaults, data.py
prepares the corpus, loader.py serves batches, model.py is the network, parallel.py the ranks, and
checkpoint.py saves and resumes.
Output in --out: log.jsonl (one line per logged step, evaluation and growth), checkpoint.pt (or the
folder checkpoint.dcp/ under FSDP), final/ (model.py's folder with tokenizer.json and meta.json),
loss.png and summary.json (also printed).
"""
import argparse
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
import flags
import grow
import model
import parallel
import planning
import scaling
import tokenizer
from loader import make_loader  # a function: train.py calls its Loader `loader`

# -----------------------------------------------------------------------------
# The run: set-up, the loop, the finish


def train(args, budget_was=None):
    """One run; each pass of the loop is one optimizer step. budget_was: the budget a resumed run
    had before this command extended it (None: not extended)."""
    # ---- set up: device and ranks, the settings, data, model and optimizer, then the clock
    device, rank, world = parallel.setup_device(args.device, args.shard)
    args, ckpt, init = resolve_settings(args, device, rank, world)
    run = start_run(args, ckpt, (device, rank, world), budget_was)
    net, optimizer, loader, state = build(run, ckpt, init)
    start_clock(run, state, net, ckpt is not None, budget_was)
    describe_run(run, net)
    amp = parallel.autocast(device, run.dtype)  # bf16 where the hardware has it, off in fp32
    handlers = budget.catch_stop_signals(run.clock)  # preemption and Ctrl-C only set a flag
    bar = progress_bar(rank)
    speed, last_ckpt, clock = Speed(state, ckpt is not None), state.elapsed, run.clock
    while True:
        # ---- stop: the budget is spent or a signal came, by the clock all ranks agree on
        state.elapsed, stop = parallel.agree_on_clock(clock.elapsed(), clock.signals, device, world)
        p = clock.progress(state.step, state.tokens, state.elapsed)
        if p >= 1.0 or stop:
            status = "budget spent" if p >= 1.0 else "preempted"
            break
        # ---- grow: the next stage starts at its budget fraction, or when the loss flattens
        if state.stage + 1 < len(run.stages):
            if args.grow_when == "auto" and p >= state.next_check:
                check_growth(run, state, net, p)
            due, why = growth_due(run, state, p)
            if due:
                net, optimizer = grow_now(run, state, (net, optimizer), p, why)
        # ---- set the learning rate: a function of progress only (cramming's budget schedules)
        lr = learning_rate(args, state, p)
        for group in optimizer.param_groups:
            group["lr"] = lr
        # ---- forward and backward over the step's micro-batches, cut at the deadline
        T, B = model.unwrap(net).config["max_seq_len"], state.micro_batch  # the stage's length
        target = target_accumulation(args.batch_tokens, B * T * world)
        accum = accumulation_steps(p, target, args.batch_ramp)
        too_late = functools.partial(budget.ends_past_deadline, clock, state, device, world)
        position = loader.state_dict()  # where a retry of this step starts reading
        try:
            loss_sum, done = forward_backward(net, loader, accum, (B, T), amp, too_late)
        except RuntimeError as error:  # out of memory: halve the micro-batch, retry the step
            back_off(run, state, (net, optimizer, loader, position), error)  # or re-raise
            continue
        loss_sum = parallel.mean_over_ranks(loss_sum, world)  # one loss: one decision on all ranks
        # clip the global norm (cramming: 0.5); queued before .item(), the step's one device wait
        grad_norm = parallel.clip_gradients(net, args.clip)
        loss = loss_sum.item() / done
        # ---- skip a non-finite step: one inf or NaN in AdamW's moments would stay there for good
        if not math.isfinite(loss):
            if skip_step(run, state, optimizer, loss) >= args.max_bad_steps:
                status = "diverged"
                break
            continue  # the data position moved on: the next step sees other batches
        # ---- update the weights and count what the step consumed
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        batch_tokens = done * B * T * world
        state.count_step(batch_tokens, model.flops_per_token(model.unwrap(net).config))
        bar.update(round(100 * p, 1) - bar.n)  # the bar counts % of the budget
        # ---- log, and once the estimate of what the whole budget buys
        speed.estimate(run, state)
        if state.step % args.log_every == 0:
            log_step(run, state, speed, bar, {"progress": p, "loss": loss, "lr": lr,
                                              "batch_tokens": batch_tokens, "grad_norm": grad_norm})
        # ---- checkpoint every --checkpoint-minutes (and --checkpoint-steps), before an evaluation
        # that might die (nanochat's lesson)
        if checkpoint_due(args, state, last_ckpt):
            last_ckpt = state.elapsed
            save_checkpoint(run, state, net, optimizer, loader)
        # ---- evaluate on held-out data (the batches the budget has time for), and a sample
        if p >= state.next_eval:
            state.next_eval += args.eval_every
            losses = evaluate(run, net, within_budget=True)
            if losses:
                log_eval(run, state, p, losses)
                run.say(f"{p:4.0%} held-out loss {val_text(losses)}; {samples(run, net)}")
    bar.close()
    budget.restore_signal_handlers(handlers)
    return finish(run, state, net, optimizer, loader, status)


def forward_backward(net, loader, accum, shape, amp, too_late):
    """One optimizer step's gradients, summed over up to accum micro-batches of shape (B, T) =
    (sequences, tokens), reduced across ranks on the last only. Returns (the summed loss, a tensor
    on the device: no wait for it here; the micro-batches done).

    The hard budget: before every micro-batch after the first, too_late(seconds the last one
    took) says whether one more would end past the deadline (or a stop signal came): then it is
    the step's last. A run ends at most one micro-batch late even when a step takes minutes."""
    B, T = shape
    loss_sum, done, seconds = 0.0, 0, 0.0
    for micro in range(accum):
        last = micro == accum - 1 or (micro > 0 and too_late(seconds))
        started = time.time()
        batch = loader.next_batch(B, T)  # input_ids (B, T); MLM: labels and label_positions (B, k)
        with parallel.gradient_sync(net, last), amp():
            loss = net(**batch)["loss"]  # MLM: cross-entropy on the masked positions only (sparse)
            (loss / accum).backward()    # gradients add up: the step's mean over its micro-batches
        loss_sum = loss_sum + loss.detach().float()
        done += 1
        seconds = time.time() - started
        if last:
            break
    # a step cut short at the deadline divided each micro-batch's loss by accum, not by done:
    # rescale its gradients to the mean over the micro-batches it has
    if done < accum:
        for param in net.parameters():
            if param.grad is not None:
                param.grad.mul_(accum / done)
    return loss_sum, done


# -----------------------------------------------------------------------------
# Schedules: pure functions of budget progress p in [0, 1]

def lr_multiplier(p, schedule="triangle", warmup=0.06):
    """Learning rate as a fraction of the peak at progress p."""
    if schedule == "triangle":      # cramming's budget-triangle2: min(0.25 + p, 4 (1 - p))
        return max(0.0, min(0.25 + p, 4.0 * (1.0 - p)))
    if schedule == "one-cycle":     # Smith & Topin 2019: up to the peak at p = 0.5, then down
        return max(0.0, 1.0 - abs(2.0 * p - 1.0))
    if warmup > 0 and p < warmup:   # linear and cosine warm up linearly from 0
        return p / warmup
    if schedule == "constant":
        return 1.0
    q = (p - warmup) / (1.0 - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - q)
    return 0.5 * (1.0 + math.cos(math.pi * min(q, 1.0)))  # cosine (Loshchilov & Hutter 2017)


def learning_rate(args, state, p):
    """The peak rate times the schedule at progress p, re-warmed after growth with --grow-rewarm."""
    lr = args.lr * lr_multiplier(p, args.schedule, args.warmup)
    if state.stage > 0 and args.grow_rewarm > 0:
        lr *= grow.rewarm_factor(p, state.stage_at, args.grow_rewarm)
    return lr


def accumulation_steps(p, target, ramp=0.6):
    """Micro-batches per optimizer step: from 1 up to target, linearly over the first `ramp` of the
    budget (cramming's batch_size_ramp 0.6 in train/bert-o4.yaml)."""
    # Early steps are small and many, when the loss falls fastest. The ramp goes through
    # the number of micro-batches, so every forward keeps one static shape (no
    # recompilation under torch.compile)
    if ramp <= 0 or p >= ramp:
        return target
    return max(1, min(target, int(p / ramp * target) + 1))


def target_accumulation(batch_tokens, micro_tokens):
    """Micro-batches per step that make --batch-tokens from micro-batches of micro_tokens (all
    ranks): a growth stage with shorter sequences, or a micro-batch halved after running out of
    memory, accumulates more of them, so every optimizer step sees the same number of tokens."""
    return max(1, round(batch_tokens / micro_tokens))


# -----------------------------------------------------------------------------
# The step's helpers: running out of memory, the progress bar, a skipped step, checkpoint times

def back_off(run, state, parts, error):
    """Out of memory in a step (CUDA's or MPS's): free what the step held, halve the micro-batch
    (the accumulation doubles, so the global batch stays), rewind the loader to the step's start,
    log it, and let the loop retry the same step: the run goes on as if it had started with the
    smaller micro-batch. Any other error is raised again. parts: (net, optimizer, loader, the
    loader's position at the step's start)."""
    net, optimizer, loader, position = parts
    if not parallel.is_out_of_memory(error):
        raise error
    optimizer.zero_grad(set_to_none=True)  # the half-accumulated gradients of the failed step
    parallel.free_memory(run.device)
    B, cfg = state.micro_batch, model.unwrap(net).config
    # One sequence that does not fit has nothing left to halve. Several ranks would have to agree
    # on the retry inside their collectives: there the error ends the run too
    if B == 1 or run.world > 1:
        need = parallel.memory_per_rank(cfg, run.world, run.args.shard)["total"]
        raise SystemExit(f"error: out of memory at micro-batch {B} on {run.device}: the model has "
                         f"{model.count_params(cfg) / 1e6:.1f} M parameters, which need "
                         f"{need / 1e9:.2f} GB per rank for weights, gradients and AdamW before "
                         "any activation; try --checkpoint-activations, --shard fsdp, --dtype "
                         "bf16 or a smaller --model") from None
    state.micro_batch = B // 2
    loader.load_state_dict(position)
    run.log({"kind": "back_off", "step": state.step, "micro_batch": state.micro_batch,
             "error": str(error).splitlines()[0][:200]})
    run.say(f"out of memory at step {state.step + 1}: micro-batch {B} -> {state.micro_batch} "
            "sequences, twice the accumulation: the same global batch; retrying the step")


def progress_bar(rank):
    """The bar counts % of the budget (whichever budget ends first), on rank 0 only."""
    return tqdm(total=100, disable=rank != 0, unit="%", desc="budget", dynamic_ncols=True,
                bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}{postfix}]")


def skip_step(run, state, optimizer, loss):
    """Drop a non-finite step's gradients, log it, and return the non-finite steps in a row."""
    optimizer.zero_grad(set_to_none=True)
    state.bad_steps, state.skipped_steps = state.bad_steps + 1, state.skipped_steps + 1
    run.log({"kind": "skip", "step": state.step, "loss": loss})
    return state.bad_steps


def checkpoint_due(args, state, last_ckpt):
    """Every --checkpoint-minutes on the agreed clock, and every --checkpoint-steps if set."""
    by_steps = args.checkpoint_steps and state.step % args.checkpoint_steps == 0
    return bool(by_steps) or state.elapsed - last_ckpt > args.checkpoint_minutes * 60


# -----------------------------------------------------------------------------
# Set-up, in the order train() calls it

@dataclass
class RunState:
    """Everything the loop changes. A checkpoint saves it; a resumed run continues
    from these values."""
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


@dataclass
class Run:
    """What the loop reads: the settings, the hardware, the data, the growth stages, the
    files and the clock. start_run makes it once; after that only the clock runs and
    evaluate fills held_out."""
    args: argparse.Namespace      # the flags with the defaults planning.py chose
    device: torch.device
    dtype: torch.dtype            # autocast dtype: bf16 where the hardware has it, else fp32
    rank: int
    world: int
    meta: dict                    # data.prepare_data's description of the token shards
    enc: object                   # the tokenizer, only to show samples
    cfg: dict                     # the model config the run trains toward (the last growth stage's)
    stages: list                  # grow.parse_schedule's stages ([] without growth)
    clock: budget.Budget          # the budget's clock; start_clock starts it
    peak: float = None            # this GPU's peak FLOP/s, or None (no MFU)
    held_out: dict = field(default_factory=dict)  # evaluate's: {seq length: {source: batches}}
    eval_seconds: float = None    # evaluate's: seconds per held-out batch, the last measured

    @property
    def log_path(self):
        return os.path.join(self.args.out, "log.jsonl")

    @property
    def ckpt_path(self):
        return checkpoint.path_in(self.args.out, self.args.shard)

    def say(self, *text):
        """Print on rank 0 only, through tqdm so that a line never breaks the progress bar."""
        if self.rank == 0:
            tqdm.write(" ".join(map(str, text)))

    def log(self, record):
        if self.rank == 0:
            checkpoint.append_log(self.log_path, record)


def resolve_settings(args, device, rank, world):
    """(the settings, the checkpoint to resume or None, --init-from's weights or None): the flags
    with the defaults chosen for this machine and budget, checked before any work (shape, growth
    schedule, masking at every length)."""
    init = None
    if args.init_from:
        init = checkpoint.load_init(args.init_from)  # read once: build() loads its weights
        args = flags.settings_from_init(args, init)
    try:
        chosen, why = planning.choose_defaults(args, planning.sustained_flops(device), world,
                                               device.type == "cuda")
    except ValueError as e:  # a shape that makes no valid model, e.g. an odd head size with rotary
        raise SystemExit(f"error: {flags.config_error_in_flags(e)}") from None
    if args.grow == "auto":  # shorthand: compound's stages, grown when the loss says so
        chosen.update(grow="compound", grow_when="auto")
    # a new Namespace: the parsed flags stay as given; args.json saves these, so
    # --resume reuses them
    args = argparse.Namespace(**{**vars(args), **chosen})
    if why and rank == 0:
        print(f"defaults: {why} (flags given on the command line always win)")
    ckpt = checkpoint.load(checkpoint.path_in(args.out, args.shard)) if args.resume else None
    stages = growth_stages(args, planning.model_config(args, args.vocab_size))  # fails before work
    lengths = {args.max_seq_len, *(s["config"]["max_seq_len"] for s in stages)}
    for T in lengths if args.objective == "mlm" else ():
        if not 1 <= round(args.mask_rate * T) <= T - 2:
            raise SystemExit(f"error: --mask-rate {args.mask_rate} masks "
                             f"{round(args.mask_rate * T)} of {T} tokens per sequence; it must "
                             f"mask 1 to {T - 2}")
    if ckpt is None:
        checkpoint.check_out_is_free(args.out, args.force, remove=rank == 0)
    return args, ckpt, init


def growth_stages(args, cfg):
    """grow.parse_schedule of --grow toward cfg ([] without growth), as a one-line
    error if invalid."""
    try:
        return grow.parse_schedule(args.grow, cfg) if args.grow else []
    except ValueError as e:
        raise SystemExit(f"error: --grow: {e}") from None


def start_run(args, ckpt, ranks, budget_was):
    """Prepare the data, write args.json (the first file written: every check has passed) and return
    the Run. ranks: (device, rank, world)."""
    device, rank, world = ranks
    meta = prepare_interruptible(args, device, rank, world)
    cfg = planning.model_config(args, meta["n_vocab"])
    if args.init_from and cfg["vocab_size"] != meta["n_vocab"]:  # another tokenizer was given
        raise SystemExit(f"error: --tokenizer {args.tokenizer} has {meta['n_vocab']} tokens; the "
                         f"weights of --init-from {args.init_from} have {cfg['vocab_size']}")
    stages = growth_stages(args, cfg)
    run = Run(args, device, parallel.autocast_dtype(args.dtype, device), rank, world, meta,
              tokenizer.load_tokenizer(meta["tokenizer"]), cfg, stages, budget.Budget(args),
              planning.gpu_peak_flops(device))
    if stages and any(stages[-1]["config"][k] != cfg[k] for k in grow.GROWN_KEYS):
        run.say(f"--grow: the schedule ends at {grow.describe(stages[-1]['config'])}, not the "
                f"model's {grow.describe(cfg)}; the run trains toward the schedule's last stage")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        if ckpt is None or budget_was:  # a resume saves its extended budget
            model.atomic_write(os.path.join(args.out, "args.json"),
                               lambda f: f.write(json.dumps(vars(args), indent=2).encode()))
        if ckpt is not None:
            checkpoint.truncate_log(run.log_path, ckpt["state"]["log_bytes"])
    return run


def prepare_interruptible(args, device, rank, world):
    """prepare() where SIGTERM exits at once with one line: data.py's temporary
    folder is removed."""
    message = ("error: stopped by a signal during data preparation; nothing was written (the cache "
               "keeps only finished entries)")
    with data.exit_cleanly_on_sigterm(args.cache, message):
        return prepare(args, device, rank, world)


def prepare(args, device, rank, world):
    """Rank 0 prepares (downloads, cleans, tokenizes); the others wait, then read the same cache."""
    tokens = planning.budget_tokens(args, device) if data.downloads(args.data) else None
    settings = {"vocab_size": args.vocab_size, "tokenizer": args.tokenizer,
                "lowercase": args.lowercase, "strip_accents": args.lowercase,
                "fineweb_shards": args.fineweb_shards, "max_tokens": tokens,
                "mix_temperature": args.mix_temperature}  # data.DEFAULTS for the rest
    meta = None
    # One process downloads and tokenizes, so ranks never race on the cache; the others then find
    # the finished entry under the same settings key and only read its meta.json
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


def build(run, ckpt, init=None):
    """(net, optimizer, loader, state): fresh from the seed (at the first growth stage), as
    saved (ckpt), or from --init-from's weights (init) with a fresh optimizer."""
    args = run.args
    torch.manual_seed(args.seed)  # the same weights on every rank: FSDP keeps each rank's slice
    first = ckpt["config"] if ckpt else run.stages[0]["config"] if run.stages else run.cfg
    net = model.build_model(first).to(run.device)
    # The order matters: weights go in before wrapping (DDP broadcasts them, FSDP keeps a slice),
    # and the optimizer is made after (under FSDP its moments are shaped like the shards)
    if ckpt:
        checkpoint.load_weights(net, ckpt)
    elif init:  # a new run from old weights: new optimizer, new budget, new data order
        net.load_state_dict(init["weights"])
        run.say(f"starting from the weights of {args.init_from}")
    net = parallel.wrap(net.train(), args, run.device, run.world)
    optimizer = make_optimizer(model.unwrap(net), args, run.device)
    settings = {"objective": args.objective, "seed": args.seed, "rank": run.rank,
                "world_size": run.world, "mask_rate": args.mask_rate}
    loader = make_loader(run.meta, "train", settings, device=run.device)
    state = RunState(next_eval=args.eval_every, next_check=args.grow_check_every)
    if ckpt:
        state = RunState(**checkpoint.restore(ckpt, net, optimizer, loader))
        run.say(f"resuming {run.ckpt_path} at step {state.step}, {state.tokens:,} tokens, "
                f"{state.elapsed:.0f} s used")
    # a run that backed off after running out of memory resumes at the micro-batch it settled on
    state.micro_batch = state.micro_batch or args.micro_batch
    return net, optimizer, loader, state


def make_optimizer(net, args, device):
    """AdamW (decoupled weight decay, Loshchilov & Hutter 2019) as cramming's bert-o4 sets it: lr
    1e-3 at width 768, betas (0.9, 0.98), eps 1e-12, weight decay 0.01."""
    params = [p for p in net.parameters() if p.requires_grad]
    # no decay on norms, biases and scalars (cramming's limited_decay_keys; here: tensors under 2-D)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # on a GPU the fused kernel updates all parameters in one launch instead of several per tensor
    return torch.optim.AdamW(groups, lr=args.lr, betas=tuple(args.betas), eps=args.eps,
                             fused=device.type == "cuda")


def start_clock(run, state, net, resumed, budget_was):
    """The step-0 evaluation (off the clock: where the curve starts, about ln V nats), then the
    clock starts (a resumed run's continues from its saved time). A resumed run checks that
    budget is left."""
    args, clock = run.args, run.clock
    if not resumed:
        losses = evaluate(run, net)
        log_eval(run, state, 0.0, losses, elapsed=0.0)
        run.say(f"held-out loss before training: {val_text(losses)}")
    clock.start_clock(state.elapsed)
    if not resumed:
        return
    p = clock.progress(state.step, state.tokens, state.elapsed)
    if p >= 1.0:
        raise SystemExit(f"error: {run.ckpt_path} has spent its budget "
                         f"({clock.left(state.step, state.tokens, state.elapsed)} left); give a "
                         "larger one with --resume to extend the run")
    if budget_was:  # extended: the schedules read progress, which just went down
        state.next_eval = (math.floor(p / args.eval_every) + 1) * args.eval_every
        run.say(f"resume: budget {budget_was} -> {flags.budget_text(args)}; progress is now "
                f"{p:.1%}, so the learning rate, batch ramp and growth stages continue from there "
                "(docs/train.md: extending a run)")


def describe_run(run, net):
    """The start-up lines: the model, the device, parameters and FLOPs, the batch, the memory."""
    args, now = run.args, model.unwrap(net).config
    flops_tok = model.flops_per_token(now)
    growing = f"; growing to {model.count_params(run.cfg) / 1e6:.1f} M in {len(run.stages) - 1} " \
        "stage(s)" if run.stages else ""
    run.say(json.dumps({"model": now}, indent=None))
    dtype, n, n_body = str(run.dtype).replace("torch.", ""), model.count_params(now), \
        model.count_params(now, False)
    run.say(f"device {run.device} ({dtype}), {run.world} process(es); {n / 1e6:.1f} M parameters "
            f"({n_body / 1e6:.1f} M without embeddings), {flops_tok / 1e6:.0f} MFLOP per token"
            f"{growing}")
    B, T = args.micro_batch, args.max_seq_len
    accum = target_accumulation(args.batch_tokens, B * T * run.world)
    run.say(f"global batch {accum * B * T * run.world:,} tokens = {B} sequences x {T} tokens x "
            f"{run.world} rank(s) x {accum} accumulation steps (ramped over {args.batch_ramp:.0%} "
            "of the budget)")
    if run.peak and run.clock.seconds:
        tokens = run.clock.seconds * run.peak * planning.scaling.PLANNING_MFU / flops_tok
        run.say(f"the budget should buy ~{tokens / 1e9:.2f} B tokens at "
                f"{planning.scaling.PLANNING_MFU:.0%} MFU (peak {run.peak / 1e12:.0f} TFLOP/s)")
    run.say(parallel.memory_text(now, run.world, args.shard, args.checkpoint_activations))
    if args.shard == "fsdp":  # a collective: every rank reports what it holds
        run.say(f"parameter bytes held by each rank after fully_shard: "
                f"{parallel.bytes_per_rank(net, run.world)}")

# -----------------------------------------------------------------------------
# Growth: when the next stage is due, and growing to it

def check_growth(run, state, net, p):
    """--grow-when auto: one held-out point on this stage's curve, every --grow-check-every."""
    every = run.args.grow_check_every
    state.next_check = (math.floor(p / every) + 1) * every
    losses = evaluate(run, net)
    state.auto_points.append([state.flops, losses["val_loss"]])
    log_eval(run, state, p, losses, growth_check=True)


def growth_due(run, state, p):
    """(due?, why): the next stage starts at its budget fraction, or (--grow-when auto) when
    grow.auto_should_grow sees this stage's held-out loss flatten."""
    args = run.args
    if args.grow_when != "auto":
        return p >= run.stages[state.stage + 1]["at"], "fraction"
    return grow.auto_should_grow(state.auto_points, p, state.stage + 1, len(run.stages),
                                 args.grow_slope)


def grow_now(run, state, trained, p, why):
    """Grow the model and optimizer (trained: the pair) to the next stage (grow.apply_stage), and
    log the event with the held-out loss just before and just after. Returns (net, optimizer)."""
    (net, optimizer), args = trained, run.args
    state.stage += 1
    # The loss just before and after shows what the operator cost: a function-preserving one
    # (Net2Net, bert2BERT) changes it by float noise only, while a sequence-length step also
    # changes the task
    loss_before = evaluate(run, net)["val_loss"]
    plain, optimizer, event = grow.apply_stage(
        model.unwrap(net), optimizer, run.stages[state.stage],
        lambda m: make_optimizer(m, args, run.device),
        {"noise": args.grow_noise, "seed": args.seed, "policy": args.grow_optimizer,
         "new_moments": args.grow_moments})
    # compile and DDP must see the new shapes: wrap the grown model again
    net = parallel.wrap(plain.to(run.device).train(), args, run.device, run.world)
    loss_after = evaluate(run, net)["val_loss"]
    state.stage_at, state.auto_points = p, [[state.flops, loss_after]]  # the new stage's curve
    event = {"kind": "grow", "step": state.step, "tokens": state.tokens, "elapsed": state.elapsed,
             "progress": p, **event, "val_loss_before": loss_before, "val_loss_after": loss_after,
             "reason": why}
    run.log(event)
    run.say(f"grow at {p:.1%}: {event}")
    return net, optimizer


# -----------------------------------------------------------------------------
# Evaluation: held-out loss, and a sample of what the model does

@torch.no_grad()
def evaluate(run, net, within_budget=False):
    """{"val_loss": the mean held-out loss} over the same --eval-batches batches every time, at
    the model's sequence length, averaged over ranks. A corpus mixture evaluates each source's
    own val split; val_loss is then their mean weighted by the mixture, and
    "val_loss_by_source" has each. within_budget: stop before a batch that would end past the
    wall-clock deadline ("eval_batches" then says how many ran; None if not one fits)."""
    plain, args = model.unwrap(net), run.args
    T = plain.config["max_seq_len"]
    names = [s["name"] for s in run.meta.get("sources", [])] or [None]  # None: the one corpus
    if T not in run.held_out:
        run.held_out[T] = {name: held_out_batches(run, name, T) for name in names}
    was_training = plain.training
    plain.eval()  # no dropout; eager and outside DDP (under FSDP: the sharded module itself)
    total = torch.zeros(len(names), device=run.device)
    amp, started, n = parallel.autocast(run.device, run.dtype), time.time(), args.eval_batches
    for j in range(args.eval_batches):  # batch j of every source, so a cut keeps them even
        if within_budget and not eval_batch_fits(run, (time.time() - started) / max(j, 1)):
            n = j
            break
        for i, name in enumerate(names):
            with amp():
                total[i] += plain(**run.held_out[T][name][j])["loss"].float()
    plain.train(was_training)
    run.eval_seconds = (time.time() - started) / max(n, 1)  # per batch: the next cut's estimate
    if n == 0:
        return None
    # each rank evaluated its own slice of the held-out batches: the mean over all of them
    total = parallel.sum_over_ranks(total, run.world)
    losses = [t / (n * run.world) for t in total.tolist()]
    cut = {"eval_batches": n} if n < args.eval_batches else {}
    if names == [None]:
        return {"val_loss": losses[0], **cut}
    weighted = sum(s["weight"] * loss for s, loss in zip(run.meta["sources"], losses))
    return {"val_loss": weighted, "val_loss_by_source": dict(zip(names, losses)), **cut}


def eval_batch_fits(run, seconds):
    """Would one more held-out batch (seconds: as long as this evaluation's so far, or the last
    evaluation's) end before the wall-clock deadline, on the slowest rank's clock? An evaluation
    counts against the budget like everything after the start, so a slow one on a busy machine
    is cut to the batches that fit rather than end the run late."""
    if not run.clock.seconds:  # a step or token budget: evaluations cost none of it
        return True
    seconds = max(seconds, run.eval_seconds or 0.0)
    elapsed, _ = parallel.agree_on_clock(run.clock.elapsed() + seconds, [], run.device, run.world)
    return elapsed <= run.clock.seconds


def held_out_batches(run, source, T):
    """--eval-batches batches of the val split read in order with a fixed seed: the same masks every
    time and in every run, so curves compare."""
    args = run.args
    settings = {"objective": args.objective, "seed": 1234, "rank": run.rank,
                "world_size": run.world, "mask_rate": args.mask_rate}
    loader = make_loader(run.meta, "val", settings, device=run.device, prefetch=False,
                         source=source)
    return [loader.next_batch(args.micro_batch, T) for _ in range(args.eval_batches)]


def val_text(losses):
    """'3.410', or for a mixture '3.410 (plays 3.302, sonnets 3.671)': the progress line's loss."""
    by_source = losses.get("val_loss_by_source", {})
    each = ", ".join(f"{name} {loss:.3f}" for name, loss in by_source.items())
    return f"{losses['val_loss']:.3f} ({each})" if each else f"{losses['val_loss']:.3f}"


def log_eval(run, state, p, losses, elapsed=None, **extra):
    """An 'eval' record in log.jsonl; elapsed defaults to the clock now (the step-0 evaluation runs
    before the clock starts, the final one after it stopped)."""
    elapsed = run.clock.elapsed() if elapsed is None else elapsed
    run.log({"kind": "eval", "step": state.step, "tokens": state.tokens, "flops": state.flops,
             "elapsed": round(elapsed, 3), "progress": round(p, 5), **losses, **extra})


SAMPLE_TEXT = {"mlm": "To be, or not to [MASK], that is the question. I [MASK] you, my lord.",
               "clm": "To be, or not to be, that is"}


def samples(run, net):
    """model.sample_line for --sample-text on rank 0, '' on the others. Under FSDP every rank runs
    the forward passes, with the root's tensors all-gathered for the whole call."""
    plain, args = model.unwrap(net), run.args
    text = args.sample_text or SAMPLE_TEXT[args.objective]
    text = text.lower() if args.lowercase else text  # as the corpus was cleaned
    if args.shard != "fsdp":
        return model.sample_line(plain, run.enc, text, args.objective) if run.rank == 0 else ""
    plain.unshard()
    try:
        line = model.sample_line(plain, run.enc, text, args.objective)
    finally:
        plain.reshard()
    return line if run.rank == 0 else ""


# -----------------------------------------------------------------------------
# Logging, checkpoints and the finish

class Speed:
    """Tokens and FLOPs per second since the last log line, and once, ten steps after the first
    (which compiles and warms up), the tokens the whole budget should buy at the measured rate."""

    def __init__(self, state, resumed):
        self.last = (time.time(), state.tokens, state.flops)
        self.first_step, self.warm, self.estimated = state.step + 1, None, resumed

    def since_last_log(self, state):
        """(tokens/s, FLOP/s) since the previous call; the next call measures from now."""
        (then, tokens, flops), now = self.last, time.time()
        self.last, seconds = (now, state.tokens, state.flops), max(now - then, 1e-9)
        return (state.tokens - tokens) / seconds, (state.flops - flops) / seconds

    def estimate(self, run, state):
        if self.estimated or not run.clock.seconds:
            return
        if state.step == self.first_step:
            self.warm = (time.time(), state.tokens)
        elif state.step >= self.first_step + 10:
            rate = (state.tokens - self.warm[1]) / (time.time() - self.warm[0])
            left = max(run.clock.seconds - run.clock.elapsed(), 0.0)
            run.say(f"measured {rate:,.0f} tokens/s: the budget should buy "
                    f"~{state.tokens + rate * left:,.0f} tokens in all")
            self.estimated = True


def log_step(run, state, speed, bar, step):
    """A 'train' record in log.jsonl and the progress bar's text. step: the step's
    progress, loss, lr, batch_tokens and grad_norm (a tensor: read here, so only logged
    steps wait for the device)."""
    tok_s, flop_s = speed.since_last_log(state)
    grad_norm = step["grad_norm"].item() if step["grad_norm"] is not None else None
    record = {"kind": "train", "step": state.step, "tokens": state.tokens,
              "elapsed": round(run.clock.elapsed(), 3), "progress": round(step["progress"], 5),
              "loss": step["loss"], "lr": step["lr"], "batch_tokens": step["batch_tokens"],
              "flops": state.flops, "tokens_per_s": round(tok_s), "grad_norm": grad_norm}
    if run.peak:  # MFU: model FLOPs spent per second over the peak (Chowdhery et al. 2022, App. B)
        record["mfu"] = round(flop_s / (run.peak * run.world), 4)
    run.log(record)
    left = run.clock.left(state.step, state.tokens, run.clock.elapsed())
    bar.set_postfix_str(f"loss {step['loss']:.3f}, lr {step['lr']:.2e}, {tok_s:,.0f} tokens/s, "
                        f"{left} left")


def save_checkpoint(run, state, net, optimizer, loader):
    """Save the run with rank 0's state. Every rank calls it: under FSDP every rank writes its
    shards. A full disk costs this checkpoint, not the run: the previous one stays whole (each is
    written beside it and renamed over it), a warning says so, and training goes on, since
    stopping would lose the steps since the last checkpoint just the same."""
    state.elapsed = run.clock.elapsed()
    if run.rank == 0:  # resume cuts log.jsonl back to this size
        state.log_bytes = os.path.getsize(run.log_path) if os.path.exists(run.log_path) else 0
    try:
        checkpoint.save(run.ckpt_path, net, optimizer, loader, asdict(state), run.rank)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        run.say(f"warning: {run.ckpt_path}: no space left on device at step {state.step}: this "
                "checkpoint is not saved, the previous one is intact; training goes on")


def save_final(run, net):
    """OUT/final: model.py's folder with the tokenizer and the data's meta.json beside the
    weights. A full disk here is one line: the checkpoint saved just before holds the weights."""
    files = {"tokenizer.json": run.meta["tokenizer"],
             "meta.json": os.path.join(run.meta["dir"], "meta.json")}
    folder = os.path.join(run.args.out, "final")
    try:
        return checkpoint.save_final(folder, net, run.rank, files)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        raise SystemExit(f"error: {folder}: no space left on device; the trained weights are in "
                         f"{run.ckpt_path}: free some space, then export them from there") from None


def finish(run, state, net, optimizer, loader, status):
    """Preempted: save and say how to resume. Diverged: the last good checkpoint goes to
    final/, exit 1. Otherwise the final evaluation, checkpoint, final/, loss.png and
    summary.json (also printed)."""
    args, state.elapsed = run.args, run.clock.elapsed()
    if status == "preempted":
        save_checkpoint(run, state, net, optimizer, loader)
        run.say(f"stopped by signal at step {state.step}: checkpoint saved to {run.ckpt_path}; "
                "continue with --resume")
        return {"status": status, **asdict(state)}
    if status == "diverged":  # the weights in memory may hold NaN: final/ gets the last good ones
        run.say(f"error: {args.max_bad_steps} non-finite losses in a row at step {state.step}")
        if os.path.exists(run.ckpt_path):
            good = checkpoint.load(run.ckpt_path)
            save_final(run, checkpoint.restored_model(good, net, optimizer))
            run.say(f"restored the last good checkpoint (step {good['state']['step']}) into "
                    f"{args.out}/final; lower --lr or raise --clip, then --resume")
        raise SystemExit(1)

    # ---- the budget is spent: the checkpoint first (a later --resume with a larger budget extends
    # the run, and an evaluation that dies loses nothing), then one last evaluation, final/ for
    # evaluate_glue.py and evaluate_lm.py, the plot and the summary. Every rank saves: under FSDP
    # each writes its shards, and takes part in gathering the weights
    save_checkpoint(run, state, net, optimizer, loader)
    losses = evaluate(run, net)
    summary = run_summary(run, state, status, losses["val_loss"], model.unwrap(net).config)
    if "val_loss_by_source" in losses:  # a mixture: each source's loss, and how often it was read
        summary.update(val_loss_by_source=losses["val_loss_by_source"],
                       epochs_by_source=loader.epochs())
    if run.peak:  # as log_step's
        summary["mfu"] = round(state.flops / max(state.elapsed, 1e-9) / (run.peak * run.world), 4)
    log_eval(run, state, 1.0, losses, elapsed=state.elapsed)
    summary["final"] = save_final(run, net)
    sample = samples(run, net)
    if run.rank == 0:
        summary["plot"] = scaling.plot_losses(run.log_path, os.path.join(args.out, "loss.png"))
        print(sample)
        model.atomic_write(os.path.join(args.out, "summary.json"),
                           lambda f: f.write(json.dumps(summary, indent=2).encode()))
        print(summary_text(summary))
    return summary


def run_summary(run, state, status, val, cfg):
    """summary.json's numbers: what was trained (cfg: the final shape), how long, how fast, and the
    final held-out loss."""
    args, seconds = run.args, max(state.elapsed, 1e-9)
    return {"status": status, "steps": state.step, "tokens": state.tokens, "model": args.model,
            "batch_tokens": args.batch_tokens, "elapsed_s": round(state.elapsed, 2),
            "flops": state.flops, "tokens_per_s": round(state.tokens / seconds),
            "final_val_loss": val, "params": model.count_params(cfg, embeddings=False),
            "params_total": model.count_params(cfg),
            "flops_per_token": model.flops_per_token(cfg), "skipped_steps": state.skipped_steps,
            "world_size": run.world, "device": str(run.device),
            "dtype": str(run.dtype).replace("torch.", ""), "out": args.out,
            # what the held-out loss depends on besides N and D: scaling.py fits only
            # runs that agree
            "comparable": {"data": os.path.basename(run.meta["dir"]),
                           "vocab_size": cfg["vocab_size"], "objective": args.objective,
                           "seq_len": cfg["max_seq_len"],
                           "mask_rate": args.mask_rate}}


def summary_text(summary):
    """The printed summary: 'key: value' lines, floats to 4 significant digits (the
    JSON keeps all)."""
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
