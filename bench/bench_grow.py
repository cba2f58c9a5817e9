"""Does grow.py buy a speedup over the strongest static baseline at equal wall clock? Which part?

    python bench/bench_grow.py                   # CPU: 17 arms x 3 seeds x 2 minutes, 2 lanes
    python bench/bench_grow.py --arms "static lr x1,compound,depth" --seeds 2 --minutes 1
    python bench/bench_grow.py --reuse           # finish an interrupted bench, keep finished runs
    python bench/bench_grow.py --analyze-only    # re-print the table from the runs in --out
    python bench/bench_grow.py --train-flags "--model mini --vocab-size 8192 --max-seq-len 128 \
        --micro-batch 32 --batch-tokens 4096" \
        --minutes 10 --out runs/bench_grow_mini  # the mini shape (4 x 256)

Every arm is train.py on the bundled sample with the same target model (--train-flags: shape,
vocabulary, tokens per step), data, budget, evaluation and a fully decayed schedule, and today's
recipe (rotary positions, the learning rate of the width rule). The arms:
  * static baselines: the target at 0.5x, 1x and 2x the width rule's learning rate, and the target
    with half and a quarter of its layers. The one with the lowest mean final held-out loss is the
    STRONGEST BASELINE; every speedup is measured against it, seed by seed;
  * attribution: compound growth (depth, FFN width and length at 1/4, then 1/2 of the target, full
    at 40% of the budget), each of its three parts alone and in pairs on the same fractions, the
    first stage kept static for the whole budget (its loss is at its own 16-token length:
    labelled, not comparable, no speedup), G_stack, and function-preserving depth growth (method
    zero, msg) against plain stacking;
  * `compound, auto`: compound's stages, each started when grow.auto_should_grow sees its loss
    flatten (train.py --grow auto).
Runs go two at a time with one thread each (bench_recipe.run_lanes), seed by seed in the arm order
above, so load from other processes hits neighbouring arms alike. From each log: the final
held-out loss (equal time), the time speedup (strongest baseline's seconds to its final loss / the
arm's seconds to reach it, interpolated; only evaluations of the fully grown model count) and the
same in training FLOPs. Median and range over seeds. Writes bench_grow.json (every curve) and
curves.png (matplotlib, optional).
"""
import json
import os
import re
import shlex
import statistics
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:0] = [ROOT, BENCH]
import files  # noqa: E402
import flags  # noqa: E402
import grow  # noqa: E402
import model  # noqa: E402
import planning  # noqa: E402
from bench_cram import time_to_loss  # noqa: E402
from bench_recipe import check_lane_args, lane_bench_parser, run_lanes  # noqa: E402

# The CPU target: 8 layers of width 64 at 64 tokens, 1,024 tokens per step (about 500 steps in
# 2 minutes on one thread, the recipe's ~1,000-step rule at half the budget).
CPU_TARGET = ("--model tiny --n-layers 8 --d-model 64 --n-heads 4 --ffn-dim 128 --max-seq-len 64 "
              "--vocab-size 512 --micro-batch 16 --batch-tokens 1024")
BASELINES = ("static lr x0.5", "static lr x1", "static lr x2", "static half depth",
             "static quarter depth")


def target_config(train_flags):
    """The target's config and the width rule's learning rate as train.py resolves --train-flags."""
    args = flags.parse_args(["--max-steps", "1", *shlex.split(train_flags)])
    cfg = planning.model_config(args, args.vocab_size or 512)
    return cfg, args.lr or round(1e-3 * 768 / cfg["d_model"], 6)  # planning.choose_defaults' rule


def stages(cfg, keys, method=None):
    """Compound's fractions (0, 0.2, 0.4), growing only `keys` (of n_layers, ffn_dim,
    max_seq_len): 1/4, 1/2, then the target."""
    full = {key: cfg[key] for key in ("n_layers", "ffn_dim", "max_seq_len")}
    part = lambda k: ",".join(f"{key}={max(1, full[key] // k)}" for key in keys)  # noqa: E731
    tail = f",method={method}" if method else ""
    return f"'0:{part(4)}; 0.2:{part(2)}{tail}; 0.4:{part(1)}{tail}'"


