"""``random``, ``tpe``, ``nsga2``, ``gp``: an Optuna sampler asking and telling a study.

A suggestion is ``study.ask()`` drawn through the problem's define-by-run space (spaces.trials.suggest_config
in a campaign: conditional dimensions such as ``code_size`` only when ``embedding: fsne`` are not drawn when
their condition is false). Optuna learns a trial from its last result by search.searchers.outcomes: a trial
stopped before its planned epochs is PRUNED, one without a score FAIL, so neither biases the sampler.

Constraints: every proposal carries the relative violation of each constraint (``Trial.set_constraint``: <= 0
met), which Optuna 5's samplers read from the trial. A proposal that breaks one never becomes a trial; it is
told COMPLETE with its exact cost objectives and the worst value told so far for each training objective (and
its positive constraint value), so every constrained sampler ranks it below each feasible trial; while some
training objective has no value yet it waits (RUNNING in the study) and is told with the first complete trial.

State: the study's trials as plain data (state, params, distributions as Optuna's JSON, values, attributes),
the trials asked and not yet told, the infeasible ones waiting, and the sampler's random states, so a restored
searcher proposes what the uninterrupted one would have. A study kept in a tracker's storage
(search.campaign.tracking.optuna_tracker) is reopened from there; the saved trials fill it only when it is
empty (a storage moved, or lost).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import optuna
from optuna.distributions import distribution_to_json, json_to_distribution

from qkvsearch.search.searchers.base import EarlierTrial, Problem, Searcher
from qkvsearch.search.searchers.outcomes import COMPLETE, earlier_state, outcome_state
from qkvsearch.spaces.search_options import default_population, default_startup

TRIAL_ID_ATTR = "trial_id"   # the campaign's trial id, a user attribute of the study's trial (a tracker's study)
TS = optuna.trial.TrialState


def constraint_values(constraints, cost: dict) -> dict[str, float]:
    """metric -> the bound's relative violation: > 0 breaks it, <= 0 meets it (minus the relative slack).
    Optuna's convention: feasible when every value is <= 0. A metric the cost lacks (measured, not known
    yet) counts 0: only a proposal infeasible by another constraint goes without it."""
    out = {}
    for c in constraints:
        if c.metric not in cost:
            out[c.metric] = 0.0
            continue
        value, worst = float(cost[c.metric]), -math.inf
        if c.max is not None:
            worst = max(worst, (value - c.max) / max(abs(c.max), 1e-12))
        if c.min is not None:
            worst = max(worst, (c.min - value) / max(abs(c.min), 1e-12))
        out[c.metric] = worst
    return out


class OptunaSearcher(Searcher):
    """An Optuna sampler over the problem's space (module docstring); a subclass per sampler."""

    def sampler(self):
        """The Optuna sampler, seeded by the problem."""
        raise NotImplementedError

    def __init__(self, problem: Problem):
        super().__init__(problem)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.sampler = self.sampler()
        directions = ["maximize" if m == "max" else "minimize" for m in problem.modes]
        self.study = optuna.create_study(directions=directions, sampler=self.sampler, storage=problem.storage,
                                         study_name=problem.study_name, load_if_exists=True)
        self.worst: dict[str, float] = {}     # training objective -> the worst value told so far
        self.waiting: list[tuple[int, dict]] = []  # (trial number, cost): infeasible, told once worst values exist
        self._handles: dict[int, optuna.trial.Trial] = {}

    # -- proposing ---------------------------------------------------------------------------------------
    def suggest(self, trial_id: str):
        trial = self.study.ask()
        with warnings.catch_warnings():  # a model-based sampler samples inside the define-by-run function
            warnings.filterwarnings("ignore", message="Define-by-run function passed in the `space` argument took")
            config = self.problem.draw(trial)
        if self.problem.storage is not None:  # a study others read (optuna-dashboard): name its trials
            trial.set_user_attr(TRIAL_ID_ATTR, trial_id)
        self._handles[trial.number] = trial
        self.proposed[trial_id] = trial.number
        return config

    def constrain(self, trial_id: str, cost: dict) -> None:
        trial = self._trial(self.proposed[trial_id])
        for metric, value in constraint_values(self.problem.constraints, cost).items():
            trial.set_constraint(metric, value)

    def rename(self, old: str, new: str) -> None:
        super().rename(old, new)
        if self.problem.storage is not None and new in self.proposed:
            self._trial(self.proposed[new]).set_user_attr(TRIAL_ID_ATTR, new)

    def tell_infeasible(self, trial_id: str, cost: dict) -> None:
        number = self.proposed.pop(trial_id)
        trial = self._trial(number)
        for metric, value in constraint_values(self.problem.constraints, cost).items():
            trial.set_constraint(metric, value)
        self._tell_infeasible(number, cost)

    def _tell_infeasible(self, number: int, cost: dict) -> None:
        values = [cost[m] if m in cost else self.worst.get(m) for m in self.problem.metrics]
        if any(v is None for v in values):
            self.waiting.append((number, dict(cost)))
            return
        self._tell(number, [float(v) for v in values], TS.COMPLETE)

    def tell_earlier(self, earlier: EarlierTrial) -> None:
        drawn = self.problem.params_of(earlier.config) if self.problem.params_of else None
        if drawn is None:
            return
        params, dists = drawn
        values = [earlier.values.get(m, earlier.cost.get(m)) for m in self.problem.metrics]
        state, told = earlier_state(earlier.status, values)
        attrs = {f"constraints:{m}": v for m, v in constraint_values(self.problem.constraints, earlier.cost).items()}
        self.study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, values=told,
                                                       state=TS[state], system_attrs=attrs))
        if state == COMPLETE:
            self._seen(told)

    # -- learning ----------------------------------------------------------------------------------------
    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        number = self.proposed.pop(trial_id, None)
        if number is None:
            return
        state, values = outcome_state(result, error, self.problem.metrics)
        self._tell(number, values, TS[state])
        if state == COMPLETE:
            self._seen(values)

    def _seen(self, values) -> None:
        """A complete trial's objective values: the worst so far per objective, then the waiting ones told."""
        for (metric, mode), v in zip(self.problem.objectives, values):
            old = self.worst.get(metric)
            self.worst[metric] = v if old is None else (min(old, v) if mode == "max" else max(old, v))
        waiting, self.waiting = self.waiting, []
        for number, cost in waiting:
            self._tell_infeasible(number, cost)

    def _tell(self, number: int, values, state) -> None:
        try:
            self.study.tell(number, values, state=state)
        except (ValueError, RuntimeError) as exc:  # e.g. the trial was told already
            optuna.logging.get_logger(__name__).warning(str(exc))
        self._handles.pop(number, None)

    def _trial(self, number: int) -> optuna.trial.Trial:
        """The study's trial of that number, to set attributes on (made anew after a restore)."""
        if number not in self._handles:
            frozen = self.study.get_trials(deepcopy=False)[number]
            self._handles[number] = optuna.trial.Trial(self.study, frozen._trial_id)
        return self._handles[number]

    # -- state -------------------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"trials": [plain_trial(t) for t in self.study.get_trials(deepcopy=False)],
                "proposed": dict(self.proposed), "worst": dict(self.worst),
                "waiting": [[n, c] for n, c in self.waiting], "rng": random_states(self.sampler)}

    def restore(self, state: dict) -> None:
        if state.get("trials") and not self.study.get_trials(deepcopy=False):  # a tracker's study keeps its own
            for plain in state["trials"]:
                self.study.add_trial(frozen_trial(plain))
        self.proposed = {k: int(v) for k, v in state["proposed"].items()}
        self.worst = {k: float(v) for k, v in state["worst"].items()}
        self.waiting = [(int(n), dict(c)) for n, c in state["waiting"]]
        self._handles = {}
        set_random_states(self.sampler, state.get("rng") or {})


