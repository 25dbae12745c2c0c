"""The replay: one simulated clock, a searcher and a scheduler driven through Tune's callbacks.

One simulated clock and ``concurrency`` slots. A free slot asks the searcher for a trial, spends
``startup_s``, then each recorded epoch's ``epoch_s``. The events (a trial finishing an epoch) sit
in a heap ordered by (time, sequence number), so simultaneous events resolve in a fixed order. Each
epoch's result (the curve's row, with ``epoch``) goes to ``on_trial_result`` as Tune passes it; a STOP,
or the curve's last recorded epoch, ends the trial (``on_trial_complete`` on the scheduler and the
searcher) and frees the slot. A trial whose curve ends before the planned epochs ends there without
being complete: what it would have done next was never recorded.

Searcher (search.simulation.searchers): ``ShuffledCurves`` suggests every curve once, in an order drawn from
the seed (a new order for each further pass when more trials than curves are asked for). Ray's ASHA draws its
brackets from numpy's global generator: it is seeded from the same seed for the run and restored afterwards. A
seed therefore fixes the whole run.

Scoring: a trial is complete when it trained for the planned epochs; its objectives are its last
epoch's values. The hypervolume of the completed trials' front (``search.analysis.pareto``) is measured
against one reference point per source (``reference_point`` of every complete curve's final values)
and compared with the full grid's (every complete curve trained to the end), against simulated time
and against epochs spent (``grid_epochs``: the epochs of every recorded curve, what FIFO over all of
them spends).
"""
from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from qkvsearch.search.analysis.pareto import hypervolume_trace
from qkvsearch.search.simulation.curves import Curves
from qkvsearch.search.simulation.searchers import make_searcher
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.metrics import SCHEDULER_METRICS as TRAINING_METRICS
from qkvsearch.spaces.sections import TRIAL_SCHEDULERS, SchedulerSpec

DEFAULT_CONCURRENCY = 4




# ---------------------------------------------------------------------------------------- settings
_SETTING_RE = re.compile(r"^(?P<type>[a-z]+)(?::(?P<opts>.*))?$")


@dataclass(frozen=True)
class Setting:
    """One scheduler configuration: ``fifo``, ``asha`` or ``moasha`` with grace, rf and brackets.

    shares (moasha, Python only: a campaign always uses the default): the share of trials each bracket
    takes, e.g. (1, 1, 1) for equal shares; None is MOASHAScheduler's default (rf**(2 s) for bracket s)."""

    type: str
    grace: int = 1
    rf: int = 3
    brackets: int = 1
    metric: str | None = None  # asha: the metric it stops on (default: the first training objective)
    shares: tuple[float, ...] | None = None

    @property
    def label(self) -> str:
        if self.type == "fifo":
            return "fifo"
        text = f"{self.type} g{self.grace} rf{self.rf}"
        if self.brackets > 1:
            text += f" b{self.brackets}"
        if self.shares is not None:
            text += " shares " + ":".join(f"{x:g}" for x in self.shares)
        return text + (f" {self.metric}" if self.metric else "")

    @classmethod
    def parse(cls, text: str, grace: int = 1, rf: int = 3) -> Setting:
        """``TYPE[:key=value,...]`` with keys grace, rf, brackets (and metric for asha), e.g.
        ``moasha:grace=1,rf=3,brackets=2``; grace and rf default to the given ones."""
        m = _SETTING_RE.match(text.strip())
        expected = "TYPE[:grace=G,rf=R,brackets=B] with TYPE fifo, asha or moasha"
        if not m or m["type"] not in TRIAL_SCHEDULERS:
            raise BadInput(f"schedulers: expected {expected}, given {text!r}")
        opts: dict = {"grace": grace, "rf": rf, "brackets": 1, "metric": None}
        for part in filter(None, (m["opts"] or "").split(",")):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in opts:
                raise BadInput(f"schedulers: expected {expected}, given {text!r}")
            if key == "metric":
                opts[key] = value.strip()
                continue
            try:
                opts[key] = int(value)
            except ValueError:
                raise BadInput(f"schedulers: expected an int for {key} in {text!r}, given {value!r}") from None
        if opts["grace"] < 1 or opts["brackets"] < 1 or opts["rf"] < 2:
            raise BadInput(f"schedulers: expected grace >= 1, rf >= 2 and brackets >= 1, given {text!r}")
        if m["type"] == "fifo":
            if m["opts"]:  # it stops no trial: grace, rf and brackets would mean nothing
                raise BadInput(f"schedulers: expected fifo without options (it stops no trial), given {text!r}")
            return cls("fifo")
        return cls(m["type"], opts["grace"], opts["rf"], opts["brackets"],
                   opts["metric"] if m["type"] == "asha" else None)