def arm_flags(cfg, lr):
    """{arm name: the train.py flags it adds to --train-flags}, in running order."""
    L, f, T = cfg["n_layers"], cfg["ffn_dim"], cfg["max_seq_len"]
    L_, F_, T_ = "n_layers", "ffn_dim", "max_seq_len"
    return {
        "static lr x0.5": f"--lr {lr / 2:g} --grow none",
        "static lr x1": f"--lr {lr:g} --grow none",
        "static lr x2": f"--lr {lr * 2:g} --grow none",
        "static half depth": f"--lr {lr:g} --n-layers {max(1, L // 2)} --grow none",
        "static quarter depth": f"--lr {lr:g} --n-layers {max(1, L // 4)} --grow none",
        "compound": f"--lr {lr:g} --grow compound",
        "depth": f"--lr {lr:g} --grow {stages(cfg, [L_])}",
        "ffn": f"--lr {lr:g} --grow {stages(cfg, [F_])}",
        "seq": f"--lr {lr:g} --grow {stages(cfg, [T_])}",
        "depth+ffn": f"--lr {lr:g} --grow {stages(cfg, [L_, F_])}",
        "depth+seq": f"--lr {lr:g} --grow {stages(cfg, [L_, T_])}",
        "ffn+seq": f"--lr {lr:g} --grow {stages(cfg, [F_, T_])}",
        "first stage, static (own length)":
            f"--lr {lr:g} --n-layers {max(1, L // 4)} --ffn-dim {max(1, f // 4)} "
            f"--max-seq-len {max(4, T // 4)} --grow none",
        "gstack": f"--lr {lr:g} --grow gstack",
        "depth, method zero": f"--lr {lr:g} --grow {stages(cfg, [L_], 'zero')}",
        "depth, method msg": f"--lr {lr:g} --grow {stages(cfg, [L_], 'msg')}",
        "compound, auto": f"--lr {lr:g} --grow auto",
    }


def split_arms(text, known):
    """'static lr x1,compound, auto' -> (['static lr x1', 'compound, auto'], unknown pieces).

    Some arm names hold a comma, so the longest run of comma-separated pieces that names a known
    arm wins."""
    pieces, names, unknown, i = [p.strip() for p in text.split(",")], [], [], 0
    while i < len(pieces):
        for j in range(len(pieces), i, -1):
            if ", ".join(pieces[i:j]) in known:
                names.append(", ".join(pieces[i:j]))
                i = j
                break
        else:
            if pieces[i]:
                unknown.append(pieces[i])
            i += 1
    return names, unknown


def parse_args(argv=None):
    p = lane_bench_parser(__doc__, seeds=3, out="runs/bench_grow")
    p.add_argument("--arms", default=None,
                   help="comma-separated arm names (default: all; see arm_flags)")
    p.add_argument("--train-flags", default=CPU_TARGET,
                   help="train.py flags of the target, shared by all arms")
    p.add_argument("--eval-every", type=float, default=0.04,
                   help="held-out evaluation interval, fraction of budget")
    p.add_argument("--eval-batches", type=int, default=8, help="held-out batches per evaluation")
    args = p.parse_args(argv)
    check_lane_args(p, args)
    return args


# -----------------------------------------------------------------------------
# Reading a run's log

# grow.describe before the config-name logs
OLD_SHAPE = re.compile(r"L(\d+) d(\d+) H(\d+) f(\d+) T(\d+)")


def shape_config(final_cfg, text):
    """grow.describe's 'n_layers=8 d_model=128 n_heads=4 ffn_dim=256 max_seq_len=64' (or the older
    'L8 d128 H4 f256 T64') -> the final config with those five sizes."""
    old = OLD_SHAPE.fullmatch(text)
    sizes = (zip(grow.GROWN_KEYS, old.groups()) if old
             else (item.split("=") for item in text.split()))
    return {**final_cfg, **{key: int(value) for key, value in sizes}}