class RandomSearcher(OptunaSearcher):
    name = "random"

    def sampler(self):
        return optuna.samplers.RandomSampler(seed=self.problem.seed)


class TPESearcher(OptunaSearcher):
    name = "tpe"

    def sampler(self):
        return optuna.samplers.TPESampler(seed=self.problem.seed, multivariate=True, constant_liar=True)


class NSGA2Searcher(OptunaSearcher):
    name = "nsga2"

    def sampler(self):
        population = self.problem.population_size or default_population(self.problem.num_trials or 1)
        return optuna.samplers.NSGAIISampler(population_size=population, seed=self.problem.seed)


class GPSearcher(OptunaSearcher):
    """log-EHVI for several objectives; running trials and constraints taken into account."""

    name = "gp"

    def sampler(self):
        startup = self.problem.n_startup_trials or default_startup(self.problem.num_trials or 1)
        return optuna.samplers.GPSampler(seed=self.problem.seed, n_startup_trials=startup,
                                         warn_independent_sampling=False)


# ----------------------------------------------------------------------------------------- plain data
def plain_trial(t) -> dict:
    """An Optuna FrozenTrial as JSON-able data (``frozen_trial`` makes it again)."""
    return {"number": t.number, "state": t.state.name, "values": t.values, "params": t.params,
            "distributions": {k: distribution_to_json(d) for k, d in t.distributions.items()},
            "user_attrs": t.user_attrs, "system_attrs": t.system_attrs,
            "intermediate_values": {str(k): v for k, v in t.intermediate_values.items()}}


def frozen_trial(plain: dict):
    state = TS[plain["state"]]
    return optuna.trial.create_trial(
        state=state, values=plain["values"] if state == TS.COMPLETE else None, params=plain["params"],
        distributions={k: json_to_distribution(d) for k, d in plain["distributions"].items()},
        user_attrs=plain["user_attrs"], system_attrs=plain["system_attrs"],
        intermediate_values={int(k): v for k, v in plain["intermediate_values"].items()})


def _random_states_of(obj, path: str = "", depth: int = 0, seen=None):
    """(path, numpy RandomState) of every random state inside an Optuna sampler: its own and those of the
    samplers it holds (TPE's and NSGA-II's random sampler, GP's independent one)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 3:
        return
    seen.add(id(obj))
    if isinstance(obj, np.random.RandomState):
        yield path, obj
        return
    if type(obj).__name__ == "LazyRandomState":
        yield path, obj.rng
        return
    if not type(obj).__module__.startswith("optuna") or not hasattr(obj, "__dict__"):
        return
    for name, value in sorted(vars(obj).items()):
        yield from _random_states_of(value, f"{path}.{name}" if path else name, depth + 1, seen)


def random_states(sampler) -> dict:
    """path -> a numpy RandomState's state as plain data."""
    out = {}
    for path, rng in _random_states_of(sampler):
        kind, keys, pos, has_gauss, cached = rng.get_state()
        out[path] = [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    return out


def set_random_states(sampler, states: dict) -> None:
    for path, rng in _random_states_of(sampler):
        if path in states:
            kind, keys, pos, has_gauss, cached = states[path]
            rng.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
