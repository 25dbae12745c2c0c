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
- hypervolume: exact. 2-D: sort + sweep, O(n log n). 3-D: dimension sweep along the third objective
  keeping the 2-D staircase of the points seen so far in bisect-sorted lists, O(n log n) comparisons
  (each point is inserted and removed at most once; list inserts move pointers in C). k >= 4: slicing
  along the last objective (HSO) down to the 3-D sweep: O(n^(k-2) log n), fine for the few hundred
  points of a front. A point with an infinite coordinate inside the reference box makes it infinite.
- hypervolume trace: the running front is kept; a point it weakly dominates changes nothing (tested
  a block of points at a time). 3-D: a new front point adds its exclusive contribution, its box minus
  the front's boxes clipped to it. Members no worse in two objectives cap the box; of the rest only
  those reaching below the cap (on each face of the box its 2-D front, and members the point
  dominates) enter the 3-D sweep: O(F) vectorised work per addition plus a sweep over its few
  neighbours (10,000 points all on one front, in random order: a few seconds). Other k: the volume of
  the new front is recomputed.
"""
from __future__ import annotations

from bisect import bisect_left
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
    if len(pts) and not (np.isfinite(pts).all() and np.isfinite(ref).all()):
        return float("inf")  # a box with an infinite side and every other side positive
    if pts.shape[1] > 3 and len(pts):
        pts = pts[_front_mask_kd(pts)]  # dominated points add nothing; drop them once, up front
    return _hv_min(pts, ref)


def _hv_min(pts: np.ndarray, ref: np.ndarray) -> float:
    """(m, k) minimise, finite, all strictly inside a finite ref -> exact hypervolume."""
    m, k = pts.shape
    if m == 0:
        return 0.0
    if k == 1:
        return float(ref[0] - pts[:, 0].min())
    if k == 2:
        return _hv_2d(pts, ref)
    if k == 3:
        return _hv_3d(pts, ref)
    return _hv_slices(pts, ref)


def _hv_2d(pts: np.ndarray, ref: np.ndarray) -> float:
    """Sweep in x: the staircase's steps are the front points sorted by x (their y then decreases)."""
    front = pts[_front_mask_2d(pts)]
    front = front[np.argsort(front[:, 0], kind="stable")]
    x, y = front[:, 0], front[:, 1]
    widths = np.diff(np.append(x, ref[0]))  # (F,)
    return float(np.sum(widths * (ref[1] - y)))


