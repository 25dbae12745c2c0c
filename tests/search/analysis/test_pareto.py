"""search.analysis.pareto against brute-force definitions on random data with ties, duplicates and NaN."""
import itertools

import numpy as np
import pytest

from qkvsearch.search.analysis.pareto import (
    NAN_RANK,
    hypervolume,
    hypervolume_trace,
    nondominated_mask,
    nondominated_ranks,
    reference_point,
    to_minimise,
)


def _dominates(a, b):
    return bool(np.all(a <= b) and np.any(a < b))


def _brute_ranks(values, directions):
    """O(n^2) per front: peel the points no remaining point dominates."""
    pts = to_minimise(values, directions)
    n = len(pts)
    ranks = np.full(n, NAN_RANK, dtype=np.int64)
    left = [i for i in range(n) if not np.isnan(pts[i]).any()]
    r = 0
    while left:
        front = [i for i in left if not any(_dominates(pts[j], pts[i]) for j in left if j != i)]
        for i in front:
            ranks[i] = r
        left = [i for i in left if i not in front]
        r += 1
    return ranks


def _brute_hv(values, directions, reference):
    """Inclusion-exclusion over all subsets of the points inside the reference box."""
    pts = to_minimise(values, directions)
    ref = to_minimise(np.asarray(reference, dtype=float).reshape(1, -1), directions)[0]
    pts = [p for p in pts if not np.isnan(p).any() and np.all(p < ref)]
    total = 0.0
    for size in range(1, len(pts) + 1):
        for subset in itertools.combinations(pts, size):
            corner = np.max(subset, axis=0)
            total += (-1) ** (size + 1) * np.prod(ref - corner)
    return total


