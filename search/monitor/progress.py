"""Where a campaign stands, read from its records: what the live terminal block, `qkvsearch watch` and
the campaign metrics show. One reader (`read_progress`) for all three, for a running or a finished
campaign, on a local path or a URI.

The front and hypervolume are those of the trials finished so far (status completed), on the spec's
objectives, against the campaign's fixed reference (search.analysis.hv_reference): it never moves, so the
hypervolume never falls while the front grows. A reference still missing a part (a loss, a measured cost:
fixed by the first completed trial) is completed here when it can be, and recorded.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from qkvsearch.search.analysis import hv_reference
from qkvsearch.search.analysis.pareto import hypervolume, nondominated_mask
from qkvsearch.search.monitor.oneshot_phases import DONE, OneShotPhases, read_phases
from qkvsearch.search.monitor.stage_status import stage_summary
from qkvsearch.search.records.front_repeats import planned_runs
from qkvsearch.search.records.layout import FINAL_STATUSES, UNTRAINED_STATUSES, open_campaign
from qkvsearch.search.records.lease import DriverState, read_lease
from qkvsearch.search.records.readers import read_trials
from qkvsearch.spaces.checks import finite as _finite

SHOWN_WAIT = 0.005   # a loader wait share the summary line names (below, it would read "0%": data in memory)


@dataclass
class RunningTrial:
    name: str
    epochs: int
    planned: int
    top1: float | None
    loader_wait: float | None = None   # its last epoch's share of training time spent waiting for batches


@dataclass
class FinishedTrial:
    name: str
    status: str                # one of records.FINAL_STATUSES
    epochs: int
    planned: int
    top1: float | None         # at its last epoch
    cost: dict                 # params_m, gmacs...
    note: str = ""             # the last line of its error, or the trial it duplicates


@dataclass
class Progress:
    """A campaign's state at `read_at` (unix seconds)."""

    name: str
    trials_planned: int
    counts: Counter            # status -> trials recorded
    epochs_done: int
    epochs_planned: int        # every planned trial's epochs (trials not yet started counted in full)
    running: list[RunningTrial]
    objectives: list[tuple[str, str]]          # (metric, "min" | "max")
    best: dict[str, float]                     # objective metric -> best value among completed trials
    front: list[dict] = field(default_factory=list)  # the completed front: {"trial", metric: value...}
    hypervolume: float | None = None
    reference: str = ""        # the hypervolume's fixed reference, as text ("" while not fixed)
    images_per_s: dict[str, float] = field(default_factory=dict)   # trial -> last epoch's images/s
    startup_s: dict[str, float] = field(default_factory=dict)      # trial -> start -> first step, s
    finished: list[FinishedTrial] = field(default_factory=list)  # trials in a final status, in record order
    ended: bool = False
    interrupted: bool = False  # its driver was stopped before the end (resume continues it)
    read_at: float = 0.0
    driver: DriverState | None = None  # the driver holding it (search.records.lease); None: not read
    stages: str = ""           # the stages' progress (search.monitor.stage_status); "": no stages
    oneshot: OneShotPhases | None = None  # a one-shot campaign's phases (search.monitor.oneshot_phases)

    @property
    def trials_recorded(self) -> int:
        return sum(self.counts.values())

    @property
    def trials_done(self) -> int:  # in a final status
        return sum(n for s, n in self.counts.items() if s in FINAL_STATUSES)

    def summary(self) -> str:
        """One line: trials by status (a one-shot campaign: its phases), epochs, front and best values."""
        by_status = ", ".join(f"{n} {s}" for s, n in sorted(self.counts.items()))
        trials = f"{self.trials_done}/{self.trials_planned} trials done ({by_status or 'none yet'})"
        if self.oneshot is not None:  # its trials are the retraining: the phases say how far it is
            trials = self.oneshot.summary() + (f" ({by_status})" if by_status else "")
            if not self.oneshot.begun("retraining"):  # no epoch, no front before it
                return f"{self.name}: {trials}"
        hv = "-" if self.hypervolume is None else f"{self.hypervolume:.4g}"
        best = ", ".join(f"{m} {v:.4g}" for m, v in self.best.items())
        return (f"{self.name}: {trials}; "
                f"epochs {self.epochs_done}/{self.epochs_planned}; front {len(self.front)}, hypervolume {hv}"
                + (f" (reference {self.reference})" if self.reference else "")
                + (f"; best {best}" if best else "") + (f"; {self.stages}" if self.stages else "")
                + (f"; loader wait up to {wait:.0%}" if (wait := self.loader_wait or 0.0) >= SHOWN_WAIT else ""))

    @property
    def loader_wait(self) -> float | None:
        """The largest loader wait share of the running trials' last epochs (None: none reported)."""
        waits = [t.loader_wait for t in self.running if t.loader_wait is not None]
        return max(waits) if waits else None


