"""Specification of scaling.py: python -m pytest -q tests/test_scaling.py

Fits recover known laws, planning identities hold, bad input fails clearly. Synthetic data come
from Epoch's constants (Besiroglu et al. 2024), so every expected number is known exactly.
"""
import json
import math
import os
import sys
import time

import numpy as np
import pytest

import scaling

TRUE = {k: scaling.PUBLISHED["epoch"][k] for k in ("E", "A", "B", "alpha", "beta")}
A_TRUE = TRUE["beta"] / (TRUE["alpha"] + TRUE["beta"])


def isoflop_points(noise=0.0, seed=0, budgets=np.geomspace(1e17, 1e20, 7), sizes=8, spread=8.0,
                   params=TRUE):
    """Per budget C, `sizes` models from N*/spread to N*·spread with D = C / 6N (D/N from ~0.4 to
    ~1600), loss from the law times log-normal noise of relative size `noise`. One point per run."""
    rng = np.random.default_rng(seed)
    points = []
    for C in budgets:
        n_opt = scaling.compute_optimal(C, params)["N"]
        for N in n_opt * np.geomspace(1 / spread, spread, sizes):
            D = C / (6 * N)
            law = float(scaling.predict_loss(N, D, params))
            loss = law * math.exp(noise * rng.standard_normal())
            points.append({"N": float(N), "D": float(D), "loss": loss,
                           "run_id": f"C{C:.1e}_N{N:.3e}"})
    return points


def rel(x, y):
    return abs(x / y - 1)


# -----------------------------------------------------------------------------
# Fitting the parametric law

def test_noise_free_round_trip_recovers_the_constants_exactly():
    fit = scaling.fit_chinchilla(isoflop_points())
    for k in ("E", "A", "B"):
        assert rel(fit[k], TRUE[k]) < 1e-3, k
    assert abs(fit["alpha"] - TRUE["alpha"]) < 1e-3 and abs(fit["beta"] - TRUE["beta"]) < 1e-3
    assert fit["converged"] and fit["objective"] < 1e-20 and fit["max_log_residual"] < 1e-9


def test_half_percent_noise_keeps_allocation_and_predictions_close():
    points = isoflop_points(noise=0.005, seed=1)
    fit = scaling.fit_chinchilla(points)
    assert abs(fit["a"] - A_TRUE) <= 0.05
    for p in points:   # the fitted surface stays within 3 sigma of the noise-free law at every run
        fitted = scaling.predict_loss(p["N"], p["D"], fit)
        assert rel(fitted, scaling.predict_loss(p["N"], p["D"], TRUE)) <= 0.015
    C = 10 * max(6 * p["N"] * p["D"] for p in points)
    ratio = scaling.compute_optimal(C, fit)["N"] / scaling.compute_optimal(C, TRUE)["N"]
    assert 1 / 1.5 <= ratio <= 1.5


def test_paper_grid_of_starting_points_finds_the_same_minimum():
    points = isoflop_points(noise=0.005, seed=2, budgets=np.geomspace(1e17, 1e19, 4), sizes=6)
    fast, grid = scaling.fit_chinchilla(points), scaling.fit_chinchilla(points, init="grid")
    for k in ("E", "A", "B", "alpha", "beta"):
        assert rel(fast[k], grid[k]) < 1e-6, k


def test_fit_is_deterministic_and_independent_of_point_order():
    points = isoflop_points(noise=0.005, seed=3)
    first, again = scaling.fit_chinchilla(points), scaling.fit_chinchilla(points)
    order = np.random.default_rng(0).permutation(len(points))
    shuffled = scaling.fit_chinchilla([points[i] for i in order])
    for k in ("E", "A", "B", "alpha", "beta"):
        assert first[k] == again[k]
        assert rel(first[k], shuffled[k]) <= 1e-8, k


def test_rescaling_N_or_D_only_moves_A_or_B():
    points = isoflop_points(noise=0.005, seed=4)
    fit = scaling.fit_chinchilla(points)
    k = 1000.0
    fit_n = scaling.fit_chinchilla([{**p, "N": p["N"] * k} for p in points])
    fit_d = scaling.fit_chinchilla([{**p, "D": p["D"] * k} for p in points])
    assert rel(fit_n["A"], fit["A"] * k ** fit["alpha"]) < 1e-6 and rel(fit_n["B"], fit["B"]) < 1e-6
    assert rel(fit_d["B"], fit["B"] * k ** fit["beta"]) < 1e-6 and rel(fit_d["A"], fit["A"]) < 1e-6
    for other in (fit_n, fit_d):
        for key in ("E", "alpha", "beta"):
            assert rel(other[key], fit[key]) < 1e-6, key