def _rungs(grace: float, rf: float, max_t: float) -> int:
    """How many MO-ASHA rungs (grace * rf**k < max_t) fit."""
    return len(SchedulerSpec.rung_epochs(grace, rf, max_t))


def default_settings(curves: Curves) -> list[Setting]:
    """fifo, asha, and moasha with 1, 2, 3 brackets (as many as fit), at the campaign's grace and
    reduction factor (1 and 3 for a table)."""
    sched = curves.scheduler
    grace = sched.get("grace_epochs") if isinstance(sched.get("grace_epochs"), int) else 1
    rf = sched.get("reduction_factor") if isinstance(sched.get("reduction_factor"), int) else 3
    grace = min(grace, curves.max_t)
    fit = max(1, _rungs(grace, rf, curves.max_t))
    out = [Setting("fifo")]
    if any(m in TRAINING_METRICS for m in curves.metrics):
        out.append(Setting("asha", grace, rf))
    out += [Setting("moasha", grace, rf, b) for b in range(1, min(3, fit) + 1)]
    return out


def build_scheduler(setting: Setting, curves: Curves):
    """The scheduler a campaign builds for this setting (search.scheduling.tune_schedulers.make_scheduler)."""
    from qkvsearch.search.scheduling.tune_schedulers import make_scheduler

    if setting.type == "fifo":
        return make_scheduler("fifo", max_t=curves.max_t)
    if setting.grace > curves.max_t:
        raise BadInput(f"schedulers: expected grace <= the planned epochs ({curves.max_t}), given {setting.label}")
    common = dict(max_t=curves.max_t, grace=setting.grace, rf=setting.rf, brackets=setting.brackets)
    fit = max(1, _rungs(setting.grace, setting.rf, curves.max_t))
    if setting.shares is not None and (setting.type != "moasha" or len(setting.shares) != setting.brackets):
        raise BadInput(f"schedulers: expected shares for moasha only, one per bracket, given {setting.label}")
    if setting.brackets > fit:
        raise BadInput(f"schedulers: expected at most {fit} bracket(s) (the rungs below {curves.max_t} epochs "
                       f"at grace {setting.grace}, rf {setting.rf}), given {setting.label}")
    if setting.type == "asha":
        metric = setting.metric or next((m for m in curves.metrics if m in TRAINING_METRICS), None)
        modes = dict(curves.objectives)
        if metric is None:
            raise BadInput(f"schedulers: expected a training metric ({', '.join(TRAINING_METRICS)}) among the "
                           f"objectives for asha, given {', '.join(curves.metrics)}")
        mode = modes.get(metric) or ("min" if metric.endswith("loss") else "max")
        return make_scheduler("asha", metric=metric, mode=mode, **common)
    if setting.type not in TRIAL_SCHEDULERS:
        raise BadInput(f"schedulers: expected one of {', '.join(TRIAL_SCHEDULERS)}, given {setting.label}")
    return make_scheduler(setting.type, metrics=curves.metrics, modes=curves.directions, shares=setting.shares,
                          **common)


# ---------------------------------------------------------------------------------------- simulation
@dataclass(frozen=True)
class SimTrial:
    """What a scheduler reads of a Tune trial: its id (and the config, for a searcher's sake)."""

    trial_id: str
    config: dict