def _random_values(rng, n, k, levels, nan_rows=2):
    """Integer-valued points (many ties) with some exact duplicates and NaN rows."""
    vals = rng.integers(0, levels, size=(n, k)).astype(float)
    dup = rng.choice(n, size=n // 5, replace=False)
    vals[dup] = vals[rng.choice(n, size=dup.size)]
    vals[rng.choice(n, size=nan_rows, replace=False), rng.integers(0, k)] = np.nan
    return vals


DIRS = {2: [["min", "min"], ["max", "min"], ["max", "max"]], 3: [["max", "min", "min"], ["min", "max", "min"]]}


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_ranks_and_mask_match_brute_force(k, seed):
    rng = np.random.default_rng(seed)
    for directions in DIRS[k]:
        for n, levels in [(60, 6), (40, 3), (25, 50)]:
            vals = _random_values(rng, n, k, levels)
            expected = _brute_ranks(vals, directions)
            np.testing.assert_array_equal(nondominated_ranks(vals, directions), expected)
            np.testing.assert_array_equal(nondominated_mask(vals, directions), expected == 0)


def test_duplicates_of_front_point_are_all_on_front():
    vals = np.array([[1.0, 5.0], [1.0, 5.0], [2.0, 2.0], [2.0, 2.0], [3.0, 3.0], [1.0, 6.0]])
    np.testing.assert_array_equal(nondominated_mask(vals, ["min", "min"]), [1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(nondominated_ranks(vals, ["min", "min"]), [0, 0, 0, 0, 1, 1])


def test_nan_rows_never_on_front_and_inf_is_a_value():
    vals = np.array([[np.nan, 0.0], [1.0, np.inf], [0.0, np.inf], [2.0, 1.0]])
    ranks = nondominated_ranks(vals, ["min", "min"])
    assert ranks[0] == NAN_RANK
    np.testing.assert_array_equal(ranks[1:], [1, 0, 0])
    assert not nondominated_mask(vals, ["min", "min"])[0]
    assert nondominated_ranks(np.full((3, 2), np.nan), ["min", "max"]).tolist() == [NAN_RANK] * 3


def test_direction_flips_front():
    vals = np.array([[0.0, 0.0], [1.0, 1.0]])
    assert nondominated_mask(vals, ["min", "min"]).tolist() == [True, False]
    assert nondominated_mask(vals, ["max", "max"]).tolist() == [False, True]
    assert nondominated_mask(vals, ["min", "max"]).tolist() == [True, True]


@pytest.mark.parametrize(
    "directions, match",
    [(["min"], "directions"), (["min", "up"], r"directions\[1\]"), ("min", "directions")],
)
def test_bad_directions_raise_value_error(directions, match):
    with pytest.raises(ValueError, match=match):
        nondominated_ranks(np.zeros((3, 2)), directions)


def test_one_objective_and_empty_input():
    assert nondominated_ranks([[3.0], [1.0], [1.0], [2.0]], ["min"]).tolist() == [2, 0, 0, 1]
    assert nondominated_mask(np.zeros((0, 2)), ["min", "max"]).shape == (0,)
    assert hypervolume(np.zeros((0, 3)), ["min"] * 3, [1, 1, 1]) == 0.0


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("seed", range(5))
def test_hypervolume_matches_inclusion_exclusion(k, seed):
    rng = np.random.default_rng(100 + seed)
    directions = (["max", "min", "min", "max"])[:k]
    vals = _random_values(rng, 9, k, 5, nan_rows=1) + rng.random((9, k)) * (seed % 2)
    ref = reference_point(vals, directions)
    assert hypervolume(vals, directions, ref) == pytest.approx(_brute_hv(vals, directions, ref), rel=1e-12)


def test_hypervolume_3d_matches_monte_carlo():
    rng = np.random.default_rng(7)
    directions = ["max", "min", "min"]
    vals = np.column_stack([rng.uniform(60, 80, 40), rng.uniform(0.2, 2, 40), rng.uniform(1, 10, 40)])
    ref = np.array([55.0, 2.5, 11.0])
    hv = hypervolume(vals, directions, ref)
    lo, hi = np.array([55.0, 0.2, 1.0]), np.array([80.0, 2.5, 11.0])  # box holding the dominated region
    samples = lo + rng.random((200_000, 3)) * (hi - lo)
    pts = to_minimise(vals, directions)
    s = to_minimise(samples, directions)
    covered = np.zeros(len(s), dtype=bool)
    for p in pts:
        covered |= (s >= p).all(axis=1)
    mc = covered.mean() * np.prod(hi - lo)
    assert hv == pytest.approx(mc, rel=0.01)


def test_hypervolume_known_values():
    # staircase (1,3),(2,2),(3,1) against (4,4): 3 + 2 + 1 = 6
    assert hypervolume([[1, 3], [2, 2], [3, 1]], ["min", "min"], [4, 4]) == 6.0
    # points outside the reference add nothing; maximisation mirrors minimisation
    assert hypervolume([[5, 0], [1, 3]], ["min", "min"], [4, 4]) == 3.0
    assert hypervolume([[-1, -3], [-2, -2], [-3, -1]], ["max", "max"], [-4, -4]) == 6.0
    assert hypervolume([[0, 0, 0]], ["min"] * 3, [2, 3, 4]) == 24.0


def test_hypervolume_trace_matches_prefix_recomputation():
    rng = np.random.default_rng(3)
    directions = ["max", "min", "min"]
    vals = _random_values(rng, 40, 3, 8)
    ref = reference_point(vals, directions)
    order = rng.permutation(40)
    trace = hypervolume_trace(vals, directions, ref, order)
    expected = [hypervolume(vals[order[: i + 1]], directions, ref) for i in range(40)]
    np.testing.assert_allclose(trace, expected, rtol=1e-12)
    assert np.all(np.diff(trace) >= 0)
    with pytest.raises(ValueError, match="order"):
        hypervolume_trace(vals, directions, ref, [0, 40])


def test_reference_point_is_worse_than_every_point():
    vals = np.array([[70.0, 0.5, 3.0], [75.0, 1.5, 3.0], [np.nan, 0.1, 1.0]])
    ref = reference_point(vals, ["max", "min", "min"])
    np.testing.assert_allclose(ref, [69.5, 1.6, 3.3])
    with pytest.raises(ValueError, match="values"):
        reference_point(np.full((2, 2), np.nan), ["min", "min"])


@pytest.mark.parametrize("k", [2, 3, 4])
def test_large_mask_matches_vectorised_brute_force(k):
    """Several screening blocks (n > 512) and many ties; brute force as one (n, n, k) comparison."""
    rng = np.random.default_rng(k)
    vals = _random_values(rng, 1500, k, 12)
    directions = (["max", "min", "min", "max"])[:k]
    pts = to_minimise(vals, directions)
    a, b = pts[:, None], pts[None]  # a: dominator candidates, b: dominated candidates
    dominated = ((a <= b).all(axis=2) & (a < b).any(axis=2)).any(axis=0)
    expected = ~dominated & ~np.isnan(pts).any(axis=1)
    np.testing.assert_array_equal(nondominated_mask(vals, directions), expected)
    np.testing.assert_array_equal(nondominated_ranks(vals, directions) == 0, expected)


# ---------------------------------------------------------------------------------------- 3-D sweep
def _slow_hv(pts, ref):
    """The slicing method (HSO) this module used before the 3-D sweep: exact, O(n^2 log n) in 3-D.
    pts: (m, k) minimise, strictly inside ref."""
    if len(pts) == 0:
        return 0.0
    if pts.shape[1] == 2:
        order = np.lexsort(pts.T[::-1])
        xs, ys = pts[order, 0], pts[order, 1]
        best = np.minimum.accumulate(ys)
        widths = np.diff(np.append(xs, ref[0]))
        return float(np.sum(widths * (ref[1] - best)))
    order = np.argsort(pts[:, -1], kind="stable")
    pts = pts[order]
    levels = np.append(pts[:, -1], ref[-1])
    return float(sum((levels[i + 1] - levels[i]) * _slow_hv(pts[: i + 1, :-1], ref[:-1])
                     for i in range(len(pts)) if levels[i + 1] > levels[i]))


def _inside(vals, directions, ref):
    pts = to_minimise(vals, directions)
    r = to_minimise(np.asarray(ref, dtype=float).reshape(1, -1), directions)[0]
    return pts[~np.isnan(pts).any(axis=1) & (pts < r).all(axis=1)], r


def _sphere_front(rng, n, ties=False):
    """n mutually non-dominated points (minimise) on the unit sphere's positive octant, shifted; with
    ``ties`` coordinates snapped to a grid, so that many share a value (still a front after dedup)."""
    v = np.abs(rng.normal(size=(n, 3)))
    pts = 1.0 - v / np.linalg.norm(v, axis=1, keepdims=True)
    return np.round(pts * 40) / 40 if ties else pts


@pytest.mark.parametrize("seed", range(8))
def test_hypervolume_3d_with_ties_duplicates_and_outside_points_matches_inclusion_exclusion(seed):
    rng = np.random.default_rng(200 + seed)
    directions = [["min", "min", "min"], ["max", "min", "max"]][seed % 2]
    vals = rng.integers(0, 4, size=(10, 3)).astype(float)
    vals[5:8] = vals[:3]  # exact duplicates
    vals[8] = [9.0, 9.0, 9.0] if seed % 2 == 0 else [-9.0, 9.0, -9.0]  # worse than the reference
    vals[9, 1] = np.nan
    ref = np.where(np.array(directions) == "min", 3.0, 0.0)  # some points sit on the reference: they add nothing
    expected = _brute_hv(vals, directions, ref)
    assert hypervolume(vals, directions, ref) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    pts, r = _inside(vals, directions, ref)
    assert _slow_hv(pts, r) == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("ties", [False, True])
def test_hypervolume_3d_on_1000_point_fronts_matches_the_slicing_method(ties):
    rng = np.random.default_rng(11 + ties)
    front = _sphere_front(rng, 1000, ties)
    vals = np.concatenate([front, front[:50], rng.uniform(0.5, 1.3, (200, 3))])  # duplicates, dominated, outside
    ref = np.array([1.05, 1.1, 1.2])
    pts, r = _inside(vals, ["min"] * 3, ref)
    assert hypervolume(vals, ["min"] * 3, ref) == pytest.approx(_slow_hv(pts, r), rel=1e-12)
    directions = ["max", "min", "max"]  # the same set seen through other directions
    flipped = vals * np.array([-1.0, 1.0, -1.0])
    assert hypervolume(flipped, directions, ref * np.array([-1.0, 1.0, -1.0])) == pytest.approx(
        _slow_hv(pts, r), rel=1e-12)


def test_hypervolume_3d_on_a_1000_point_random_cloud_matches_the_slicing_method():
    rng = np.random.default_rng(5)
    vals = rng.random((1000, 3))
    vals[::7, 2] = vals[::7, 0]  # shared values across objectives and points
    vals[::11] = vals[1::11][: len(vals[::11])]
    pts, r = _inside(vals, ["min"] * 3, [1.0, 0.9, 1.0])
    assert hypervolume(vals, ["min"] * 3, [1.0, 0.9, 1.0]) == pytest.approx(_slow_hv(pts, r), rel=1e-12)


@pytest.mark.timeout(60)  # the sweep takes milliseconds (benchmarks/bench_report.py); slicing, minutes
def test_hypervolume_3d_of_a_10000_point_front():
    front = _sphere_front(np.random.default_rng(3), 10_000)
    hv = hypervolume(front, ["min"] * 3, [1.1, 1.1, 1.1])
    assert 0 < hv < 1.1 ** 3


def test_infinite_coordinates_give_an_infinite_volume():
    vals = np.array([[0.5, 0.5, 0.5], [-np.inf, 0.9, 0.9], [np.nan, 0.0, 0.0]])
    assert hypervolume(vals[:1], ["min"] * 3, [1, 1, 1]) == pytest.approx(0.125)
    assert hypervolume(vals, ["min"] * 3, [1, 1, 1]) == np.inf
    assert hypervolume(vals[:1], ["min"] * 3, [np.inf, 1, 1]) == np.inf
    assert hypervolume(np.array([[2.0, 0.0, 0.0]]), ["min"] * 3, [np.inf, 1, 1]) == np.inf
    assert hypervolume(np.array([[np.inf, 0.0, 0.0]]), ["min"] * 3, [np.inf, 1, 1]) == 0.0  # not inside
    trace = hypervolume_trace(vals, ["min"] * 3, [1, 1, 1], [2, 0, 1, 0])
    assert trace.tolist() == [0.0, 0.125, np.inf, np.inf]


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("seed", range(3))
def test_hypervolume_trace_with_ties_duplicates_and_outside_points_matches_every_prefix(k, seed):
    rng = np.random.default_rng(300 + seed)
    directions = (["max", "min", "min", "max"])[:k]
    vals = _random_values(rng, 120, k, 6)  # integer grid: many ties, duplicates, NaN rows
    ref = reference_point(vals, directions)
    ref = ref - 0.3 * np.sign(ref) * (np.array(directions) == "min")  # pull in: some points end up outside
    order = rng.permutation(120)[:100]  # some rows never added
    trace = hypervolume_trace(vals, directions, ref, order)
    expected = [hypervolume(vals[order[: i + 1]], directions, ref) for i in range(len(order))]
    np.testing.assert_allclose(trace, expected, rtol=1e-12, atol=1e-12)


def test_hypervolume_trace_3d_on_a_1000_point_front_matches_the_slicing_method():
    rng = np.random.default_rng(8)
    front = _sphere_front(rng, 1000, ties=True)
    vals = np.concatenate([front, rng.uniform(0.3, 1.2, (300, 3))])
    order = rng.permutation(len(vals))
    ref = np.array([1.1, 1.1, 1.1])
    trace = hypervolume_trace(vals, ["min"] * 3, ref, order)
    assert np.all(np.diff(trace) >= 0)
    for i in (0, 9, 99, 499, 999, len(order) - 1):  # spot checks: the slicing method is slow
        pts, r = _inside(vals[order[: i + 1]], ["min"] * 3, ref)
        assert trace[i] == pytest.approx(_slow_hv(pts, r), rel=1e-12)