def test_shifting_all_losses_moves_only_E():
    fit = scaling.fit_chinchilla([{**p, "loss": p["loss"] + 0.5} for p in isoflop_points()])
    assert abs(fit["E"] - (TRUE["E"] + 0.5)) < 1e-6
    assert abs(fit["alpha"] - TRUE["alpha"]) < 1e-6 and abs(fit["beta"] - TRUE["beta"]) < 1e-6


def test_fit_of_three_hundred_points_takes_under_two_seconds():
    points = isoflop_points(noise=0.005, seed=5, budgets=np.geomspace(1e17, 1e20, 10), sizes=30)
    start = time.perf_counter()
    fit = scaling.fit_chinchilla(points)
    assert time.perf_counter() - start < 2.0 and fit["converged"] and len(points) == 300


@pytest.mark.parametrize("points, message", [
    (isoflop_points()[:4], "at least 5 points"),
    ([{**p, "N": 0.0} if i == 0 else p for i, p in enumerate(isoflop_points())],
     "positive finite 'N'"),
    ([{**p, "D": -1.0} if i == 3 else p for i, p in enumerate(isoflop_points())],
     "positive finite 'D'"),
    ([{**p, "loss": float("nan")} if i == 5 else p for i, p in enumerate(isoflop_points())],
     "'loss'"),
    ([{**p, "N": 1e8} for p in isoflop_points()], "2 distinct model sizes"),
])
def test_bad_points_raise_a_clear_value_error(points, message):
    with pytest.raises(ValueError, match=message):
        scaling.fit_chinchilla(points)


# -----------------------------------------------------------------------------
# Bootstrap intervals

def test_bootstrap_interval_contains_the_estimate_and_widens_with_noise():
    widths = []
    for noise in (0.0, 0.002, 0.01):
        points = isoflop_points(noise=noise, seed=6)
        fit = scaling.fit_chinchilla(points)
        boot = scaling.bootstrap(points, fit, n_boot=100, seed=0)
        for k in ("E", "A", "B", "alpha", "beta", "a"):
            lo, med, hi = boot["intervals"][k]
            assert lo <= med <= hi and lo - 1e-9 <= fit[k] <= hi + 1e-9, (noise, k)
        widths.append(boot["intervals"]["a"][2] - boot["intervals"]["a"][0])
    assert widths[0] < 1e-8 < widths[1] < widths[2]


def test_bootstrap_is_reproducible_for_a_seed_and_order_independent():
    points = isoflop_points(noise=0.005, seed=7)
    one = scaling.bootstrap(points, n_boot=50, seed=3)
    two = scaling.bootstrap(points[::-1], n_boot=50, seed=3)
    other = scaling.bootstrap(points, n_boot=50, seed=4)
    assert np.allclose(one["samples"]["a"], two["samples"]["a"], rtol=1e-8)
    assert not np.allclose(one["samples"]["a"], other["samples"]["a"])


def test_bootstrap_resamples_whole_runs_not_single_evaluations():
    # With all points in one run, every resample is the full data set, so there is no spread
    # even with noise.
    points = [{**p, "run_id": "one-run"} for p in isoflop_points(noise=0.01, seed=8)]
    boot = scaling.bootstrap(points, n_boot=20)
    lo, _, hi = boot["intervals"]["alpha"]
    assert hi - lo < 1e-12 and boot["n_runs"] == 1


def test_bootstrap_interval_covers_the_true_exponent_in_most_noisy_datasets():
    covered = 0
    for seed in range(20):
        points = isoflop_points(noise=0.005, seed=100 + seed)
        lo, _, hi = scaling.bootstrap(points, n_boot=100)["intervals"]["a"]
        covered += lo <= A_TRUE <= hi
    assert covered >= 16                                            # nominal 95%: 19 of 20 expected


