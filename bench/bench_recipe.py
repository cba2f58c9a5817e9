"""Which levers of the recipe matter in a short budget? One lever at a time, at equal wall clock.

    python bench/bench_recipe.py                                 # bundled sample, 2 seeds x 2 min
    python bench/bench_recipe.py --data corpora/pydocs.jsonl.gz  # any corpus train.py accepts
    python bench/bench_recipe.py --arms "default,positions=sinusoidal,lr=4e-3" --minutes 1

Every run is train.py with the same --data, budget, seed and evaluation; the `default` arm adds
nothing to --base-flags (empty: train.py's own defaults for this machine and budget), and every
other arm changes one lever. The levers are the ones the literature says matter in a short budget:
position scheme, peak learning rate, schedule shape, batch size and its ramp, sequence-length
warm-up (Li et al. 2022), masking rate, model shape at about the same parameter count, and growth
(grow.py). Runs go two at a time with one thread each, so a load spike from another process slows
both lanes alike; the arms are interleaved by seed.

For each arm it prints the final held-out loss of every seed, their mean, and the difference to the
default arm's mean; negative is better. The loss is on the same held-out batches for every arm, at
the target sequence length, with 25% of the tokens masked whatever the arm trained with. Writes
results.json.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import files  # noqa: E402
import model  # noqa: E402
from loader import load_meta, make_loader  # noqa: E402

# One lever per arm: a name and the train.py flags it adds to the base flags.
ARMS = {
    "default": "",
    "positions=sinusoidal": "--positions sinusoidal",   # cramming's scaled sinusoids
    "positions=learned": "--positions learned",         # BERT's learned absolute positions
    "positions=alibi": "--positions alibi",
    # The default's peak rate, divided or multiplied.
    "lr/4": "--lr {lr_quarter}",
    "lr/2": "--lr {lr_half}",
    "lr*2": "--lr {lr_double}",
    # Cramming's rate for the base model, unscaled.
    "lr=1e-3": "--lr 1e-3",
    "schedule=linear": "--schedule linear",             # 6% warm-up, then linearly to 0
    "schedule=cosine": "--schedule cosine",
    "schedule=one-cycle": "--schedule one-cycle",
    # No decay: what No Train No Gain warns against.
    "schedule=constant": "--schedule constant",
    "batch-ramp=off": "--batch-ramp 0",
    "batch/4": "--batch-tokens {batch_quarter}",
    "batch*4": "--batch-tokens {batch_times4}",
    "seq-warmup": ("--grow '0:max_seq_len={seq_quarter}; 0.2:max_seq_len={seq_half}; "
                   "0.4:max_seq_len={seq}'"),
    "mask-rate=0.15": "--mask-rate 0.15",                # BERT's rate
    "mask-rate=0.40": "--mask-rate 0.4",                 # Wettig et al. 2023
    "deeper-narrower": "--n-layers {layers_times2} --d-model {d_narrow} --ffn-dim {f_narrow}",
    "grow=compound": "--grow compound",
}


def lane_bench_parser(doc, seeds, out):
    """The command line every lane bench shares: budget, seeds, folders.

    The lane benches are bench_recipe, bench_grow and bench_ablation."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--minutes", type=float, default=2.0,
                   help="wall-clock budget of every run, in minutes")
    p.add_argument("--seeds", type=int, default=seeds, help="seeds per arm")
    p.add_argument("--out", default=out, help="folder for the runs and the JSON result")
    p.add_argument("--cache", default="cache", help="train.py's data cache")
    p.add_argument("--reuse", action="store_true",
                   help="keep the finished runs already in --out, run the rest")
    p.add_argument("--analyze-only", action="store_true",
                   help="do not train: analyze the runs already in --out")
    return p


def check_lane_args(p, args):
    if args.minutes <= 0 or args.seeds < 1:
        p.error("--minutes must be positive and --seeds >= 1")


