"""bench_compile.py: what torch.compile costs and gains, compiling the whole model or each block.

    python bench/bench_compile.py                      # 4 x 128, grown from 2 layers, bf16 on a CPU
    python bench/bench_compile.py --d-model 256 --dtype fp32

Growth is why this matters here: the default recipe trains half the layers and then stacks them,
so a whole-model compile compiles twice, while blocks compiled one by one (parallel.compile_blocks,
what --compile does) share their graphs across the growth. Two measurements:
  - cold compile: in a fresh process per mode (inductor's on-disk caches off), the seconds of the
    first training step and the first evaluation of a model at half depth, then of a fresh model at
    full depth in the same process, as train.py's growth builds one;
  - steady steps: eager, whole-model and per-block steps of the full-depth model, interleaved one by
    one (bench_model.time_alternating), so load from other processes hits all alike.
Training steps are bench_model's (forward, backward, AdamW) on random tokens with 40% of positions
masked. Output: a table and --out JSON.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_model  # noqa: E402  (beside this file)
import files  # noqa: E402
import model  # noqa: E402
import parallel  # noqa: E402

MODES = ("eager", "whole", "blocks")


def config(args, n_layers):
    return model.make_config("base", n_layers=n_layers, d_model=args.d_model, n_heads=args.n_heads,
                             ffn_dim=args.ffn_dim, vocab_size=args.vocab_size,
                             max_seq_len=args.seq_len, value_residual=True, mask_rate=0.4)


def prepared(cfg, mode, device, dtype):
    """(model, its loss on a batch, bench_model's timed training step), the model compiled as
    mode says."""
    net = model.build_model(cfg).to(device).train()
    run = torch.compile(net, dynamic=False) if mode == "whole" else net
    if mode == "blocks":
        parallel.compile_blocks(net)

    def loss(batch):
        return run(batch["ids"], labels=batch["labels"], label_positions=batch["positions"])["loss"]
    return net, loss, bench_model.make_stepper(net, loss, device, dtype)


def first_calls(args, mode, device, dtype):
    """{"half": (train s, eval s), "full": (train s, eval s)}: the first training step and the first
    evaluation, at half depth and then at full depth, in this process."""
    seconds = {}
    for name, layers in (("half", args.n_layers // 2), ("full", args.n_layers)):
        cfg = config(args, layers)
        net, loss, stepper = prepared(cfg, mode, device, dtype)
        batch = bench_model.make_batch(cfg, args.batch_size, device)
        train_s = stepper(batch)
        net.eval()
        started = time.perf_counter()
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype,
                                             enabled=dtype != torch.float32):
            loss(batch).item()
        seconds[name] = (round(train_s, 2), round(time.perf_counter() - started, 2))
    return seconds


def cold_compile(argv, mode):
    """first_calls in a fresh process with inductor's caches off: what a first run pays."""
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    done = subprocess.run([sys.executable, __file__, *argv, "--first-calls", mode], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-layers", type=int, default=4, help="full depth; half of it before growth")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--ffn-dim", type=int, default=352)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step")
    p.add_argument("--steps", type=int, default=40, help="timed steps per mode")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--first-calls", choices=MODES, help=argparse.SUPPRESS)  # the child process
    p.add_argument("--out", default="runs/bench_compile.json")
    args = p.parse_args(argv)
    device, _, _ = parallel.setup_device(args.device)
    dtype = parallel.autocast_dtype(args.dtype, device)
    if args.first_calls:
        print(json.dumps(first_calls(args, args.first_calls, device, dtype)))
        return None
    cold = {mode: cold_compile(argv, mode) for mode in MODES}
    cfg = config(args, args.n_layers)
    steppers = {mode: prepared(cfg, mode, device, dtype)[2] for mode in MODES}
    batch = bench_model.make_batch(cfg, args.batch_size, device)
    step_s = bench_model.time_alternating(steppers, batch, args.steps, warmup=3)
    print(f"{args.n_layers // 2} then {args.n_layers} layers x {args.d_model}, "
          f"{args.batch_size} x {args.seq_len} tokens, {str(dtype).split('.')[-1]}, {device}")
    print(f"{'mode':8} {'cold compile: half (train + eval), full (train + eval)':>58} "
          f"{'step':>9} {'vs eager':>9}")
    for mode in MODES:
        (h_train, h_eval), (f_train, f_eval) = cold[mode]["half"], cold[mode]["full"]
        total = h_train + h_eval + f_train + f_eval
        print(f"{mode:8} {h_train:8.1f} + {h_eval:4.1f}, {f_train:6.1f} + {f_eval:4.1f} "
              f"= {total:6.1f} s {'':16} {1e3 * step_s[mode]:6.1f} ms "
              f"{step_s['eager'] / step_s[mode]:8.2f}x")
    result = {"settings": vars(args), "device": str(device), "dtype": str(dtype),
              "cold_compile_s": cold, "step_s": step_s}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    files.atomic_write(args.out, lambda f: f.write(json.dumps(result, indent=2).encode()))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