def test_allocation_band_brackets_the_point_estimate():
    points = isoflop_points(noise=0.005, seed=9)
    fit = scaling.fit_chinchilla(points)
    band = scaling.allocation_band(1e21, scaling.bootstrap(points, fit, n_boot=100))
    n_opt = scaling.compute_optimal(1e21, fit)["N"]
    assert band["N"][0] < n_opt < band["N"][2] and band["D"][0] < 1e21 / (6 * n_opt) < band["D"][2]


# -----------------------------------------------------------------------------
# Compute-optimal identities and the other fits

@pytest.mark.parametrize("name", sorted(scaling.PUBLISHED))
def test_compute_optimal_spends_the_budget_and_minimizes_the_loss(name):
    params = scaling.PUBLISHED[name]
    for C in (1e18, 1e21, 1e24):
        opt = scaling.compute_optimal(C, params)
        assert rel(6 * opt["N"] * opt["D"], C) < 1e-9
        grid = np.geomspace(opt["N"] / 100, opt["N"] * 100, 20001)
        brute = grid[np.argmin(scaling.predict_loss(grid, C / (6 * grid), params))]
        assert rel(brute, opt["N"]) < 1e-2
        assert rel(scaling.tokens_for_params(opt["N"], params), opt["D"]) < 1e-9
    n20, n22 = (scaling.compute_optimal(C, params)["N"] for C in (1e20, 1e22))
    slope = np.log(n22 / n20) / np.log(100)
    assert abs(slope - params["beta"] / (params["alpha"] + params["beta"])) < 1e-12


def test_symmetric_law_splits_compute_evenly():
    symmetric = {"E": 1.0, "A": 300.0, "B": 300.0, "alpha": 0.3, "beta": 0.3}
    opt = scaling.compute_optimal(6e20, symmetric)
    assert rel(opt["N"], 1e10) < 1e-12 and rel(opt["D"], 1e10) < 1e-12


def test_published_constants_differ_in_tokens_per_parameter_as_epoch_reported():
    # At Chinchilla's own budget (70B params x 1.4T tokens) Epoch's refit gives ~20 tokens/param
    # like the model itself, while Hoffmann et al.'s printed constants imply several times more
    # (Besiroglu et al. 2024, Sec. 4).
    C = 6 * 70e9 * 1.4e12
    epoch = scaling.compute_optimal(C, scaling.PUBLISHED["epoch"])["tokens_per_param"]
    hoffmann = scaling.compute_optimal(C, scaling.PUBLISHED["hoffmann"])["tokens_per_param"]
    assert 15 < epoch < 30 and hoffmann > 50


def test_predicted_loss_falls_with_N_and_D_towards_E():
    N = np.geomspace(1e6, 1e12, 50)
    assert np.all(np.diff(scaling.predict_loss(N, 1e10, TRUE)) < 0)
    assert np.all(np.diff(scaling.predict_loss(1e8, N, TRUE)) < 0)
    assert abs(scaling.predict_loss(1e30, 1e30, TRUE) - TRUE["E"]) < 1e-6


def test_isoflop_parabolas_cross_check_the_exponent():
    points = isoflop_points(budgets=np.geomspace(1e17, 1e20, 5), sizes=9, spread=4.0)
    iso = scaling.fit_isoflop(points)
    assert len(iso["budgets"]) == 5
    assert abs(iso["a"] - A_TRUE) < 0.03 and abs(iso["a"] + iso["b"] - 1) < 0.03
    for b in iso["budgets"]:
        assert rel(b["N_opt"], scaling.compute_optimal(b["C"], TRUE)["N"]) < 0.10


def test_isoflop_skips_budgets_whose_minimum_lies_outside_the_sizes():
    points = [p for p in isoflop_points(budgets=[1e18, 1e19], sizes=9, spread=4.0)
              if p["N"] > 1.5 * scaling.compute_optimal(1e18, TRUE)["N"]
              or 6 * p["N"] * p["D"] > 5e18]
    iso = scaling.fit_isoflop(points)
    assert len(iso["budgets"]) == 1 and "no minimum inside" in iso["skipped"][0]["why"]
    assert iso["a"] is None


def test_the_saturating_power_law_fit_round_trips_and_the_compute_frontier_only_falls():
    C = np.geomspace(1e15, 1e20, 30)
    law = scaling.fit_power_law(C, 1.7 + 50.0 * C ** -0.12)
    assert rel(law["E"], 1.7) < 1e-6 and rel(law["A"], 50.0) < 1e-6 and rel(law["k"], 0.12) < 1e-6
    front = scaling.frontier(isoflop_points())
    assert all(b["loss"] < a["loss"] for a, b in zip(front, front[1:]))
    with pytest.raises(ValueError, match="positive"):
        scaling.fit_power_law([1.0, 2.0, -3.0], [1.0, 1.0, 1.0])


