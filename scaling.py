"""scaling.py: scaling-law fits and compute planning, from published constants or from our own runs.

Turns "I have H GPU hours" into "train this shape on this many tokens":

    python scaling.py plan --hours 24 --gpu a100     # published constants (Epoch's refit)
    python scaling.py sweep --hours 12 --gpu a100    # train.py commands of a small IsoFLOP sweep
    python scaling.py fit runs/sweep/*               # constants with bootstrap intervals: fit.json
    python scaling.py plan --hours 24 --gpu a100 --fit fit.json

The law is Chinchilla's parametric form (Hoffmann et al. 2022, "Training Compute-Optimal Large
Language Models", Eq. 2 and App. D.2): L(N, D) = E + A / N^alpha + B / D^beta, N parameters, D
training tokens. fit.py fits it as they describe (log-space Huber, delta = 1e-3, many starts), but
summed and run to convergence, which Epoch AI's replication (Besiroglu et al. 2024) showed the
published, rounded constants were not. With C = 6 N D the compute-optimal allocation is
closed-form (Hoffmann et al. Sec. 3.3, Eq. 4): N*(C) = G (C/6)^a, D*(C) = (C/6)^b / G,
G = (alpha A / (beta B))^(1 / (alpha + beta)), a = beta/(alpha+beta), b = 1-a.

Conventions. N counts the parameters the way the constants were fitted: the published sets count all
parameters (Chinchilla); our own fits use summary.json's "params" (non-embedding, Kaplan et al.
2020). The constant sets record which ("N_counts") and the shape planner matches N the same way.
Points are dicts {"N", "D", "loss"} with optional "C" (training FLOPs actually spent) and "run_id"
(points of one run are resampled together). numpy only; parameter and FLOP counts come from model.py
(imported when needed: it pulls in torch); matplotlib only for the optional plot.
"""
import argparse
import csv
import json
import math
import os
import re

import numpy as np

import files  # atomic writes of the JSON and PNG files (the standard library only: no torch)

# The numerics of every fit below (numpy only), by name: in this file "fit" is a fitted law.
# fit_power_law is part of this file's API too (cmd_fit fits the loss-vs-compute frontier with it).
from fit import (
    check_points,
    fit_power_law,
    levenberg_marquardt,
    lse_model,
    multistart,
    projection_starts,
    to_params,
)

# -----------------------------------------------------------------------------
# Accounting: hardware peaks, and hours x GPUs x MFU -> FLOPs -> tokens

# The model FLOPs utilization every plan assumes: what a well-tuned small-model run reaches
# (nanoGPT measures ~37% on an A100; PaLM App. B defines MFU). train.py's defaults and its
# download size use it too (planning.py)
PLANNING_MFU = 0.4

# Dense (no 2:4 sparsity) tensor-core peak FLOP/s for bf16 inputs with fp32 accumulation, per GPU,
# from the vendor datasheets / architecture whitepapers (the same values as nanochat's
# get_peak_flops table where they overlap). GeForce cards accumulate in fp32 at half their
# fp16-accumulate rate; pre-Ampere cards have no bf16, so their fp16 (fp32-accumulate) peak is
# listed, which is what torch autocast fp16 uses.
GPU_PEAK_FLOPS = {
    # Turing whitepaper: RTX 2080 Ti 107.6 TF fp16-acc, 53.8 fp32-acc; fp16 only (cramming's GPU)
    "2080ti": 53.8e12,
    "v100": 125e12,        # V100 SXM2 datasheet, fp16 tensor; no bf16
    "t4": 65e12,           # T4 datasheet, fp16 tensor; no bf16
    "3090": 71e12,         # GA102 whitepaper: 142 TF fp16-acc, 71 fp32-acc (bf16)
    "a10": 125e12,         # A10 datasheet, bf16 dense
    "a40": 149.7e12,       # A40 datasheet, bf16 dense
    "a6000": 154.8e12,     # RTX A6000 datasheet: 154.8 dense, 309.7 sparse (cramming's last GPU)
    "4090": 165.2e12,      # Ada whitepaper: 165.2 fp32-acc dense, 330.3 with sparsity
    "l4": 121e12,          # L4 datasheet: 242 with sparsity
    "l40s": 362e12,        # L40S datasheet: 733 with sparsity
    "a100": 312e12,        # A100 datasheet: 312 dense, 624 with sparsity (both 40 and 80 GB)
    "h100-pcie": 756e12,   # H100 PCIe datasheet: 1513 with sparsity
    "h100-nvl": 835e12,    # H100 NVL datasheet: 1671 with sparsity
    "h100": 989e12,        # H100 SXM datasheet: 1979 with sparsity
    "h200": 989e12,        # H200 SXM datasheet: same compute as H100 SXM, more memory
    "b200": 2250e12,       # B200 datasheet: 4500 with sparsity
}


def peak_flops(gpu):
    """Peak bf16 FLOP/s of one GPU: a table name ("a100", "H100 SXM", "rtx-4090"), a CUDA device
    name as torch.cuda.get_device_name gives it ("NVIDIA A100-SXM4-80GB",
    "NVIDIA GeForce RTX 2080 Ti"), or a number of FLOP/s such as "150e12" for hardware not in the
    table. Names match whole words ("A10G" is not an "A10")."""
    try:
        if float(gpu) >= 1e9:
            return float(gpu)
    except (TypeError, ValueError):
        pass
    words = re.findall(r"[a-z0-9]+", str(gpu).lower())
    # The longest names first, so that "h100-pcie" is tried before "h100".
    for key in sorted(GPU_PEAK_FLOPS, key=lambda k: -len(k.replace("-", ""))):
        if any("".join(words[i:j]) == key.replace("-", "") for i in range(len(words))
               for j in range(i + 1, min(i + 3, len(words)) + 1)):
            return GPU_PEAK_FLOPS[key]
    raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPU_PEAK_FLOPS)}, or give its peak "
                     "in FLOP/s (>= 1e9)")


def budget_flops(hours, gpu, n_gpus=1, mfu=0.4):
    """Model FLOPs a budget buys: hours * 3600 * n_gpus * peak * MFU (MFU as in PaLM, App. B)."""
    if not (hours > 0 and math.isfinite(hours)):
        raise ValueError(f"hours must be positive, got {hours!r}")
    if not (isinstance(n_gpus, int) and n_gpus >= 1) or not 0 < mfu <= 1:
        raise ValueError(f"need an integer n_gpus >= 1 and mfu in (0, 1], got n_gpus={n_gpus!r}, "
                         f"mfu={mfu!r}")
    return hours * 3600.0 * n_gpus * peak_flops(gpu) * mfu


