"""BigScience's architecture ablation at CPU scale, judged by zero-shot accuracy, not loss alone.

    python bench/bench_ablation.py                        # 8 arms x 2 seeds x 2 min, bundled sample
    python bench/bench_ablation.py --minutes 5 --seeds 3 --items 1000
    python bench/bench_ablation.py --analyze-only         # re-evaluate the finished runs in --out

Le Scao et al. 2022 ("What Language Model to Train if You Have One Million GPU Hours?") trained
small decoders under one budget and compared their average zero-shot accuracy; they found ALiBi
ahead of learned and rotary positions and the embedding LayerNorm costing accuracy. Here: one
causal decoder shape (--train-flags), one wall-clock budget, positions learned / rotary / ALiBi /
none, each with and without the embedding LayerNorm, two lanes of one thread
(bench_recipe.run_lanes). Every run is then scored by evaluate_lm.py on its held-out loss and on
the built-in zero-shot tasks made from the validation documents of the same prepared data (cloze:
the true next sentence among 4; last-word: the final word of a 40-word passage). Prints every seed
and the spread, writes results.json.
"""
import json
import os
import shlex
import statistics
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:0] = [ROOT, BENCH]
import evaluate_lm  # noqa: E402
import files  # noqa: E402
from bench_recipe import check_lane_args, lane_bench_parser, run_lanes  # noqa: E402

TARGET = ("--objective clm --model tiny --n-layers 4 --d-model 64 --n-heads 4 --ffn-dim 128 "
          "--max-seq-len 64 --vocab-size 2048 --micro-batch 16 --batch-tokens 2048")
ARMS = {f"{positions}, {'emb norm' if norm else 'no emb norm'}":
        f"--positions {positions} --embedding-norm {'on' if norm else 'off'}"
        for positions in ("learned", "rotary", "alibi", "none") for norm in (True, False)}


def parse_args(argv=None):
    p = lane_bench_parser(__doc__, seeds=2, out="runs/bench_ablation")
    p.add_argument("--train-flags", default=TARGET,
                   help="train.py flags of the decoder shared by all arms")
    p.add_argument("--items", type=int, default=500, help="items per zero-shot task")
    args = p.parse_args(argv)
    check_lane_args(p, args)
    if args.items < 1:
        p.error("--items must be >= 1")
    return args


def folder(args, arm, seed):
    return os.path.join(args.out, arm.replace(", ", "-").replace(" ", "_") + f"-seed{seed}")


def command(args, arm, seed):
    out = folder(args, arm, seed)
    return out, [
        sys.executable, os.path.join(ROOT, "train.py"), "--data", "sample", "--cache", args.cache,
        *shlex.split(args.train_flags), *shlex.split(ARMS[arm]), "--minutes", str(args.minutes),
        "--seed", str(seed), "--eval-every", "0.25", "--log-every", "50",
        "--checkpoint-minutes", "1000", "--out", out, "--force"]


def score(args, run):
    """Held-out loss and zero-shot accuracy of one finished run.

    The tasks are made from the validation split of the run's own data."""
    with open(os.path.join(run, "summary.json")) as f:
        summary = json.load(f)
    held_out = os.path.join(args.cache, summary["comparable"]["data"])
    result = evaluate_lm.evaluate(os.path.join(run, "final"), tasks=evaluate_lm.BUILT_IN, settings={
        "held_out": held_out, "n_items": args.items, "progress": False})
    t = result["tasks"]
    return {"val_loss": summary["final_val_loss"], "cloze": t["cloze"]["metrics"]["acc"],
            "cloze_norm": t["cloze"]["metrics"]["acc_norm"],
            "last_word": t["last-word"]["metrics"]["acc"],
            "last_word_ppl": t["last-word"]["metrics"]["perplexity"]}


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if not args.analyze_only:
        run_lanes([command(args, arm, s) for s in range(args.seeds) for arm in ARMS
                   if not (args.reuse
                           and os.path.exists(os.path.join(folder(args, arm, s), "summary.json")))],
                  args.out)
    scores = {arm: [score(args, folder(args, arm, s)) for s in range(args.seeds)] for arm in ARMS}
    keys = ("val_loss", "cloze", "cloze_norm", "last_word", "last_word_ppl")
    print(f"\n{args.minutes:g} min per run, {args.seeds} seeds; "
          f"zero-shot on {args.items} held-out items per task")
    print(f"{'arm':<26} | " + " | ".join(f"{k:>23}" for k in keys))
    rows = []
    for arm, runs in scores.items():
        cells = {k: [r[k] for r in runs] for k in keys}
        stats = {k: {"mean": statistics.mean(v), "min": min(v), "max": max(v), "seeds": v}
                 for k, v in cells.items()}
        rows.append({"arm": arm, **stats})
        columns = [f"{statistics.mean(v):7.3f} [{min(v):.2f}-{max(v):.2f}]".rjust(23)
                   for v in cells.values()]
        print(f"{arm:<26} | " + " | ".join(columns))
    path = os.path.join(args.out, "results.json")
    result = {"args": vars(args), "rows": rows}
    files.atomic_write(path, lambda f: f.write(json.dumps(result, indent=1).encode()))
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
