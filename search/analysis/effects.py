"""What a design choice is worth at equal cost: each value of a categorical design key against the key's baseline
value, along each cost objective, with a bootstrap interval and a plain verdict. The report opens with these lines.

    design keys     the categorical keys of the model (spaces.keys: a closed set of values, model or embedding
                    group: embedding, code_sharing, attention, pos_embed, patch_embed, key, ...) whose values vary
                    over the trials eligible for the front; the baseline value is the key's default (linear for
                    embedding, softmax for attention, ...)
    configurations  a value's eligible trials with a finite accuracy and cost, grouped by training identity without
                    the seed (spaces.keys.identity): a configuration's accuracy is the mean over its seeds
    attainment      A_v(x): the best accuracy among value v's configurations of cost <= x: v's front in the (cost,
                    accuracy) plane, as a step function of the cost (a cost to maximise, throughput, is negated)
    gap             the mean of A_v - A_b over the cost range where both have points: from lo, the first cost at
                    which both have a configuration, to hi = max(lo, the smaller of the two largest costs); the
                    difference at lo when hi == lo (each side one cost). In the accuracy's units: top-1 points
    interval        95 % percentile bootstrap over BOOTSTRAP resamples: each side's configurations drawn with
                    replacement, and each drawn configuration's seeds (where repeats trained it under several)
                    drawn with replacement for its mean
    verdict         better | worse: the interval on one side of 0 (by the accuracy's direction); else not told
                    apart, as it is when a side has fewer than MIN_TRIALS trials (nothing to resample)

Pure numpy on the collected trials (search.analysis.front.FrontInfo); nothing here reads or writes files.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from qkvsearch.search.analysis.results import CONFIG_PREFIX
from qkvsearch.spaces.blocks import is_block_key_of
from qkvsearch.spaces.keys import KEYS, identity
from qkvsearch.spaces.metrics import COST_METRICS

BOOTSTRAP = 2000          # resamples for each interval
MIN_TRIALS = 2            # trials a side needs before its spread can be resampled
LEVEL = 95                # the interval's coverage, percent
BETTER, WORSE, UNTOLD = "better", "worse", "not told apart"
FIRST_KEY = "embedding"   # the question the campaigns exist for: listed first
# The categorical design keys, from their declarations: a closed set of values that decides the model.
CHOICE_KEYS = tuple(sorted((k.name for k in KEYS.values() if k.group in ("model", "embedding") and k.check.options
                            and k.searchable), key=lambda name: name != FIRST_KEY))


@dataclass(frozen=True)
class Effect:
    """One value of a design key against its baseline along one cost objective (module docstring)."""

    key: str
    value: str
    baseline: str
    metric: str                     # the accuracy objective, e.g. top1
    mode: str                       # its direction: max | min
    cost: str                       # the cost objective, e.g. gmacs
    gap: float | None               # value - baseline, in the metric's units; None: not comparable
    ci: tuple[float, float] | None  # its interval; None: too few trials
    verdict: str                    # better | worse | not told apart
    configs: int                    # the value's configurations and trials
    trials: int
    base_configs: int
    base_trials: int
    cost_range: tuple[float, float] | None   # [lo, hi] in the cost's own units
    note: str = ""                  # why there is no gap or no interval

    def line(self) -> str:
        """The effect in one line of words."""
        head = f"{self.key} {self.value} vs {self.baseline}: {self.metric} "
        counts = (f"{self.configs} configuration(s) / {self.trials} trial(s) against {self.base_configs} / "
                  f"{self.base_trials}")
        if self.gap is None:
            return head + f"at equal {self.cost}: n/a ({self.note}; {counts})"
        lo, hi = self.cost_range
        where = f"{self.cost} {lo:.4g}" + (f"-{hi:.4g}" if hi != lo else "")
        ci = (f"{LEVEL} % bootstrap interval {self.ci[0]:+.3g} to {self.ci[1]:+.3g}" if self.ci is not None
              else f"no interval: {self.note}")
        return head + f"{self.gap:+.3g} at equal {self.cost} ({where}; {ci}; {counts}): {self.verdict}"


def accuracy_objective(metrics, directions) -> int | None:
    """The index of the objective a design is judged on: the first that is not a cost (top1, val_loss, ...)."""
    return next((i for i, m in enumerate(metrics) if m not in COST_METRICS), None)


def cost_objectives(metrics) -> list[int]:
    """The indexes of the cost objectives (counted or measured before training)."""
    return [i for i, m in enumerate(metrics) if m in COST_METRICS]


# ---------------------------------------------------------------------------------------- the gap
def attained(costs: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """costs (n,) ascending; values (R, n), -inf where a configuration is absent -> (R, m): the best value among
    the configurations of cost <= each of ``at`` (m,), -inf below the first present one."""
    best = np.maximum.accumulate(values, axis=1)
    idx = np.searchsorted(costs, at, side="right") - 1
    return np.where(idx >= 0, best[:, np.maximum(idx, 0)], -np.inf)


def _extremes(costs: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R,) the least and the largest cost of the configurations present in each resample."""
    first = np.argmax(present, axis=1)
    last = costs.size - 1 - np.argmax(present[:, ::-1], axis=1)
    return costs[first], costs[last]