# -----------------------------------------------------------------------------
# Accounting and planning (numbers from model.py)

def test_gpu_names_resolve_to_peak_flops_and_budgets_convert_hours_to_tokens():
    assert scaling.peak_flops("A100") == 312e12 and scaling.peak_flops("H100 SXM") == 989e12
    assert scaling.peak_flops("rtx-4090") == 165.2e12 and scaling.peak_flops("150e12") == 150e12
    assert scaling.peak_flops("3090") == 71e12  # a name, not 3090 FLOP/s
    # names as torch.cuda.get_device_name reports them (train.py computes MFU this way)
    assert scaling.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert scaling.peak_flops("NVIDIA H200") == 989e12
    assert scaling.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert scaling.peak_flops("NVIDIA RTX A6000") == 154.8e12
    assert scaling.peak_flops("NVIDIA GeForce RTX 2080 Ti") == 53.8e12
    for unknown in ("tpu-v9", "NVIDIA A10G", "cpu"):
        with pytest.raises(ValueError, match="unknown GPU"):
            scaling.peak_flops(unknown)
    one = scaling.hours_to_tokens(1, "h100", 6e8, mfu=0.4)
    assert rel(one["tokens"], 3600 * 989e12 * 0.4 / 6e8) < 1e-12                   # 2.37e9 tokens
    three = scaling.hours_to_tokens(3, "h100", 6e8, n_gpus=2, mfu=0.2)
    assert rel(three["tokens"], 3 * one["tokens"]) < 1e-12
    with pytest.raises(ValueError, match="mfu"):
        scaling.budget_flops(1, "a100", mfu=1.5)


def test_accounting_is_model_py_accounting():
    import model
    cfg = model.make_config("tiny")
    acct = scaling.model_accounting(cfg)
    assert acct["params_total"] == sum(p.numel() for p in model.build_model(cfg).parameters())
    assert acct["params"] == model.count_params(cfg, embeddings=False)
    assert acct["flops_per_token"] == model.flops_per_token(cfg)


@pytest.mark.parametrize("target, count", [(1e7, "non_embedding"), (1e8, "non_embedding"),
                                           (1e9, "total"), (3e8, "total")])
def test_suggested_shapes_divide_cleanly_and_hit_the_target(target, count):
    s = scaling.suggest_shape(target, count=count)
    assert s["d_model"] % 128 == 0 and s["d_model"] % s["n_heads"] == 0
    assert s["d_model"] // s["n_heads"] == 64
    assert s["ffn_dim"] % 128 == 0 and s["vocab_size"] % 64 == 0
    assert rel(s["N"], target) <= 0.15 and 32 <= s["aspect_ratio"] <= 128
    assert s["N"] == (s["params_total"] if count == "total" else s["params"])


def test_plan_allocates_the_budget_and_emits_a_train_command():
    p = scaling.plan(2, "a6000", {"mfu": 0.35})
    C = 2 * 3600 * 154.8e12 * 0.35
    assert rel(p["C"], C) < 1e-12 and rel(6 * p["N_opt"] * p["D_opt"], C) < 1e-9
    assert rel(p["tokens"] * p["shape"]["flops_per_token"], C) < 1e-12
    assert rel(p["shape"]["N"], p["N_opt"]) < 0.15 and p["constants"] == "epoch"
    s = p["shape"]
    assert p["command"].startswith("python train.py --model base")
    for flag in (f"--n-layers {s['n_layers']}", f"--d-model {s['d_model']}",
                 f"--n-heads {s['n_heads']}", f"--ffn-dim {s['ffn_dim']}", "--hours 2",
                 f"--max-tokens {int(p['tokens'])}"):
        assert flag in p["command"]


