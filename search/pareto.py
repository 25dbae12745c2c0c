"""Pareto fronts, non-dominated ranks and hypervolume as pure numpy data.

Every function takes objective values as an array of shape (n, k) (n points, k objectives) and a list
of k directions, each "min" or "max". Internally every objective is turned into "minimise" (columns
with "max" are negated), so a point a dominates b when a <= b in every objective and a < b in at least
one. Identical points do not dominate each other: duplicates of a front point are all on the front.

Rows holding a NaN in any objective are never ranked: they are off the front and their rank is
``NAN_RANK`` (the largest int64, so sorting by rank puts them last). +/-inf are ordinary values.

Algorithms (n points, k objectives, R fronts, F = size of the largest front):
- ranks / front: sort points lexicographically (a point can only be dominated by points before it in
  that order), then place each point into the first front none of whose members dominates it, found by
  binary search over the fronts (membership of p's dominators in front r implies one in front r-1).
  2-D: a front is summarised by its last member, so each test is O(1): O(n log n) in all.
  k-D: each test is vectorised over the front's members: O(n log R * F * k).
- the front alone (``nondominated_mask``): 2-D a fully vectorised sort + prefix-minimum sweep,
  O(n log n); k-D one pass in lexicographic order against the running front, O(n log n + n F k).
- hypervolume: exact. 2-D: sort + sweep, O(n log n). k >= 3: slicing along the last objective (HSO),
  each slice a (k-1)-D hypervolume: O(n^(k-1) log n), fine for the few hundred points of a front.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NAN_RANK = np.iinfo(np.int64).max  # rank of rows with a NaN objective (never on a front)
_DIRECTIONS = ("min", "max")

__all__ = [
    "NAN_RANK",
    "hypervolume",
    "hypervolume_trace",
    "nondominated_mask",
    "nondominated_ranks",
    "reference_point",
    "to_minimise",
]


def to_minimise(values, directions: Sequence[str]) -> np.ndarray:
    """(n, k) objective values -> (n, k) float64 copy where every column is to be minimised."""
    arr = np.array(values, dtype=np.float64, copy=True)
    if arr.size == 0 and not isinstance(directions, str):
        arr = arr.reshape(0, len(directions))
    elif arr.ndim == 1:
        arr = arr.reshape(-1, 1) if len(directions) == 1 else arr.reshape(1, -1)
    if arr.ndim != 2:
        raise ValueError(f"values: expected an array of shape (n, k), given shape {arr.shape}")
    if isinstance(directions, str) or len(directions) != arr.shape[1]:
        raise ValueError(
            f"directions: expected a list of {arr.shape[1]} entries 'min'/'max' (one per objective), "
            f"given {directions!r}"
        )
    for j, d in enumerate(directions):
        if d not in _DIRECTIONS:
            raise ValueError(f"directions[{j}]: expected 'min' or 'max', given {d!r}")
        if d == "max":
            arr[:, j] = -arr[:, j]
    return arr


def _lex_order(pts: np.ndarray) -> np.ndarray:
    """Indices sorting the rows of (m, k) pts lexicographically (first column most significant)."""
    return np.lexsort(pts.T[::-1])


def nondominated_mask(values, directions: Sequence[str]) -> np.ndarray:
    """(n,) bool: True for points no other point dominates (NaN rows: False)."""
    pts = to_minimise(values, directions)
    n, k = pts.shape
    finite = ~np.isnan(pts).any(axis=1)
    mask = np.zeros(n, dtype=bool)
    idx = np.flatnonzero(finite)
    if idx.size == 0:
        return mask
    if k == 1:
        mask[idx] = pts[idx, 0] == pts[idx, 0].min()
    elif k == 2:
        mask[idx] = _front_mask_2d(pts[idx])
    else:
        mask[idx] = _front_mask_kd(pts[idx])
    return mask


def _front_mask_2d(pts: np.ndarray) -> np.ndarray:
    """(m, 2) minimise, no NaN -> (m,) front mask. Sort by (x, y); p is on the front iff p.y is the
    least y of its x-group and strictly less than every y at a smaller x."""
    order = _lex_order(pts)
    x, y = pts[order, 0], pts[order, 1]
    m = x.size
    new_group = np.ones(m, dtype=bool)
    new_group[1:] = x[1:] != x[:-1]
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(m), 0))  # (m,) first index of group
    prefix_min = np.minimum.accumulate(y)  # (m,) min y over sorted[0..i]
    has_before = group_start > 0  # False in the first x-group: nothing lies at a smaller x
    before = np.full(m, np.inf)  # min y over all strictly smaller x
    before[has_before] = prefix_min[group_start[has_before] - 1]
    on_front = (y == y[group_start]) & (~has_before | (y < before))
    out = np.empty(m, dtype=bool)
    out[order] = on_front
    return out


def nondominated_ranks(values, directions: Sequence[str]) -> np.ndarray:
    """(n,) int64 ranks: 0 = the non-dominated front, 1 = the front once rank 0 is removed, ...
    Rows with a NaN objective get NAN_RANK."""
    pts = to_minimise(values, directions)
    n, k = pts.shape
    ranks = np.full(n, NAN_RANK, dtype=np.int64)
    idx = np.flatnonzero(~np.isnan(pts).any(axis=1))
    if idx.size == 0:
        return ranks
    if k == 1:
        _, dense = np.unique(pts[idx, 0], return_inverse=True)
        ranks[idx] = dense.reshape(-1)
    elif k == 2:
        ranks[idx] = _nondominated_ranks_2d(pts[idx])
    else:
        ranks[idx] = _nondominated_ranks_kd(pts[idx])
    return ranks


def _nondominated_ranks_2d(pts: np.ndarray) -> np.ndarray:
    """(m, 2) minimise, no NaN -> (m,) ranks in O(m log m).

    In (x, y) order, front r is summarised by its last member (lx[r], ly[r]), the one with the least y.
    Front r dominates p iff ly[r] < p.y, or ly[r] == p.y and lx[r] < p.x (equal point = duplicate)."""
    order = _lex_order(pts)
    xs, ys = pts[order, 0].tolist(), pts[order, 1].tolist()
    lx: list[float] = []
    ly: list[float] = []
    out = np.empty(len(xs), dtype=np.int64)
    for i, (px, py) in enumerate(zip(xs, ys)):
        lo, hi = 0, len(ly)
        while lo < hi:  # first front that does not dominate p
            mid = (lo + hi) // 2
            if ly[mid] < py or (ly[mid] == py and lx[mid] < px):
                lo = mid + 1
            else:
                hi = mid
        if lo == len(ly):
            lx.append(px)
            ly.append(py)
        else:
            lx[lo], ly[lo] = px, py
        out[i] = lo
    ranks = np.empty_like(out)
    ranks[order] = out
    return ranks


class _Front:
    """Members of one front as a growing (capacity, k) buffer, so appends are amortised O(k)."""

    def __init__(self, k: int):
        self.buf = np.empty((8, k))
        self.size = 0

    def add(self, p: np.ndarray) -> None:
        if self.size == len(self.buf):
            self.buf = np.concatenate([self.buf, np.empty_like(self.buf)])
        self.buf[self.size] = p
        self.size += 1

    def dominates(self, p: np.ndarray) -> bool:
        members = self.buf[: self.size]  # (F, k)
        return bool(np.any((members <= p).all(axis=1) & (members < p).any(axis=1)))


def _front_mask_kd(pts: np.ndarray, block: int = 512) -> np.ndarray:
    """(m, k) minimise, no NaN -> (m,) front mask. In lexicographic order a point can only be
    dominated by earlier points, and then by an earlier front member. Blocks of points are first
    screened against the running front in one vectorised test (B, F, k); the few survivors are then
    checked one by one: O(m log m + m F k)."""
    order = _lex_order(pts)
    sorted_pts = pts[order]
    front = _Front(pts.shape[1])
    on_front = np.zeros(len(order), dtype=bool)
    for start in range(0, len(order), block):
        chunk = sorted_pts[start : start + block]  # (B, k)
        members = front.buf[: front.size][None]  # (1, F, k)
        hit = ((members <= chunk[:, None]).all(axis=2) & (members < chunk[:, None]).any(axis=2)).any(axis=1)
        for j in np.flatnonzero(~hit):
            if not front.dominates(chunk[j]):
                front.add(chunk[j])
                on_front[start + j] = True
    out = np.empty_like(on_front)
    out[order] = on_front
    return out


def _nondominated_ranks_kd(pts: np.ndarray) -> np.ndarray:
    """(m, k) minimise, no NaN -> (m,) ranks. Lexicographic order + binary search over fronts, each
    front tested against p with one vectorised comparison over its members."""
    order = _lex_order(pts)
    fronts: list[_Front] = []
    out = np.empty(len(order), dtype=np.int64)
    for i, p in enumerate(pts[order]):
        lo, hi = 0, len(fronts)
        while lo < hi:  # first front that does not dominate p
            mid = (lo + hi) // 2
            if fronts[mid].dominates(p):
                lo = mid + 1
            else:
                hi = mid
        if lo == len(fronts):
            fronts.append(_Front(pts.shape[1]))
        fronts[lo].add(p)
        out[i] = lo
    ranks = np.empty_like(out)
    ranks[order] = out
    return ranks


def reference_point(values, directions: Sequence[str], margin: float = 0.1) -> np.ndarray:
    """(k,) default hypervolume reference, in the objectives' own units: per objective the worst
    finite value, moved outwards by ``margin`` times the objective's range (or, for a zero range,
    by ``margin`` times max(|worst|, 1)). Rows with a NaN are ignored."""
    pts = to_minimise(values, directions)
    pts = pts[~np.isnan(pts).any(axis=1)]
    pts = np.where(np.isfinite(pts), pts, np.nan)
    if pts.shape[0] == 0 or np.isnan(pts).all(axis=0).any():
        raise ValueError("values: need at least one finite value per objective to place a reference point")
    worst, best = np.nanmax(pts, axis=0), np.nanmin(pts, axis=0)
    span = worst - best
    span = np.where(span > 0, span, np.maximum(np.abs(worst), 1.0))
    ref = worst + margin * span
    sign = np.array([-1.0 if d == "max" else 1.0 for d in directions])
    return ref * sign


def _reference_min(reference, directions: Sequence[str], k: int) -> np.ndarray:
    ref = np.asarray(reference, dtype=np.float64).reshape(-1)
    if ref.shape != (k,) or np.isnan(ref).any():
        raise ValueError(f"reference: expected {k} numbers (one per objective), given {reference!r}")
    return to_minimise(ref.reshape(1, k), directions)[0]


def hypervolume(points, directions: Sequence[str], reference) -> float:
    """Exact hypervolume dominated by ``points`` and bounded by ``reference`` (same units and
    directions as the points). Points not strictly better than the reference in every objective
    and NaN rows add nothing."""
    pts = to_minimise(points, directions)
    ref = _reference_min(reference, directions, pts.shape[1])
    inside = ~np.isnan(pts).any(axis=1) & (pts < ref).all(axis=1)
    pts = pts[inside]
    if pts.shape[1] > 2 and len(pts):
        pts = pts[_front_mask_kd(pts)]  # dominated points add nothing; drop them once, up front
    return _hv_min(pts, ref)


def _hv_min(pts: np.ndarray, ref: np.ndarray) -> float:
    """(m, k) minimise, all strictly inside ref -> exact hypervolume."""
    m, k = pts.shape
    if m == 0:
        return 0.0
    if k == 1:
        return float(ref[0] - pts[:, 0].min())
    if k == 2:
        return _hv_2d(pts, ref)
    return _hv_slices(pts, ref)


def _hv_2d(pts: np.ndarray, ref: np.ndarray) -> float:
    """Sweep in x: the staircase's steps are the front points sorted by x (their y then decreases)."""
    front = pts[_front_mask_2d(pts)]
    front = front[np.argsort(front[:, 0], kind="stable")]
    x, y = front[:, 0], front[:, 1]
    widths = np.diff(np.append(x, ref[0]))  # (F,)
    return float(np.sum(widths * (ref[1] - y)))


