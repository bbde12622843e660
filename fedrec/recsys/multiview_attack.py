"""The server reconstruction attack on FedMVMF (paper 004, Sec. 4, App. .1, Table 3).

The honest-but-curious server knows Q, U (it updates them), lambda1, lambda2, gamma and each
user's plaintext gradients f(i,j) (items it received: O_i under ObsOnly, all under InclUnc)
and f(i,d). From them it builds a system of equations in the user's ratings and attributes
and solves it with scipy's root finders, the method per scenario the paper's Table 6
selected:

- ``semials-obsonly`` (eqs. 18-21, ``hybr``): unknowns r_i on O_i and x_i; p_i = r_i A_i +
  x_i B_i; one gradient coordinate n gives a square system;
- ``semials-inclunc`` (eqs. 22-24, ``linearmixing``, the "scalar Jacobian approximation"):
  unknowns r_i on all items and x_i, c(r) smoothed;
- ``sgd-obsonly`` (eqs. 25-32, ``anderson``) and ``sgd-inclunc`` (eqs. 33-35, ``hybr``):
  unknown p_i^{t-1} from the gradients of epochs t-1 and t; then r_i and x_i in closed form.

Nothing is expanded: for a candidate the residual recomputes the user's own gradients (the
paper's eqs. 20, 24, 31, 33 are these products written out).

Decisions (docs/protocols/mvmf.md): c(r) = alpha + (1 - alpha) clip(r, 0, 1) for the solver
(the paper's eq. 42 has c(0) = 0, contradicting InclUnc's c(0) = alpha); under SGD-InclUnc
an item's c is alpha when its ratio implies r = 0 (|r_alpha| < 0.5), else 1; the SemiALS
residual is oriented so its Jacobian is negative (``linearmixing`` assumes -I / alpha; the
sign of p_n is read off the observed gradients); (r, x) -> (-r, -x) (SemiALS-ObsOnly) and
p -> -p (SGD) map roots to roots, and the server keeps the one with positive ratings;
initial guesses r = 0 (InclUnc) / 3 (ObsOnly), x = 0.5, p along the direction of an
observed gradient (f(i,j) is parallel to p_i) at scales 0.1..10 and both signs, the root
kept the one that best explains every gradient of epoch t (the one-item square system has
spurious roots); R_max = 5;
accuracy (eq. 43) on all of r_i (zeros included) under InclUnc, on O_i under ObsOnly; the
random-guess baseline is one over the number of values an entry can take (ratings 1..5:
1/5, 0..5: 1/6; dummies: 1/2); Laplace noise of scale b on every gradient entry the server
receives; with noise, solutions for every n (SemiALS) or for several items (SGD) are clipped
and averaged before rounding (Sec. 6.2).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from fedrec.recsys.multiview import MVMFConfig

SCENARIOS = ("semials-obsonly", "semials-inclunc", "sgd-obsonly", "sgd-inclunc")
#: The solver the paper's Table 6 selected per scenario (scipy.optimize.root methods).
SOLVERS = {"semials-obsonly": "hybr", "semials-inclunc": "linearmixing",
           "sgd-obsonly": "anderson", "sgd-inclunc": "hybr"}
R_MAX = 5.0
#: Function evaluations ``hybr`` may spend: MINPACK's default, 200 (n + 1), is ~750,000
#: for SemiALS-InclUnc on ML-1M (n = 3,706 items + 41 attributes, one finite-difference
#: Jacobian = n evaluations), minutes per user; 20,000 is ~5 such Jacobians there and still
#: 100 for ObsOnly's ~200 unknowns. The paper's Table 6 has no hybr result for
#: SemiALS-InclUnc ("doesn't return the solution").
HYBR_MAXFEV = 20_000
#: Scales of the SGD attack's starting points along p^{t-1}'s known direction.
START_SCALES = (1.0, 0.3, 3.0, 0.1, 10.0, 0.5, 2.0, 5.0)


@dataclass
class Observed:
    """What the server received from one user in one epoch, and the factors it sent."""

    user: int
    fQ: np.ndarray  # items x K (rows the server did not receive are zero)
    fU: np.ndarray  # attributes x K
    Q: np.ndarray
    U: np.ndarray
    sent: np.ndarray  # item indices the server received a gradient for


def smooth_c(r: np.ndarray, alpha: float) -> np.ndarray:
    """c(r) for the solver: alpha at r = 0, 1 from r = 1, linear between (c(0) = alpha)."""
    return alpha + (1.0 - alpha) * np.clip(r, 0.0, 1.0)


def _root(fun, x0: np.ndarray, method: str) -> tuple[np.ndarray, float]:
    """scipy.optimize.root, quiet; (solution, residual norm) (non-finite: inf)."""
    from scipy.optimize import root

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            opts = ({"maxfev": HYBR_MAXFEV} if method == "hybr" else
                    {"maxiter": 300} if method in ("linearmixing", "anderson", "broyden2")
                    else {})
            sol = root(fun, x0, method=method, options=opts)
            x = np.asarray(sol.x, dtype=np.float64)
            res = float(np.linalg.norm(fun(x)))
        except (ValueError, np.linalg.LinAlgError, OverflowError, FloatingPointError):
            return x0, np.inf
    return (x, res) if np.isfinite(res) and np.all(np.isfinite(x)) else (x0, np.inf)


# ---------------------------------------------------------------------------- SemiALS
def _semials_residual(obs: Observed, cfg: MVMFConfig, n: int, inclunc: bool):
    Q, U = obs.Q, obs.U
    S = np.arange(Q.shape[0]) if inclunc else obs.sent
    QS = Q[S]
    K, L = Q.shape[1], U.shape[0]
    UU = cfg.lam1 * (U.T @ U) + cfg.lam2 * np.eye(K)
    target = np.concatenate([obs.fQ[S, n], obs.fU[:, n]])

    # The residual's sign: scipy's linearmixing takes the Jacobian as -I / alpha, while this
    # one is about p_n diag(c, 1); p_n's sign is that of the summed observed coordinate (on
    # rated items r - q p is mostly positive: f(i,j) points along p). Roots are unchanged.
    sign = -1.0 if np.sum(obs.fQ[S, n]) >= 0 else 1.0

    def fun(z: np.ndarray) -> np.ndarray:
        r, x = z[:len(S)], z[len(S):]
        c = smooth_c(r, cfg.alpha) if inclunc else np.ones(len(S))
        A = QS.T @ (c[:, None] * QS) + UU
        p = np.linalg.solve(A, (r * c) @ QS + cfg.lam1 * (x @ U))
        pred = np.concatenate([(c * (r - QS @ p)) * p[n], (x - U @ p) * p[n]])
        return sign * (pred - target)

    return fun, len(S), L


def attack_semials(obs: Observed, cfg: MVMFConfig, inclunc: bool, ns: Iterable[int],
                   method: str) -> tuple[np.ndarray, np.ndarray]:
    """(r_hat on the attacked items, x_hat), clipped and averaged over the coordinates ns."""
    rs, xs = [], []
    for n in ns:
        fun, m, L = _semials_residual(obs, cfg, n, inclunc)
        z0 = np.concatenate([np.full(m, 0.0 if inclunc else 3.0), np.full(L, 0.5)])
        z, _ = _root(fun, z0, method)
        if not inclunc and z[:m].sum() < 0:
            z = -z  # (r, x) -> (-r, -x) is also a root under ObsOnly: ratings are positive
        rs.append(np.clip(z[:m], 0, R_MAX))
        xs.append(np.clip(z[m:], 0, 1))
    return np.mean(rs, axis=0), np.mean(xs, axis=0)


# ---------------------------------------------------------------------------- SGD
def _sgd_parts(prev: Observed, cur: Observed, cfg: MVMFConfig, n: int, inclunc: bool):
    """Functions of the unknown p^{t-1}: the next p, and per item the implied (c, r)."""
    S = np.arange(prev.Q.shape[0]) if inclunc else prev.sent
    Qp, Qc, Up = prev.Q[S], cur.Q[S], prev.U

    def step(p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a = prev.fQ[S, n] / p[n]  # c (r - p q^{t-1})
        aU = prev.fU[:, n] / p[n]  # x - p u^{t-1}
        grad = -2.0 * a @ Qp - 2.0 * cfg.lam1 * aU @ Up + 2.0 * cfg.lam2 * p
        return p - cfg.lr * grad, a, aU

    def c_r(p: np.ndarray, p_t: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s1 = Qp @ p
        if not inclunc:
            return np.ones(len(S)), a + s1
        r_alpha = a / cfg.alpha + s1
        unrated = np.abs(r_alpha) < 0.5
        return np.where(unrated, cfg.alpha, 1.0), np.where(unrated, 0.0, a + s1)

    return S, Qp, Qc, step, c_r


def attack_sgd(prev: Observed, cur: Observed, cfg: MVMFConfig, inclunc: bool,
               items: Iterable[int], method: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(r_hat on the attacked items, x_hat) from epochs t-1 and t, averaged over the
    solutions for ``items`` (positions in the attacked item set)."""
    S, Qp, Qc, step, c_r = _sgd_parts(prev, cur, cfg, n, inclunc)

    def everything(p: np.ndarray) -> np.ndarray:
        """The residual of the epoch-t gradients of every received item at p^{t-1}."""
        with np.errstate(all="ignore"):
            p_t, a, _ = step(p)
            c, r = c_r(p, p_t, a)
            return (c * (r - Qc @ p_t))[:, None] * p_t[None, :] - cur.fQ[S]

    rs, xs = [], []
    for j in items:
        target = cur.fQ[S[j]]

        def fun(p: np.ndarray, j: int = j, target: np.ndarray = target) -> np.ndarray:
            p_t, a, _ = step(p)
            c, r = c_r(p, p_t, a)
            return c[j] * (r[j] - Qc[j] @ p_t) * p_t - target

        seed_dir = prev.fQ[S[j]]
        norm = np.linalg.norm(seed_dir)
        if norm == 0:
            continue
        # Starts along p^{t-1}'s direction (every f^{t-1}(i,j) is parallel to it) at scales
        # 0.1..10, both signs. The one-item square system has spurious roots; the server
        # keeps the root that best explains every gradient it received at t.
        best, best_res = None, np.inf
        for scale in START_SCALES:
            for sign in (1.0, -1.0):
                p, res = _root(fun, sign * scale * seed_dir / norm, method)
                if not np.isfinite(res) or abs(p[n]) <= 1e-9:
                    continue
                full = float(np.linalg.norm(everything(p)))
                if full < best_res:
                    best, best_res = p, full
            if best_res < 1e-4 * max(1.0, float(np.linalg.norm(cur.fQ[S]))):
                break  # a root of the whole system: no need for further starts
        if best is None:
            continue
        # p -> -p maps a root to a root with every r and x negated (p_t, the ratios a and
        # the implied r all change sign; the products f = c (r - q p) p do not): keep the
        # one whose ratings on the received items are positive, as ratings are
        if c_r(best, *step(best)[:2])[1].sum() < 0:
            best = -best
        p_t, a, aU = step(best)
        c, r = c_r(best, p_t, a)
        if inclunc:  # eq. 35: both epochs' ratios eliminate c
            b = cur.fQ[S, n] / p_t[n]
            s1, s2 = Qp @ best, Qc @ p_t
            den = a - b
            ok = np.abs(den) > 1e-12
            r = np.where(ok, (a * s2 - b * s1) / np.where(ok, den, 1.0), r)
        rs.append(np.clip(r, 0, R_MAX))
        xs.append(np.clip(aU + prev.U @ best, 0, 1))
    if not rs:
        m = len(S)
        return np.zeros(m), np.zeros(prev.U.shape[0])
    return np.mean(rs, axis=0), np.mean(xs, axis=0)