def model_accounting(cfg):
    """Parameters and training FLOPs per token of a model.py config, from model.py itself."""
    import model  # here, not at the top: fits and plots need no torch
    return {"params": model.count_params(cfg, embeddings=False),
            "params_total": model.count_params(cfg),
            "flops_per_token": model.flops_per_token(cfg)}


def hours_to_tokens(hours, gpu, flops_per_token, n_gpus=1, mfu=0.4):
    """How many tokens a model costing flops_per_token (model.flops_per_token) trains on."""
    if not flops_per_token > 0:
        raise ValueError(f"flops_per_token must be positive, got {flops_per_token!r}")
    flops = budget_flops(hours, gpu, n_gpus, mfu)
    return {"flops": flops, "tokens": flops / flops_per_token,
            "tokens_per_sec": flops / flops_per_token / (hours * 3600.0),
            "peak_flops": peak_flops(gpu)}


# -----------------------------------------------------------------------------
# The law and its compute-optimal frontier

PUBLISHED = {
    # Besiroglu et al. 2024 (Epoch AI): Chinchilla's own data refitted to convergence. The default:
    # it also agrees with Chinchilla's Approaches 1 and 2 (about 20 tokens per parameter).
    "epoch": {"E": 1.8172, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658,
              "N_counts": "total",
              "source": "Besiroglu et al. 2024 (Epoch AI) refit of Chinchilla's data"},
    # Hoffmann et al. 2022, Approach 3 as printed (rounded).
    # It implies 60-90 tokens per parameter at Chinchilla's budget.
    "hoffmann": {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28,
                 "N_counts": "total",
                 "source": "Hoffmann et al. 2022 (Chinchilla), Approach 3"},
}
CAVEAT = ("published constants were fitted on decoder LMs trained on MassiveText (N = all "
          "parameters); for BERT MLM on our data they only suggest an allocation: run "
          "`scaling.py sweep` and `fit` for your own")


def predict_loss(N, D, params):
    """L(N, D) = E + A / N^alpha + B / D^beta (Hoffmann et al. Eq. 2); N, D scalars or arrays."""
    N, D = np.asarray(N, float), np.asarray(D, float)
    return params["E"] + params["A"] * N ** -params["alpha"] + params["B"] * D ** -params["beta"]


def compute_optimal(C, params):
    """argmin_N L(N, C / 6N) in closed form. Setting d/dN [A N^-alpha + B (C/6)^-beta N^beta] = 0
    gives N^(alpha+beta) = (alpha A / (beta B)) (C/6)^beta, hence N* = G (C/6)^a and
    D* = C / (6 N*) = (C/6)^b / G."""
    if not (np.all(np.asarray(C) > 0) and np.all(np.isfinite(C))):
        raise ValueError(f"compute budget must be positive and finite, got {C!r}")
    alpha, beta = params["alpha"], params["beta"]
    G = (alpha * params["A"] / (beta * params["B"])) ** (1.0 / (alpha + beta))
    a, b = beta / (alpha + beta), alpha / (alpha + beta)
    N = G * (np.asarray(C, float) / 6.0) ** a
    D = np.asarray(C, float) / (6.0 * N)
    return {"C": C, "N": N, "D": D, "tokens_per_param": D / N, "loss": predict_loss(N, D, params),
            "G": G, "a": a, "b": b}


def tokens_for_params(N, params):
    """The D that makes a model of N parameters compute-optimal: D = G^-(1 + b/a) N^(b/a)."""
    opt = compute_optimal(1.0, params)
    return opt["G"] ** -(1 + opt["b"] / opt["a"]) * np.asarray(N, float) ** (opt["b"] / opt["a"])


# -----------------------------------------------------------------------------
# Fitting the law to runs (the numerics, log-space Huber and batched Levenberg-Marquardt, are in
# fit.py), and the cross-checks

def _law(theta, ref):
    """fit.to_params's constants plus a, b and G of their compute-optimal frontier (NaN when an
    exponent is not positive: then the law has no finite optimum)."""
    params = to_params(theta, *ref)
    ok = params["alpha"] > 0 and params["beta"] > 0
    opt = compute_optimal(1.0, params) if ok else {"a": math.nan, "b": math.nan, "G": math.nan}
    return {**params, "a": opt["a"], "b": opt["b"], "G": opt["G"]}


def fit_chinchilla(points, delta=1e-3, init="projection"):
    """Fit the law to points [{"N", "D", "loss"}, ...] as the module docstring describes.
    init="projection" (fast, default) starts from the best variable-projection solutions,
    init="grid" from the paper's 4500-point grid (slower, same answer). Returns unrounded constants,
    a, b, G, the objective, convergence and log-residual diagnostics."""
    # five parameters (E, A, B, alpha, beta): at least five points
    pts, N, D, L = check_points(points, 5, "fit_chinchilla")
    # centre ln N and ln D, so a and b do not trade off against alpha and beta
    x_ref, y_ref = np.log(N).mean(), np.log(D).mean()
    X = np.stack([np.log(N) - x_ref, np.log(D) - y_ref])
    # residuals in log loss, as Hoffmann et al. (Approach 3) fit them
    model = lse_model(X, np.log(L))
    if init == "projection":
        # exponents 0.05 .. 1.2 in steps of 0.025: 47 values for each of alpha and beta
        starts = projection_starts(X, L, np.arange(0.05, 1.2001, 0.025))
    elif init == "grid":
        # Hoffmann et al.'s 4500 initialisations: a, b in {0, 5, .., 25}, e in {-1, -0.5, .., 1},
        # alpha, beta in {0, 0.5, .., 2}; 6 * 6 * 5 * 5 * 5 = 4500
        grid = (np.arange(0, 26, 5.0), np.arange(0, 26, 5.0), np.arange(-1, 1.01, 0.5),
                np.arange(0, 2.01, 0.5), np.arange(0, 2.01, 0.5))
        a, b, e, al, be = (g.ravel() for g in np.meshgrid(*grid, indexing="ij"))
        # the paper's a, b are for uncentred ln N, ln D: move them to centred units
        starts = np.stack([a - al * x_ref, b - be * y_ref, e, al, be], axis=1)
    else:
        raise ValueError(f"init must be 'projection' or 'grid', got {init!r}")
    # every point weighs 1: the Huber loss is summed, not averaged (Besiroglu et al. 2024)
    best = multistart(model, starts, np.ones_like(L), delta)
    r = best["residuals"]
    return {**_law(best["theta"], (x_ref, y_ref)), "objective": float(best["objective"]),
            "converged": bool(best["converged"]), "iterations": int(best["iterations"]),
            "grad_norm": float(best["grad_norm"]),
            "rms_log_residual": float(np.sqrt(np.mean(r * r))),
            "max_log_residual": float(np.max(np.abs(r))), "n_points": len(pts),
            "n_runs": len({p.get("run_id", i) for i, p in enumerate(pts)}), "delta": delta,
            # the "_" keys are for bootstrap's warm start; cmd_fit leaves them out of fit.json
            "init": init, "_theta": best["theta"], "_ref": (x_ref, y_ref)}


