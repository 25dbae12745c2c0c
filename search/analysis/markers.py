"""Where and how the scatter figures draw each point, so that every point can be seen and hovered:

- coincident points (the same value on every axis of a figure, e.g. a baseline and a wider trial that happen to
  score alike) are drawn side by side: the first (in row order) where it is, each further one moved along x by
  SPREAD of the x values' span, alternately right and left (+1, -1, +2, ... steps); their hover text says so and
  keeps the exact values, and the figure's title notes how many were moved. Deterministic: the same tables draw
  the same figure.
- the baseline (the linear q/k/v embedding: XCiT's own) has a marker of its own in every figure, whatever its
  status, so it can always be found.
"""
from __future__ import annotations

import numpy as np

BASELINE = "linear"   # the embedding whose trials are the baseline the others are judged against
SPREAD = 0.01         # x step between coincident points, as a share of the x values' span: about a marker apart
BASELINE_MARKER = {"symbol": "hexagram", "size": 11, "line": {"color": "black", "width": 1}}
BASELINE_MARKER_3D = {"symbol": "square", "size": 5, "line": {"color": "black", "width": 1}}


def baseline_marker(finished: bool, three_d: bool) -> dict:
    """The baseline's marker: filled when its trial completed, open otherwise (the status in words is in the
    trace's name and the hover text)."""
    marker = dict(BASELINE_MARKER_3D if three_d else BASELINE_MARKER)
    if not finished:
        marker["symbol"] += "-open"
    return marker


def spread(coords: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """coords: one (n,) float array per axis, x first, NaN where missing. -> (x to draw (n,), shared (n,) int: how
    many other rows have the same point; 0 for a point of its own or a missing one)."""
    x = np.asarray(coords[0], dtype=np.float64)
    drawn, shared = x.copy(), np.zeros(len(x), dtype=np.int64)
    points = np.column_stack(coords).astype(np.float64) if len(x) else np.zeros((0, len(coords)))
    present = np.flatnonzero(~np.isnan(points).any(axis=1))
    if present.size < 2:
        return drawn, shared
    _, group, counts = np.unique(points[present], axis=0, return_inverse=True, return_counts=True)
    group = group.reshape(-1)
    if counts.max() == 1:
        return drawn, shared
    span = np.ptp(x[present]) or np.abs(x[present]).max() or 1.0
    order = np.argsort(group, kind="stable")          # rows of each group together, in row order
    starts = np.cumsum(counts) - counts
    slot = np.empty(present.size, dtype=np.int64)
    slot[order] = np.arange(present.size) - np.repeat(starts, counts)   # k-th row of its group: 0, 1, 2, ...
    steps = (slot + 1) // 2 * np.where(slot % 2 == 1, 1, -1)           # 0, +1, -1, +2, -2, ...
    drawn[present] = x[present] + steps * SPREAD * span
    shared[present] = counts[group] - 1
    return drawn, shared


def shared_note(shared: int) -> str:
    """The hover line of a point drawn beside others it coincides with ("" for a point of its own)."""
    if not shared:
        return ""
    return (f"<br><i>the same point as {shared} other trial(s): drawn side by side, "
            f"{SPREAD:.0%} of the x range apart</i>")


def title_note(shared: np.ndarray) -> str:
    """The title's second line when some points were drawn apart ("" when none)."""
    n = int(np.count_nonzero(shared))
    if not n:
        return ""
    return (f"<br><sup>{n} points share their coordinates with another: drawn side by side along x, {SPREAD:.0%} "
            "of its range apart (hover for the exact values)</sup>")