def test_sweep_spends_the_hours_on_budgets_ratio_apart():
    s = scaling.sweep_plan(6, "a100", {"budgets": 3, "sizes": 5, "ratio": 3.0})
    levels = sorted({r["C"] for r in s["runs"]})
    assert len(levels) == 3 and rel(levels[1] / levels[0], 3.0) < 1e-12
    assert s["hours_total"] <= 6 * (1 + 1e-9) and len(s["runs"]) >= 12
    for r in s["runs"]:
        assert rel(r["D"] * r["shape"]["flops_per_token"], r["C"]) < 1e-12
        assert "--max-tokens" in r["command"]
    for C in levels:    # sizes straddle the optimum of the constants they were centred on
        n = [r["N"] for r in s["runs"] if r["C"] == C]
        assert min(n) < scaling.compute_optimal(C, scaling.PUBLISHED["epoch"])["N"] < max(n)


# -----------------------------------------------------------------------------
# Reading runs and the command line

def write_run(folder, N, evals, params=TRUE, fpt=None, extra_lines=(), comparable=None):
    """A train.py output folder with summary.json and log.jsonl.

    The log has train lines and eval lines at `evals` tokens."""
    os.makedirs(folder)
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({"params": N, "params_total": N + 1000, "flops_per_token": fpt or 6.0 * N,
                   **({"comparable": comparable} if comparable else {})}, f)
    with open(os.path.join(folder, "log.jsonl"), "w") as f:
        for line in extra_lines:
            f.write(line + "\n")
        for D in evals:
            f.write(json.dumps({"kind": "train", "tokens": D, "loss": 9.9}) + "\n")
            # At D = 0, before training: ~ln(vocab).
            loss = float(scaling.predict_loss(N, D, params)) if D > 0 else 10.4
            f.write(json.dumps({"kind": "eval", "tokens": D, "val_loss": loss}) + "\n")


def test_reader_turns_each_eval_line_into_a_point(tmp_path):
    run = str(tmp_path / "run")
    write_run(run, 1e7, [0, 1e8, 2e8], fpt=7e7)
    points = scaling.read_points([run])
    # tokens=0 is skipped.
    assert [(p["N"], p["D"], p["C"]) for p in points] == [(1e7, 1e8, 7e15), (1e7, 2e8, 1.4e16)]
    assert points[1]["loss"] == pytest.approx(scaling.predict_loss(1e7, 2e8, TRUE))
    assert points[0]["run_id"] == run
    assert scaling.read_points([os.path.join(run, "log.jsonl")]) == points