def bootstrap(points, fit=None, n_boot=200, seed=0, level=0.95, delta=1e-3):
    """Confidence intervals by resampling runs with replacement (all evaluations of a run go
    together; a point without "run_id" is its own run), each resample refitted from the full fit
    (Epoch's warm start), all resamples in one batched LM: a resample is a vector of per-point
    counts used as Huber weights. Returns {"intervals": {name: [lo, median, hi]}, "samples": {name:
    array}, ...}."""
    # the warm start needs fit_chinchilla's centred theta (a fit read from fit.json has none)
    fit = fit if fit and "_theta" in fit else fit_chinchilla(points, delta)
    # the same canonical order as the fit, so the centring and the points line up
    pts, N, D, L = check_points(points, 5, "bootstrap")
    x_ref, y_ref = fit["_ref"]
    model = lse_model(np.stack([np.log(N) - x_ref, np.log(D) - y_ref]), np.log(L))
    keys = [str(p["run_id"]) if "run_id" in p else f"#point{i}" for i, p in enumerate(pts)]
    # index: the run of each point, so a run's points are drawn together
    groups, index = np.unique(keys, return_inverse=True)
    rng = np.random.default_rng(seed)
    # (n_boot, runs): how often each run is drawn, as many draws as there are runs
    counts = rng.multinomial(len(groups), np.full(len(groups), 1.0 / len(groups)), size=n_boot)
    starts = np.repeat(fit["_theta"][None], n_boot, 0)
    # a run drawn twice weighs 2 in the summed Huber loss: the same as two copies of its points
    out = levenberg_marquardt(model, starts, counts[:, index], delta)
    draws = [_law(t, (x_ref, y_ref)) for t in out["theta"]]
    names = ("E", "A", "B", "alpha", "beta", "a", "b", "G")
    samples = {k: np.array([d[k] for d in draws]) for k in names}
    # percentiles: 2.5, 50 and 97.5 at the default level 0.95
    q = [50 * (1 - level), 50.0, 50 * (1 + level)]
    # nanpercentile: a resample with a non-positive exponent has NaN a, b and G (_law)
    intervals = {k: [float(v) for v in np.nanpercentile(s, q)] for k, s in samples.items()}
    return {"n_boot": n_boot, "seed": seed, "level": level, "n_runs": len(groups),
            "converged_fraction": float(out["converged"].mean()), "intervals": intervals,
            "samples": samples}


def allocation_band(C, boot, level=None):
    """Bootstrap interval of N*(C) and D*(C): push every resampled parameter set through
    compute_optimal."""
    s = boot["samples"]
    level = level or boot["level"]
    names = ("E", "A", "B", "alpha", "beta")
    opt = [compute_optimal(C, {k: s[k][i] for k in names}) for i in range(len(s["E"]))]
    q = [50 * (1 - level), 50.0, 50 * (1 + level)]
    return {k: [float(v) for v in np.nanpercentile([o[k] for o in opt], q)] for k in ("N", "D")}


def _compute(p):
    """Training FLOPs of a point: the measured "C" when the run recorded it, else 6 N D (Kaplan et
    al. 2020)."""
    return p["C"] if p.get("C") else 6.0 * p["N"] * p["D"]


def frontier(points):
    """The points that set a new lowest loss as compute grows (the loss-vs-compute frontier
    BigScience fitted)."""
    best, out = math.inf, []
    for p in sorted(points, key=lambda p: (_compute(p), p["loss"])):
        if p["loss"] < best:
            best = p["loss"]
            out.append(p)
    return out


def final_points(points):
    """The last evaluation (most tokens) of each run; points without run_id are kept as they are."""
    last = {}
    for i, p in enumerate(points):
        key = p.get("run_id", f"#point{i}")
        if key not in last or p["D"] > last[key]["D"]:
            last[key] = p
    return list(last.values())


def fit_isoflop(points, tol=0.25):
    """Chinchilla Approach 2, as a cross-check of the parametric fit: final points grouped into
    budgets (compute within a factor 1 + tol), a parabola of loss in ln N per budget with >= 3
    sizes, its vertex N_opt (kept only when inside the sampled sizes), D_opt interpolated from the
    runs, then power laws N_opt ~ C^a and D_opt ~ C^b."""
    pts = sorted(final_points(points), key=_compute)
    groups, budgets, skipped = [], [], []
    for p in pts:
        if groups and math.log(_compute(p) / _compute(groups[-1][0])) <= math.log1p(tol):
            groups[-1].append(p)
        else:
            groups.append([p])
    for g in groups:
        C = float(np.exp(np.mean([math.log(_compute(p)) for p in g])))
        lnN, lnD = (np.log([p[k] for p in g]) for k in ("N", "D"))
        L = np.array([p["loss"] for p in g])
        if np.unique(lnN).size < 3:
            skipped.append({"C": C, "why": f"{np.unique(lnN).size} model sizes, need 3"})
            continue
        c2, c1, c0 = np.polyfit(lnN, L, 2)
        x_opt = -c1 / (2 * c2) if c2 > 0 else math.nan
        if not lnN.min() <= x_opt <= lnN.max():
            skipped.append({"C": C,
                            "why": "loss has no minimum inside the sampled sizes; widen the sweep"})
            continue
        d1, d0 = np.polyfit(lnN, lnD, 1)
        budgets.append({"C": C, "N_opt": math.exp(x_opt), "D_opt": math.exp(d1 * x_opt + d0),
                        "loss_opt": c0 + c1 * x_opt + c2 * x_opt ** 2, "n_runs": len(g)})
    out = {"budgets": budgets, "skipped": skipped, "a": None, "b": None}
    if len(budgets) >= 2:
        lnC = np.log([b["C"] for b in budgets])
        out["a"] = float(np.polyfit(lnC, np.log([b["N_opt"] for b in budgets]), 1)[0])
        out["b"] = float(np.polyfit(lnC, np.log([b["D_opt"] for b in budgets]), 1)[0])
    return out


