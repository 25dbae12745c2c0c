"""Multi-objective asynchronous successive halving (MO-ASHA) for Ray Tune.

Rungs sit at ``grace_period * reduction_factor**k`` epochs, below ``max_t``. When a trial reports a
result at or past a rung it has not yet been judged at, the objectives of that result join every
result recorded at the rung, and the rung is ordered:

1. by non-dominated rank (``search.pareto.nondominated_ranks``; 0 = the rung's Pareto front);
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

Why most trials go to the bracket that judges last, rather than Hyperband's shares (equal budget per
bracket: most trials in bracket 0, which Ray approximates with weights e^rungs) or equal shares: a
trial an early rung misjudges is lost to the front for good, while a trial kept too long costs only
epochs, and early rungs misjudge often. Measured with benchmarks/bench_search.py (27 epochs, grace 1,
rf 3, objectives top1 and params; 20 seeds), one bracket alone judging first at epoch 1, 3 or 9 trains
to the end 0.23, 0.45 and 0.82 of the full grid's front for 4.0, 7.3 and 15 epochs per configuration
when larger models learn slower and overtake later (81 configurations), and still only 0.52, 0.69 and
0.96 for 6.0, 9.2 and 16 epochs when curves keep their order: with two objectives a rung's top third
by rank and crowding distance, judged as results arrive, cuts true front members too. So at half the
grid's epochs, 3 brackets kept of the grid's hypervolume on crossing curves 0.929 (81 configurations)
and 0.953 (243) with equal shares, 0.970 and 0.968 with shares 1 : 9 : 81 (random search with full
training: 0.953 and 0.970), and on ordered curves 0.983 and 0.995, then 0.982 and 0.993. The price is
epochs: trying every configuration once, 3 brackets spend 0.55 to 0.59 of the grid's epochs instead of
0.36 to 0.45. The shares were chosen over rf^s (1 : 3 : 9) and over the last bracket alone on 20 other
random grids of each benchmark (8 seeds each): the mean lead over random search at half the epochs on
crossing curves was -0.008 and -0.014 (81, 243 configurations) with equal shares, +0.007 and +0.005
with 1 : 3 : 9, +0.013 and +0.012 with 1 : 9 : 81, +0.011 and +0.011 with bracket 2 alone; on ordered
curves +0.035 and +0.033, +0.037 and +0.034, +0.036 and +0.031, +0.041 and +0.031. On the benchmark's own
grid with 60 seeds, 1 : 9 : 81 kept 0.966 on crossing curves (81 configurations; 1 : 3 : 9: 0.953,
random search: 0.950). The early brackets stay, with small shares, for large campaigns on curves whose
early ranking holds.

State is plain Python (lists, dicts, floats) so the object pickles; ``get_state``/``set_state`` and
``save``/``restore`` use JSON (a state saved before brackets existed loads as bracket 0's). Ray Tune
2.60 does not save a scheduler with the experiment state: on ``Tuner.restore`` it unpickles the
scheduler as it was when the ``Tuner`` was built. Given the campaign's folder (``experiment``, a local
path or a URI), the scheduler rebuilds its state from the trials' records instead (search.records, which
hold every epoch a trial reported, whatever the storage): on its first callback it reads them, and as
Tune adds each restored trial back, its recorded epochs are placed at its bracket's rungs as they were
judged (the first result with finite objectives at or past a rung is the one recorded there) and a
trial recorded as stopped early is stopped again at the rung of its last epoch. A trial's bracket is a
function of its number in the campaign (Tune's trial tag ``<n>_...``, kept by a restored trial): the
n-th trial takes the bracket the deal above gives the n-th trial, so a restored trial rejoins its bracket
in whatever order Tune adds trials back. A result the scheduler judged but the driver died before
recording is judged again when the restored trial reports it again (trainers.loop re-reports every epoch
of the checkpoint it resumes from); a trial judged promotable and one stopped in the milliseconds before
its record says so look alike, and rebuild as promoted.

Every scheduler of a campaign (``CheckpointsTrialChanges``) also makes Tune save its experiment state
(trials, searcher) whenever trials were added or ended: Tune otherwise saves it at most every 10 s, and a
driver killed in between restores an older list of trials and an older searcher.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np
from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, TrialScheduler

from qkvsearch.search.pareto import NAN_RANK, nondominated_ranks, to_minimise
from qkvsearch.search.records import read_trials
from qkvsearch.search.storage import write_json

__all__ = ["CampaignASHAScheduler", "CampaignFIFOScheduler", "CheckpointsTrialChanges", "MOASHAScheduler",
           "candidate_position", "crowding_distance", "default_shares", "next_bracket", "promotable",
           "recorded_progress", "rung_positions"]

_STATE_FORMAT = "qkvsearch.moasha/2"
_STATE_FORMAT_V1 = "qkvsearch.moasha/1"  # one bracket; still loaded


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
    """A reported value as a float; NaN when absent, not a number, or non-finite."""
    if isinstance(x, bool) or x is None:
        return math.nan
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


class CheckpointsTrialChanges:
    """Scheduler mixin: Tune saves its experiment state (the trials, with the searcher's state: what
    ``Tuner.restore`` starts from) before it starts a trial, whenever trials were added or ended since.

    Tune saves that state at most every 10 s (longer on large experiments). A driver killed in between
    restores an older state: a trial added since is unknown to it (its searcher, restored as it was,
    suggests it again under a new id, which trains from scratch, and the trial count goes back), and a
    trial that ended since runs again. The scheduler is the one extension point Tune hands its controller,
    at every step (``choose_trial_to_run``, called before any trial starts). Each save writes the state and
    copies Tune's staging folder to the campaign's storage, once per trial added or ended."""

    _trials_changed = False  # a trial added or ended since the last save

    def on_trial_add(self, tune_controller, trial) -> None:
        self._trials_changed = True
        super().on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial) -> None:
        self._trials_changed = True
        super().on_trial_error(tune_controller, trial)

    def on_trial_complete(self, tune_controller, trial, result) -> None:
        self._trials_changed = True
        super().on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial) -> None:
        self._trials_changed = True
        super().on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller):
        if self._trials_changed:
            _save_experiment(tune_controller)
            self._trials_changed = False
        return super().choose_trial_to_run(tune_controller)


def _save_experiment(tune_controller) -> None:
    """Tune's experiment state saved and copied to storage now. Tune hands schedulers a wrapper that warns
    about attributes outside a short list; the controller behind it has ``checkpoint(force, wait)``. No
    controller (a scheduler driven by hand): nothing."""
    controller = getattr(tune_controller, "_tune_controller", tune_controller)
    save = getattr(controller, "checkpoint", None)
    if save is not None:
        save(force=True, wait=True)


class CampaignFIFOScheduler(CheckpointsTrialChanges, FIFOScheduler):
    """Tune's FIFOScheduler (no early stopping) with ``CheckpointsTrialChanges``."""


