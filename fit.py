"""fit.py: robust curve fitting in log space, the numerics behind scaling.py's fits (numpy only).

What it is. A sum of Huber losses on log-residuals, minimized by a batched Levenberg-Marquardt
that runs many starting points at once. This is how Hoffmann et al. 2022 ("Training
Compute-Optimal Language Models", Approach 3) fit L(N, D) = E + A / N^alpha + B / D^beta: the
model's log-loss LSE(a - alpha ln N, b - beta ln D, e) against the observed log-loss, Huber
delta = 1e-3, best of many starts. They used L-BFGS from a grid of 4500 starts; it stopped early on
a mean-reduced objective, as Besiroglu et al. 2024 (Epoch AI, arXiv 2404.10102) found, so here the
loss is summed and the optimizer stops only on step size.

How to use it (scaling.fit_chinchilla does exactly this):

    pts, N, D, L = fit.check_points(points, 5, "my fit")        # [{"N", "D", "loss"}, ...]
    x_ref, y_ref = np.log(N).mean(), np.log(D).mean()
    X = np.stack([np.log(N) - x_ref, np.log(D) - y_ref])        # centred log inputs, (m, n)
    model = fit.lse_model(X, np.log(L))                          # residuals and Jacobian
    starts = fit.projection_starts(X, L, np.arange(0.05, 1.2001, 0.025))
    best = fit.multistart(model, starts, np.ones_like(L), 1e-3)  # the best start, run to the end
    constants = fit.to_params(best["theta"], x_ref, y_ref)      # {"E", "A", "B", "alpha", "beta"}

levenberg_marquardt runs a batch of starts with per-start point weights (scaling.bootstrap passes
resampling counts there). fit_power_law(x, y) fits y = E + A x^-k the same way, in one call.
Nothing here knows about runs, files or compute: scaling.py does that.
"""
import math

import numpy as np


def _huber(r, delta, w):
    """Sum over points of w * Huber_delta(r), (S, n) -> (S,): quadratic inside |r| <= delta,
    linear outside."""
    absr = np.abs(r)
    # 0.5 delta^2 at |r| = delta from both sides, so the loss and its slope are continuous there
    return np.sum(w * np.where(absr <= delta, 0.5 * r * r, delta * (absr - 0.5 * delta)), axis=-1)


def levenberg_marquardt(model, theta, w, delta, max_iter=1000, xtol=1e-10):
    """Minimize sum_i w_i Huber(r_i(theta)) for S starting points at once. model(theta (S, P))
    returns residuals r (S, n) and their Jacobian J (S, n, P). Huber is handled by iteratively
    reweighted least squares: outside |r| <= delta a point weighs delta/|r|, which makes the
    quadratic model an upper bound of the Huber loss, and a step is kept only if the true summed
    objective decreases. A start stops when its accepted step is below xtol (relative), or when no
    damping gives a decrease, never on the objective value (what cut Chinchilla's fit short)."""
    theta = np.array(theta, float)
    S, P = theta.shape
    r, J = model(theta)
    # one weight per point and start: bootstrap resamples differ only in these
    w = np.broadcast_to(w, r.shape)
    f = _huber(r, delta, w)
    # damping per start; small, so the first steps are close to Gauss-Newton
    lam = np.full(S, 1e-3)
    done, iters = np.zeros(S, bool), np.zeros(S, int)
    for _ in range(max_iter):
        # only the starts still moving are solved: the batch shrinks as starts converge
        act = np.flatnonzero(~done)
        if act.size == 0:
            break
        ra, Ja, wa = r[act], J[act], w[act]
        # IRLS weight: 1 inside |r| <= delta, delta/|r| outside
        irls = wa * (delta / np.maximum(np.abs(ra), delta))
        # (s, P), the exact gradient: the Huber derivative is r clipped to [-delta, delta]
        grad = np.einsum("snp,sn->sp", Ja, wa * np.clip(ra, -delta, delta))
        H = np.swapaxes(Ja * irls[..., None], 1, 2) @ Ja                              # (s, P, P)
        diag = np.diagonal(H, axis1=1, axis2=2)
        # Marquardt scaling: damp each parameter by its own curvature; the floor keeps a flat
        # direction from dividing by zero
        diag = np.maximum(diag, 1e-12 * diag.max(axis=1, keepdims=True) + 1e-300)
        damped = H + lam[act, None, None] * (diag[:, :, None] * np.eye(P))
        step = -np.linalg.solve(damped, grad[..., None])[..., 0]
        trial = theta[act] + step
        r_t, J_t = model(trial)
        f_t = _huber(r_t, delta, wa)
        # accept only a true decrease of the summed objective
        ok = f_t < f[act]
        keep = act[ok]
        theta[keep], r[keep], J[keep], f[keep] = trial[ok], r_t[ok], J_t[ok], f_t[ok]
        # trust more after a success (/3), much less after a failure (x4)
        lam[keep] = np.maximum(lam[keep] / 3.0, 1e-12)
        lam[act[~ok]] *= 4.0
        iters[act] += 1
        small = np.max(np.abs(step), axis=1) <= xtol * (1.0 + np.max(np.abs(trial), axis=1))
        # stop on a small accepted step, or when no damping finds a decrease (lam past 1e16)
        done[act[(ok & small) | (lam[act] > 1e16)]] = True
    grad = np.einsum("snp,sn->sp", J, w * np.clip(r, -delta, delta))  # r, J are kept at theta
    return {"theta": theta, "objective": f, "converged": done, "iterations": iters,
            "grad_norm": np.max(np.abs(grad), axis=1), "residuals": r}


