"""Multi-objective asynchronous successive halving (MO-ASHA): the rules, as pure functions (no Ray).

search.scheduling.tune_schedulers applies them to a Ray Tune experiment; search.simulation replays them
on recorded curves.

Rungs sit at ``grace_period * reduction_factor**k`` epochs, below ``max_t``. When a trial reports a
result at or past a rung it has not yet been judged at, the objectives of that result join every
result recorded at the rung, and the rung is ordered:

1. by non-dominated rank (``search.analysis.pareto.nondominated_ranks``; 0 = the rung's Pareto front);
2. inside a front, by crowding distance (NSGA-II), largest first: a front's extreme points (best on
   some objective) have an infinite distance, so a unique trade-off always ranks first in its front.

The candidate's position is the number of results strictly ahead of it (ties favour the candidate).
It continues iff ``position * reduction_factor < n`` (n = results at the rung, itself included),
i.e. it lies in the top ``ceil(n / reduction_factor)`` — the same count plain ASHA's percentile
cutoff keeps. The first result at a rung always continues. Results at ``max_t`` or later are stopped
(the trial is done), as ASHA does; those are not early stops and are not listed in ``stopped``.

Missing or non-finite objectives: a result whose objective is absent, not a number, NaN or +/-inf
ranks behind every complete result at its rung (it is judged, so it can still be stopped) but is not
recorded there (it never raises the bar for later trials). A result without ``time_attr`` is ignored.

Brackets (asynchronous Hyperband): with ``brackets=B`` there are B independent sets of rungs.
Bracket s starts judging at ``grace_period * reduction_factor**s``: its rungs are bracket 0's from the
(s+1)-th on, so a trial of bracket s is first compared after rf^s times more epochs, and only with
trials of its own bracket. Bracket 0 alone (B = 1, the constructor's default) is the rule above.

Which bracket a trial joins (``bracket_shares``): bracket s takes a share of the trials proportional to
rf^(2 s), so each bracket takes rf^2 times the trials of the one before it (rf 3, 3 brackets: 1/91,
9/91 and 81/91 of them). Trials are dealt in the order they reach the scheduler (``on_trial_add``, or
the first result of a trial never added): a new trial joins the bracket furthest behind its share
(``next_bracket``), the lowest index on a tie, so every bracket stays within about one trial of its
share; with rf 3 and 3 brackets trials 0, 1, 2, ... join brackets 2, 2, 2, 2, 1, 2, ... and the first
trial of bracket 0 is the 34th (equal shares would give plain round-robin, 0, 1, 2, 0, ...). No random
number is drawn (Ray's ASHA draws one per trial), and the assignment is a plain trial_id -> bracket map
saved with the rungs: a restored scheduler keeps every trial where it was and goes on from the counts.

Why most trials go to the bracket that judges last, and the measured figures behind the shares:
benchmarks/README.md ("MO-ASHA brackets").
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from qkvsearch.search.analysis.pareto import NAN_RANK, nondominated_ranks, to_minimise
from qkvsearch.search.records.readers import read_trials
from qkvsearch.spaces.checks import finite
from qkvsearch.spaces.sections import SchedulerSpec

__all__ = ["candidate_position", "crowding_distance", "default_shares", "next_bracket", "promotable",
           "recorded_progress", "rung_positions"]


def crowding_distance(values, directions: Sequence[str], ranks: np.ndarray) -> np.ndarray:
    """(n,) NSGA-II crowding distance of each row inside its own front (rows sharing a rank).

    Per objective, a front's members sorted by value get inf at both ends and, in between, the gap
    between their two neighbours divided by the front's range of that objective (0 if the range is
    0), summed over objectives. Fronts of 1 or 2 members: inf. Rows with rank NAN_RANK: 0."""
    pts = to_minimise(values, directions)  # (n, k)
    out = np.zeros(pts.shape[0])
    for r in np.unique(ranks):
        if r == NAN_RANK:
            continue
        idx = np.flatnonzero(ranks == r)  # (m,) members of front r
        if idx.size <= 2:
            out[idx] = np.inf
            continue
        dist = np.zeros(idx.size)
        for j in range(pts.shape[1]):
            col = pts[idx, j]
            order = np.argsort(col, kind="stable")
            span = col[order[-1]] - col[order[0]]
            dist[order[[0, -1]]] = np.inf
            if span > 0:
                dist[order[1:-1]] += (col[order[2:]] - col[order[:-2]]) / span
        out[idx] = dist
    return out


def rung_positions(rung_values, directions: Sequence[str]) -> np.ndarray:
    """(n, k) objective values at one rung -> (n,) int positions, 0 = best.

    Position of row i = number of rows strictly ahead of it in the order (non-dominated rank
    ascending, crowding distance descending); tied rows share a position. Non-finite values count
    as missing: such rows rank behind every complete row."""
    vals = _rung_array(rung_values, directions)
    ranks = nondominated_ranks(vals, directions)  # (n,) NaN rows: NAN_RANK
    crowd = crowding_distance(vals, directions, ranks)  # (n,)
    r_ahead = ranks[None, :] < ranks[:, None]  # (n, n) [i, j]: j has a better rank than i
    c_ahead = (ranks[None, :] == ranks[:, None]) & (crowd[None, :] > crowd[:, None])
    return (r_ahead | c_ahead).sum(axis=1)


def _rung_array(rung_values, directions: Sequence[str]) -> np.ndarray:
    vals = np.array(rung_values, dtype=np.float64)
    if vals.ndim != 2 or vals.shape[1] != len(directions):
        raise ValueError(
            f"rung_values: expected an array of shape (n, {len(directions)}) (one column per "
            f"direction), given shape {vals.shape}"
        )
    vals[~np.isfinite(vals)] = np.nan  # +/-inf too: a diverged metric must not look best
    return vals


def candidate_position(rung_values, directions: Sequence[str], candidate_index: int) -> int:
    """``rung_positions(rung_values, directions)[candidate_index]`` without ordering the whole rung:
    the rows ahead are those of a better rank plus, in the candidate's own front, those of a larger
    crowding distance, and a member's crowding distance depends on its front alone. O(n log n)
    instead of O(n^2) in time and memory: the schedulers judge one result at a time."""
    vals = _rung_array(rung_values, directions)
    ranks = nondominated_ranks(vals, directions)  # (n,)
    r = ranks[candidate_index]
    ahead = int(np.count_nonzero(ranks < r))
    if r == NAN_RANK:  # rows with a missing value all have crowding distance 0: tied
        return ahead
    front = np.flatnonzero(ranks == r)  # (m,) includes the candidate
    crowd = crowding_distance(vals[front], directions, np.zeros(front.size, dtype=np.int64))
    mine = crowd[np.searchsorted(front, candidate_index)]
    return ahead + int(np.count_nonzero(crowd > mine))


def promotable(rung_values, directions: Sequence[str], reduction_factor: float, candidate_index: int) -> bool:
    """True iff row ``candidate_index`` of the (n, k) rung values is in the top ceil(n / rf) of the
    rung, i.e. position * reduction_factor < n (see ``rung_positions``)."""
    _check_reduction_factor(reduction_factor)
    n = len(rung_values)
    if not 0 <= candidate_index < n:
        raise ValueError(f"candidate_index: expected an int in [0, {n}), given {candidate_index!r}")
    return candidate_position(rung_values, directions, candidate_index) * reduction_factor < n


def _check_reduction_factor(rf) -> None:
    if isinstance(rf, bool) or not isinstance(rf, (int, float)) or not rf > 1:
        raise ValueError(f"reduction_factor: expected a number > 1, given {rf!r}")


def default_shares(brackets: int, reduction_factor: float) -> list[Fraction]:
    """The default shares of trials per bracket: rf**(2 s) for bracket s (module doc), exact fractions."""
    _check_reduction_factor(reduction_factor)
    return [Fraction(reduction_factor) ** (2 * s) for s in range(brackets)]


def next_bracket(counts: Sequence[int], shares: Sequence) -> int:
    """The bracket a new trial joins, given the trials each bracket holds and the brackets' shares.

    With k trials dealt so far, bracket s is behind its share by (k + 1) * share_s / total - counts_s
    once the new trial is counted; the one furthest behind wins, the lowest index on a tie. Compared as
    (k + 1) * share_s - total * counts_s in exact fractions of the given numbers, so rounding never
    decides. Equal shares: the bracket holding the fewest trials (round-robin)."""
    if len(counts) != len(shares) or not counts:
        raise ValueError(f"counts: expected one per share ({len(shares)}), given {list(counts)!r}")
    w = [Fraction(x) for x in shares]
    k, total = sum(counts), sum(w)
    behind = [(k + 1) * w[s] - total * counts[s] for s in range(len(w))]
    return max(range(len(w)), key=lambda s: (behind[s], -s))


def as_float(x) -> float:
    """A reported value as a float; NaN when absent, not a number, or non-finite (spaces.checks.finite)."""
    return finite(x, math.nan)


def recorded_progress(experiment: str, metrics: Sequence[str], time_attr: str) -> dict[str, tuple]:
    """trial_id -> (status, (E,) float64 progress values ``time_attr``, (E, k) float64 objective values) of
    each trial recorded in the campaign at ``experiment`` (local path or URI; search.records), its epochs
    in order. An objective in the record's cost is taken from there (cost metrics ride along each result
    and are recorded once, in the cost); others come from the epochs; NaN where a value is missing."""
    read = read_trials(experiment)
    cols = read.epoch_columns()  # (E, names) for every trial, rows trial after trial
    column = {n: j for j, n in enumerate(cols.names)}
    ends = np.cumsum(cols.counts)
    out = {}
    for rec, end, count in zip(read.records, ends.tolist(), cols.counts.tolist()):
        rows = slice(end - count, end)
        times = cols.values[rows, column[time_attr]] if time_attr in column else np.full(count, np.nan)
        values = np.full((count, len(metrics)), np.nan)  # (E, k)
        cost = rec.get("cost") if isinstance(rec.get("cost"), dict) else {}
        for j, m in enumerate(metrics):
            if m in cost:
                values[:, j] = as_float(cost[m])
            elif m in column:
                values[:, j] = cols.values[rows, column[m]]
        out[rec["trial_id"]] = (rec.get("status"), times, values)
    return out


def _check_objectives(metrics, modes) -> tuple[list[str], list[str]]:
    if isinstance(metrics, str) or not metrics or not all(isinstance(m, str) and m for m in metrics):
        raise ValueError(f"metrics: expected a non-empty list of result keys, given {metrics!r}")
    if len(set(metrics)) != len(metrics):
        raise ValueError(f"metrics: expected distinct result keys, given {list(metrics)!r}")
    if isinstance(modes, str) or len(modes) != len(metrics) or any(m not in ("min", "max") for m in modes):
        raise ValueError(
            f"modes: expected a list of {len(metrics)} entries 'min'/'max' (one per metric), given {modes!r}"
        )
    return list(metrics), list(modes)


def _check_shares(shares, brackets: int) -> list[float]:
    """B positive finite numbers -> list of floats (plain, so the scheduler pickles and prints simply)."""
    ok = not isinstance(shares, (str, bytes)) and hasattr(shares, "__len__") and len(shares) == brackets
    vals = [as_float(x) for x in shares] if ok else []
    if not ok or any(not v > 0 for v in vals):
        raise ValueError(f"bracket_shares: expected {brackets} numbers > 0 (one per bracket), given {shares!r}")
    return vals


def _check_positive(name: str, x) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0:
        raise ValueError(f"{name}: expected a number > 0, given {x!r}")


def _milestones(grace_period: float, rf: float, max_t: float) -> list[float]:
    """grace_period * rf**k for k = 0, 1, ... while < max_t (ints kept as ints): the spec's rung ladder."""
    return SchedulerSpec.rung_epochs(grace_period, rf, max_t)

