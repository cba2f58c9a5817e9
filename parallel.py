"""parallel.py: one process or many. Devices, process groups, DDP and FSDP2, and what each rank
holds.

    device, rank, world = parallel.setup_device("auto", shard="ddp")  # joins torchrun's group
    net = parallel.wrap(net, args, device, world)    # checkpointing, FSDP, compile, DDP
    with parallel.gradient_sync(net, last=micro == accum - 1): ...    # one all-reduce a step
    elapsed, stopped = parallel.agree_on_clock(elapsed, signals, device, world)

Data parallel (DDP) keeps a whole copy of the model on every rank and averages gradients; FSDP2
keeps 1/world of every parameter, gradient and AdamW moment on each rank (ZeRO stage 3) and
all-gathers a block just before it is needed. Both are PyTorch's own engines: this file only
chooses, wraps and measures.
"""
import ctypes
import functools
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

import model


def setup_device(choice, shard="ddp"):
    """(device, rank, world size). Under torchrun (RANK and WORLD_SIZE set) this joins the
    process group: NCCL on GPUs, gloo on CPUs; multi-node works through torchrun's
    MASTER_ADDR and MASTER_PORT. On a CPU, malloc keeps the memory that steps free
    (keep_freed_memory)."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else \
            "mps" if torch.backends.mps.is_available() else "cpu"
    if shard == "fsdp" and choice == "mps":
        raise SystemExit("error: --shard fsdp runs on CUDA GPUs (NCCL) or CPUs (gloo), not on mps; "
                         "use --device cpu")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = torch.device(choice)
    if choice == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        # fp32 matmuls outside autocast (the loss, the optimizer's norms) may use TF32 tensor
        # cores, as cramming's impl config allows: fp32's range at a 10-bit mantissa, several times
        # faster on Ampere+
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    backend = "nccl" if choice == "cuda" else "gloo"
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend=backend)
    elif shard == "fsdp" and not dist.is_initialized():
        # FSDP needs a process group even in one process: a group of one rank, over an in-memory
        # store.
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    if device.type == "cpu":
        keep_freed_memory()
    return device, rank, world


# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


def keep_freed_memory():
    """Make glibc's malloc reuse the memory a training step frees instead of handing it back to the
    operating system. True if it took effect (Linux with glibc), False elsewhere, which changes
    nothing.

    By default glibc serves every allocation over a threshold (128 KB to start, at most 32 MB) with
    a fresh mmap, and unmaps it on free. A CPU step at mini allocates and frees its (B*k, V) logits
    and their gradient (134 MB each at batch 32, k 32, V 32,768) every step, so each one is a new
    mapping that the kernel fills with zeroed pages on first touch: page faults that cost about as
    much as the softmax itself. With mmap off (M_MMAP_MAX 0) and the heap trimmed only past 2 GB of
    free top, a freed block stays in the process and later steps reuse it (not always the same
    block: PyTorch's 64-byte-aligned requests ask a little more than a block freed exactly; at mini
    the minor faults per step fall from about 185,000 to about 40,000). The PyTorch CPU tuning
    guide buys the same with jemalloc or TCMalloc through LD_PRELOAD; this needs no library.
    The process keeps its peak memory until it ends, which a training run does anyway."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # glibc only: musl, macOS and Windows have none
    except (OSError, AttributeError):
        return False
    no_mmap = mallopt(M_MMAP_MAX, 0) == 1
    no_trim = mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
    return no_mmap and no_trim

def autocast(device, dtype):
    """The context of every forward pass: torch.autocast to dtype, off in fp32. Call it: amp()."""
    return functools.partial(torch.autocast, device.type, dtype=dtype,
                             enabled=dtype != torch.float32)


def autocast_dtype(choice, device):
    """bf16 where the hardware multiplies in it (cpu_has_fast_bf16, or a GPU that has it), fp32
    elsewhere unless --dtype bf16 asks."""
    # bf16 keeps fp32's exponent range, so no loss scaling is needed (cramming used fp16 with a
    # GradScaler)
    if device.type == "cuda":
        fast = torch.cuda.is_bf16_supported()
    else:
        fast = device.type == "cpu" and cpu_has_fast_bf16()
    if choice == "fp32" or (choice == "auto" and not fast):
        return torch.float32
    return torch.bfloat16