def parse_args(argv=None):
    p = lane_bench_parser(__doc__, seeds=2, out="runs/bench_recipe")
    p.add_argument("--data", default="sample", help="corpus for train.py --data")
    p.add_argument("--arms", default=",".join(ARMS),
                   help="comma-separated arm names (see ARMS in this file)")
    p.add_argument("--base-flags", default="",
                   help="train.py flags every arm starts from (default: none)")
    args = p.parse_args(argv)
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        p.error(f"--arms: unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    check_lane_args(p, args)
    return args


def read_final(folder):
    """(final held-out loss, resolved model config, global batch in tokens) of a finished run."""
    with open(os.path.join(folder, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(folder, "final", "config.json")) as f:
        cfg = json.load(f)
    return summary["final_val_loss"], cfg, summary


def loss_at_common_masking(folder, cache, mask_rate=0.25, batches=16):
    """The held-out loss of a run's final model on held_out.HeldOut's batches, with mask_rate of the
    tokens masked. A run reports its loss at its own masking rate, and those are not comparable:
    fewer masks leave more context to each prediction. For a run trained at mask_rate this
    reproduces its reported loss."""
    import torch

    with open(os.path.join(folder, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(folder, "args.json")) as f:
        micro_batch = json.load(f)["micro_batch"]
    meta = load_meta(os.path.join(cache, summary["comparable"]["data"]))
    net = model.load_model(os.path.join(folder, "final")).eval()
    loader = make_loader(meta, "val", {"seed": 1234, "mask_rate": mask_rate}, prefetch=False)
    seq_len = summary["comparable"]["seq_len"]
    with torch.no_grad():
        return sum(net(**loader.next_batch(micro_batch, seq_len))["loss"].item()
                   for _ in range(batches)) / batches


def arm_flags(name, default_cfg, batch_tokens, lr):
    """The arm's flags, with the placeholders filled from the default run's resolved config,
    global batch and peak learning rate."""
    d, L, f, T = (default_cfg["d_model"], default_cfg["n_layers"], default_cfg["ffn_dim"],
                  default_cfg["max_seq_len"])
    heads = default_cfg["n_heads"]
    step = 2 * heads  # an even head size, which rotary positions need
    # About the same parameters at twice the depth.
    d_narrow = max(step, round(d / 2 ** 0.5 / step) * step)
    return ARMS[name].format(
        lr_quarter=f"{lr / 4:g}", lr_half=f"{lr / 2:g}", lr_double=f"{lr * 2:g}",
        batch_quarter=max(T, batch_tokens // 4), batch_times4=batch_tokens * 4,
        seq=T, seq_half=T // 2, seq_quarter=max(4, T // 4), layers_times2=2 * L,
        d_narrow=d_narrow, f_narrow=max(8, round(f * d_narrow / d)))


def command(args, name, seed, flags):
    out = os.path.join(args.out, f"{name}-seed{seed}")
    if args.reuse and os.path.exists(os.path.join(out, "summary.json")):
        return None
    return out, [
        sys.executable, os.path.join(ROOT, "train.py"), "--data", args.data, "--cache", args.cache,
        *shlex.split(args.base_flags), *shlex.split(flags), "--minutes", str(args.minutes),
        "--seed", str(seed), "--eval-every", "0.1", "--eval-batches", "16", "--log-every", "50",
        "--checkpoint-minutes", "1000", "--out", out, "--force"]  # replaces an earlier bench's run


def run_lanes(jobs, out_root):
    """Run (out, cmd) jobs two at a time, one thread each, with output to a file: a full pipe would
    block a run. None stands for a finished run kept by --reuse."""
    jobs = [j for j in jobs if j is not None]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for i in range(0, len(jobs), 2):
        procs = []
        for out, cmd in jobs[i:i + 2]:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "train_output.txt"), "w") as log:
                procs.append((out, cmd, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                                         stderr=subprocess.STDOUT)))
        for out, cmd, proc in procs:
            if proc.wait():
                # An orphaned lane would load the machine under the next benchmark.
                for _, _, other in procs:
                    other.kill()
                with open(os.path.join(out, "train_output.txt")) as f:
                    raise SystemExit(f"bench_recipe.py: train.py failed ({shlex.join(cmd)}):\n"
                                     f"{f.read()[-2000:]}")
        finished = ", ".join(os.path.relpath(o, out_root) for o, _ in jobs[i:i + 2])
        print(f"  {finished} done", flush=True)


def table(results, names):
    """Rows of (arm, per-seed losses, mean, mean - default mean)."""
    base = statistics.mean(results["default"])
    return [(n, results[n], statistics.mean(results[n]), statistics.mean(results[n]) - base)
            for n in names]


def main(argv=None):
    args = parse_args(argv)
    names = ["default"] + [a for a in args.arms.split(",") if a != "default"]
    os.makedirs(args.out, exist_ok=True)
    print(f"{len(names)} arms x {args.seeds} seeds x {args.minutes} min on {args.data}; "
          f"base flags: {args.base_flags or '(train.py defaults)'}", flush=True)
    start = time.time()
    # The default arm first: the others' flags are sized from its resolved config.
    if not args.analyze_only:
        run_lanes([command(args, "default", s, "") for s in range(args.seeds)], args.out)
    _, default_cfg, default_summary = read_final(os.path.join(args.out, "default-seed0"))
    with open(os.path.join(args.out, "default-seed0", "args.json")) as f:
        resolved = json.load(f)  # train.py saves the defaults it chose
    flags = {n: arm_flags(n, default_cfg, resolved["batch_tokens"], resolved["lr"]) for n in names}
    if not args.analyze_only:
        run_lanes([command(args, n, s, flags[n])
                   for s in range(args.seeds) for n in names if n != "default"], args.out)
    own = {n: [read_final(os.path.join(args.out, f"{n}-seed{s}"))[0] for s in range(args.seeds)]
           for n in names}
    results = {n: [loss_at_common_masking(os.path.join(args.out, f"{n}-seed{s}"), args.cache)
                   for s in range(args.seeds)] for n in names}
    rows = table(results, names)
    print(f"\nfinal held-out loss after {args.minutes} min at 25% masking "
          f"({time.time() - start:.0f} s in all)")
    print(f"{'arm':<22} | {'flags':<58} | {'seeds':<15} | {'mean':>6} | {'vs default':>10} | "
          "own masking rate")
    for n, losses, mean, delta in rows:
        print(f"{n:<22} | {flags[n][:58]:<58} | {' '.join(f'{x:.3f}' for x in losses):<15} | "
              f"{mean:6.3f} | {delta:+10.3f} | {statistics.mean(own[n]):.3f}")
    result = {"args": vars(args), "flags": flags, "default_config": default_cfg,
              "arms": [{"arm": n, "losses": losses, "mean": m, "delta": d,
                        "losses_at_own_mask_rate": own[n]} for n, losses, m, d in rows]}
    path = os.path.join(args.out, "results.json")
    files.atomic_write(path, lambda f: f.write(json.dumps(result, indent=1).encode()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
