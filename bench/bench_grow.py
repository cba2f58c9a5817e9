"""Growth against no growth at the same wall-clock budget: does grow.py buy a speedup on this machine?

    python bench/bench_grow.py                                  # CPU default: 2 seeds x 2 runs of 3 minutes
    python bench/bench_grow.py --grow gstack                    # G_stack-style depth-only growth
    python bench/bench_grow.py --minutes 20 --train-flags "--model small --seq-len 128"   # a CUDA GPU, unchanged

For every seed it runs train.py twice on the bundled Shakespeare sample with the same target model, learning-rate
schedule, batch ramp and budget: once without growth (the baseline) and once with --grow SCHEDULE. On a CPU the two
run at the same time with one thread each, so load from other processes hits both alike (on a shared 2-core machine
one run alone saw 2-40x swings in tokens/s); on a GPU they run one after the other. From each run's log.jsonl it reads
the held-out loss curve and reports:
  * loss at equal time: both final held-out losses (the budget is the same);
  * time speedup: baseline's time to its final loss / growth run's time to reach that loss (linearly interpolated
    between evaluations; only evaluations of the fully grown model count, since a shorter sequence stage has
    a different loss). Growth's papers report this as "x% faster" = speedup - 1;
  * FLOP speedup: the same at equal training FLOPs (model.flops_per_token of each stage times its tokens).
Wall-clock numbers on a shared CPU are noisy: read the per-seed rows, not only the mean. Prints a table, writes JSON.
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data  # noqa: E402
import model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A target small enough for a CPU: 8 layers of width 64 at 64 tokens; the schedule grows toward it. Cramming's
# sinusoidal positions, with which the README's growth table was measured (train.py now defaults to rotary).
CPU_TARGET = ("--model tiny --n-layers 8 --d-model 64 --n-heads 4 --ffn-dim 128 --seq-len 64 --vocab-size 512 "
              "--micro-batch 16 --batch-tokens 1024 --lr 2e-3 --positions sinusoidal")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--grow", default="compound", help="growth schedule for train.py --grow (text or preset name)")
    p.add_argument("--minutes", type=float, default=3.0, help="wall-clock budget of every run, in minutes")
    p.add_argument("--seeds", type=int, default=2, help="number of seeds (each runs baseline and growth)")
    p.add_argument("--train-flags", default=CPU_TARGET, help="train.py flags shared by all runs (target model, batch)")
    p.add_argument("--eval-every", type=float, default=0.04, help="held-out evaluation interval, fraction of budget")
    p.add_argument("--eval-batches", type=int, default=8, help="held-out batches per evaluation")
    p.add_argument("--out", default="runs/bench_grow", help="folder for the runs and the JSON result")
    p.add_argument("--cache", default="cache", help="train.py's data cache")
    p.add_argument("--analyze-only", action="store_true",
                   help="do not train: recompute the table from the runs already in --out")
    p.add_argument("--parallel", choices=["auto", "on", "off"], default="auto",
                   help="run baseline and growth of a seed at the same time, one thread each (auto: on a CPU)")
    args = p.parse_args()
    if args.minutes <= 0 or args.seeds < 1:
        p.error("--minutes must be positive and --seeds >= 1")
    return args


# -----------------------------------------------------------------------------
# Reading a run's log

SHAPE = re.compile(r"L(\d+) d(\d+) H(\d+) f(\d+) T(\d+)")


def shape_config(final_cfg, text):
    """grow.describe's 'L8 d128 H4 f256 T64' -> the final config with those five sizes."""
    L, d, H, f, T = map(int, SHAPE.fullmatch(text).groups())
    return {**final_cfg, "n_layers": L, "d_model": d, "n_heads": H, "ffn_dim": f, "max_seq_len": T}


def read_run(folder):
    """[(elapsed s, training FLOPs, val loss, fully grown?)] for every evaluation of a finished run."""
    with open(os.path.join(folder, "log.jsonl")) as f:
        records = [json.loads(line) for line in f]
    with open(os.path.join(folder, "final", "config.json")) as f:
        final = json.load(f)
    grows = [r for r in records if r["kind"] == "grow"]
    # Stages as (tokens at start, config); train.py counts the tokens actually fed (at each stage's length).
    stages = [(0, shape_config(final, grows[0]["from"]) if grows else final)]
    stages += [(g["tokens"], shape_config(final, g["to"])) for g in grows]

    def flops_at(tokens):
        total = 0.0
        for i, (start, cfg) in enumerate(stages):
            end = min(tokens, stages[i + 1][0]) if i + 1 < len(stages) else tokens
            total += max(0, end - start) * model.flops_per_token(cfg)
        return total

    curve, seen = [], 0
    for r in records:
        seen += r["kind"] == "grow"
        if r["kind"] == "eval":   # "fully grown": logged after the last growth event
            curve.append((r["elapsed"], r.get("flops", flops_at(r["tokens"])), r["val_loss"], seen == len(grows)))
    return curve


def first_reach(curve, target, axis):
    """Interpolated time (axis 0) or FLOPs (axis 1) at which the fully grown model's loss first is <= target,
    or None if it never is."""
    points = [c for c in curve if c[3]]
    for i, point in enumerate(points):
        if point[2] <= target:
            if i == 0:
                return point[axis]
            a, b = points[i - 1], point
            w = (a[2] - target) / (a[2] - b[2])
            return a[axis] + w * (b[axis] - a[axis])
    return None


