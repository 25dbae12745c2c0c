"""The campaign's Ray Tune schedulers: FIFO, Ray's ASHA, and MO-ASHA (the rules of
search.scheduling.moasha) as a Tune ``TrialScheduler``.

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
recording is judged again when the restored trial reports it again (trainers.ray_train.loop re-reports every epoch
of the checkpoint it resumes from); a trial judged promotable and one stopped in the milliseconds before
its record says so look alike, and rebuild as promoted.

Every scheduler of a campaign also makes Tune save its experiment state (trials, searcher) whenever trials
were added or ended (search.scheduling.forced_saves).
"""
from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, TrialScheduler

from qkvsearch.search.scheduling.forced_saves import CheckpointsTrialChanges
from qkvsearch.search.scheduling.moasha import (
    _check_objectives,
    _check_positive,
    _check_reduction_factor,
    _check_shares,
    _milestones,
    as_float,
    default_shares,
    next_bracket,
    promotable,
    recorded_progress,
)
from qkvsearch.spaces.metrics import EPOCH
from qkvsearch.spaces.sections import SCHEDULERS
from qkvsearch.storage import write_json

_STATE_FORMAT = "qkvsearch.moasha/2"


_STATE_FORMAT_V1 = "qkvsearch.moasha/1"  # one bracket; still loaded


class CampaignFIFOScheduler(CheckpointsTrialChanges, FIFOScheduler):
    """Tune's FIFOScheduler (no early stopping) with ``CheckpointsTrialChanges``."""


class CampaignASHAScheduler(CheckpointsTrialChanges, AsyncHyperBandScheduler):
    """Ray's ASHA with ``CheckpointsTrialChanges``. Its rungs are Ray's, in memory only: a restored
    campaign starts them empty."""


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
        time_attr: str = EPOCH,
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
        return self._judge(trial, t, self._objectives(trial, result))

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        # A trial ending on its own between rungs still adds its last result to its rung.
        super().on_trial_complete(tune_controller, trial, result)
        self._ensure_loaded()
        b = self._assign(trial)
        t = as_float((result or {}).get(self._time_attr))
        i = self._rung_index(b, t)
        row = self._objectives(trial, result or {})
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
    def _objectives(self, trial, result: dict) -> list[float]:
        """The objectives of a result; a cost objective is the trial's cost (its config's, search.searchers.
        problem.build_trial; a table's rows hold it in the replay)."""
        config = getattr(trial, "config", None)
        cost = config.get("cost") if isinstance(config, dict) else None
        known = {**result, **cost} if isinstance(cost, dict) else result
        return [as_float(known.get(m)) for m in self._metrics]

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


def _write_json_atomic(path: Path, obj) -> None:
    write_json(os.fspath(path), obj)


# ---------------------------------------------------------------------------------------- builders
# Each builder (spaces.sections.SCHEDULERS names it) takes the scheduler's settings (make_scheduler) and uses those it
# has; ``section``: the campaign's scheduler section (spaces.sections.SchedulerSpec: an option of a scheduler's own
# is a field there), None where `simulate` builds one from its settings alone.
def fifo(**_) -> CampaignFIFOScheduler:
    return CampaignFIFOScheduler()


def asha(*, metric: str, mode: str, common: dict, **_) -> CampaignASHAScheduler:
    return CampaignASHAScheduler(metric=metric, mode=mode, **common)


def moasha(*, metrics, modes, shares, experiment, common: dict, **_) -> MOASHAScheduler:
    return MOASHAScheduler(metrics=metrics, modes=modes, bracket_shares=shares, experiment=experiment, **common)


def builder(kind: str):
    """The builder of a scheduler type (spaces.sections.SCHEDULERS), imported."""
    module, _, name = SCHEDULERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def make_scheduler(kind: str, *, max_t: float, grace: float = 1, rf: float = 3, brackets: int = 1,
                   metrics=(), modes=(), metric: str | None = None, mode: str | None = None, shares=None,
                   experiment=None, section=None):
    """The Tune scheduler of a scheduler type: FIFO; ASHA on ``metric``/``mode``; MO-ASHA on ``metrics`` and
    ``modes``, rebuilding its state from the records of ``experiment`` on a restore (module doc); another its
    builder's, from the ``section`` that holds its options."""
    common = dict(time_attr=EPOCH, grace_period=grace, reduction_factor=rf, max_t=max_t, brackets=brackets)
    return builder(kind)(metrics=list(metrics), modes=list(modes), metric=metric, mode=mode, shares=shares,
                         experiment=experiment, common=common, section=section)
