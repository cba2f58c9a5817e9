"""Is train.py's loop as fast as its step?

Tokens per second of train.py's whole loop against the same step run bare, at one shape,
micro-batch and thread count, in one process.

    python bench/bench_loop.py                      # 4 x 128-wide, 4 layers, 4 x 128 tokens, CPU
    python bench/bench_loop.py --micro-batch 32 --pairs 3

The bare step is exactly what train.py's loop calls: train.train_step over a real Loader's
batches, with the gradient clip and AdamW's step. The loop is `train.main` with the same model,
data, micro-batch and accumulation, a step budget, no evaluation but the last (after the clock), and
the default logging. Its tokens/s is the run's tokens over its clock (summary.json), which counts
everything the loop does around the step (schedules, the clock, logging, the progress bar, the
loader). The two alternate, so a busy machine slows both alike; the ratio of their medians is the
loop's overhead. Time nothing else on the machine while this runs.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flags  # noqa: E402
import model  # noqa: E402
import parallel  # noqa: E402
import planning  # noqa: E402
import train  # noqa: E402
from loader import make_loader  # noqa: E402


def train_argv(args, out):
    """train.py's command line for the loop: accumulation 1, no ramp, no growth, a step budget."""
    return ["--data", "sample", "--cache", args.cache, "--out", out, "--force",
            "--vocab-size", str(args.vocab_size), "--model", "mini", "--n-layers", "4",
            "--d-model", str(args.d_model), "--n-heads", "4", "--max-seq-len", str(args.seq_len),
            "--micro-batch", str(args.micro_batch),
            "--batch-tokens", str(args.micro_batch * args.seq_len), "--batch-ramp", "0",
            "--max-steps", str(args.steps), "--eval-every", "1", "--eval-batches", "1",
            "--lr", "1e-3", "--grow", "none", "--device", "cpu", "--dtype", args.dtype]


def loop_tokens_per_s(args):
    """train.main's tokens over its clock."""
    with tempfile.TemporaryDirectory() as out:
        summary = train.main(train_argv(args, out))
    return summary["tokens"] / summary["elapsed_s"]


def bare_tokens_per_s(args):
    """The same model, data and step without the loop: train.train_step (clip and AdamW too)."""
    settings = flags.parse_args(train_argv(args, "unused"))
    settings = argparse.Namespace(**{**vars(settings), "batch_ramp": 0.0})
    meta = train.prepare(settings, torch.device("cpu"), 0, 1)  # the cache entry the loop uses
    torch.manual_seed(0)
    net = model.build_model(planning.model_config(settings, meta["n_vocab"])).train()
    cpu = torch.device("cpu")
    hw = train.Hardware(cpu, rank=0, world=1, dtype=parallel.autocast_dtype(args.dtype, cpu))
    optimizer = train.make_optimizer(net, settings, hw)
    loader = make_loader(meta, "train", {"objective": "mlm", "seed": 0})
    amp = parallel.autocast(cpu, hw.dtype)
    started = time.time()
    for _ in range(args.steps):  # all steps timed, the first (cold) ones too, as the loop's clock
        batch = loader.next_batch(args.micro_batch, args.seq_len)
        train.train_step(net, optimizer, [batch], clip=0.5, autocast=amp)
    return args.steps * args.micro_batch * args.seq_len / (time.time() - started)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per step (default 4)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default 128)")
    p.add_argument("--d-model", type=int, default=128, help="width (default 128)")
    p.add_argument("--vocab-size", type=int, default=4096, help="vocabulary (default 4096)")
    p.add_argument("--steps", type=int, default=300, help="timed steps per run (default 300)")
    p.add_argument("--pairs", type=int, default=3, help="loop/bare pairs, alternating (default 3)")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto",
                   help="autocast dtype (default: auto, train.py's choice for this CPU)")
    p.add_argument("--cache", default="cache", help="the data cache (default: cache)")
    args = p.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    loops, bares = [], []
    for _ in range(args.pairs):
        bares.append(bare_tokens_per_s(args))
        loops.append(loop_tokens_per_s(args))
    loop, bare = statistics.median(loops), statistics.median(bares)
    print(f"bare step: {bare:,.0f} tokens/s (runs: {', '.join(f'{x:,.0f}' for x in bares)})")
    print(f"train.py:  {loop:,.0f} tokens/s (runs: {', '.join(f'{x:,.0f}' for x in loops)})")
    print(f"loop / step: {loop / bare:.3f} ({torch.get_num_threads()} threads, "
          f"{args.micro_batch} x {args.seq_len} tokens, width {args.d_model}, "
          f"{parallel.autocast_dtype(args.dtype, torch.device('cpu'))})")
    return {"loop": loop, "bare": bare, "ratio": loop / bare}


if __name__ == "__main__":
    main()