class CampaignASHAScheduler(CheckpointsTrialChanges, AsyncHyperBandScheduler):
    """Ray's ASHA with ``CheckpointsTrialChanges``. Its rungs are Ray's, in memory only: a restored
    campaign starts them empty."""


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


def _trial_number(trial) -> int | None:
    """A trial's 0-based position among the campaign's trials: Tune tags trials ``<n>_<config>`` with n
    counting from 1 in the order the searcher suggested them, and a restored trial keeps its tag. None for
    a trial without such a tag."""
    head = str(getattr(trial, "experiment_tag", "") or "").split("_", 1)[0]
    return int(head) - 1 if head.isdigit() and int(head) > 0 else None


class MOASHAScheduler(CheckpointsTrialChanges, FIFOScheduler):
    """MO-ASHA: asynchronous successive halving over several objectives (see the module doc).

    metrics/modes: the objectives and "min"/"max" for each. time_attr: the result key counting
    progress (our workers report ``epoch``, which, unlike Tune's training_iteration, survives a
    restore). Rungs at grace_period * reduction_factor**k < max_t; set max_t to the planned epochs.
    brackets: how many Hyperband brackets (1 to the number of rungs); bracket s skips the first s rungs.
    bracket_shares: the share of trials each bracket takes (B numbers > 0); default rf**(2 s) (module doc).
    experiment: the campaign's folder (local path or URI) whose trial records a restored scheduler rebuilds
    its state from (module doc); None: it starts empty.

    After (or during) a run: ``stopped`` maps trial_id -> rung (epoch milestone) where this
    scheduler stopped it early; ``rungs`` lists bracket 0's milestones, ``bracket_rungs`` every
    bracket's, ``bracket_of(trial_id)`` the bracket a trial joined."""

    def __init__(
        self,
        metrics: Sequence[str],
        modes: Sequence[str],
        time_attr: str = "epoch",
        grace_period: float = 1,
        reduction_factor: float = 3,
        max_t: float = 100,
        brackets: int = 1,
        bracket_shares: Sequence[float] | None = None,
        experiment: str | os.PathLike | None = None,
    ):
        super().__init__()
        self._metrics, self._modes = _check_objectives(metrics, modes)
        if not isinstance(time_attr, str) or not time_attr:
            raise ValueError(f"time_attr: expected a non-empty result key, given {time_attr!r}")
        _check_positive("grace_period", grace_period)
        _check_reduction_factor(reduction_factor)
        _check_positive("max_t", max_t)
        if max_t < grace_period:
            raise ValueError(f"max_t: expected a value >= grace_period ({grace_period}), given {max_t!r}")
        base = _milestones(grace_period, reduction_factor, max_t)  # bracket 0, ascending
        most = max(1, len(base))  # grace_period == max_t: no rung, one (empty) bracket
        if isinstance(brackets, bool) or not isinstance(brackets, (int, np.integer)) or not 1 <= brackets <= most:
            raise ValueError(f"brackets: expected an int in [1, {most}] (at most one per rung below "
                             f"max_t {max_t}), given {brackets!r}")
        brackets = int(brackets)
        shares = default_shares(brackets, reduction_factor) if bracket_shares is None else bracket_shares
        self._shares = _check_shares(shares, brackets)  # (B,) floats > 0: trials dealt per bracket
        self._time_attr = time_attr
        self._rf = reduction_factor
        self._max_t = max_t
        self._brackets = [base[s:] for s in range(brackets)]  # bracket s: rungs from grace * rf**s
        # [bracket][rung] -> trial_id -> objective values recorded there
        self._recorded: list[list[dict[str, list[float]]]] = [[{} for _ in ms] for ms in self._brackets]
        self._bracket_of: dict[str, int] = {}  # trial_id -> bracket
        self._counts = [0] * brackets  # trials per bracket (from _bracket_of)
        self._deal: list[int] = []  # bracket of the n-th trial of the campaign, as far as dealt (_dealt)
        self._deal_counts = [0] * brackets  # trials per bracket in _deal
        self.stopped: dict[str, float] = {}  # trial_id -> milestone where it was stopped early
        self._experiment = None if experiment is None else os.fspath(experiment)
        self._unplaced: dict[str, tuple] = {}  # recorded_progress of trials not yet given a bracket
        self._loaded = False  # records read yet?

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_unplaced": {}, "_loaded": False}  # a copy reads the records itself

    def __setstate__(self, state: dict) -> None:
        # An unpickled copy (Tune's tuner.pkl on restore) reads the campaign's records on its first callback.
        legacy = state.pop("_state_path", None)  # pickled when the state went to <experiment>/qs_scheduler.json
        state.setdefault("_experiment", None if legacy is None else os.path.dirname(legacy))
        state.setdefault("_deal", [])
        state.setdefault("_deal_counts", [0] * len(state.get("_brackets") or [None]))
        state["_unplaced"] = {}
        if "_brackets" not in state:  # pickled before brackets existed: one bracket
            recorded = state.pop("_recorded")
            known = {t: 0 for r in recorded for t in r} | {t: 0 for t in state.get("stopped", {})}
            state.update(_brackets=[state.pop("_milestones")], _recorded=[recorded], _bracket_of=known,
                         _counts=[len(known)])
        if "_shares" not in state:  # pickled before shares existed: the default ones
            state["_shares"] = _check_shares(default_shares(len(state["_brackets"]), state["_rf"]),
                                             len(state["_brackets"]))
        self.__dict__.update(state)
        self._loaded = False

    # ---- read-only views -------------------------------------------------------------------
    @property
    def metrics(self) -> list[str]:
        return list(self._metrics)

    @property
    def modes(self) -> list[str]:
        return list(self._modes)

    @property
    def rungs(self) -> list[float]:
        """Bracket 0's milestones (every rung)."""
        return list(self._brackets[0])

    @property
    def bracket_rungs(self) -> list[list[float]]:
        """Milestones of each bracket; bracket s holds bracket 0's from the (s+1)-th on."""
        return [list(ms) for ms in self._brackets]

    def bracket_of(self, trial_id: str) -> int | None:
        """The bracket a trial joined; None for a trial this scheduler has not seen."""
        return self._bracket_of.get(trial_id)

    def recorded(self, milestone: float, bracket: int = 0) -> dict[str, list[float]]:
        """trial_id -> objective values recorded at the rung ``milestone`` of ``bracket`` (a copy)."""
        if not (isinstance(bracket, int) and 0 <= bracket < len(self._brackets)):
            raise ValueError(f"bracket: expected an int in [0, {len(self._brackets)}), given {bracket!r}")
        ms = self._brackets[bracket]
        if milestone not in ms:
            raise ValueError(f"milestone: expected one of {ms} (bracket {bracket}), given {milestone!r}")
        return {t: list(v) for t, v in self._recorded[bracket][ms.index(milestone)].items()}

    # ---- Tune callbacks --------------------------------------------------------------------
    def set_search_properties(self, metric, mode, **spec) -> bool:
        # The objectives come from the constructor; a TuneConfig metric/mode would conflict (Tune
        # then raises). Scheduler.metric stays None, so Tune does not demand one metric per result.
        return not metric and not mode

    def on_trial_add(self, tune_controller, trial) -> None:
        self._ensure_loaded()
        self._assign(trial)
        super().on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        self._ensure_loaded()
        t = as_float(result.get(self._time_attr))
        if math.isnan(t):
            return TrialScheduler.CONTINUE
        if t >= self._max_t:
            return TrialScheduler.STOP
        return self._judge(trial, t, self._objectives(result))

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        # A trial ending on its own between rungs still adds its last result to its rung.
        super().on_trial_complete(tune_controller, trial, result)
        self._ensure_loaded()
        b = self._assign(trial)
        t = as_float((result or {}).get(self._time_attr))
        i = self._rung_index(b, t)
        row = self._objectives(result or {})
        if i is None or trial.trial_id in self._recorded[b][i] or math.isnan(sum(row)):
            return
        self._recorded[b][i][trial.trial_id] = row

    def debug_string(self) -> str:
        parts = []
        for b, (ms, rec) in enumerate(zip(self._brackets, self._recorded)):
            rungs = " | ".join(f"epoch {m:g}: {len(r)}" for m, r in zip(ms, rec))
            parts.append(rungs if len(self._brackets) == 1 else f"bracket {b}: {rungs}")
        return f"Using MOASHA: {len(self.stopped)} stopped early; recorded per rung: {'; '.join(parts)}"

    # ---- rung logic ------------------------------------------------------------------------
    def _objectives(self, result: dict) -> list[float]:
        return [as_float(result.get(m)) for m in self._metrics]

    def _assign(self, trial) -> int:
        """The trial's bracket. A new trial with a number in the campaign (_trial_number) takes the bracket
        the deal gives that number; one without, the bracket furthest behind its share now (the same in a
        campaign that numbers every trial). A new trial's recorded epochs, if any, go to its rungs."""
        b = self._bracket_of.get(trial.trial_id)
        if b is not None:
            return b
        n = _trial_number(trial)
        b = next_bracket(self._counts, self._shares) if n is None else self._dealt(n)
        self._bracket_of[trial.trial_id] = b
        self._counts[b] += 1
        self._place_recorded(trial.trial_id, b)
        return b

    def _dealt(self, n: int) -> int:
        """The bracket of the campaign's n-th trial (0-based) when trials 0..n are dealt in order."""
        if len(self._brackets) == 1:
            return 0
        while len(self._deal) <= n:
            b = next_bracket(self._deal_counts, self._shares)
            self._deal.append(b)
            self._deal_counts[b] += 1
        return self._deal[n]

    def _place_recorded(self, trial_id: str, b: int) -> None:
        """A restored trial's recorded epochs at bracket b's rungs, as the live scheduler recorded them: at
        each rung the first result with finite objectives at or past it; a trial recorded as stopped early
        is stopped at the rung of its last epoch."""
        found = self._unplaced.pop(trial_id, None)
        if found is None:
            return
        status, times, values = found
        last = None
        for t, row in zip(times.tolist(), values.tolist()):  # (E,), (E, k)
            i = self._rung_index(b, t)
            if i is None:
                continue
            last = i
            if trial_id not in self._recorded[b][i] and not math.isnan(sum(row)):
                self._recorded[b][i][trial_id] = row
        if status == "stopped_early" and last is not None:
            self.stopped[trial_id] = self._brackets[b][last]

    def _rung_index(self, bracket: int, t: float) -> int | None:
        """Index of the bracket's highest milestone <= t, None if below its first (or t is NaN)."""
        below = [i for i, m in enumerate(self._brackets[bracket]) if m <= t]
        return below[-1] if below else None

    def _judge(self, trial, t: float, row: list[float]) -> str:
        trial_id = trial.trial_id
        b = self._assign(trial)
        i = self._rung_index(b, t)
        if i is None:
            return TrialScheduler.CONTINUE
        if trial_id in self.stopped:  # already stopped (a re-sent result): keep the decision
            return TrialScheduler.STOP
        rung = self._recorded[b][i]
        if trial_id in rung:  # judged at this rung already and promoted
            return TrialScheduler.CONTINUE
        values = [*rung.values(), row]  # (n, k), candidate last
        keep = promotable(np.array(values), self._modes, self._rf, len(values) - 1)
        if not math.isnan(sum(row)):
            rung[trial_id] = row
        if not keep:
            self.stopped[trial_id] = self._brackets[b][i]
        return TrialScheduler.CONTINUE if keep else TrialScheduler.STOP

    # ---- state -----------------------------------------------------------------------------
    def get_state(self) -> dict:
        """The decision state as plain JSON-able data."""
        return {
            "format": _STATE_FORMAT,
            "metrics": list(self._metrics),
            "modes": list(self._modes),
            "time_attr": self._time_attr,
            "brackets": [list(ms) for ms in self._brackets],
            "recorded": [[{t: list(v) for t, v in r.items()} for r in rec] for rec in self._recorded],
            "bracket_of": dict(self._bracket_of),
            "stopped": dict(self.stopped),
        }

    def set_state(self, state: dict) -> None:
        """Load ``get_state()`` output; the objectives and rungs must match this scheduler's. A state
        of format qkvsearch.moasha/1 (one bracket) loads into bracket 0."""
        fmt = state.get("format") if isinstance(state, dict) else None
        if fmt == _STATE_FORMAT_V1:
            state = _upgrade_v1(state, self._brackets)
        elif fmt != _STATE_FORMAT:
            got = fmt if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"state: expected a dict with format {_STATE_FORMAT!r}, given {got!r}")
        for key, mine in (("metrics", self._metrics), ("modes", self._modes),
                          ("time_attr", self._time_attr), ("brackets", self._brackets)):
            if state.get(key) != mine:
                raise ValueError(f"state[{key!r}]: expected {mine!r} (this scheduler's), given {state.get(key)!r}")
        self._recorded = [[{str(t): [float(x) for x in v] for t, v in r.items()} for r in rec]
                          for rec in state["recorded"]]
        self._bracket_of = {str(t): int(b) for t, b in state["bracket_of"].items()}
        self._counts = [0] * len(self._brackets)
        for b in self._bracket_of.values():
            self._counts[b] += 1
        self.stopped = {str(t): m for t, m in state["stopped"].items()}
        self._unplaced, self._loaded = {}, True  # this state replaces the records'

    def save(self, checkpoint_path: str) -> None:
        _write_json_atomic(Path(checkpoint_path), self.get_state())

    def restore(self, checkpoint_path: str) -> None:
        self.set_state(json.loads(Path(checkpoint_path).read_text()))

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if self._experiment is not None:
            self._unplaced = recorded_progress(self._experiment, self._metrics, self._time_attr)


def _upgrade_v1(state: dict, brackets: list[list[float]]) -> dict:
    """A one-bracket state (format qkvsearch.moasha/1) in the current format: its rungs become
    bracket 0's (they must match), every trial it knows joins bracket 0, other brackets start empty."""
    if state.get("milestones") != brackets[0]:
        raise ValueError(f"state['milestones']: expected {brackets[0]!r} (this scheduler's bracket 0), "
                         f"given {state.get('milestones')!r}")
    recorded = list(state.get("recorded") or [])
    seen = {t: 0 for r in recorded for t in r} | {t: 0 for t in state.get("stopped") or {}}
    return {**state, "format": _STATE_FORMAT, "brackets": [list(ms) for ms in brackets],
            "recorded": [recorded] + [[{} for _ in ms] for ms in brackets[1:]], "bracket_of": seen}


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
    """grace_period * rf**k for k = 0, 1, ... while < max_t (ints kept as ints)."""
    out, m = [], grace_period
    while m < max_t:
        out.append(int(m) if float(m).is_integer() else float(m))
        m = m * rf
    return out


def _write_json_atomic(path: Path, obj) -> None:
    write_json(os.fspath(path), obj)