@dataclass
class Run:
    """One simulated campaign. end_*: (T,) per trial end, in time order: time_s, epochs (spent by
    then, all trials), curve, complete. hv: (C,) the completed front's hypervolume after each complete
    trial, at hv_time_s / hv_epochs (C = complete trials)."""

    setting: Setting
    seed: int
    trials: int
    complete: int
    stopped: int
    truncated: int
    epochs: int
    time_s: float
    end_time_s: np.ndarray
    end_epochs: np.ndarray
    end_curve: np.ndarray
    end_complete: np.ndarray
    hv: np.ndarray
    hv_time_s: np.ndarray
    hv_epochs: np.ndarray
    scheduler: object = field(default=None, repr=False, compare=False)  # as the run left it
    searcher: object = field(default=None, repr=False, compare=False)   # as the run left it (its counters)
    searcher_name: str = "shuffle"

    @property
    def label(self) -> str:
        return self.setting.label if self.searcher_name == "shuffle" else f"{self.searcher_name} {self.setting.label}"

    @property
    def infeasible_share(self) -> float:
        """Proposals that broke a cost constraint (no trial slot) / proposals, as the searcher counted them."""
        proposals = getattr(self.searcher, "proposals", 0)
        return getattr(self.searcher, "infeasible", 0) / proposals if proposals else 0.0

    @property
    def final_hv(self) -> float:
        return float(self.hv[-1]) if self.hv.size else 0.0

    def hv_at_epochs(self, budget: float) -> float:
        """Hypervolume of the trials completed by the time ``budget`` epochs were spent."""
        i = np.searchsorted(self.hv_epochs, budget, side="right")
        return float(self.hv[i - 1]) if i else 0.0

    def hv_at_time(self, seconds: float) -> float:
        i = np.searchsorted(self.hv_time_s, seconds, side="right")
        return float(self.hv[i - 1]) if i else 0.0

    def epochs_to(self, hv: float) -> float:
        """Epochs spent when the hypervolume first reached ``hv`` (inf if never)."""
        i = np.flatnonzero(self.hv >= hv)
        return float(self.hv_epochs[i[0]]) if i.size else math.inf

    def completed_curves(self) -> np.ndarray:
        return self.end_curve[self.end_complete]


def simulate(curves: Curves, setting: Setting, *, concurrency: int = DEFAULT_CONCURRENCY,
             startup_s: float | None = None, seed: int = 0, num_trials: int | None = None,
             searcher: str = "shuffle", constraints=(), searcher_options: dict | None = None, measured=()) -> Run:
    """Replay one scheduler setting on the curves (see the module doc); searcher: a name of
    search.simulation.searchers.SEARCHERS, constraints: spaces.schema.Constraint on cost columns;
    searcher_options: keyword arguments of the searcher's class; measured: cost columns a campaign would
    measure (known to the searcher once proposed, search.simulation.searchers.table_problem)."""
    from ray.tune.schedulers import TrialScheduler

    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise BadInput(f"concurrency: expected an int >= 1, given {concurrency!r}")
    startup = curves.startup_s if startup_s is None else float(startup_s)
    if not (math.isfinite(startup) and startup >= 0):
        raise BadInput(f"startup_s: expected a number >= 0, given {startup_s!r}")
    scheduler = build_scheduler(setting, curves)
    name, searcher = searcher, make_searcher(searcher, curves, seed, num_trials, constraints, searcher_options,
                                             measured)
    replay = _Replay(curves, scheduler, searcher, startup)
    saved = np.random.get_state()  # Ray's ASHA draws brackets from numpy's global generator
    np.random.seed(seed)
    try:
        for _ in range(concurrency):
            replay.start(0.0)
        while replay.events:
            replay.step(TrialScheduler.STOP)
    finally:
        np.random.set_state(saved)
    return replay.scored(setting, seed, name)