def gaps(cost_v, values_v, cost_b, values_b) -> np.ndarray:
    """The gap (module docstring) of value v over baseline b, per resample. cost_*: (n_*,) costs to minimise,
    ascending; values_*: (R, n_*) accuracies to maximise, -inf where a configuration is absent from the
    resample (every row holds at least one). -> (R,)."""
    cost_v, cost_b = np.asarray(cost_v, float), np.asarray(cost_b, float)
    values_v, values_b = np.atleast_2d(values_v), np.atleast_2d(values_b)
    at = np.unique(np.concatenate([cost_v, cost_b]))       # (m,) every cost where a front may step
    with np.errstate(invalid="ignore"):   # -inf - -inf below lo: never read
        diff = attained(cost_v, values_v, at) - attained(cost_b, values_b, at)   # (R, m); finite from lo on
    low_v, high_v = _extremes(cost_v, np.isfinite(values_v))
    low_b, high_b = _extremes(cost_b, np.isfinite(values_b))
    lo = np.maximum(low_v, low_b)
    hi = np.maximum(lo, np.minimum(high_v, high_b))
    inside = (at[:-1] >= lo[:, None]) & (at[1:] <= hi[:, None])     # (R, m - 1) steps within [lo, hi]
    widths = np.where(inside, np.diff(at), 0.0)
    length = widths.sum(axis=1)
    area = (np.where(inside, diff[:, :-1], 0.0) * widths).sum(axis=1)
    at_lo = diff[np.arange(len(lo)), np.searchsorted(at, lo)]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(length > 0, area / np.where(length > 0, length, 1.0), at_lo)


def attainment_gap(cost_v, acc_v, cost_b, acc_b) -> float:
    """The gap of one set of points (cost to minimise, accuracy to maximise, one per configuration) over another:
    what ``gaps`` gives without resampling."""
    def arranged(cost, acc):
        cost, acc = np.asarray(cost, float), np.asarray(acc, float)
        order = np.argsort(cost, kind="stable")
        return cost[order], acc[order][None, :]

    return float(gaps(*arranged(cost_v, acc_v), *arranged(cost_b, acc_b))[0])