def read_progress(exp) -> Progress:
    """The campaign at ``exp`` now. CampaignFileError when ``exp`` is not a campaign folder."""
    campaign = open_campaign(exp)
    read = read_trials(exp)
    records, counts, lasts = read.records, read.epoch_counts(), read.last_epochs()
    oneshot = read_phases(exp, campaign, records)
    # search.num_trials counts every planned trial already (grid: points x repeats); a one-shot campaign's
    # trials are the retrained subnets, as many as its selection plans (none before it is made)
    wanted = campaign.trials_planned if oneshot is None else oneshot.to_retrain
    if wanted is not None and oneshot is None:   # and the front's runs under more seeds, once planned
        wanted += planned_runs(exp)
    planned = max(wanted or len(records), len(records))
    epochs_each = campaign.epochs_planned or 0
    objectives = campaign.objectives
    status = Counter(str(r.get("status")) for r in records)
    running = [RunningTrial(_name(r), n, int(r.get("epochs_planned") or epochs_each), _finite(last.get("top1")),
                            _finite(last.get("loader_wait")))
               for r, n, last in zip(records, counts, lasts) if r.get("status") == "running"]
    progress = Progress(
        name=campaign.name, trials_planned=planned, counts=status,
        epochs_done=int(sum(counts)),
        epochs_planned=sum(_epochs_to_train(r, epochs_each) for r in records) + (planned - len(records)) * epochs_each,
        running=running, objectives=objectives, best={}, read_at=time.time(), oneshot=oneshot)
    # ended: the driver recorded its end, or (a campaign recorded before drivers did) every trial is final; a
    # one-shot campaign's trials come after its other phases, which say when it is done
    if oneshot is not None:
        progress.ended = oneshot.phase == DONE
    else:
        progress.ended = campaign.ended or (len(records) >= planned and progress.trials_done >= planned)
    progress.interrupted = campaign.interrupted_at is not None and not progress.ended
    progress.stages = stage_summary(exp, campaign.spec)
    try:
        progress.driver = read_lease(exp)
    except OSError:  # storage away for a moment: the next snapshot reads it
        progress.driver = None
    progress.finished = [_finished(r, n, last, epochs_each) for r, n, last in zip(records, counts, lasts)
                         if r.get("status") in FINAL_STATUSES]
    for r, last in zip(records, lasts):
        if _finite(last.get("images_per_s")) is not None:
            progress.images_per_s[_name(r)] = last["images_per_s"]
        if _finite(r.get("first_step_at")) and _finite(r.get("started_at")):
            progress.startup_s[_name(r)] = r["first_step_at"] - r["started_at"]
    done = [(r, last) for r, last in zip(records, lasts) if r.get("status") == "completed"]
    reference = _reference(exp, objectives, records, done)
    progress.reference = hv_reference.describe(reference)
    _add_front(progress, done, hv_reference.ready(reference))
    return progress


def _reference(exp, objectives, records: list[dict], done: list[tuple[dict, dict]]) -> dict | None:
    """The campaign's fixed reference (search.analysis.hv_reference), completed and recorded once the records
    allow; a campaign launched before references existed gets one here, by the same rule."""
    record = hv_reference.read(exp)
    if record is None or [tuple(o) for o in record["objectives"]] != [tuple(o) for o in objectives]:
        from qkvsearch.search.records.proposals import read_proposals

        record = hv_reference.at_launch(objectives, [])
        costs = [r.get("cost") or {} for r in records] + [p.get("cost") or {} for p in read_proposals(exp)]
    else:
        costs = ()
    if hv_reference.ready(record) is not None:
        return record
    first = _first_completed(objectives, done)
    fixed = hv_reference.completed(record, first, costs)
    if fixed != hv_reference.read(exp):
        try:
            hv_reference.write(exp, fixed)
        except OSError:  # a reader without write access: fixed by the same rule at the next read
            pass
    return fixed


def _first_completed(objectives, done: list[tuple[dict, dict]]) -> dict | None:
    """The objective values of the first trial to complete (by its end time) with every objective finite."""
    ordered = sorted(done, key=lambda d: (_finite(d[0].get("ended_at"), math.inf), str(d[0].get("trial_id"))))
    for record, last in ordered:
        values = {m: _objective(record, last, m) for m, _ in objectives}
        if all(math.isfinite(v) for v in values.values()):
            return values
    return None


def _finished(record: dict, epochs: int, last: dict, epochs_each: int) -> FinishedTrial:
    error = record.get("error")
    note = error.strip().splitlines()[-1][:160] if isinstance(error, str) and error.strip() else ""
    if record.get("duplicate_of"):
        note = f"same configuration as trial {record['duplicate_of']}: not trained again"
    return FinishedTrial(_name(record), record["status"], epochs, int(record.get("epochs_planned") or epochs_each),
                         _finite(last.get("top1")), record.get("cost") or {}, note)


def _add_front(progress: Progress, done: list[tuple[dict, dict]], reference: list[float] | None) -> None:
    """Best values, the non-dominated completed trials and their hypervolume against ``reference`` (None:
    not fixed yet, no hypervolume)."""
    if not done or not progress.objectives:
        return
    metrics = [m for m, _ in progress.objectives]
    dirs = [d for _, d in progress.objectives]
    values = np.array([[_objective(r, last, m) for m in metrics] for r, last in done], dtype=float)
    ok = np.isfinite(values).all(axis=1)
    for j, (m, d) in enumerate(progress.objectives):
        col = values[np.isfinite(values[:, j]), j]
        if len(col):
            progress.best[m] = float(col.max() if d == "max" else col.min())
    if not ok.any():
        return
    pts = values[ok]
    names = [_name(r) for (r, _), good in zip(done, ok) if good]
    mask = nondominated_mask(pts, dirs)
    progress.front = [{"trial": n, **dict(zip(metrics, map(float, p)))} for n, p, f in zip(names, pts, mask) if f]
    if reference is not None:
        progress.hypervolume = float(hypervolume(pts[mask], dirs, reference))


def _objective(record: dict, last: dict, metric: str) -> float:
    """An objective's value: the trial's last epoch metric, else its cost (params_m, gmacs...)."""
    v = last.get(metric, (record.get("cost") or {}).get(metric))
    return _finite(v, math.nan)


def _epochs_to_train(record: dict, default: int) -> int:
    """Epochs a trial will train: none for one that never trains (a duplicate, an infeasible one)."""
    return 0 if record.get("status") in UNTRAINED_STATUSES else int(record.get("epochs_planned") or default)


def _name(record: dict) -> str:
    return str(record.get("trial_name") or record["trial_id"])