def read_run(folder):
    """A finished run's evaluations: [(elapsed s, training FLOPs, val loss, fully grown?)]."""
    with open(os.path.join(folder, "log.jsonl")) as f:
        records = [json.loads(line) for line in f]
    with open(os.path.join(folder, "final", "config.json")) as f:
        final = json.load(f)
    grows = [r for r in records if r["kind"] == "grow"]
    # Stages as (tokens at start, config). train.py counts the tokens actually fed, at each
    # stage's length.
    stages_ = [(0, shape_config(final, grows[0]["from"]) if grows else final)]
    stages_ += [(g["tokens"], shape_config(final, g["to"])) for g in grows]

    def flops_at(tokens):
        total = 0.0
        for i, (start, cfg) in enumerate(stages_):
            end = min(tokens, stages_[i + 1][0]) if i + 1 < len(stages_) else tokens
            total += max(0, end - start) * model.flops_per_token(cfg)
        return total

    curve, seen = [], 0
    for r in records:
        seen += r["kind"] == "grow"
        if r["kind"] == "eval":   # "fully grown": logged after the last growth event
            curve.append((r["elapsed"], r.get("flops", flops_at(r["tokens"])), r["val_loss"],
                          seen == len(grows)))
    return curve


def first_reach(curve, target, axis):
    """Interpolated time (axis 0) or FLOPs (axis 1) at which the fully grown model's loss is
    first <= target, or None if it never is: bench_cram.time_to_loss on the evaluations after the
    last growth event."""
    points = [{"elapsed": t, "flops": f, "val_loss": loss} for t, f, loss, grown in curve if grown]
    return time_to_loss(points, target, ("elapsed", "flops")[axis])


def compare(base, grown):
    """One seed's numbers for an arm's curve against the baseline's."""
    target = base[-1][2]
    t_base, f_base = base[-1][0], base[-1][1]
    t_grow, f_grow = first_reach(grown, target, 0), first_reach(grown, target, 1)
    return {"baseline_loss": target, "growth_loss": grown[-1][2],
            "baseline_seconds": t_base, "growth_seconds_to_baseline_loss": t_grow,
            "time_speedup": t_base / t_grow if t_grow else None,
            "baseline_flops": f_base, "growth_flops": grown[-1][1],
            "growth_flops_to_baseline_loss": f_grow,
            "flop_speedup": f_base / f_grow if f_grow else None}


# -----------------------------------------------------------------------------
# Analysis

def strongest_baseline(curves, baselines=BASELINES):
    """The baseline arm with the lowest mean final held-out loss over the seeds it has, or None.

    curves: {arm: {seed: curve}}; arms or seeds that did not run are simply missing."""
    finals = {a: [c[-1][2] for c in curves[a].values()] for a in baselines if curves.get(a)}
    return min(finals, key=lambda a: statistics.mean(finals[a])) if finals else None


def spread(values):
    """(median, min, max) of the values that exist, or (None, None, None); `reached` counts them."""
    xs = [v for v in values if v is not None]
    return (statistics.median(xs), min(xs), max(xs)) if xs else (None, None, None)


# The target itself with the default recipe: what growth papers compare against.
TARGET_ARM = "static lr x1"


def analyze(curves):
    """Per arm: final losses per seed, median / range of the speedups against the strongest
    baseline, and (for context, labelled as the weaker comparison) the time speedup against the
    static target, TARGET_ARM."""
    best = strongest_baseline(curves)
    rows = []
    for arm, by_seed in curves.items():
        finals = {s: c[-1][2] for s, c in by_seed.items()}
        row = {"arm": arm, "final_loss": finals, "mean_loss": statistics.mean(finals.values()),
               "comparable": not arm.startswith("first stage")}
        if best and row["comparable"] and arm != best:
            per_seed = {s: compare(curves[best][s], c)
                        for s, c in by_seed.items() if s in curves[best]}
            row["per_seed"] = per_seed
            for key in ("time_speedup", "flop_speedup"):
                row[key] = spread([r[key] for r in per_seed.values()])
            row["reached"] = sum(r["time_speedup"] is not None for r in per_seed.values())
        if TARGET_ARM in curves and row["comparable"] and arm != TARGET_ARM:
            vs = [compare(curves[TARGET_ARM][s], c)["time_speedup"]
                  for s, c in by_seed.items() if s in curves[TARGET_ARM]]
            row["time_speedup_vs_target"] = spread(vs)
            row["reached_target"] = f"{sum(v is not None for v in vs)}/{len(vs)}"
        rows.append(row)
    return {"strongest_baseline": best, "rows": rows}


def fmt_spread(t):
    median, low, high = t
    return "not reached" if median is None else f"{median:.2f}x [{low:.2f}-{high:.2f}]"