class _Replay:
    """One replay's state: the simulated clock's events, the trials started, and how each ended."""

    def __init__(self, curves: Curves, scheduler, searcher, startup: float):
        self.curves, self.scheduler, self.searcher, self.startup = curves, scheduler, searcher, startup
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, trial number, epoch reached)
        self.trials: list[SimTrial] = []
        self.curve_of: list[int] = []
        self.ends: list[tuple[float, int, int, bool]] = []  # (time, epochs spent, curve, complete)
        self.seq = self.spent = self.stopped = self.truncated = 0
        self.finished = False

    def _push(self, when: float, k: int, epoch: int) -> None:
        heapq.heappush(self.events, (when, self.seq, k, epoch))
        self.seq += 1

    def start(self, now: float) -> None:
        """A free slot asks the searcher for a trial; a curve with no epoch recorded ends at once and the
        slot asks again."""
        while not self.finished:
            k = len(self.trials)
            trial_id = f"sim_{k:05d}"
            suggestion = self.searcher.suggest(trial_id)
            if suggestion is None:
                self.finished = True
                return
            c = suggestion["curve"]
            trial = SimTrial(trial_id, suggestion)
            self.trials.append(trial)
            self.curve_of.append(c)
            self.scheduler.on_trial_add(None, trial)
            if self.curves.results[c]:
                self._push(now + self.startup + float(self.curves.epoch_s[c][0]), k, 1)
                return
            now += self.startup
            self.ends.append((now, self.spent, c, False))
            self.searcher.on_trial_complete(trial_id, None)

    def step(self, stop) -> None:
        """The next event: a trial's epoch reaches the scheduler, which lets it go on or ends it."""
        now, _, k, epoch = heapq.heappop(self.events)
        trial, c = self.trials[k], self.curve_of[k]
        self.spent += 1
        result = dict(self.curves.results[c][epoch - 1])
        decision = self.scheduler.on_trial_result(None, trial, result)
        last = epoch >= len(self.curves.results[c]) or epoch >= self.curves.max_t
        if decision != stop and not last:
            self.searcher.on_trial_result(trial.trial_id, result)
            self._push(now + float(self.curves.epoch_s[c][epoch]), k, epoch + 1)
            return
        complete = epoch >= self.curves.max_t
        if not complete:
            if decision == stop:
                self.stopped += 1
            else:
                self.truncated += 1
        self.scheduler.on_trial_complete(None, trial, result)
        self.searcher.on_trial_complete(trial.trial_id, result)
        self.ends.append((now, self.spent, c, complete))
        self.start(now)

    def scored(self, setting: Setting, seed: int, name: str) -> Run:
        """The run: its trials' ends in time order and the completed front's hypervolume after each."""
        kinds = [("t", "f8"), ("e", "i8"), ("c", "i8"), ("done", "?")]
        end = np.array(self.ends, dtype=kinds) if self.ends else np.zeros(0, dtype=kinds)
        end = end[np.argsort(end["t"], kind="stable")]  # trials without epochs may end out of order
        done = end["done"]
        curves = self.curves
        hv = (hypervolume_trace(curves.finals, curves.directions, curves.reference, order=end["c"][done])
              if done.any() else np.zeros(0))
        return Run(setting, seed, len(self.trials), int(done.sum()), self.stopped, self.truncated, self.spent,
                   float(end["t"].max()) if end.size else 0.0, end["t"], end["e"], end["c"], done,
                   hv, end["t"][done], end["e"][done], self.scheduler, self.searcher, name)


def compare(curves: Curves, settings: Sequence[Setting], *, concurrency: int | None = None,
            startup_s: float | None = None, seed: int = 0, num_trials: int | None = None,
            searchers: Sequence[str] = ("shuffle",), constraints=()) -> list[Run]:
    """``simulate`` for each searcher x setting on the same curves and seed."""
    conc = concurrency or curves.concurrency or DEFAULT_CONCURRENCY
    return [simulate(curves, s, concurrency=conc, startup_s=startup_s, seed=seed, num_trials=num_trials,
                     searcher=name, constraints=constraints)
            for name in searchers for s in settings]


def parse_settings(texts: Sequence[str] | None, curves: Curves) -> list[Setting]:
    """Setting strings (``Setting.parse``; grace and rf default to the campaign's, else 1 and 3), or
    ``default_settings`` when none are given."""
    if not texts:
        return default_settings(curves)
    sched = curves.scheduler
    grace = sched.get("grace_epochs") if isinstance(sched.get("grace_epochs"), int) else 1
    rf = sched.get("reduction_factor") if isinstance(sched.get("reduction_factor"), int) else 3
    return [Setting.parse(t, min(grace, curves.max_t), rf) for t in texts]