# ---------------------------------------------------------------------------- scoring
def accuracy(estimate: np.ndarray, truth: np.ndarray, upper: float) -> float:
    """Eq. 43 for one user: the share of entries equal after clipping and rounding."""
    return float(np.mean(np.rint(np.clip(estimate, 0, upper)) == truth)) if truth.size else 0.0


def value_shares(values: np.ndarray, upper: float) -> np.ndarray:
    """Share of each value 0..upper among ``values`` clipped to [0, upper] and rounded (how
    eq. 43 reads an estimate; truths are already integers)."""
    v = np.rint(np.clip(np.asarray(values, dtype=np.float64), 0, upper)).astype(np.int64)
    counts = np.bincount(v.ravel(), minlength=int(upper) + 1).astype(np.float64)
    return counts / max(v.size, 1)


def baselines(scenario: str) -> tuple[float, float]:
    """Random-guess accuracy (rating, attribute): 1 / number of values of an entry."""
    return (1.0 / 6.0 if scenario.endswith("inclunc") else 1.0 / 5.0), 0.5


def add_noise(obs: Observed, b: float, rng: np.random.Generator) -> Observed:
    """The observation with Laplace(b) noise on every gradient entry the server received."""
    if b <= 0:
        return obs
    fQ = obs.fQ.copy()
    fQ[obs.sent] += rng.laplace(scale=b, size=(len(obs.sent), fQ.shape[1]))
    return Observed(obs.user, fQ, obs.fU + rng.laplace(scale=b, size=obs.fU.shape), obs.Q,
                    obs.U, obs.sent)