def lse_model(X, logy):
    """Residuals and Jacobian of log y = LSE(c_1 - s_1 X_1, .., c_m - s_m X_m, e) - log y_obs,
    batched over theta = (c_1..c_m, e, s_1..s_m) (S, 2m+1). Chinchilla (Hoffmann et al. Approach
    3): X = (ln N, ln D) centred, theta = (a, b, e, alpha, beta) with A = exp(a), B = exp(b),
    E = exp(e); the power law: X = (ln C,), (a, e, k). Centring (x = ln N - mean ln N) keeps the
    columns apart; the caller adds s_j * mean back to c_j."""
    m = X.shape[0]

    def model(theta):
        # (S, m+1, n) terms: c_j - s_j X_j for each input, then the constant e
        const = np.broadcast_to(theta[:, m, None, None], (len(theta), 1, X.shape[1]))
        t = np.concatenate([theta[:, :m, None] - theta[:, m + 1:, None] * X, const], axis=1)
        # log-sum-exp less the largest term, so exp never overflows
        mx = t.max(axis=1, keepdims=True)
        e = np.exp(t - mx)
        p = e / e.sum(axis=1, keepdims=True)                                        # d LSE / d term
        J = np.concatenate([p, -p[:, :m] * X], axis=1).transpose(0, 2, 1)          # (S, n, 2m+1)
        return (mx + np.log(e.sum(axis=1, keepdims=True)))[:, 0] - logy, J
    return model


def _thin(order, coords, k, min_dist):
    """The first k indices of `order` whose coords are at least min_dist apart (diverse starting
    points)."""
    picked = []
    for i in order:
        # max-norm distance: apart in at least one exponent
        if all(np.max(np.abs(coords[i] - coords[j])) >= min_dist for j in picked):
            picked.append(i)
            if len(picked) == k:
                break
    return picked


def projection_starts(X, y, grid, k=8):
    """Starting points by variable projection: for fixed exponents the law is linear in its
    coefficients (E, A, B), so solve the least-squares problem for every exponent combination on
    `grid` (residuals divided by y, close to log residuals), keep solutions with all coefficients
    > 0, and start from the k best that are at least two grid steps apart. 47 x 47 exponent pairs
    cost a few milliseconds and land in the basin of the full paper grid."""
    m = X.shape[0]
    # Every combination of exponents on the grid: S is (P, m).
    S = np.stack(np.meshgrid(*[grid] * m, indexing="ij"), axis=-1).reshape(-1, m)
    # (P, m+1, n): the columns exp(-s_j X_j) and a column of ones for E
    Z = np.concatenate([np.exp(-S[:, :, None] * X), np.ones((len(S), 1, X.shape[1]))], axis=1)
    # weights 1/y^2 on squared residuals: relative errors, close to log-space ones
    Zw = Z / y ** 2
    # a singular system only makes a combination fail the > 0 or finite test below
    with np.errstate(all="ignore"):
        rhs = Zw @ y
        # normal equations, with a tiny ridge for exponent pairs whose columns coincide
        gram = Zw @ Z.transpose(0, 2, 1) + 1e-12 * np.eye(m + 1)
        coef = np.linalg.solve(gram, rhs[..., None])[..., 0]
        sse = np.sum(np.ones_like(y)) - np.sum(coef * rhs, axis=-1)  # sum (1 - fit/y)^2
    ok = np.flatnonzero(np.all(coef > 0, axis=1) & np.isfinite(sse))
    # no positive solution: a guess
    if ok.size == 0:
        return np.concatenate([np.zeros(m), [np.log(y.min()) - 0.1], np.full(m, 0.3)])[None]
    # The k best solutions, as indices into the grid, at least two grid steps apart.
    picked = _thin(ok[np.argsort(sse[ok], kind="stable")], S, k, 2 * (grid[1] - grid[0]) - 1e-12)
    return np.concatenate([np.log(coef[picked]), S[picked]], axis=1)