def print_table(result):
    best = result["strongest_baseline"]
    print(f"\nstrongest static baseline: {best}")
    print(f"{'arm':<34} | {'final held-out loss per seed':<28} | {'mean':>6} | "
          f"{'time speedup':>22} | {'FLOP speedup':>22} | reached | "
          f"vs the static target ({TARGET_ARM})")
    for r in result["rows"]:
        losses = " ".join(f"{r['final_loss'][s]:.3f}" for s in sorted(r["final_loss"]))
        if "time_speedup" in r:
            extra = (f"{fmt_spread(r['time_speedup']):>22} | {fmt_spread(r['flop_speedup']):>22} | "
                     f"{r['reached']}/{len(r['per_seed'])}")
        else:
            note = ("(the baseline)" if r["arm"] == best
                    else "" if r["comparable"] else "(own length: not comparable)")
            extra = f"{note:>22} |"
        vs_target = f"{fmt_spread(r['time_speedup_vs_target'])} ({r['reached_target']} reached)" \
            if "time_speedup_vs_target" in r else ""
        print(f"{r['arm']:<34} | {losses:<28} | {r['mean_loss']:6.3f} | {extra} | {vs_target}")


def plot(curves, path):
    """Held-out loss against seconds, every arm and seed (seed 0 labelled).

    Skipped without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, (arm, by_seed) in enumerate(curves.items()):
        color = plt.cm.tab20(i % 20)
        for s, c in sorted(by_seed.items()):
            ax.plot([p[0] for p in c], [p[2] for p in c], color=color,
                    lw=2.0 if arm.startswith("static") else 1.0,
                    ls="--" if arm.startswith("static") else "-", alpha=0.9,
                    label=arm if s == min(by_seed) else None)
    ax.set(xlabel="wall-clock seconds", ylabel="held-out MLM loss",
           title="growth against static baselines")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# -----------------------------------------------------------------------------
# Running

def train_command(args, out, seed, flags):
    """The train.py command line of one run; --force replaces the outputs of an earlier bench."""
    return [
        sys.executable, os.path.join(ROOT, "train.py"), "--data", "sample", "--cache", args.cache,
        *shlex.split(args.train_flags), *shlex.split(flags), "--minutes", str(args.minutes),
        "--seed", str(seed), "--eval-every", str(args.eval_every),
        "--eval-batches", str(args.eval_batches), "--log-every", "10",
        "--checkpoint-minutes", "1000", "--out", out, "--force"]


def folder(args, arm, seed):
    name = re.sub(r"[^a-z0-9.+]+", "_", arm.lower()).strip("_")
    return os.path.join(args.out, name + f"-seed{seed}")


def main(argv=None):
    args = parse_args(argv)
    cfg, lr = target_config(args.train_flags)
    flags = arm_flags(cfg, lr)
    names, unknown = split_arms(args.arms, flags) if args.arms else (list(flags), [])
    if unknown:
        raise SystemExit(f"error: --arms: unknown arm(s) {unknown}; known: {'; '.join(flags)}")
    os.makedirs(args.out, exist_ok=True)
    print(f"{len(names)} arms x {args.seeds} seeds x {args.minutes} min, two lanes of one thread; "
          f"target: {args.train_flags} (lr {lr:g} by the width rule)", flush=True)
    start = time.time()
    if not args.analyze_only:
        jobs = []
        for seed in range(args.seeds):
            for arm in names:
                out = folder(args, arm, seed)
                if not (args.reuse and os.path.exists(os.path.join(out, "summary.json"))):
                    jobs.append((out, train_command(args, out, seed, flags[arm])))
        run_lanes(jobs, args.out)
    curves = {a: {s: read_run(folder(args, a, s)) for s in range(args.seeds)
                  if os.path.exists(os.path.join(folder(args, a, s), "summary.json"))}
              for a in names}
    curves = {a: c for a, c in curves.items() if c}
    result = analyze(curves)
    print_table(result)
    print(f"({time.time() - start:.0f} s)")
    blob = {"args": vars(args), "flags": {a: flags[a] for a in names}, "target": cfg, **result,
            "curves": curves}
    path = os.path.join(args.out, "bench_grow.json")
    files.atomic_write(path, lambda f: f.write(json.dumps(blob, indent=1).encode()))
    png = plot(curves, os.path.join(args.out, "curves.png"))
    print(f"wrote {path}" + (f" and {png}" if png else " (pip install matplotlib for curves.png)"))
    return blob


if __name__ == "__main__":
    main()