# -----------------------------------------------------------------------------
# Planning: a concrete shape for a target N, and the train.py command for it

# The shape rules of suggest_shape; pass a dict with the keys to change
SHAPE = {
    "aspect": 64,        # preferred d_model / n_layers, as BERT-base (768/12) and GPT-2 small
    "head_dim": 64,      # BERT's and GPT-2's head size; heads follow the width
    "multiple_of": 128,  # d_model and ffn_dim step: GPU tiles (BigScience: hidden % 128 == 0)
}


def suggest_shape(n_target, preset="base", count="non_embedding", rules=None, **overrides):
    """The model.py config (preset + overrides) whose parameter count is closest to n_target, with
    d_model a multiple of 128 (GPU tiles; BigScience required hidden % 128 == 0), heads of 64, the
    preset's ffn_dim / d_model ratio (rounded to a multiple of 128) and the vocabulary padded to a
    multiple of 64 (model.padded_vocab_size). Shape matters little for loss at fixed N (Kaplan et
    al. 2020, Fig. 5: aspect ratios 40x apart are within a few percent), so ties are broken towards
    d_model / n_layers = aspect (64 as BERT-base and GPT-2 small): the score is |ln(N / n_target)| +
    0.05 |ln(ratio / aspect)| (a ratio 2x off costs as much as 3.5% in N), plus the distance of
    ln(ratio) outside [aspect/4, 4 aspect], so tiny targets (where the vocabulary dominates N) stay
    sane shapes. count: "non_embedding" or "total", the convention of the constants that produced
    n_target. rules: the keys of SHAPE to change."""
    rules = {**SHAPE, **(rules or {})}
    aspect, head_dim, multiple_of = rules["aspect"], rules["head_dim"], rules["multiple_of"]
    # imported here so that the fits above run with numpy alone (no torch)
    import model
    if not n_target > 0:
        raise ValueError(f"target parameter count must be positive, got {n_target!r}")
    if count not in ("non_embedding", "total"):
        raise ValueError(f"count must be 'non_embedding' or 'total', got {count!r}")
    if multiple_of % head_dim:
        raise ValueError(f"head_dim {head_dim} must divide multiple_of {multiple_of}")
    base = model.make_config(preset, **overrides)
    ratio, vocab = base["ffn_dim"] / base["d_model"], model.padded_vocab_size(base)
    best = None
    for d in range(multiple_of, 64 * 1024 + 1, multiple_of):
        ffn = max(multiple_of, round(ratio * d / multiple_of) * multiple_of)
        for L in range(2, 513):
            shape = {"n_layers": L, "d_model": d, "n_heads": d // head_dim, "ffn_dim": ffn,
                     "vocab_size": vocab}
            cfg = model.make_config(preset, **{**overrides, **shape})
            n = model.count_params(cfg, embeddings=(count == "total"))
            ln_ar = math.log(d / L)
            # the docstring's score: size first, then the aspect ratio, then sane-shape bounds
            score = (abs(math.log(n / n_target)) + 0.05 * abs(ln_ar - math.log(aspect))
                     + max(0.0, ln_ar - math.log(4 * aspect), math.log(aspect / 4) - ln_ar))
            if best is None or score < best[0]:
                best = (score, cfg)
            if n > 2 * n_target:
                break
        if L == 2 and n > 2 * n_target:
            # even 2 layers of this width are too big
            break
    cfg = best[1]
    acct = model_accounting(cfg)
    keys = ("n_layers", "d_model", "n_heads", "ffn_dim", "vocab_size", "max_seq_len", "objective")
    return {"preset": preset, **{k: cfg[k] for k in keys},
            "aspect_ratio": cfg["d_model"] / cfg["n_layers"], "count": count,
            "N": acct["params_total"] if count == "total" else acct["params"], **acct,
            "config": cfg}


def train_command(shape, run=None):
    """The train.py command line for a suggested shape: --model preset plus the shape overrides
    (and budget). run: any of hours, max_tokens, out, data, seq_len, objective, grow (unset ones are
    left out)."""
    run = run or {}
    hours, max_tokens, objective = run.get("hours"), run.get("max_tokens"), run.get("objective")
    seq_len, data, out, grow = run.get("seq_len"), run.get("data"), run.get("out"), run.get("grow")
    flags = [("model", shape["preset"]), ("n-layers", shape["n_layers"]),
             ("d-model", shape["d_model"]), ("n-heads", shape["n_heads"]),
             ("ffn-dim", shape["ffn_dim"]), ("objective", objective),
             ("max-seq-len", seq_len), ("data", data), ("hours", hours and f"{hours:.4g}"),
             ("max-tokens", max_tokens and int(max_tokens)), ("grow", grow), ("out", out)]
    return " ".join(["python train.py"] + [f"--{k} {v}" for k, v in flags if v])


def load_constants(fit_path=None, constants="epoch"):
    """Law constants: a fit.json written by `scaling.py fit`, else a published set from
    PUBLISHED."""
    if fit_path is None:
        if constants not in PUBLISHED:
            raise ValueError(f"unknown constants {constants!r}; choose from {', '.join(PUBLISHED)}")
        return {**PUBLISHED[constants], "name": constants}
    try:
        with open(fit_path) as f:
            blob = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{fit_path}: cannot read a fit JSON ({e})") from None
    fit = blob.get("fit", blob)
    missing = [k for k in ("E", "A", "B", "alpha", "beta")
               if not isinstance(fit.get(k), (int, float))]
    if missing:
        raise ValueError(f"{fit_path}: not a scaling.py fit (missing {', '.join(missing)})")
    return {**fit, "N_counts": fit.get("N_counts", "non_embedding"), "name": fit_path,
            "source": f"own fit {fit_path} ({fit.get('n_points', '?')} points)"}