def estimate_user(scenario: str, cfg: MVMFConfig, cur: Observed, prev: Observed | None,
                  rng: np.random.Generator, noisy: bool = False, sgd_items: int = 5,
                  method: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The server's estimates (r_hat, x_hat) for one user: r_hat on every item under InclUnc,
    on the items it received (``cur.sent``) under ObsOnly; unclipped, unrounded.

    Without noise one random coordinate n (SemiALS) or item j (SGD) is used, as in the paper;
    with noise the solutions for every n / ``sgd_items`` items are averaged. ``method``: a
    ``scipy.optimize.root`` method in place of the scenario's :data:`SOLVERS` entry (the
    paper's Table 6 compares four).
    """
    inclunc = scenario.endswith("inclunc")
    method = method or SOLVERS[scenario]
    K = cur.Q.shape[1]
    if scenario.startswith("semials"):
        ns = range(K) if noisy else [int(rng.integers(K))]
        return attack_semials(cur, cfg, inclunc, ns, method)
    assert prev is not None
    m = prev.Q.shape[0] if inclunc else len(prev.sent)
    if inclunc:  # a random item among the 10% largest gradients (what the server sees:
        # weight 1 against alpha makes them mostly rated items)
        norms = np.linalg.norm(prev.fQ, axis=1)
        pool = np.argsort(-norms, kind="stable")[:max(1, m // 10)]
    else:
        pool = np.arange(m)
    items = rng.choice(pool, size=min(len(pool), sgd_items if noisy else 1), replace=False)
    # n: the largest coordinate of p^{t-1}'s direction (every f^{t-1}(i,j) is parallel
    # to p^{t-1}), so the divisions by p_n are well conditioned
    lead = prev.fQ[np.argmax(np.linalg.norm(prev.fQ, axis=1))]
    return attack_sgd(prev, cur, cfg, inclunc, items, method, int(np.argmax(np.abs(lead))))


def attack_truth(scenario: str, cur: Observed, r_true: np.ndarray) -> np.ndarray:
    """The ratings eq. 43 scores an estimate against: all items (zeros included) under
    InclUnc, the items the server received under ObsOnly."""
    return r_true if scenario.endswith("inclunc") else r_true[cur.sent]


def attack_user(scenario: str, cfg: MVMFConfig, cur: Observed, prev: Observed | None,
                r_true: np.ndarray, x_true: np.ndarray, rng: np.random.Generator,
                noisy: bool = False, sgd_items: int = 5,
                method: str | None = None) -> tuple[float, float, float]:
    """(rating accuracy, attribute accuracy, rating accuracy on the rated items) of the
    attack on one user (under ObsOnly the first and the last are the same).

    ``r_true``: the user's ratings on all items (0 = unrated); the other arguments as in
    :func:`estimate_user`.
    """
    r_hat, x_hat = estimate_user(scenario, cfg, cur, prev, rng, noisy, sgd_items, method)
    return accuracies(r_hat, x_hat, attack_truth(scenario, cur, r_true), x_true)


def accuracies(r_hat: np.ndarray, x_hat: np.ndarray, truth: np.ndarray,
               x_true: np.ndarray) -> tuple[float, float, float]:
    """Eq. 43 on the ratings, on the attributes and on the truly rated entries alone."""
    rated = truth > 0
    return (accuracy(r_hat, truth, R_MAX), accuracy(x_hat, x_true, 1.0),
            accuracy(r_hat[rated], truth[rated], R_MAX))


def capture(R, X: np.ndarray, Y: np.ndarray, cfg: MVMFConfig, epochs: int,
            users: Iterable[int]) -> dict[int, dict[int, Observed]]:
    """Train the (centralized, same-code) model and record, per epoch, what the FedMVMF
    server receives from each of ``users``: their gradients and the Q, U they were made at."""
    from fedrec.recsys.multiview import MVMF

    wanted = set(int(u) for u in users)
    seen: dict[int, dict[int, Observed]] = {}

    def on_epoch(epoch, step, model) -> None:
        seen[epoch] = {}
        for uid, fq, fu in step.per_user:
            if uid in wanted:
                sent = np.flatnonzero(np.any(fq != 0, axis=1))
                seen[epoch][uid] = Observed(uid, fq, fu, model.Q.copy(), model.U.copy(), sent)

    MVMF(cfg, on_epoch=on_epoch).fit(R, X, Y, epochs)
    return seen