def test_reader_reads_csv_with_D_or_C(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("N,D,C,loss\n1e7,2e8,,3.5\n1e8,,6e17,3.1\n")
    points = scaling.read_points([str(path)])
    assert points[0]["D"] == 2e8 and points[1]["D"] == pytest.approx(1e9)
    assert points[1]["loss"] == 3.1


@pytest.mark.parametrize("setup, message", [
    (lambda d: (d / "a.csv").write_text("N,D,loss\n1e7,abc,3\n"), r"a\.csv:2"),
    (lambda d: (d / "a.csv").write_text("N,D,loss\n1e7,-5,3\n"), "positive"),
    (lambda d: write_run(str(d / "a.csv"[:-4]), 1e7, [1e8],
                         extra_lines=['{"kind": "eval", "tokens": 5, "val_loss": NaN}']),
     r"log\.jsonl:1"),
    (lambda d: (d / "a").mkdir(), r"summary\.json"),
])
def test_reader_names_the_file_and_problem(tmp_path, setup, message):
    setup(tmp_path)
    target = tmp_path / "a.csv" if (tmp_path / "a.csv").exists() else tmp_path / "a"
    with pytest.raises(ValueError, match=message):
        scaling.read_points([str(target)])


def test_the_cli_fits_runs_then_plans_from_the_saved_fit(tmp_path, capsys):
    runs = []
    for C in (1e17, 1e18, 1e19):  # an isoFLOP sweep whose runs also log intermediate evaluations
        n_opt = scaling.compute_optimal(C, TRUE)["N"]
        for N in n_opt * np.geomspace(0.25, 4, 5):
            runs.append(str(tmp_path / f"C{C:.0e}_N{N:.3e}"))
            write_run(runs[-1], float(N), C / (6 * N) * np.array([0.25, 0.5, 1.0]))
    out = str(tmp_path / "fit.json")
    scaling.main(["fit", *runs, "--out", out, "--n-boot", "50"])
    text = capsys.readouterr().out
    saved = json.load(open(out))
    assert "alpha" in text and "isoFLOP cross-check (3 budgets)" in text
    assert rel(saved["fit"]["alpha"], TRUE["alpha"]) < 1e-3
    assert saved["fit"]["N_counts"] == "non_embedding"
    assert saved["bootstrap"]["n_runs"] == 15 and abs(saved["isoflop"]["a"] - A_TRUE) < 0.05
    scaling.main(["plan", "--hours", "1", "--gpu", "a100", "--fit", out])
    text = capsys.readouterr().out
    assert f"own fit {out}" in text and "python train.py --model base" in text
    assert "caveat" not in text


def test_cli_plan_names_the_published_constants_and_the_caveat(capsys):
    scaling.main(["plan", "--hours", "24", "--gpu", "a100", "--constants", "hoffmann"])
    text = capsys.readouterr().out
    assert "Hoffmann et al. 2022" in text and "MassiveText" in text and "--max-tokens" in text


def test_cli_bad_input_exits_with_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no such run folder"):
        scaling.main(["fit", str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="unknown GPU"):
        scaling.main(["plan", "--hours", "1", "--gpu", "abacus"])


def test_fit_needs_no_matplotlib(tmp_path, monkeypatch):
    # Makes `import matplotlib` raise ImportError.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    points = isoflop_points()
    fit = scaling.fit_chinchilla(points)
    assert scaling.plot_fit(points, fit, str(tmp_path / "fit.png")) is None


def test_plot_is_written_when_matplotlib_is_present(tmp_path):
    pytest.importorskip("matplotlib")
    points = isoflop_points()
    path = scaling.plot_fit(points, scaling.fit_chinchilla(points), str(tmp_path / "fit.png"))
    assert os.path.getsize(path) > 1000


def write_loss_log(folder):
    """A small train.py log.jsonl: train records (one non-finite), evaluations and a growth step."""
    records = [{"kind": "train", "step": 1, "elapsed": 1.0, "loss": 9.0},
               {"kind": "eval", "step": 1, "elapsed": 1.5, "val_loss": 8.5},
               {"kind": "train", "step": 2, "elapsed": 2.0, "loss": float("nan")},
               {"kind": "grow", "step": 2, "elapsed": 2.5},
               {"kind": "train", "step": 3, "elapsed": 3.0, "loss": 7.0},
               {"kind": "eval", "step": 3, "elapsed": 3.5, "val_loss": 7.2}]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "log.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


def test_loss_plot_is_written_without_torch_or_model_py(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib is optional; plot_losses needs it to draw")
    log = write_loss_log(str(tmp_path / "run"))
    monkeypatch.setitem(sys.modules, "torch", None)              # any `import torch` would now fail
    monkeypatch.setitem(sys.modules, "model", None)
    png = str(tmp_path / "run" / "loss.png")
    assert scaling.plot_losses(log, png) == png
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # No temporary file left.
    assert sorted(os.listdir(tmp_path / "run")) == ["log.jsonl", "loss.png"]


def test_loss_plot_returns_none_without_matplotlib(tmp_path, monkeypatch):
    log = write_loss_log(str(tmp_path / "run"))
    # Makes `import matplotlib` raise ImportError.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert scaling.plot_losses(log, str(tmp_path / "run" / "loss.png")) is None
    assert not os.path.exists(tmp_path / "run" / "loss.png")


def test_reader_refuses_runs_that_grew(tmp_path):
    run = str(tmp_path / "grown")
    write_run(run, 1e7, [1e8], extra_lines=['{"kind": "grow", "step": 10, "tokens": 5000}'])
    with pytest.raises(ValueError, match="grew"):
        scaling.read_points([run])


def test_reader_refuses_runs_whose_losses_are_not_comparable(tmp_path):
    setting = {"data": "sample-abc", "vocab_size": 8192, "objective": "mlm", "seq_len": 128,
               "mask_rate": 0.25}
    write_run(str(tmp_path / "a"), 1e7, [1e8], comparable=setting)
    write_run(str(tmp_path / "b"), 2e7, [1e8], comparable=setting)
    write_run(str(tmp_path / "c"), 3e7, [1e8], comparable={**setting, "vocab_size": 512})
    assert len(scaling.read_points([str(tmp_path / "a"), str(tmp_path / "b")])) == 2
    message = r"runs differ in vocab_size \(512, 8192\): their losses are not comparable"
    with pytest.raises(ValueError, match=message):
        scaling.read_points([str(tmp_path / x) for x in "abc"])