@dataclass(frozen=True)
class _Side:
    """One value's configurations: costs (n,) ascending (to minimise), each configuration's accuracies (to
    maximise) over its seeds."""

    costs: np.ndarray
    seeds: list[np.ndarray]

    @property
    def trials(self) -> int:
        return int(sum(len(s) for s in self.seeds))

    def means(self) -> np.ndarray:
        return np.array([s.mean() for s in self.seeds])[None, :]

    def resampled(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """(n, configurations): the configurations drawn with replacement (absent: -inf), each present one at the
        mean of its seeds drawn with replacement."""
        k = len(self.seeds)
        drawn = rng.integers(0, k, (n, k))
        present = np.zeros((n, k), dtype=bool)
        present[np.arange(n)[:, None], drawn] = True
        means = np.empty((n, k))
        for j, seeds in enumerate(self.seeds):
            means[:, j] = seeds[rng.integers(0, len(seeds), (n, len(seeds)))].mean(axis=1) if len(seeds) > 1 \
                else seeds[0]
        return np.where(present, means, -np.inf)


def _side(rows: pd.DataFrame, acc_col: str, acc_sign: float, cost_col: str, cost_sign: float) -> _Side:
    groups: dict[str, list[float]] = {}
    costs: dict[str, float] = {}
    for key, acc, cost in zip(rows["identity"], rows[acc_col].astype("float64"), rows[cost_col].astype("float64")):
        groups.setdefault(key, []).append(acc_sign * acc)
        costs.setdefault(key, cost_sign * cost)
    order = sorted(groups, key=lambda k: costs[k])
    return _Side(np.array([costs[k] for k in order]), [np.array(groups[k]) for k in order])


def effect_of(value: _Side, base: _Side, seed: int = 0) -> tuple[float, tuple[float, float] | None]:
    """(the gap of ``value`` over ``base``, its interval or None when a side has fewer than MIN_TRIALS trials)."""
    gap = float(gaps(value.costs, value.means(), base.costs, base.means())[0])
    if value.trials < MIN_TRIALS or base.trials < MIN_TRIALS:
        return gap, None
    rng = np.random.default_rng(seed)
    sample = gaps(value.costs, value.resampled(rng, BOOTSTRAP), base.costs, base.resampled(rng, BOOTSTRAP))
    tail = (100 - LEVEL) / 2
    return gap, (float(np.percentile(sample, tail)), float(np.percentile(sample, 100 - tail)))


def verdict(ci, mode: str) -> str:
    """better | worse | not told apart, for an interval of value - baseline on a metric of this direction."""
    if ci is None:
        return UNTOLD
    low, high = ci if mode == "max" else (-ci[1], -ci[0])
    return BETTER if low > 0 else WORSE if high < 0 else UNTOLD


# ---------------------------------------------------------------------------------------- a campaign's effects
def _mixed(df: pd.DataFrame, key: str) -> np.ndarray:
    """(n,) rows whose blocks draw ``key`` themselves (a per-block space): no one value to group them by."""
    own = [c for c in df.columns if c.startswith(CONFIG_PREFIX) and is_block_key_of(c.removeprefix(CONFIG_PREFIX), key)]
    return df[own].notna().any(axis=1).to_numpy() if own else np.zeros(len(df), dtype=bool)


def design_effects(info, seed: int = 0) -> list[Effect]:
    """Every effect (module docstring) of a campaign's trials. info: search.analysis.front.FrontInfo."""
    acc = accuracy_objective(info.metrics, info.directions)
    costs = cost_objectives(info.metrics) or ([None] if "gmacs" in info.trials else [])
    if acc is None or not costs:
        return []
    df, acc_col, mode = info.trials, info.columns[acc], info.directions[acc]
    usable = df["eligible"].to_numpy() & np.isfinite(df[acc_col].to_numpy(dtype="float64", na_value=np.nan))
    rows = df.loc[usable].copy()
    rows["identity"] = [identity(json.loads(c), ignore=("seed",)) for c in rows["config_json"]]
    out = []
    for key in CHOICE_KEYS:
        col = CONFIG_PREFIX + key
        if col not in rows:
            continue
        own = rows[rows[col].notna().to_numpy() & ~_mixed(rows, key)]
        values = list(dict.fromkeys(str(v) for v in own[col]))
        if len(values) < 2:
            continue
        baseline = str(KEYS[key].default)
        for j in costs:
            cost_col, cost_mode, cost_name = ("gmacs", "min", "gmacs") if j is None else \
                (info.columns[j], info.directions[j], info.metrics[j])
            priced = own[np.isfinite(own[cost_col].to_numpy(dtype="float64", na_value=np.nan))]
            groups = {v: priced[priced[col].astype(str) == v] for v in values}
            sign = 1.0 if mode == "max" else -1.0
            cost_sign = 1.0 if cost_mode == "min" else -1.0
            sides = {v: _side(g, acc_col, sign, cost_col, cost_sign) for v, g in groups.items() if len(g)}
            base = sides.get(baseline)
            for v in values:
                if v == baseline:
                    continue
                out.append(_effect(key, v, baseline, info.metrics[acc], mode, cost_name, cost_sign, sides.get(v), base,
                                   seed))
    return out


def _effect(key, value, baseline, metric, mode, cost, cost_sign, side: _Side | None, base: _Side | None,
            seed: int) -> Effect:
    counts = (len(side.seeds) if side else 0, side.trials if side else 0,
              len(base.seeds) if base else 0, base.trials if base else 0)
    if side is None or base is None:
        why = f"no completed trial of the baseline {baseline}" if base is None else "no completed trial with a cost"
        return Effect(key, value, baseline, metric, mode, cost, None, None, UNTOLD, *counts, None, why)
    sign = 1.0 if mode == "max" else -1.0
    gap, ci = effect_of(side, base, seed)
    lo = max(side.costs[0], base.costs[0])
    hi = max(lo, min(side.costs[-1], base.costs[-1]))
    cost_range = tuple(sorted((cost_sign * lo, cost_sign * hi)))
    ci = None if ci is None else tuple(sorted((sign * ci[0], sign * ci[1])))
    note = "" if ci is not None else f"a side has fewer than {MIN_TRIALS} trials"
    return Effect(key, value, baseline, metric, mode, cost, sign * gap, ci, verdict(ci, mode), *counts, cost_range,
                  note)


# ---------------------------------------------------------------------------------------- text
EFFECTS_TITLE = "Effects at equal cost against the baseline"
EFFECTS_HOW = (f"gap: the mean, over the cost range where both have points, of the difference between the best "
               f"accuracy each reaches at that cost or less (a configuration's accuracy: the mean over its seeds); "
               f"{LEVEL} % percentile bootstrap interval over {BOOTSTRAP} resamples of the configurations and of each "
               f"one's seeds; better or worse when the interval lies on one side of 0")


def effects_markdown(effects: list[Effect]) -> list[str]:
    """The report's opening lines (report.md): one bullet per effect, then how they are computed."""
    if not effects:
        return []
    return [f"## {EFFECTS_TITLE}", "", *(f"- {e.line()}" for e in effects), "", f"_{EFFECTS_HOW}._", ""]


def effects_html(effects: list[Effect]) -> str:
    if not effects:
        return ""
    items = "".join(f"<li data-verdict=\"{html.escape(e.verdict)}\">{html.escape(e.line())}</li>" for e in effects)
    return (f"<section id=\"effects\"><h2>{EFFECTS_TITLE}</h2><ul>{items}</ul>"
            f"<p class=\"how\">{html.escape(EFFECTS_HOW)}.</p></section>")