# What plan and sweep_plan assume besides hours and GPU; pass a dict with the keys to change
PLAN = {
    "n_gpus": 1,         # data-parallel GPUs: C grows linearly with them
    "mfu": 0.4,          # model FLOPs utilization: a safe guess (nanochat reaches ~51% on H100s)
    "params": None,      # law constants (load_constants); None: the published "epoch" set
    "preset": "base",    # model.py preset whose options (and ffn_dim / d_model) the shapes keep
    "out": None,         # plan's --out; None: runs/plan_LxD
    "data": None,        # --data for the commands
    "seq_len": None,     # --max-seq-len for the shapes and commands
    "objective": None,   # --objective (mlm | clm) for the shapes and commands
    # sweep_plan only (Hoffmann et al. 2022, Approach 2: IsoFLOP profiles)
    "budgets": 3,        # compute levels
    "sizes": 5,          # model sizes per level: enough points for a parabola's minimum
    "ratio": 3.0,        # compute ratio between levels
    "spread": 3.0,       # sizes from N*/spread to N*·spread
    "out_dir": "runs/sweep",
}


def plan(hours, gpu, options=None):
    """Budget -> C -> compute-optimal N*, D* -> nearest shape -> tokens that shape gets in the
    budget at its real FLOPs per token (6N plus attention and the output layer, so usually a little
    fewer than D*) -> command. options: the keys of PLAN to change."""
    o = {**PLAN, **(options or {})}
    n_gpus, mfu, preset, out = o["n_gpus"], o["mfu"], o["preset"], o["out"]
    seq_len, objective = o["seq_len"], o["objective"]
    params = o["params"] or load_constants()
    C = budget_flops(hours, gpu, n_gpus, mfu)
    opt = compute_optimal(C, params)
    overrides = {k: v for k, v in (("max_seq_len", seq_len), ("objective", objective)) if v}
    shape = suggest_shape(float(opt["N"]), preset, count=params["N_counts"], **overrides)
    tok = hours_to_tokens(hours, gpu, shape["flops_per_token"], n_gpus, mfu)
    out = out or f"runs/plan_{shape['n_layers']}x{shape['d_model']}"
    run = {"hours": hours, "max_tokens": tok["tokens"], "out": out, "data": o["data"],
           "seq_len": seq_len, "objective": objective}
    return {"hours": hours, "gpu": gpu, "n_gpus": n_gpus, "mfu": mfu, "peak_flops": peak_flops(gpu),
            "C": C, "constants": params.get("name"), "source": params.get("source"),
            "N_opt": float(opt["N"]), "D_opt": float(opt["D"]),
            "tokens_per_param": float(opt["tokens_per_param"]), "loss_opt": float(opt["loss"]),
            # the config dict stays out: plan is saved as JSON (--json) and printed
            "shape": {k: v for k, v in shape.items() if k != "config"},
            "tokens": tok["tokens"], "tokens_per_sec": tok["tokens_per_sec"],
            # the law's loss at this shape's N and tokens: usually a little above loss_opt
            "loss_shape": float(predict_loss(shape["N"], tok["tokens"], params)),
            "command": train_command(shape, run)}


def sweep_plan(hours, gpu, options=None):
    """A small IsoFLOP sweep (Hoffmann et al. Approach 2; nanochat's runs/scaling_laws.sh) that
    spends `hours` in total: `budgets` compute levels `ratio` apart, at each `sizes` shapes from
    N*/spread to N*·spread around the current constants' optimum (so D/N spans about spread^4 and
    the loss curve has a visible minimum). Every run gets its own horizon (--max-tokens), so its
    schedule ends where its point is measured; its --hours is a safety cap at 1.5x the estimate
    (train.py stops at whichever comes first, its schedules follow the nearer one). options: the
    keys of PLAN to change."""
    o = {**PLAN, **(options or {})}
    n_gpus, mfu, preset = o["n_gpus"], o["mfu"], o["preset"]
    seq_len, objective = o["seq_len"], o["objective"]
    budgets, sizes, ratio, spread = o["budgets"], o["sizes"], o["ratio"], o["spread"]
    params = o["params"] or load_constants()
    if budgets < 1 or sizes < 1 or ratio <= 1 or spread < 1:
        raise ValueError("need budgets >= 1, sizes >= 1, ratio > 1 and spread >= 1")
    C_total = budget_flops(hours, gpu, n_gpus, mfu)
    C1 = C_total / (sizes * sum(ratio ** j for j in range(budgets)))
    per_sec = n_gpus * peak_flops(gpu) * mfu
    overrides = {k: v for k, v in (("max_seq_len", seq_len), ("objective", objective)) if v}
    runs = []
    for j in range(budgets):
        C = C1 * ratio ** j
        n_opt = float(compute_optimal(C, params)["N"])
        seen = set()
        for f in np.geomspace(1 / spread, spread, sizes):
            shape = suggest_shape(n_opt * f, preset, count=params["N_counts"], **overrides)
            if (shape["n_layers"], shape["d_model"]) in seen:
                # two targets snapped to one shape
                continue
            seen.add((shape["n_layers"], shape["d_model"]))
            tokens = C / shape["flops_per_token"]
            # e.g. runs/sweep/C1e19_L8_d512 ("+" of "1e+19" dropped: no odd characters in paths)
            name = f"C{C:.2g}_L{shape['n_layers']}_d{shape['d_model']}".replace("+", "")
            out = f"{o['out_dir']}/{name}"
            hours_run = C / per_sec / 3600.0
            runs.append({"C": C, "N": shape["N"], "D": tokens, "hours": hours_run,
                         "shape": {k: v for k, v in shape.items() if k != "config"},
                         "command": train_command(shape, {
                             "hours": 1.5 * hours_run, "max_tokens": tokens, "out": out,
                             "data": o["data"], "seq_len": seq_len, "objective": objective,
                             # a sweep fits the law of models trained at one size throughout
                             "grow": "none"})})
    return {"C_total": C_total, "hours_total": sum(r["hours"] for r in runs),
            "constants": params.get("name"), "runs": runs}


# -----------------------------------------------------------------------------
# Reading runs: train.py folders (log.jsonl + summary.json), their JSONL logs, or a CSV