def cpu_has_fast_bf16():
    """Does this CPU have bf16 matmul instructions (AVX512-BF16 or AMX)? Without them a bf16
    matmul is emulated and no faster than fp32; with them it is much faster (measured on an AMD
    EPYC with AVX512-BF16: a 2048 x 2048 torch.mm runs at 744 GFLOP/s in bf16, 181 in fp32)."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private, so looked up
    return any(getattr(cpu, name, lambda: False)() for name in checks)


# -----------------------------------------------------------------------------
# Wrapping: activation checkpointing, FSDP and torch.compile (each block, in place), then DDP

def wrap(net, args, device, world):
    """The model as the loop runs it; model.unwrap finds the plain model again (under FSDP that is
    the module itself). args: train.py's settings (checkpoint_activations, shard, dtype,
    compile)."""
    # Checkpointing rewrites each block's forward and FSDP shards the blocks, and torch.compile
    # compiles each block, all in place; DDP goes outermost.
    if args.checkpoint_activations:
        checkpoint_activations(net)
    if args.shard == "fsdp":
        shard_fsdp(net, device, world, autocast_dtype(args.dtype, device))
    if args.compile:
        compile_blocks(net)
    if world > 1 and args.shard == "ddp":
        net = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    return net


def compile_blocks(net):
    """torch.compile each block in place ("regional compilation", as torchtitan compiles each
    Transformer block): blocks of one shape share their compiled graphs, so a model grown from 2
    to 4 layers compiles nothing new, and parameter names stay as they are. The head and its loss
    are a compiled region of their own; the embedding runs eager. Measured on 2 CPU cores
    (bench/bench_compile.py, 4 x 128, bf16): a cold compile of 31 s against 55 s for the whole
    model, which compiles again after growth, and steps 1.30x eager's against the whole model's
    1.38x (blocks alone, before the head joined them)."""
    for block in net.blocks:
        block.compile(dynamic=False)
    # The final norm, output projection and loss: one region of their own, which growth in depth
    # leaves as it is. Compiled, the plain loss beats model.py's fused one (fused_loss_pays). Its
    # shapes follow the masked positions per sequence, which --mask-rate-end changes, so they may
    # become dynamic instead of compiling once per rate.
    net.head_and_loss = torch.compile(net.head_and_loss)
    return net


def shard_fsdp(net, device, world, dtype):
    """FSDP2 (torch.distributed.fsdp.fully_shard; PyTorch's FSDP2 tutorial): every rank keeps
    1/world of each parameter (a slice along dim 0), and so of its gradient and AdamW moments.
    Build the optimizer after this. All ranks built the same weights from the same seed, so each
    simply keeps its slice."""
    mesh = init_device_mesh(device.type, (world,))
    # On a GPU with bf16 the all-gathered copies are bf16 and gradients are reduced in fp32; the
    # sharded weights and AdamW stay fp32. CPU: fp32 throughout
    bf16 = device.type == "cuda" and dtype == torch.bfloat16
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32 if bf16 else None)
    # each block is one unit, all-gathered just before its forward and its backward and freed after;
    # the root unit holds the rest (embedding, norms)
    for block in net.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(net, mesh=mesh, mp_policy=policy)
    return net


def checkpoint_activations(net):
    """--checkpoint-activations: each block keeps only its input for the backward pass and
    recomputes its activations there (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
    Cost"): less memory for about one more forward pass of compute."""
    # A wrapped forward, not a wrapper module: parameter names stay the same for checkpoints and
    # growth, FSDP's hooks stay outside the recomputed region (as in torchtitan), and
    # torch.compile traces it
    for block in net.blocks:
        block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward,
                                          use_reentrant=False)
    return net


def is_sharded(net):
    """FSDP: the parameters are DTensors, each rank holding its slice."""
    return any(isinstance(p, DTensor) for p in model.unwrap(net).parameters())


# -----------------------------------------------------------------------------
# What ranks say to each other during a step

def gradient_sync(net, last):
    """The context of one micro-batch's backward: gradients are reduced across ranks on the step's
    last micro-batch only (fewer collectives; the unsharded gradients wait in memory until then)."""
    plain = model.unwrap(net)
    if hasattr(plain, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter on the last only
        plain.set_requires_gradient_sync(last)
        return nullcontext()
    # DDP: no_sync() skips the all-reduce. nanoGPT toggles the flag by hand; the context says the
    # same.
    return net.no_sync() if isinstance(net, DDP) and not last else nullcontext()


def agree_on_clock(elapsed, signals, device, world):
    """(elapsed, stopped) the same on every rank: the slowest clock and any rank's stop signal
    count for all, or ranks would stop, grow or cut a step apart and wait for each other
    forever. One all-reduce, and none on one process (cramming's communicate_flags does the same
    once per step)."""
    stop = float(bool(signals))
    if world > 1:
        flags = torch.tensor([elapsed, stop], dtype=torch.float64, device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        elapsed, stop = flags.tolist()
    return elapsed, stop > 0


def slowest_over_ranks(value, device, world):
    """The smallest of a number over ranks (the number itself on one process)."""
    if world > 1:
        value = torch.tensor(value, dtype=torch.float64, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        value = value.item()
    return value


def sum_over_ranks(value, world):
    """The sum of a tensor over ranks, in place (nothing to do on one process)."""
    if world > 1:
        dist.all_reduce(value)
    return value


def mean_over_ranks(value, world):
    """The mean of a tensor over ranks, in place: every rank then takes the same skip-or-step
    decision."""
    if world > 1:
        sum_over_ranks(value, world)
        value /= world
    return value


# -----------------------------------------------------------------------------
# Memory: what each rank holds

def is_out_of_memory(error):
    """CUDA's torch.OutOfMemoryError, MPS's RuntimeError that says it ran out of memory, or the CPU
    allocator's ("DefaultCPUAllocator: can't allocate memory ... Error code 12")."""
    return (isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error)
            or "can't allocate memory" in str(error))


def free_memory(device):
    """Give the caching allocator's free blocks back after an out-of-memory error, so a smaller
    retry starts from what is really in use."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


def out_of_memory_exit(where, cfg, *, device, world, args):
    """The one-line error when halving cannot help: what ran out, and what the model needs."""
    need = memory_per_rank(cfg, world, args.shard, optimizer=args.optimizer,
                           neuron_beta2=args.neuron_beta2, ema=args.ema)["total"]
    return SystemExit(f"error: out of memory {where} on {device}: the model has "
                      f"{model.count_params(cfg) / 1e6:.1f} M parameters, which need "
                      f"{need / 1e9:.2f} GB per rank for weights, gradients, the optimizer's "
                      "state and the weights' average before any activation; try "
                      "--checkpoint-activations, --shard fsdp, --dtype bf16 or a smaller --model")


def memory_per_rank(cfg, world, shard, optimizer="adamw", neuron_beta2=0.0, ema=0.0):
    """Bytes of training state on each rank, all of it fp32: parameters 4 per parameter, gradients
    4, the optimizer's state and the weights' average (--ema above 0: 4). AdamW keeps two moments
    (8); Muon one momentum on the blocks' matrices (4, plus NorMuon's 4 per row when neuron_beta2
    is above 0) and AdamW's 8 on the rest (muon.py). Activations come on top, and under FSDP the
    all-gathered block being computed."""
    n = model.count_params(cfg)
    state = 8 * n                                                 # AdamW's two moments
    if optimizer == "muon":
        # The blocks' matrices keep one momentum (4 bytes, not 8), NorMuon one moment per row.
        d, blocks = cfg["d_model"], cfg["n_layers"]
        state -= 4 * blocks * model._block_linear_weights(cfg)
        if neuron_beta2 > 0:
            state += 4 * blocks * (3 * d + d + model.up_width(cfg) + d)  # qkv, out, up, down
    sizes = {"params": 4 * n, "grads": 4 * n, "optimizer": state,
             "average": 4 * n if ema > 0 else 0}
    # DDP replicates all of it on every rank; FSDP shards it (ZeRO stage 3, Rajbhandari et al.
    # 2020), so each rank holds 1/world, plus padding of at most one dim-0 row per tensor
    share = world if shard == "fsdp" else 1
    per_rank = {name: -(-size // share) for name, size in sizes.items()}  # ceil(size / share)
    return {**per_rank, "total": sum(per_rank.values())}


def memory_text(cfg, world, args):
    """The start-up line: the training state per rank under DDP and under FSDP, e.g. 'memory per
    rank (fp32 weights + gradients + optimizer state + the weights' average): DDP with muon 0.5 MB
    + 0.5 MB + 0.6 MB + 0.5 MB = 2.1 MB; FSDP over 2 rank(s) with adamw ...; this run: ddp'."""
    def size(n):
        return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"

    def text(shard):
        # Under FSDP train.py steps with AdamW: Muon needs whole matrices (planning.py).
        optimizer = "adamw" if shard == "fsdp" else args.optimizer
        memory = memory_per_rank(cfg, world, shard, optimizer=optimizer,
                                 neuron_beta2=args.neuron_beta2, ema=args.ema)
        parts = " + ".join(size(memory[k]) for k in ("params", "grads", "optimizer", "average")
                           if memory[k])
        return f"with {optimizer} {parts} = {size(memory['total'])}"
    average = " + the weights' average" if args.ema > 0 else ""
    recomputed = ", activations checkpointed" if args.checkpoint_activations else ""
    return (f"memory per rank (fp32 weights + gradients + optimizer state{average}): "
            f"DDP {text('ddp')}; FSDP over {world} rank(s) {text('fsdp')}; "
            f"this run: {args.shard}{recomputed}")


def shard_bytes(net):
    """FSDP: bytes of parameters this rank holds, its slice of every tensor (what memory_per_rank
    predicts)."""
    plain = model.unwrap(net)
    plain.reshard()  # a forward in eval mode (the step-0 evaluation) leaves the root all-gathered
    return sum(p.to_local().numel() * p.to_local().element_size() for p in plain.parameters())


def bytes_per_rank(net, world):
    """[bytes of parameters on each rank]: every rank's shard_bytes, gathered (a collective)."""
    shards = [None] * world
    dist.all_gather_object(shards, shard_bytes(net))
    return shards
