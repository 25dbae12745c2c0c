"""The models behind ``ehvi`` and ``mfehvi``: a configuration's features, a Gaussian process over them (and a
tree ensemble), and the warping of the values a model learns.

Features (``encode``): per key that varies, min-max scaled numbers (log10 when positive and spanning 10x or
more) with a column marking where the key is absent (an inactive dimension), or one-hot categories (absent:
a category of its own). ``groups`` names each column's key.

GP: a zero-mean process on standardised values, kernel s2 * Matern-5/2(r) + noise, with
r^2 = sum over groups g of |x_g - x'_g|^2 / l_g^2. The groups are either every feature column alone
(``columns``: one length scale per category of a categorical key, per number, per absent marker) or every key
(``keys``: one length scale per key; on a key's one-hot columns |x_g - x'_g|^2 is 2 [x_g != x'_g], the
overlap kernel of categorical Bayesian optimisation). Hyperparameters: the marginal likelihood's maximum by
L-BFGS with its exact gradient, within bounds that keep the kernel well conditioned. A fit costs O(n^3)
(n observations); a prediction O(m n) for m candidates.

Additive GP (``additive``): s2 * the mean over keys g of Matern-5/2(|x_g - x'_g| / l_g), a first-order
additive kernel (Duvenaud et al., 2011): each key's effect is learnt from every observation that differs in
that key alone, where the product above needs neighbours close in every key. With a ``product`` group (mfehvi's
fidelity) the sum is multiplied by that group's Matern: the effects hold across fidelities as far as its
length scale says.

Trees (``trees``): extremely randomised trees (scikit-learn), the mean and the spread over the trees as the
prediction: no kernel to fit, indifferent to how categories are coded.

Warping (``warp``): ``copula`` maps observed values to normal quantiles of their ranks (ties share a rank),
so a few far outliers (a diverged run's loss) do not flatten everything else; the acquisition then works on
that scale (search.searchers.ehvi).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.linalg import cho_solve, cholesky, solve_triangular
from scipy.optimize import minimize
from scipy.stats import norm, rankdata

SQRT5 = math.sqrt(5.0)
# log bounds: length scales (features lie in [0, 1]; a one-hot difference is sqrt 2), signal and noise
# variances of standardised values. A noise floor of 1e-6 keeps the Cholesky factor of duplicates finite.
LOG_LENGTH = (math.log(0.05), math.log(50.0))
LOG_SIGNAL = (math.log(0.05), math.log(20.0))
LOG_NOISE = (math.log(1e-6), math.log(1.0))
KERNELS = ("columns", "keys", "additive")
MODELS = (*KERNELS, "trees")


def encode(configs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """((n, d) features, (d,) the group of each column: the index of its key among those that vary)."""
    keys = sorted({k for c in configs for k in c})
    columns, groups = [], []
    for k in keys:
        values = [c.get(k) for c in configs]
        if len({repr(v) for v in values}) < 2:
            continue
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
            block = _scaled(values)
        else:
            levels = sorted({repr(v) for v in values})
            block = np.zeros((len(values), len(levels)))
            block[np.arange(len(values)), [levels.index(repr(v)) for v in values]] = 1.0
        groups += [len(columns)] * block.shape[1]
        columns.append(block)
    if not columns:
        return np.zeros((len(configs), 1)), np.zeros(1, dtype=int)
    return np.hstack(columns), np.asarray(groups, dtype=int)


def _scaled(values: list) -> np.ndarray:
    """(n, 1 or 2): numbers scaled to [0, 1] (absent: 0), and an absent-marker column when any is absent."""
    absent = np.array([v is None for v in values])
    x = np.array([0.0 if v is None else float(v) for v in values])
    seen = x[~absent]
    if seen.min() > 0 and seen.max() / seen.min() >= 10:
        x[~absent] = np.log10(seen)
        seen = x[~absent]
    span = seen.max() - seen.min()
    x[~absent] = (seen - seen.min()) / span if span > 0 else 0.0
    x[absent] = 0.0
    return np.column_stack([x, absent.astype(float)]) if absent.any() else x[:, None]


def copula(y: np.ndarray) -> np.ndarray:
    """Normal quantiles of the ranks of y (ties averaged): (rank - 0.5) / n through the inverse normal CDF."""
    y = np.asarray(y, float)
    return norm.ppf((rankdata(y) - 0.5) / len(y)) if len(y) > 1 else np.zeros_like(y)


def _matern(r: np.ndarray) -> np.ndarray:
    return (1.0 + SQRT5 * r + (5.0 / 3.0) * r * r) * np.exp(-SQRT5 * r)


def _matern_dlog_l(r: np.ndarray) -> np.ndarray:
    """d Matern(d / l) / d log l at r = d / l."""
    return (5.0 / 3.0) * r * r * (1.0 + SQRT5 * r) * np.exp(-SQRT5 * r)


def _likelihood(kernel: np.ndarray, noise: float, y: np.ndarray):
    """(negative log marginal likelihood of y, alpha alpha^T - K^-1: what its gradient in a kernel parameter
    is made of, -0.5 sum(inner * dK)) for K = kernel + noise; None when K is not positive definite."""
    n = len(y)
    try:
        L = cholesky(kernel + (noise + 1e-9) * np.eye(n), lower=True)
    except np.linalg.LinAlgError:
        return None
    alpha = cho_solve((L, True), y)
    nll = 0.5 * y @ alpha + np.log(np.diag(L)).sum() + 0.5 * n * math.log(2 * math.pi)
    return nll, np.outer(alpha, alpha) - cho_solve((L, True), np.eye(n))


class GP:
    """The Gaussian process of the module docstring over columns grouped by ``groups`` ((d,) ints);
    theta = log of (one length scale per group, the signal variance, the noise variance)."""

    def __init__(self, groups: np.ndarray):
        self.groups = np.asarray(groups, dtype=int)
        self.n_groups = int(self.groups.max()) + 1 if len(self.groups) else 1
        self.theta: np.ndarray | None = None

    def default_theta(self) -> np.ndarray:
        return np.concatenate([np.full(self.n_groups, math.log(1.0)), [0.0, math.log(1e-2)]])

    def bounds(self) -> list[tuple[float, float]]:
        return [LOG_LENGTH] * self.n_groups + [LOG_SIGNAL, LOG_NOISE]

    def _sq(self, a: np.ndarray, b: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """(m, n) sum over groups of squared differences over squared length scales."""
        scale = np.exp(-theta[self.groups])           # (d,) 1 / l of each column's group
        a, b = a * scale, b * scale
        d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
        return np.maximum(d2, 0.0)

    def _pairs(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(G, m, n) squared differences of each group's columns between a and b (unscaled)."""
        out = np.zeros((self.n_groups, len(a), len(b)))
        for g in range(self.n_groups):
            ca, cb = a[:, self.groups == g], b[:, self.groups == g]
            out[g] = np.maximum((ca * ca).sum(1)[:, None] + (cb * cb).sum(1)[None, :] - 2.0 * ca @ cb.T, 0.0)
        return out

    def _kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(m, n) the kernel (without the noise) between a and b at the fitted theta."""
        return math.exp(self.theta[self.n_groups]) * _matern(np.sqrt(self._sq(a, b, self.theta)))

    def _nll(self, theta: np.ndarray, y: np.ndarray, per_group: np.ndarray):
        """(negative log marginal likelihood, its gradient in theta)."""
        G = self.n_groups
        inv_l2 = np.exp(-2.0 * theta[:G])
        d2 = np.tensordot(inv_l2, per_group, axes=1)
        r = np.sqrt(d2)
        signal, noise = math.exp(theta[G]), math.exp(theta[G + 1])
        base = _matern(r)
        found = _likelihood(signal * base, noise, y)
        if found is None:
            return 1e10, np.zeros_like(theta)
        nll, inner = found
        dk_dd2 = signal * (5.0 / 6.0) * (1.0 + SQRT5 * r) * np.exp(-SQRT5 * r)  # -dk/d(d2) * ... (see below)
        grad = np.empty_like(theta)
        # d K / d log l_g = signal * (5/3) (1 + sqrt5 r) exp(-sqrt5 r) * D_g / l_g^2
        for g in range(G):
            grad[g] = -0.5 * np.sum(inner * (2.0 * dk_dd2 * per_group[g] * inv_l2[g]))
        grad[G] = -0.5 * np.sum(inner * (signal * base))
        grad[G + 1] = -0.5 * np.trace(inner) * noise
        return nll, grad

    def _optimised(self, z: np.ndarray, pairs: np.ndarray) -> np.ndarray:
        """theta of the largest marginal likelihood of standardised z, from the last theta (or the default)."""
        start = self.theta if self.theta is not None else self.default_theta()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            found = minimize(self._nll, start, args=(z, pairs), jac=True, method="L-BFGS-B",
                             bounds=self.bounds(), options={"maxiter": 200})
        return found.x if np.isfinite(found.fun) else self.default_theta()

    def fit(self, x: np.ndarray, y: np.ndarray, optimise: bool = True) -> GP:
        """Condition on (x, y); optimise: fit the hyperparameters first (from the last ones, when any)."""
        x, y = np.asarray(x, float), np.asarray(y, float)
        self.mean, self.std = float(y.mean()), float(y.std()) or 1.0
        z = (y - self.mean) / self.std
        if optimise or self.theta is None:
            self.theta = self._optimised(z, self._pairs(x, x))
        K = self._kernel(x, x)
        K[np.diag_indices_from(K)] += math.exp(self.theta[self.n_groups + 1]) + 1e-9
        self.x, self.L, self.top_eigen = x, cholesky(K, lower=True), None
        self.alpha = cho_solve((self.L, True), z)
        return self

    def sd_bound(self, k: np.ndarray) -> np.ndarray:
        """(m,) an upper bound of the predictive standard deviation at the points of ``k`` (cross), in O(m n):
        k^T K^-1 k >= k_j^2 / K_jj for every observation j (Cauchy-Schwarz) and >= |k|^2 / the largest
        eigenvalue of K, so the variance s2 - k^T K^-1 k is at most s2 minus the larger of the two."""
        signal = math.exp(self.theta[self.n_groups])
        diag = signal + math.exp(self.theta[self.n_groups + 1]) + 1e-9
        if self.top_eigen is None:
            self.top_eigen = float(np.linalg.eigvalsh(self.L @ self.L.T)[-1])
        explained = np.maximum((k * k).max(1) / diag, (k * k).sum(1) / self.top_eigen)
        return np.sqrt(np.maximum(signal - explained, 1e-12)) * self.std

    def cross(self, x: np.ndarray) -> np.ndarray:
        """(m, n) the kernel between x and the observations: what a prediction is made of."""
        return self._kernel(np.asarray(x, float), self.x)

    def predict(self, x: np.ndarray, sd: bool = True, k: np.ndarray | None = None):
        """(mean, standard deviation) of the latent function at x, in y's units; sd False: the mean alone
        (O(m n) instead of O(m n^2)); k: cross(x), when already made."""
        k = self.cross(x) if k is None else k
        mu = k @ self.alpha * self.std + self.mean
        if not sd:
            return mu
        v = solve_triangular(self.L, k.T, lower=True)                                      # (n, m)
        var = np.maximum(math.exp(self.theta[self.n_groups]) - (v * v).sum(0), 1e-12)
        return mu, np.sqrt(var) * self.std


class AdditiveGP(GP):
    """The additive GP of the module docstring; theta as GP's (a length scale per group, the product group's
    included). The kernel is built from per-group squared differences, (G, m, n), G the keys."""

    def __init__(self, groups: np.ndarray, product: int | None = None):
        super().__init__(groups)
        self.product = product
        self.adds = [g for g in range(self.n_groups) if g != product]

    def _parts(self, pairs: np.ndarray, theta: np.ndarray):
        """r per group, (G, m, n); the sum's mean A of Matern(r) and the product's factor F, (m, n)."""
        r = np.sqrt(pairs) * np.exp(-theta[:self.n_groups])[:, None, None]
        m = _matern(r)
        return r, m[self.adds].mean(0), m[self.product] if self.product is not None else 1.0

    def _nll(self, theta: np.ndarray, y: np.ndarray, pairs: np.ndarray):
        G = self.n_groups
        r, A, F = self._parts(pairs, theta)
        signal, noise = math.exp(theta[G]), math.exp(theta[G + 1])
        Ks = signal * A * F
        found = _likelihood(Ks, noise, y)
        if found is None:
            return 1e10, np.zeros_like(theta)
        nll, inner = found
        grad = np.zeros_like(theta)
        for g in self.adds:
            grad[g] = -0.5 * np.sum(inner * (signal * F * _matern_dlog_l(r[g]) / len(self.adds)))
        if self.product is not None:
            grad[self.product] = -0.5 * np.sum(inner * (signal * A * _matern_dlog_l(r[self.product])))
        grad[G] = -0.5 * np.sum(inner * Ks)
        grad[G + 1] = -0.5 * np.trace(inner) * noise
        return nll, grad

    def _kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        _, A, F = self._parts(self._pairs(a, b), self.theta)
        return math.exp(self.theta[self.n_groups]) * A * F


class Trees:
    """Extremely randomised trees (module docstring); ``theta`` is None (nothing carried between fits), and no
    bound on a prediction's spread is known (``prior_sd``)."""

    theta = None
    sd_bound = None

    def __init__(self, groups: np.ndarray, seed: int = 0):
        self.seed = seed

    def fit(self, x: np.ndarray, y: np.ndarray, optimise: bool = True) -> Trees:
        from sklearn.ensemble import ExtraTreesRegressor

        self.model = ExtraTreesRegressor(n_estimators=64, min_samples_leaf=2, random_state=self.seed)
        self.model.fit(np.asarray(x, float), np.asarray(y, float))
        self.floor = 1e-3 * (float(np.std(y)) or 1.0)
        return self

    def predict(self, x: np.ndarray, sd: bool = True):
        each = np.stack([t.predict(np.asarray(x, float)) for t in self.model.estimators_])   # (trees, m)
        return each.mean(0), np.maximum(each.std(0), self.floor)