def _read_run(path):
    """Points (N, D = tokens seen, loss = val_loss, C = flops_per_token * D) of one train.py run: a
    folder holding log.jsonl and summary.json, or the log.jsonl itself."""
    folder, log = ((path, os.path.join(path, "log.jsonl")) if os.path.isdir(path)
                   else (os.path.dirname(path), path))
    summary = os.path.join(folder, "summary.json")
    try:
        with open(summary) as f, open(log) as g:
            info, lines = json.load(f), g.read().splitlines()
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{folder}: needs a readable summary.json (for N) and log.jsonl "
                         f"({e})") from None
    N, fpt = info.get("params"), info.get("flops_per_token")
    if not isinstance(N, (int, float)) or not N > 0:
        raise ValueError(f"{summary}: 'params' must be a positive number, got {N!r}")
    points = []
    for i, line in enumerate(lines, 1):
        try:
            row = json.loads(line) if line.strip() else {}
        except json.JSONDecodeError:
            raise ValueError(f"{log}:{i}: not a JSON object") from None
        if row.get("kind") == "grow":    # N changed during the run: no single (N, D) curve to fit
            raise ValueError(f"{log}:{i}: this run grew (grow.py); "
                             "fit runs of one fixed shape only")
        if row.get("kind") != "eval":
            continue
        D, loss = row.get("tokens"), row.get("val_loss")
        numbers = isinstance(D, (int, float)) and isinstance(loss, (int, float))
        if not (numbers and math.isfinite(loss) and loss > 0):
            raise ValueError(f"{log}:{i}: eval line needs numeric 'tokens' and a positive finite "
                             "'val_loss'")
        if D > 0:  # an evaluation before training has no D
            # C from the model's own FLOPs per token (model.flops_per_token), when summary has it
            has_fpt = isinstance(fpt, (int, float)) and fpt > 0
            points.append({"N": float(N), "D": float(D), "loss": float(loss), "run_id": folder,
                           "C": float(fpt) * D if has_fpt else None,
                           "comparable": info.get("comparable")})
    # A log written by a train.py before resume truncated it can repeat the steps between a
    # checkpoint and a kill: one point per token count is kept, the last logged (the resumed run's).
    return list({p["D"]: p for p in points}.values())


def _read_csv(path):
    """Rows with columns N, D (or C, then D = C / 6N) and loss; an optional run_id column groups
    rows."""
    points = []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows, 2):
        row = {k.strip().lower(): (v or "").strip() for k, v in row.items() if k}
        try:
            N, loss = float(row["n"]), float(row["loss"])
            C = float(row["c"]) if row.get("c") else None
            D = float(row["d"]) if row.get("d") else C / (6 * N)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            raise ValueError(f"{path}:{i}: need numeric columns N, D (or C) and loss, got "
                             f"{row}") from None
        if not all(math.isfinite(v) and v > 0 for v in (N, D, loss)):
            raise ValueError(f"{path}:{i}: N, D and loss must be positive and finite, got {row}")
        p = {"N": N, "D": D, "loss": loss, "C": C}
        if row.get("run_id"):
            p["run_id"] = row["run_id"]
        points.append(p)
    return points


def read_points(paths):
    """Points from run folders, JSONL logs and CSV files, in the order given."""
    points = []
    for path in paths:
        if not os.path.exists(path):
            raise ValueError(f"{path}: no such run folder or file")
        points += _read_csv(path) if path.endswith(".csv") else _read_run(path)
    if not points:
        raise ValueError(f"no evaluation points found in {', '.join(paths)}")
    # Runs on different data, tokenizers, objectives or sequence lengths lie on different curves.
    runs = {p["run_id"]: p["comparable"] for p in points if p.get("comparable")}
    for key in sorted({k for c in runs.values() for k in c}):
        values = {json.dumps(c.get(key)) for c in runs.values()}
        if len(values) > 1:
            raise ValueError(f"runs differ in {key} ({', '.join(sorted(values))}): their losses "
                             "are not comparable; fit runs of one setting at a time")
    return points