def multistart(model, starts, w, delta, keep=8):
    """Run LM from every start; with many starts, first 25 iterations for all, then the best `keep`
    to the end."""
    # with the paper's 4500 starts: 25 steps rank the basins, only the best few run to convergence
    if len(starts) > keep:
        rough = levenberg_marquardt(model, starts, w, delta, max_iter=25)
        starts = rough["theta"][np.argsort(rough["objective"], kind="stable")[:keep]]
    out = levenberg_marquardt(model, starts, w, delta)
    # a start that diverged to inf or nan never wins
    i = int(np.argmin(np.where(np.isfinite(out["objective"]), out["objective"], np.inf)))
    return {k: v[i] for k, v in out.items()}


def check_points(points, n_params, what):
    """Points (list of dicts) -> canonical order and arrays; ValueError naming the problem. Sorting
    makes the fit independent of input order to the last bit."""
    if len(points) < n_params:
        raise ValueError(f"{what}: need at least {n_params} points (one per parameter), got "
                         f"{len(points)}")
    for i, p in enumerate(points):
        for key in ("N", "D", "loss"):
            v = p.get(key) if isinstance(p, dict) else None
            # logs of all three are taken: each must be a positive finite number
            number = isinstance(v, (int, float, np.number))
            if v is None or not number or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{what}: point {i} needs a positive finite {key!r}, got {v!r} in "
                                 f"{p!r}")
    pts = sorted(points, key=lambda p: (p["N"], p["D"], p["loss"], str(p.get("run_id", ""))))
    N, D, L = (np.array([p[k] for p in pts], float) for k in ("N", "D", "loss"))
    # one size (or one token count) leaves alpha (or beta) undetermined
    if np.unique(N).size < 2 or np.unique(D).size < 2:
        raise ValueError(f"{what}: need at least 2 distinct model sizes N and 2 distinct token "
                         "counts D")
    return pts, N, D, L


def to_params(theta, x_ref, y_ref):
    """Centred (a, b, e, alpha, beta) -> the constants E, A, B, alpha, beta in the units of the
    data: A = exp(a + alpha x_ref) undoes the centring ln N - x_ref (and B likewise with y_ref)."""
    a, b, e, alpha, beta = theta
    return {"E": math.exp(e), "A": math.exp(a + alpha * x_ref), "B": math.exp(b + beta * y_ref),
            "alpha": float(alpha), "beta": float(beta)}


def fit_power_law(x, y, delta=1e-3):
    """Saturating power law y = E + A x^-k (Kaplan et al. 2020's L(C) with an irreducible term, as
    BigScience fitted loss against compute), fitted like the parametric law: log-space Huber from
    variable-projection starts."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 3 or x.shape != y.shape:
        raise ValueError("fit_power_law: need at least 3 (x, y) pairs of equal length, got "
                         f"{x.size} and {y.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(x > 0) and np.all(y > 0)):
        raise ValueError("fit_power_law: x and y must be positive and finite")
    x_ref = np.log(x).mean()
    # one input (m = 1): theta = (a, e, k), log y = LSE(a - k (ln x - x_ref), e)
    X = (np.log(x) - x_ref)[None]
    # k from 0.005 to 2: Kaplan's compute exponent (0.050) is near the low end
    starts = projection_starts(X, y, np.arange(0.005, 2.0, 0.005))
    best = multistart(lse_model(X, np.log(y)), starts, np.ones_like(y), delta)
    a, e, k = best["theta"]
    # the centring undone as in to_params: A = exp(a + k x_ref)
    return {"E": math.exp(e), "A": math.exp(a + k * x_ref), "k": float(k),
            "objective": float(best["objective"]), "converged": bool(best["converged"]),
            "n_points": int(x.size)}