def _hv_3d(pts: np.ndarray, ref: np.ndarray) -> float:
    """Dimension sweep in z (Fonseca, Paquete, Lopez-Ibanez 2006; Beume et al. 2009).

    Points in z order; between consecutive z levels the dominated region's cross-section is the 2-D
    region of every point at or below the lower level, whose area is kept current as points arrive.
    That region is a staircase: xs increasing, ys strictly decreasing, no member weakly dominating
    another. A new point weakly dominated in (x, y) leaves it unchanged; otherwise the members it
    dominates (a contiguous run from its x on) are replaced by it and the area grows by the strip
    between the old steps and the new point's y. Only additions of non-negative terms: no cancellation."""
    order = np.argsort(pts[:, 2], kind="stable")
    sx, sy, sz = (pts[order, j].tolist() for j in range(3))
    rx, ry, rz = float(ref[0]), float(ref[1]), float(ref[2])
    xs: list[float] = []
    ys: list[float] = []
    area = volume = 0.0
    last_z = sz[0]
    for px, py, pz in zip(sx, sy, sz):
        if pz != last_z:
            volume += area * (pz - last_z)
            last_z = pz
        i = bisect_left(xs, px)
        if i < len(xs) and xs[i] == px:
            if ys[i] <= py:
                continue  # a member at the same x, no higher
        elif i and ys[i - 1] <= py:
            continue  # the member just left of p is no higher: p adds nothing
        h = ys[i - 1] if i else ry  # height of the staircase just right of px
        e, cx, add = i, px, 0.0
        n = len(xs)
        while e < n and ys[e] >= py:  # members p dominates
            add += (xs[e] - cx) * (h - py)
            cx, h = xs[e], ys[e]
            e += 1
        add += ((xs[e] if e < n else rx) - cx) * (h - py)
        area += add
        if e == i:
            xs.insert(i, px)
            ys.insert(i, py)
        else:
            xs[i:e] = (px,)
            ys[i:e] = (py,)
    return float(volume + area * (rz - last_z))


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
    Only the running front is kept. A point weakly dominated by it changes nothing; otherwise in 3-D
    its exclusive contribution is added, in other dimensions the volume of the new front recomputed."""
    pts = to_minimise(values, directions)
    n, k = pts.shape
    ref = _reference_min(reference, directions, k)
    seq = np.arange(n) if order is None else np.asarray(order, dtype=np.int64).reshape(-1)
    if seq.size and (seq.min() < 0 or seq.max() >= n):
        raise ValueError(f"order: expected row indices in [0, {n}), given values from {seq.min()} to {seq.max()}")
    cand = pts[seq]  # (N, k) in completion order
    counts = ~np.isnan(cand).any(axis=1) & (cand < ref).all(axis=1)  # (N,) rows that can add volume
    infinite = counts & ~np.isfinite(cand).all(axis=1) if np.isfinite(ref).all() else counts
    first_inf = int(np.argmax(infinite)) if infinite.any() else seq.size  # volume infinite from there on
    counts[first_inf:] = False
    added = np.zeros(seq.size, dtype=bool)  # (N,) rows that changed the front
    value = np.zeros(seq.size, dtype=np.float64)  # (N,) the volume right after them
    front = np.empty((k, 0))  # (k, F): the running front, one row per objective
    current = 0.0
    for start in range(0, seq.size, _TRACE_BLOCK):
        live = np.flatnonzero(counts[start:start + _TRACE_BLOCK]) + start
        if live.size and front.shape[1]:
            # The dominated region only grows: a point under the front now stays under it (one test per block).
            under = _rows_all(front[None] <= cand[live][:, :, None], axis=1).any(axis=1)  # (B, k, F) -> (B,)
            live = live[~under]
        for i in live.tolist():
            p = cand[i]
            no_worse = front <= p[:, None]  # (k, F): member no worse than p, per objective
            if _rows_all(no_worse).any():
                continue  # weakly dominated (or a duplicate): adds nothing
            if k == 3:
                current += _contribution_3d(front, no_worse, p, ref)
            covered = _rows_all(front >= p[:, None])  # (F,) members p weakly dominates leave
            front = np.concatenate([front[:, ~covered], p[:, None]], axis=1)
            if k != 3:
                current = _hv_min(front.T, ref)
            added[i], value[i] = True, current
    last = np.maximum.accumulate(np.where(added, np.arange(seq.size), -1))  # (N,) last addition so far
    trace = np.where(last >= 0, value[np.maximum(last, 0)], 0.0)
    trace[first_inf:] = np.inf
    return trace


_TRACE_BLOCK = 256  # points screened against the front at once: (256, F, k) comparisons


def _rows_all(mask: np.ndarray, axis: int = 0) -> np.ndarray:
    """mask.all(axis) for a short axis (the k objectives), as k - 1 elementwise ands: numpy's
    reduction over a short leading axis is several times slower."""
    if axis:
        mask = np.moveaxis(mask, axis, 0)
    out = mask[0].copy()
    for row in mask[1:]:
        out &= row
    return out


def _contribution_3d(front: np.ndarray, no_worse: np.ndarray, p: np.ndarray, ref: np.ndarray) -> float:
    """Volume that p (finite, inside ref, weakly dominated by no member) adds to the (3, F) front
    (``no_worse`` = front <= p, per objective): its box minus the union of the members' boxes clipped
    to it, max(q, p). A member no worse than p in two objectives covers the box from its third
    coordinate on, so the least such coordinate caps the box (per objective). Only members below the
    cap in every objective reach into the capped box: clipped, one no worse in one objective lies on
    that face of the box, where only its 2-D front matters; one no worse in none is a member p
    dominates. These few go through the 3-D sweep."""
    cap = ref.copy()
    for j in range(3):
        a, b = [c for c in range(3) if c != j]
        two = no_worse[a] & no_worse[b]  # then front[j] > p[j]: p is not weakly dominated
        if two.any():
            cap[j] = min(cap[j], front[j, two].min())
    box = float(np.prod(cap - p))
    near = np.flatnonzero(_rows_all(front < cap[:, None]))  # (m,) members reaching into the capped box
    if not near.size:
        return box
    pts = np.maximum(front[:, near], p[:, None])  # (3, m) clipped
    held = no_worse[:, near]  # (3, m)
    count = held.sum(axis=0)  # (m,) 0 or 1: two or more would have set the cap at or below them
    parts = [pts[:, count == 0].T]
    for j in range(3):
        a, b = [c for c in range(3) if c != j]
        on_face = pts[:, held[j]]  # (3, f) with row j == p[j]
        if on_face.shape[1]:
            parts.append(on_face[:, _face_front(on_face[[a, b]].T)].T)
    sub = np.concatenate(parts)
    return max(0.0, box - _hv_3d(sub, cap)) if len(sub) else box  # a tiny contribution can round below 0


def _face_front(face: np.ndarray) -> np.ndarray:
    """(m, 2) -> indices of a subset whose 2-D dominated region is the whole set's: sorted by the first
    coordinate, a point is kept when its second is below every earlier one (a tie may keep a point
    weakly dominated by a later one; it adds nothing)."""
    order = np.argsort(face[:, 0])
    second = face[order, 1]
    below = np.empty(len(order), dtype=bool)
    below[0] = True
    below[1:] = second[1:] < np.minimum.accumulate(second)[:-1]
    return order[below]