def save_json(obj, path):
    """Write JSON atomically (files.atomic_write), creating the folder if needed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # the same bytes json.dump(obj, f, indent=2) writes to a text file
    files.atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2).encode()))


def plot_fit(points, fit, path):
    """Loss against compute, coloured by N, with the fitted law along each size and the
    compute-optimal frontier. Returns the path, or None when matplotlib is not installed (it is
    optional)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    N, D, L = (np.array([p[k] for p in points]) for k in ("N", "D", "loss"))
    C = 6 * N * D  # the law's own compute convention
    fig, ax = plt.subplots(figsize=(7, 5))
    sc = ax.scatter(C, L, c=np.log10(N), cmap="viridis", s=14)
    for n in np.unique(N):
        d = np.geomspace(D[N == n].min(), D[N == n].max(), 50)
        ax.plot(6 * n * d, predict_loss(n, d, fit), color=sc.cmap(sc.norm(np.log10(n))), lw=1)
    c = np.geomspace(C.min(), C.max() * 10, 100)
    ax.plot(c, compute_optimal(c, fit)["loss"], "k--", lw=1.5, label="compute-optimal L(N*, D*)")
    ax.set(xscale="log", xlabel="training FLOPs C = 6ND", ylabel="validation loss",
           title=f"alpha={fit['alpha']:.3f} beta={fit['beta']:.3f} E={fit['E']:.3f} "
                 f"a={fit['a']:.3f}")
    fig.colorbar(sc, label="log10 N")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_losses(log_path, png_path):
    """loss.png of a train.py run: training and held-out loss against time from its log.jsonl, a
    dotted line where the model grew. Returns png_path, or None when matplotlib is not installed
    (it is optional). Imports neither torch nor model.py, like the rest of this file."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # Agg draws to files only: no display needed on a training machine
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    with open(log_path) as f:
        records = [json.loads(line) for line in f]
    fig, ax = plt.subplots(figsize=(7, 4))
    curves = (("train", "loss", "training loss"), ("eval", "val_loss", "held-out loss"))
    for kind, key, label in curves:
        # leave out NaN and inf losses: they would break the curve and the axis limits
        points = [(r["elapsed"], r[key]) for r in records
                  if r["kind"] == kind and math.isfinite(r[key])]
        if points:
            ax.plot(*zip(*points), marker="o" if kind == "eval" else None, label=label)
    for r in records:
        if r["kind"] == "grow":  # grow.py changed the model here: the loss may jump
            ax.axvline(r["elapsed"], color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="seconds", ylabel="loss (nats per predicted token)",
           title=os.path.dirname(log_path))
    ax.legend()
    fig.tight_layout()
    files.atomic_write(png_path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
    return png_path


# -----------------------------------------------------------------------------
# Command line

def _si(x):
    """1234567 -> '1.23M' (counts in plain text output)."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def cmd_plan(args):
    p = plan(args.hours, args.gpu, {
        "n_gpus": args.gpus, "mfu": args.mfu, "params": load_constants(args.fit, args.constants),
        "preset": args.model, "out": args.out, "data": args.data, "seq_len": args.max_seq_len,
        "objective": args.objective})
    s = p["shape"]
    print(f"budget: {p['hours']:g} h x {p['n_gpus']} {p['gpu']} "
          f"({p['peak_flops'] / 1e12:g} TFLOP/s bf16 peak) "
          f"at {p['mfu']:.0%} MFU -> C = {p['C']:.3g} FLOPs")
    published = p["constants"] in PUBLISHED
    print(f"constants: {p['source']}" + (f" (--constants {p['constants']})" if published else ""))
    if published:
        # published constants are for another model family and data: say so every time
        print(f"  caveat: {CAVEAT}")
    print(f"compute-optimal (C = 6ND): N* = {_si(p['N_opt'])} params, "
          f"D* = {_si(p['D_opt'])} tokens ({p['tokens_per_param']:.1f} tokens/param), "
          f"predicted loss {p['loss_opt']:.3f}")
    print(f"shape ({s['preset']} + overrides): {s['n_layers']} layers, d_model {s['d_model']}, "
          f"{s['n_heads']} heads of 64, ffn_dim {s['ffn_dim']}, vocab {s['vocab_size']} "
          f"(d_model/n_layers = {s['aspect_ratio']:.0f})")
    print(f"  params {_si(s['params_total'])} total, {_si(s['params'])} non-embedding "
          f"(N counted as {s['count']}: {_si(s['N'])}); "
          f"{s['flops_per_token']:.3g} FLOPs/token (model.flops_per_token)")
    # the optimum is flat (Kaplan et al. 2020): only a shape far from N* is worth a note
    if not 0.67 < s["N"] / p["N_opt"] < 1.5:
        print(f"  note: the nearest shape has {s['N'] / p['N_opt']:.2g}x N* (at this size the "
              "vocabulary embedding dominates the count; a smaller tokenizer vocabulary fits the "
              "target better)")
    print(f"tokens in budget at this shape: {_si(p['tokens'])} "
          f"({_si(p['tokens_per_sec'])} tokens/s), predicted loss {p['loss_shape']:.3f}")
    print(f"command:\n  {p['command']}")
    if args.json:
        save_json(p, args.json)


def cmd_sweep(args):
    params = load_constants(args.fit, args.constants)
    s = sweep_plan(args.hours, args.gpu, {
        "n_gpus": args.gpus, "mfu": args.mfu, "params": params, "budgets": args.budgets,
        "sizes": args.sizes, "ratio": args.ratio, "spread": args.spread, "preset": args.model,
        "data": args.data, "seq_len": args.max_seq_len, "objective": args.objective,
        "out_dir": args.out_dir})
    print(f"IsoFLOP sweep: {len(s['runs'])} runs, {s['C_total']:.3g} FLOPs in "
          f"{s['hours_total']:.3g} h ({args.gpus} {args.gpu} at {args.mfu:.0%} MFU); "
          f"sizes centred on N* from constants {s['constants']}")
    print(f"{'C (FLOPs)':>10} {'N':>7} {'D':>7} {'D/N':>6} {'hours':>6}  shape")
    for r in s["runs"]:
        print(f"{r['C']:10.3g} {_si(r['N']):>7} {_si(r['D']):>7} {r['D'] / r['N']:6.1f} "
              f"{r['hours']:6.3g}  {r['shape']['n_layers']}x{r['shape']['d_model']}")
    print("commands:")
    for r in s["runs"]:
        print(f"  {r['command']}")
    print(f"then: python scaling.py fit {args.out_dir}/*")
    if args.json:
        save_json(s, args.json)


def cmd_fit(args):
    points = read_points(args.runs)
    if args.final_only:
        points = final_points(points)
    fit = fit_chinchilla(points, args.delta, args.init)
    boot = bootstrap(points, fit, args.n_boot, args.seed, delta=args.delta)
    iso = fit_isoflop(points)
    front = frontier(points)
    # a saturating power law has three parameters: at least three frontier points
    law = None
    if len(front) >= 3:
        law = fit_power_law([_compute(p) for p in front], [p["loss"] for p in front])
    C_max = max(_compute(p) for p in points)
    # extrapolate at most about 10x beyond the largest run: the band is reported exactly there
    band = allocation_band(10 * C_max, boot)
    ci = boot["intervals"]
    print(f"fit: {fit['n_points']} points from {fit['n_runs']} runs, N = non-embedding params, "
          f"delta = {args.delta}, {'converged' if fit['converged'] else 'NOT converged'} "
          f"({fit['iterations']} LM steps, |grad| {fit['grad_norm']:.1e}), "
          f"rms log residual {fit['rms_log_residual']:.4f}")
    print(f"L(N, D) = E + A/N^alpha + B/D^beta: estimate [{boot['level']:.0%} interval, "
          f"{args.n_boot} resamples of runs]")
    for k in ("E", "A", "B", "alpha", "beta", "a", "b"):
        lo, med, hi = ci[k]
        print(f"  {k:>5} = {fit[k]:<12.6g} [{lo:.4g}, {hi:.4g}]")
    print(f"  N* ~ C^{fit['a']:.3f}, D* ~ C^{fit['b']:.3f}; "
          f"at 10x the largest run (C = {10 * C_max:.3g}): "
          f"N* {_si(band['N'][1])} [{_si(band['N'][0])}, {_si(band['N'][2])}], "
          f"D* {_si(band['D'][1])} [{_si(band['D'][0])}, {_si(band['D'][2])}]")
    if iso["a"] is not None:
        print(f"isoFLOP cross-check ({len(iso['budgets'])} budgets): N_opt ~ C^{iso['a']:.3f}, "
              f"D_opt ~ C^{iso['b']:.3f}")
    else:
        print("isoFLOP cross-check: needs 2 budgets with a minimum inside the sizes "
              f"({len(iso['budgets'])} usable)")
    if law:
        print(f"frontier L(C) = {law['E']:.4g} + {law['A']:.4g} C^-{law['k']:.4g} "
              f"({law['n_points']} points)")
    # "_theta" and "_ref" are numpy internals for bootstrap: not JSON, not for readers
    fit_out = {k: v for k, v in fit.items() if not k.startswith("_")}
    # the resampled parameter sets stay out too: the intervals summarize them
    boot_out = {k: boot[k] for k in ("n_boot", "seed", "level", "n_runs", "converged_fraction")}
    # N_counts: plan --fit matches shapes by the same parameter count (summary.json's "params")
    blob = {"fit": {**fit_out, "N_counts": "non_embedding"}, "intervals": ci, "bootstrap": boot_out,
            "isoflop": iso, "frontier_law": law,
            "allocation_at_10x_max_C": {"C": 10 * C_max, **band}, "sources": list(args.runs)}
    save_json(blob, args.out)
    png = plot_fit(points, fit, os.path.splitext(args.out)[0] + ".png")
    print(f"saved {args.out}"
          + (f" and {png}" if png else " (no plot: matplotlib is not installed)"))