def _hv_slices(pts: np.ndarray, ref: np.ndarray) -> float:
    """HSO: sort by the last objective; between consecutive levels the dominated region is the
    (k-1)-D hypervolume of every point at or below the lower level."""
    order = np.argsort(pts[:, -1], kind="stable")
    pts = pts[order]
    z = pts[:, -1]
    levels = np.append(z, ref[-1])
    total = 0.0
    for i in range(len(z)):
        depth = levels[i + 1] - levels[i]
        if depth > 0:
            total += depth * _hv_min(pts[: i + 1, :-1], ref[:-1])
    return float(total)


def hypervolume_trace(values, directions: Sequence[str], reference, order=None) -> np.ndarray:
    """Hypervolume after each point is added, in ``order``.

    order: row indices of ``values`` in completion order (default 0..n-1); rows left out are
    never added. Returns (len(order),) float64: entry i is the hypervolume of rows order[:i+1].
    Only the running front is kept, and the volume is recomputed only when it changes."""
    pts = to_minimise(values, directions)
    n, k = pts.shape
    ref = _reference_min(reference, directions, k)
    seq = np.arange(n) if order is None else np.asarray(order, dtype=np.int64).reshape(-1)
    if seq.size and (seq.min() < 0 or seq.max() >= n):
        raise ValueError(f"order: expected row indices in [0, {n}), given values from {seq.min()} to {seq.max()}")
    trace = np.zeros(seq.size, dtype=np.float64)
    front = np.empty((0, k))
    current = 0.0
    for i, row in enumerate(seq):
        p = pts[row]
        if not np.isnan(p).any() and (p < ref).all():
            dominated = np.any((front <= p).all(axis=1) & (front < p).any(axis=1))
            if not dominated:
                keep = ~((p <= front).all(axis=1) & (p < front).any(axis=1))  # drop members p dominates
                front = np.vstack([front[keep], p])
                current = _hv_min(front, ref)
        trace[i] = current
    return trace