class Linear:
    """Bayesian linear regression (scikit-learn's BayesianRidge: its precisions by evidence maximisation), the
    model of a measured cost: a cost is close to additive in a configuration's parts and follows its counted
    costs, and a linear model carries that from the cheap configurations a search measures first to the others,
    where a GP reverts to its mean (on NAS-Bench-201 latency, 50 measurements biased to the fast cells: rank
    correlation with the rest 0.93 against the GP's 0.50). Refitted from the measurements each time."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> Linear:
        from sklearn.linear_model import BayesianRidge

        self.model = BayesianRidge().fit(np.asarray(x, float), np.asarray(y, float))
        return self

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.model.predict(np.asarray(x, float), return_std=True)


def make_model(kind: str, groups: np.ndarray, seed: int = 0, product: int | None = None):
    """A model of that kind (MODELS) over features whose columns are grouped by ``groups``; product: the group
    an additive GP multiplies its sum with (the others treat it as one more group)."""
    if kind == "additive":
        return AdditiveGP(groups, product)
    if kind == "trees":
        return Trees(groups, seed)
    if kind == "columns":
        return GP(np.arange(len(groups)))
    if kind == "keys":
        return GP(groups)
    raise ValueError(f"model: expected one of {', '.join(MODELS)}, given {kind!r}")