def check_args(parser, args):
    """One-line errors (usage line + error) for numbers that parse but plan or fit nothing."""
    rules = [("hours", lambda v: v > 0 and math.isfinite(v), "a positive number"),
             ("gpus", lambda v: v >= 1, ">= 1"),
             ("mfu", lambda v: 0 < v <= 1, "in (0, 1]"), ("max_seq_len", lambda v: v >= 4, ">= 4"),
             ("budgets", lambda v: v >= 1, ">= 1"), ("sizes", lambda v: v >= 2, ">= 2"),
             ("ratio", lambda v: v > 1, "> 1"), ("spread", lambda v: v > 1, "> 1"),
             ("n_boot", lambda v: v >= 0, ">= 0"), ("delta", lambda v: v > 0, "> 0")]
    for name, ok, rule in rules:
        value = getattr(args, name, None)
        if value is not None and not ok(value):
            parser.error(f"--{name.replace('_', '-')} must be {rule} (got {value!r})")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="scaling.py",
                                 description="Scaling-law fits and compute planning for growcram.")
    sub = ap.add_subparsers(dest="command", required=True)
    budget = argparse.ArgumentParser(add_help=False)
    # Budget
    budget.add_argument("--hours", type=float, required=True,
                        help="wall-clock budget in hours (all runs together for sweep)")
    budget.add_argument("--gpu", required=True,
                        help=f"GPU name ({', '.join(GPU_PEAK_FLOPS)}) or peak FLOP/s")
    budget.add_argument("--gpus", type=int, default=1, help="number of GPUs (default 1)")
    budget.add_argument("--mfu", type=float, default=0.4,
                        help="model FLOPs utilization, fraction of peak (0.4)")
    # Law
    budget.add_argument("--fit",
                        help="fit.json from `scaling.py fit` (default: published constants)")
    budget.add_argument("--constants", default="epoch", choices=sorted(PUBLISHED),
                        help="published constant set when no --fit (default epoch)")
    # Model and train.py pass-through
    budget.add_argument("--model", default="base",
                        help="model.py preset the shape overrides (default base)")
    budget.add_argument("--objective", choices=("mlm", "clm"),
                        help="training objective (default: preset's)")
    budget.add_argument("--max-seq-len", type=int,
                        help="sequence length in tokens (default: preset's)")
    budget.add_argument("--data", help="--data value passed to train.py")
    budget.add_argument("--json", help="also write the plan as JSON to this path")
    short = "scaling.py {} {}[flags]  (--help lists them)".format
    p = sub.add_parser("plan", parents=[budget],
                       help="N*, D*, a shape and the train.py command for a budget",
                       usage=short("plan", "--hours H --gpu GPU "))
    p.add_argument("--out", help="train.py --out folder (default runs/plan_<layers>x<width>)")
    s = sub.add_parser("sweep", parents=[budget],
                       help="train.py commands of an IsoFLOP sweep spending --hours",
                       usage=short("sweep", "--hours H --gpu GPU "))
    s.add_argument("--budgets", type=int, default=3, help="number of compute levels (3)")
    s.add_argument("--sizes", type=int, default=5, help="model sizes per compute level (5)")
    s.add_argument("--ratio", type=float, default=3.0, help="compute ratio between levels (3)")
    s.add_argument("--spread", type=float, default=3.0,
                   help="sizes span N*/spread .. N*·spread (3)")
    s.add_argument("--out-dir", default="runs/sweep",
                   help="parent folder of the runs' --out (runs/sweep)")
    f = sub.add_parser("fit",
                       help="fit L(N, D) to train.py runs (folders or log.jsonl) or CSV files",
                       usage=short("fit", "RUN [RUN ...] "))
    f.add_argument("runs", nargs="+",
                   help="train.py output folders, their log.jsonl, or CSV (N, D or C, loss)")
    f.add_argument("--out", default="fit.json",
                   help="where to save the fit (fit.json; plot beside it as .png)")
    f.add_argument("--n-boot", type=int, default=200, help="bootstrap resamples of runs (200)")
    f.add_argument("--seed", type=int, default=0, help="bootstrap seed (0)")
    # Hoffmann et al.'s delta: residuals beyond it count linearly, so outliers weigh less
    f.add_argument("--delta", type=float, default=1e-3,
                   help="Huber delta on log-loss residuals (1e-3)")
    f.add_argument("--init", default="projection", choices=("projection", "grid"),
                   help="starting points: variable projection (fast) or Hoffmann et al.'s "
                        "4500-point grid")
    f.add_argument("--final-only", action="store_true",
                   help="use only the last evaluation of each run")
    args = ap.parse_args(argv)
    check_args({"plan": p, "sweep": s, "fit": f}[args.command], args)
    try:
        {"plan": cmd_plan, "sweep": cmd_sweep, "fit": cmd_fit}[args.command](args)
    except ValueError as e:
        raise SystemExit(f"scaling.py {args.command}: {e}")


if __name__ == "__main__":
    main()
