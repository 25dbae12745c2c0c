"""Expected hypervolume improvement of a candidate whose training objective is normal and whose costs are
known exactly, or known only as a prediction (a measured cost not measured yet).

Known costs, exact in closed form for one training objective and one or two costs:

    EHVI(x) = E[ integral over t from r_y to y(x) of A_x(t) dt ],  y(x) ~ N(mu, sd)
    A_x(t)  = the area (one cost: length) of x's cost box [c(x), r_c] not dominated in cost by a
              known point with training value >= t

A_x is a step function of t (it changes at the known points' values), so EHVI is a sum over those steps of
A_j * (E[(y - t_j)+] - E[(y - t_{j+1})+]), with E[(y - t)+] = (mu - t) Phi(z) + sd phi(z), z = (mu - t)/sd.

Predicted costs (``ehvi_sampled``): the costs of x are independent of y(x), so EHVI is the mean over the
costs' distribution of the closed form above. That mean is taken over a fixed sample of the costs: COST_DRAWS
stratified normal quantiles per cost (one cost), or that many pairs of them in a fixed shuffled order (two);
Monte Carlo over the costs, closed form over the training objective. The training objective is maximised,
costs minimised throughout.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr
from scipy.stats import norm

from qkvsearch.search.analysis.pareto import nondominated_mask

COST_DRAWS = 16   # cost samples per candidate whose cost is predicted
SQRT_2PI = math.sqrt(2.0 * math.pi)


def above(mu: np.ndarray, sd: np.ndarray, t: float) -> np.ndarray:
    """E[(y - t)+] for y ~ N(mu, sd) (0 for t = +inf)."""
    if math.isinf(t):
        return np.zeros_like(mu)
    z = (mu - t) / sd
    return (mu - t) * ndtr(z) + sd * np.exp(-0.5 * z * z) / SQRT_2PI


def undominated(box: np.ndarray, known: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """(n,) measure of each candidate's cost box [box_i, ref] not dominated by the known cost points
    (m, k), k = 1 (a length) or 2 (an area, through the known points' staircase)."""
    whole = np.prod(np.clip(ref - box, 0, None), axis=1)
    if not len(known):
        return whole
    if box.shape[1] == 1:
        return np.clip(np.minimum(ref[0], known[:, 0].min()) - box[:, 0], 0, None)
    stair, best = [], math.inf   # the known points' front in cost, by the first cost ascending
    for x, y in sorted(map(tuple, known)):
        if y < best:
            stair.append((x, y))
            best = y
    covered = np.zeros(len(box))
    for r, (x, y) in enumerate(stair):
        x_next = stair[r + 1][0] if r + 1 < len(stair) else ref[0]
        width = np.clip(np.minimum(x_next, ref[0]) - np.maximum(box[:, 0], x), 0, None)
        covered += width * np.clip(ref[1] - np.maximum(box[:, 1], y), 0, None)
    return whole - covered


def _front(known_y: np.ndarray, known_costs: np.ndarray):
    """The known points another does not dominate: only they can cover anything."""
    if not len(known_y):
        return known_y, known_costs
    keep = nondominated_mask(np.column_stack([known_y, known_costs]), ["max"] + ["min"] * known_costs.shape[1])
    return known_y[keep], known_costs[keep]


def ehvi(mu, sd, cand_costs, known_y, known_costs, ref_y: float, ref_costs) -> np.ndarray:
    """Expected hypervolume improvement of each candidate (module docstring): mu, sd (n,); cand_costs (n, k);
    known_y (m,), known_costs (m, k)."""
    mu, sd = np.asarray(mu, float), np.maximum(np.asarray(sd, float), 1e-12)
    known_y, known_costs = np.asarray(known_y, float), np.asarray(known_costs, float)
    if known_costs.ndim == 1:
        known_costs = known_costs.reshape(len(known_y), -1)
    known_y, known_costs = _front(known_y, known_costs)
    ref_costs = np.asarray(ref_costs, float)
    steps = np.concatenate([[ref_y], np.unique(known_y[known_y > ref_y]), [math.inf]])
    total = np.zeros_like(mu)
    for lo, hi in zip(steps[:-1], steps[1:]):
        area = undominated(np.asarray(cand_costs, float), known_costs[known_y >= hi], ref_costs)
        total += area * (above(mu, sd, lo) - above(mu, sd, hi))
    return total


def cost_draws(k: int, draws: int = COST_DRAWS) -> np.ndarray:
    """(draws, k) standard normal values: stratified quantiles per cost, paired in a fixed shuffled order."""
    q = norm.ppf((np.arange(draws) + 0.5) / draws)
    cols = [q] + [np.random.default_rng(j).permutation(q) for j in range(1, k)]
    return np.column_stack(cols)


def ehvi_sampled(mu, sd, cost_mean, cost_sd, known_y, known_costs, ref_y: float, ref_costs,
                 to_cost=None, draws: int = COST_DRAWS) -> np.ndarray:
    """EHVI of candidates whose costs are predicted: cost_mean, cost_sd (n, k) on the scale the prediction is
    made (to_cost maps (n, k) values of that scale to costs, minimised; identity when None); a cost known
    exactly has sd 0. The mean of ``ehvi`` over ``cost_draws``."""
    cost_mean, cost_sd = np.asarray(cost_mean, float), np.asarray(cost_sd, float)
    exact = ~(cost_sd > 0).any(axis=1)
    total = np.zeros(len(cost_mean))
    as_cost = to_cost or (lambda v: v)
    if exact.any():
        total[exact] = ehvi(np.asarray(mu)[exact], np.asarray(sd)[exact], as_cost(cost_mean[exact]),
                            known_y, known_costs, ref_y, ref_costs)
    rest = ~exact
    if rest.any():
        m, s = cost_mean[rest], cost_sd[rest]
        for z in cost_draws(cost_mean.shape[1], draws):
            total[rest] += ehvi(np.asarray(mu)[rest], np.asarray(sd)[rest], as_cost(m + s * z), known_y,
                                known_costs, ref_y, ref_costs) / draws
    return total
