"""Does a change to the code change what training computes?

Four fixed runs, their logged losses compared:

    python tests/same_losses.py --save tests/same_losses.json   # record (before a refactor)
    python tests/same_losses.py                                 # compare: exit 1 if any differs

The first three runs are the ones a restructure is most likely to disturb: a plain run, a grown run
(two growth stages, so the optimizer and the wrapping are rebuilt mid-run) and a two-source corpus
mixture. They keep cramming's AdamW, triangle schedule, no growth and no value residual, train.py's
defaults when they were recorded, so their record still holds since the defaults changed; the
fourth run pins today's defaults (recorded again when depth growth and the value residual joined,
again when 40% masking did, again when growth at 20% and the linear decay did: record 6, and
again when growth moved to 15%: record 7, and again when every block began to run the value
residual's code, the first mixing in zeros at weight 0: that run's losses moved in the last bits
only, because the first block's values now reach attention as a contiguous tensor instead of a
view of the qkv projection; the old code with that one `.contiguous()` added gives the new record
bit for bit; and again when Muon began to orthogonalize the matrices of one shape together, with
baddbmm: every logged number within 5e-7 of the record before; and again when NorMuon's per-neuron
normalization joined Muon: record 9, every logged number within 6e-4 of record 8's; and again
when the weights' average joined: record 10, the training losses within 2e-7 of record 9's, the
held-out losses now the average's).
Each is a fresh `python train.py` process on the bundled sample with a fixed seed and a step budget
(a deterministic clock), on the CPU. Everything they log is compared: every step's loss and
gradient norm, every held-out loss (per source for the mixture) and the losses around each growth
event. tests/test_same_losses.py runs this too.
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(ROOT, "tests", "same_losses.json")
COMMON = ["--model", "tiny", "--vocab-size", "512", "--max-seq-len", "32", "--micro-batch", "4",
          "--batch-tokens", "512", "--lr", "2e-3", "--eval-batches", "2", "--eval-every", "0.25",
          "--log-every", "1", "--seed", "3", "--device", "cpu", "--dtype", "fp32"]
# train.py's recipe before Muon, warmup-stable-decay, depth growth, the value residual, 40%
# masking and the weights' average became the defaults. The tests of mechanics that need a loss
# to fall within a few dozen steps of 128-256 tokens pin it too (conftest.py): at such tiny
# batches Muon's fixed-size steps learn slower than AdamW's (docs/train.md). A test that grows
# puts its own --grow after these flags: the last wins.
CRAMMING_ADAMW = ["--optimizer", "adamw", "--schedule", "triangle", "--grow", "none",
                  "--value-residual", "off", "--mask-rate", "0.25", "--ema", "0"]
RUNS = {
    "plain": ["--data", "sample", "--max-steps", "24", *CRAMMING_ADAMW],
    "grown": ["--data", "sample", "--max-steps", "24", *CRAMMING_ADAMW,
              "--grow", "0:n_layers=1; 0.5:n_layers=2"],  # the last --grow wins
    "mixture": ["--data", "{plays}:0.7,{sonnets}:0.3", "--max-steps", "16", *CRAMMING_ADAMW],
    "defaults": ["--data", "sample", "--max-steps", "24"],
}
LOGGED = ("loss", "grad_norm", "val_loss", "val_loss_by_source", "val_loss_before",
          "val_loss_after")


def write_mixture_sources(folder):
    """Two sources cut from the bundled sample: four plays and two more works."""
    with gzip.open(os.path.join(ROOT, "corpora", "shakespeare.jsonl.gz"), "rt") as f:
        works = [json.loads(line)["text"] for line in f]
    paths = {}
    for name, docs in (("plays", works[:4]), ("sonnets", works[4:6])):
        paths[name] = os.path.join(folder, name + ".jsonl")
        with open(paths[name], "w") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    return paths


def losses_of(log_path):
    """[(kind, step, {field: value})] of every record in log.jsonl, with only the loss fields."""
    with open(log_path) as f:
        records = [json.loads(line) for line in f]
    return [[r["kind"], r.get("step"), {k: r[k] for k in LOGGED if k in r}] for r in records]


def run_all(folder, threads=2):
    """{run name: losses_of its log}: each run in a fresh process, one cache shared by all."""
    paths, found = write_mixture_sources(folder), {}
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0"}
    for name, flags in RUNS.items():
        flags = [f.format(**paths) for f in flags]
        out = os.path.join(folder, name)
        cmd = [sys.executable, os.path.join(ROOT, "train.py"), *flags, *COMMON,
               "--cache", os.path.join(folder, "cache"), "--out", out]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"error: run {name} failed:\n"
                             f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        found[name] = losses_of(os.path.join(out, "log.jsonl"))
    return found


def differences(found, recorded):
    """Lines naming each run, record and field that differs from the record; empty: all the same."""
    lines = []
    for name in RUNS:
        got, want = found.get(name, []), recorded.get(name, [])
        if len(got) != len(want):
            lines.append(f"{name}: {len(got)} records, the record has {len(want)}")
        for g, w in zip(got, want):
            if g != w:
                lines.append(f"{name}: {g[0]} record at step {g[1]}: {g[2]} != recorded {w[2]}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--save", metavar="FILE",
                        help="record the losses in FILE instead of comparing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        found = run_all(folder)
    if args.save:
        with open(args.save, "w") as f:
            json.dump(found, f, indent=1)
        n_records = sum(map(len, found.values()))
        print(f"recorded {n_records} records of {len(found)} runs in {args.save}")
        return
    with open(RECORD) as f:
        diff = differences(found, json.load(f))
    print("\n".join(diff[:20]) if diff
          else f"the same losses as {RECORD}, exactly, in all {len(RUNS)} runs")
    sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