def compare(base, grown):
    """One seed's numbers from the two curves."""
    target = base[-1][2]
    t_base, f_base = base[-1][0], base[-1][1]
    t_grow, f_grow = first_reach(grown, target, 0), first_reach(grown, target, 1)
    return {"baseline_loss": target, "growth_loss": grown[-1][2],
            "baseline_seconds": t_base, "growth_seconds_to_baseline_loss": t_grow,
            "time_speedup": t_base / t_grow if t_grow else None,
            "baseline_flops": f_base, "growth_flops": grown[-1][1], "growth_flops_to_baseline_loss": f_grow,
            "flop_speedup": f_base / f_grow if f_grow else None}


# -----------------------------------------------------------------------------
# Running

def train_command(args, out, seed, grow=None):
    """The train.py command line of one run; --force replaces the outputs of an earlier bench."""
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--data", "sample", "--cache", args.cache,
           *shlex.split(args.train_flags), "--minutes", str(args.minutes), "--seed", str(seed),
           "--eval-every", str(args.eval_every), "--eval-batches", str(args.eval_batches), "--log-every", "10",
           "--checkpoint-minutes", "1000", "--out", out, "--force"]
    return cmd + (["--grow", grow] if grow else [])


def run_pair(args, seed, parallel):
    """Baseline and growth run of one seed, as fresh train.py processes. parallel: both at once with one thread
    each, so a load spike from another process slows both alike (a shared CPU); else one after the other."""
    outs = [os.path.join(args.out, f"{name}-seed{seed}") for name in ("baseline", "growth")]
    cmds = [train_command(args, outs[0], seed), train_command(args, outs[1], seed, args.grow)]
    env = dict(os.environ, **({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if parallel else {}))
    start, procs = time.time(), []
    for cmd, out in zip(cmds, outs):
        # Output goes to a file, never to an undrained pipe: a full pipe would block that run mid-budget.
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "train_output.txt"), "w") as log:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        if not parallel:
            procs[-1].wait()
    for cmd, out, proc in zip(cmds, outs, procs):
        if proc.wait():
            with open(os.path.join(out, "train_output.txt")) as f:
                tail = f.read()[-2000:]
            raise SystemExit(f"bench_grow.py: train.py failed ({shlex.join(cmd)}):\n{tail}")
    print(f"  seed {seed}: {time.time() - start:.0f} s", flush=True)
    return read_run(outs[0]), read_run(outs[1])


def prepare_cache(args):
    """Prepare the data once (tokenizer + shards) so its time is in no run's budget."""
    cmd = train_command(args, os.path.join(args.out, "prepare"), 0)
    cmd[cmd.index("--minutes") + 1] = "0.001"
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        raise SystemExit(f"bench_grow.py: data preparation failed:\n{r.stdout[-2000:]}")


def print_table(rows):
    """One line per seed; 'not reached' where the growth run never got down to the baseline's final loss."""
    def cell(v, spec, width=11):
        return format("not reached" if v is None else format(v, spec), f">{width}")
    print(f"\n{'seed':>4} | {'loss base':>9} | {'loss grow':>9} | {'t base s':>8} | {'t grow s':>11} | "
          f"{'time x':>11} | {'GFLOP base':>10} | {'GFLOP grow':>11} | {'FLOP x':>11}")
    for r in rows:
        grow_gflop = r["growth_flops_to_baseline_loss"] and r["growth_flops_to_baseline_loss"] / 1e9
        print(f"{r['seed']:>4} | {r['baseline_loss']:9.4f} | {r['growth_loss']:9.4f} | {r['baseline_seconds']:8.1f} | "
              f"{cell(r['growth_seconds_to_baseline_loss'], '.1f')} | {cell(r['time_speedup'], '.2f')} | "
              f"{r['baseline_flops'] / 1e9:10.1f} | {cell(grow_gflop, '.1f')} | {cell(r['flop_speedup'], '.2f')}")


def summarize(rows):
    """Means over seeds. Speedups are averaged over the seeds whose growth run reached the baseline's loss;
    `reached` says how many did (a seed that never got there had a speedup below 1 at this budget)."""
    def mean(key):
        values = [r[key] for r in rows if r[key] is not None]
        return statistics.mean(values) if values else None
    return {"baseline_loss": mean("baseline_loss"), "growth_loss": mean("growth_loss"),
            "loss_gain_at_equal_time": statistics.mean(r["baseline_loss"] - r["growth_loss"] for r in rows),
            "time_speedup": mean("time_speedup"), "flop_speedup": mean("flop_speedup"),
            "reached": sum(r["time_speedup"] is not None for r in rows), "seeds": len(rows)}


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"growth {args.grow!r} vs no growth, {args.minutes} min each, {args.seeds} seed(s); train flags: "
          f"{args.train_flags}", flush=True)
    parallel = args.parallel == "on" or (args.parallel == "auto" and not torch.cuda.is_available())
    print(f"runs of a seed {'in parallel, one thread each' if parallel else 'one after the other'}", flush=True)
    if not args.analyze_only:
        prepare_cache(args)
    rows = []
    for seed in range(args.seeds):
        if args.analyze_only:
            base, grown = (read_run(os.path.join(args.out, f"{n}-seed{seed}")) for n in ("baseline", "growth"))
        else:
            base, grown = run_pair(args, seed, parallel)
        rows.append({"seed": seed, **compare(base, grown),
                     "baseline_curve": base, "growth_curve": grown})

    print_table(rows)
    summary = summarize(rows)
    print("---")
    for k, v in summary.items():
        print(f"{k:>14}: {v if not isinstance(v, float) else round(v, 4)}")
    result = {"args": vars(args), "summary": summary, "seeds": rows}
    path = os.path.join(args.out, "bench_grow.json")
    data.atomic_write(path, lambda f: f.write(json.dumps(result, indent=1).encode()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
