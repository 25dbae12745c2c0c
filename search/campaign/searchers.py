"""Searchers: grid (the space's configurations in order), Optuna (random, TPE, NSGA-II, GP) and ehvi
(search.campaign.known_cost), each wrapped in `TrialConfigs`, which turns a suggestion into the trial's
resolved config and cost, once.

Cost constraints act before a proposal becomes a trial: parameters and MACs are known from the config
(trainers.cost), so a proposal that breaks a constraint takes no trial slot. It is recorded
(search.records.proposals, status "infeasible"; never a trial, never a result), the Optuna searcher
learns it (`Teller.tell_infeasible`: COMPLETE with its exact cost objectives, the worst value told so
far for each training objective, and a positive constraint value through ``Trial.set_constraint``, so
every constrained sampler ranks it below each feasible trial), and the wrapper asks again, at most
MAX_INFEASIBLE times per trial. Every trial of a constrained campaign carries its constraint values
(<= 0: met), which Optuna 5's samplers read from the trial (their ``constraints_func`` is deprecated).

Measured cost (search.campaign.measured): a proposal whose model has not been measured waits here while a
Ray task measures it, and the searcher is asked for the next proposal meanwhile; once measured, it meets
the constraints on its measured cost as above (no trial slot when it breaks one). Every trial carries every
constraint's value; a proposal rejected on a counted constraint before it was measured carries 0 for the
measured ones (unknown; it is infeasible by the other).

Optuna samples the campaign's space define-by-run (`spaces.suggest_config`), so conditional
dimensions (`code_size` only when `embedding: fsne`) are simply not suggested when their condition
is false.
"""
from __future__ import annotations

import itertools
import math
import warnings
from functools import partial

import optuna
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from qkvsearch.search.campaign.driver import build_trial, outcome_of_result
from qkvsearch.search.campaign.measured import Measurer, measure_settings, measured_key
from qkvsearch.search.campaign.tracking.optuna_tracker import TRIAL_ID_ATTR
from qkvsearch.search.records.layout import ORIGINAL_STATUS_KEY
from qkvsearch.search.records.proposals import write_proposal
from qkvsearch.spaces import base_config, dimensions, suggest_config
from qkvsearch.spaces.keys import identity
from qkvsearch.spaces.schema import violations
from qkvsearch.storage import read_json, write_json

MAX_INFEASIBLE = 100  # infeasible proposals per trial before one is run as a trial (that ends at once)


class GridSearcher(Searcher):
    """Suggests each configuration of an enumerable space in order, ``repeats`` times with successive
    seeds, then FINISHED.

    Configurations are generated as they are suggested (spaces.dimensions.iterate): a grid of 10^8 points
    costs no memory. Its state is the number suggested so far.
    """

    def __init__(self, space, repeats: int = 1, seed: int = 0):
        super().__init__()
        self.space, self.repeats, self.seed = space, repeats, seed
        self.next = 0
        self._pending = None  # iterator over the configurations not yet suggested

    def _repeated(self):
        """Each configuration, then its repeats with the next seeds (seed + 1, ...): distinct trainings."""
        for cfg in dimensions.iterate(self.space):
            seed = cfg.get("seed", self.seed)
            yield cfg
            for k in range(1, self.repeats):
                yield {**cfg, "seed": seed + k}

    def suggest(self, trial_id: str):
        if self._pending is None:
            self._pending = itertools.islice(self._repeated(), self.next, None)
        config = next(self._pending, None)
        if config is None:
            return Searcher.FINISHED
        self.next += 1
        return config

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass

    def __getstate__(self):  # Tune pickles its search algorithm (tuner.pkl): iterators do not pickle
        return {**self.__dict__, "_pending": None}

    def save(self, checkpoint_path: str):
        write_json(checkpoint_path, {"next": self.next})

    def restore(self, checkpoint_path: str):
        self.next, self._pending = read_json(checkpoint_path)["next"], None


class TrialConfigs(Searcher):
    """A searcher whose suggestions are trials: {"config": resolved config, "cost": cost} (driver.build_trial).

    Defaults, the solved width and the cost are computed here, once per trial, in the campaign's driver;
    the trial's process, its workers and the records take them from the trial's config.

    No configuration trains twice: a suggestion whose identity (spaces.keys.identity) was suggested before
    becomes a duplicate trial that reuses that trial's outcome (driver.run_trial), which the wrapped
    searcher then learns as this trial's result. An enumerating searcher (grid) skips such suggestions:
    a grid runs each distinct configuration once.
    """

    def __init__(self, searcher: Searcher, base: dict, skip_duplicates: bool = False, constraints: tuple = (),
                 record=None, measurer: Measurer | None = None):
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher
        self.base = base
        self.skip_duplicates = skip_duplicates
        self.constraints = tuple(constraints)  # spaces.schema.Constraint: checked here, before a trial exists
        self.record = record                   # record(proposal_id, trial_id, trial, error): an infeasible proposal
        self.first: dict[str, str] = {}     # identity -> the trial that trains it
        self.identity_of: dict[str, str] = {}  # trial id -> identity (trials that train)
        self.outcomes: dict[str, dict] = {}    # identity -> outcome, once its trial has ended
        self.warm: set[str] = set()            # identities an earlier campaign trained (search.warm_start)
        self.proposals = 0                     # configurations proposed (duplicates skipped by a grid excluded)
        self.infeasible = 0                    # of which broke a constraint and took no trial slot
        self.measurer = measurer               # None: the campaign measures nothing
        self.waiting: list[tuple[str, str, dict]] = []  # (parked id, measured_key, trial): being measured
        self.ahead = 1                         # at most this many wait (the campaign's concurrency)
        self.live: set[str] = set()            # trials suggested and not yet ended

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self.ahead = max(1, int(max_concurrent))
        return self.searcher.set_max_concurrency(max_concurrent)

    def suggest(self, trial_id: str):
        trial = self._suggest(trial_id)
        if isinstance(trial, dict):
            self.live.add(trial_id)
        return trial

    def _suggest(self, trial_id: str):
        if self.measurer is not None:
            measured = self._measured_trial(trial_id)
            if measured is not None:
                return measured
        rejected = 0
        while True:
            if self.measurer is not None and len(self.waiting) >= self.ahead:
                return None  # Tune asks again once a measurement is done
            sampled = self.searcher.suggest(trial_id)
            if sampled == Searcher.FINISHED and self.waiting:
                return None  # the proposals still measured become the last trials
            if sampled is None or sampled == Searcher.FINISHED:
                return sampled
            trial = build_trial(self.base, sampled)
            if trial.get("invalid"):
                return trial
            key = identity(trial["config"])
            if self.skip_duplicates and key in self.first and key not in self.warm:
                continue
            self.proposals += 1
            if self.measurer is not None:
                found = self.measurer.result(measured_key(trial["config"]))
                trial = _with_measured(trial, found) if found is not None else trial
            broken = violations(self.constraints, trial["cost"])
            if broken and rejected < MAX_INFEASIBLE:  # past the bound it runs as a trial that ends infeasible
                rejected += 1
                self._reject(trial_id, trial, "; ".join(broken))
                continue
            if self.measurer is not None and found is None:
                self._park(trial_id, trial)
                continue
            admitted = self._admit(trial_id, trial)
            if admitted is not None:
                return admitted

    def _park(self, trial_id: str, trial: dict) -> None:
        """The proposal waits for its model's measurement under a name of its own; trial_id asks anew."""
        parked, key = f"{trial_id}-measuring", measured_key(trial["config"])
        if hasattr(self.searcher, "rename"):
            self.searcher.rename(trial_id, parked)
        self.waiting.append((parked, key, trial))
        self.measurer.start(key, trial["config"], idle=not self.live)

    def _measured_trial(self, trial_id: str):
        """The first waiting proposal whose measurement is done and that meets the constraints, as trial_id's
        trial; those that break one are rejected on the way. None while none is ready."""
        for _, key, trial in self.waiting:  # again after a restore; at once (idle) once no trial is live
            self.measurer.start(key, trial["config"], idle=not self.live)
        self.measurer.poll()
        while True:
            ready = next((w for w in self.waiting if self.measurer.result(w[1]) is not None), None)
            if ready is None:
                return None
            self.waiting.remove(ready)
            parked, key, trial = ready
            if hasattr(self.searcher, "rename"):
                self.searcher.rename(parked, trial_id)
            trial = _with_measured(trial, self.measurer.result(key))
            broken = violations(self.constraints, trial["cost"])
            if broken and "measure_error" not in trial:
                self._reject(trial_id, trial, "; ".join(broken))
                continue
            admitted = self._admit(trial_id, trial)
            if admitted is not None:
                return admitted

    def _admit(self, trial_id: str, trial: dict):
        """A proposal that becomes trial_id's trial: the one that trains its configuration, or a duplicate of
        it; None when a grid skips it."""
        key = identity(trial["config"])
        if hasattr(self.searcher, "constrain"):
            self.searcher.constrain(trial_id, trial["cost"])
        if key not in self.first:
            self.first[key] = trial_id
            self.identity_of[trial_id] = key
            return trial
        if not self.skip_duplicates:
            return {**trial, "duplicate_of": self.first[key], "known": self.outcomes.get(key)}
        return None

    def _reject(self, trial_id: str, trial: dict, error: str) -> None:
        """An infeasible proposal: recorded, learnt by the searcher, no trial."""
        self.infeasible += 1
        if self.record is not None:
            self.record(f"{trial_id}-infeasible-{self.infeasible}", trial_id, trial, error)
        if hasattr(self.searcher, "tell_infeasible"):
            self.searcher.tell_infeasible(trial_id, trial["cost"])

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        self.live.discard(trial_id)
        if trial_id in self.identity_of:
            self.outcomes[self.identity_of[trial_id]] = outcome_of_result(result, error)
        self.searcher.on_trial_complete(trial_id, result=result, error=error)

    # Tune saves a wrapper's state (it has a .searcher) apart from the searcher it wraps.
    def get_state(self) -> dict:
        return {k: getattr(self, k) for k in ("base", "skip_duplicates", "constraints", "record", "first",
                                              "identity_of", "outcomes", "warm", "proposals", "infeasible",
                                              "measurer", "waiting", "ahead", "live")}

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)

    def __setstate__(self, state: dict) -> None:
        # A campaign launched before constraints, proposals, warm starts and measurements existed pickled its
        # searcher without them: they start empty, as in a campaign that has none.
        self.__dict__.update(constraints=(), record=None, warm=set(), proposals=0, infeasible=0, measurer=None,
                             waiting=[], ahead=1, live=set())
        self.__dict__.update(state)

    def save(self, checkpoint_path: str):
        self.searcher.save(checkpoint_path)

    def restore(self, checkpoint_path: str):
        self.searcher.restore(checkpoint_path)

    def on_pause(self, trial_id: str):
        self.searcher.on_pause(trial_id)

    def on_unpause(self, trial_id: str):
        self.searcher.on_unpause(trial_id)


class Teller:
    """What a searcher tells its Optuna study besides Tune's results: constraint values and infeasible
    proposals. objectives: ((metric, "max"|"min"), ...); a metric the cost holds is a cost objective.

    An infeasible proposal is told COMPLETE with its cost objectives and, for each training objective,
    the worst value told so far; while some training objective has no value yet it waits (RUNNING in
    the study) and is told with the first complete trial."""

    def __init__(self, objectives, constraints=()):
        self.objectives = tuple(objectives)
        self.constraints = tuple(constraints)
        self.worst: dict[str, float] = {}
        self.waiting: list = []  # (study, optuna trial, cost)

    def constrain(self, ot_trial, cost: dict) -> None:
        for metric, value in constraint_values(self.constraints, cost).items():
            ot_trial.set_constraint(metric, value)

    def seen(self, values) -> None:
        """A complete trial's objective values: the worst so far per objective, then the waiting ones told."""
        for (metric, mode), v in zip(self.objectives, values):
            old = self.worst.get(metric)
            self.worst[metric] = v if old is None else (min(old, v) if mode == "max" else max(old, v))
        waiting, self.waiting = self.waiting, []
        for study, ot_trial, cost in waiting:
            self._tell(study, ot_trial, cost)

    def tell_infeasible(self, study, ot_trial, cost: dict) -> None:
        self.constrain(ot_trial, cost)
        self._tell(study, ot_trial, cost)

    def _tell(self, study, ot_trial, cost: dict) -> None:
        values = [cost[m] if m in cost else self.worst.get(m) for m, _ in self.objectives]
        if any(v is None for v in values):
            self.waiting.append((study, ot_trial, cost))
            return
        study.tell(ot_trial, [float(v) for v in values], state=optuna.trial.TrialState.COMPLETE)


def _with_measured(trial: dict, found) -> dict:
    """A proposal with its model's measurement: (metrics, record) join its cost and ``measured_on``; an
    error text becomes ``measure_error`` (its trial ends failed without training)."""
    if isinstance(found, str):
        return {**trial, "measure_error": found}
    metrics, record = found
    return {**trial, "cost": {**trial["cost"], **metrics}, "measured_on": record}


def constraint_values(constraints, cost: dict) -> dict[str, float]:
    """metric -> the bound's relative violation: > 0 breaks it (spaces.schema.Constraint.violation), <= 0
    meets it (minus the relative slack). Optuna's convention: feasible when every value is <= 0."""
    out = {}
    for c in constraints:
        if c.metric not in cost:  # measured, not known yet: only a proposal infeasible by another constraint
            out[c.metric] = 0.0
            continue
        value, worst = float(cost[c.metric]), -math.inf
        if c.max is not None:
            worst = max(worst, (value - c.max) / max(abs(c.max), 1e-12))
        if c.min is not None:
            worst = max(worst, (c.min - value) / max(abs(c.min), 1e-12))
        out[c.metric] = worst
    return out


class CampaignOptunaSearch(OptunaSearch):
    """OptunaSearch that tells Optuna the truth about trials without a final score.

    Stock OptunaSearch reports an early-stopped trial's last (partial) metrics as a completed
    result. Here a trial that stopped before its planned epochs is PRUNED, and an infeasible or
    diverged one is FAIL, so neither biases the sampler. Constraints and infeasible proposals: `Teller`.
    """

    def __init__(self, *args, constraints=(), **kwargs):
        super().__init__(*args, **kwargs)
        metrics, modes = kwargs.get("metric"), kwargs.get("mode")
        metrics, modes = (metrics, modes) if isinstance(metrics, list) else ([metrics], [modes])
        self.teller = Teller(zip(metrics, modes), constraints)

    def suggest(self, trial_id: str):
        with warnings.catch_warnings():  # a model-based sampler samples inside the define-by-run function
            warnings.filterwarnings("ignore", message="Define-by-run function passed in the `space` argument took")
            config = super().suggest(trial_id)
        if self._storage is not None and trial_id in self._ot_trials:  # a study others read: name its trials
            self._ot_trials[trial_id].set_user_attr(TRIAL_ID_ATTR, trial_id)
        return config

    def constrain(self, trial_id: str, cost: dict) -> None:
        self.teller.constrain(self._ot_trials[trial_id], cost)

    def rename(self, old: str, new: str) -> None:
        """The study trial proposed for ``old`` now belongs to ``new`` (a proposal that waited to be measured)."""
        self._ot_trials[new] = self._ot_trials.pop(old)
        if self._storage is not None:
            self._ot_trials[new].set_user_attr(TRIAL_ID_ATTR, new)

    def tell_infeasible(self, trial_id: str, cost: dict) -> None:
        """The proposal just made for trial_id broke a constraint: told, and trial_id asks anew."""
        self.teller.tell_infeasible(self._ot_study, self._ot_trials.pop(trial_id), cost)

    def on_trial_complete(self, trial_id, result=None, error=False):
        if trial_id in self._completed_trials or trial_id not in self._ot_trials:
            return super().on_trial_complete(trial_id, result=result, error=error)
        state, values = _outcome(result, error, self.metric)
        if state is optuna.trial.TrialState.COMPLETE:
            super().on_trial_complete(trial_id, result=result, error=error)
            self.teller.seen(values)
            return None
        try:
            self._ot_study.tell(self._ot_trials[trial_id], values, state=state)
        except (ValueError, RuntimeError) as exc:  # e.g. the trial was already told
            optuna.logging.get_logger(__name__).warning(str(exc))
        self._completed_trials.add(trial_id)


def _outcome(result, error, metric):
    """Optuna state for a finished trial's last result, and the values to tell with it."""
    TS = optuna.trial.TrialState
    if error or not result:
        return TS.FAIL, None
    status = outcome_of_result(result, error)["status"]
    if status == "duplicate":  # the outcome of the trial that trained this configuration
        status = result.get(ORIGINAL_STATUS_KEY)
    if status == "stopped_early":
        return TS.PRUNED, None
    if status in ("infeasible", "diverged", "failed"):
        return TS.FAIL, None
    metrics = metric if isinstance(metric, list) else [metric]
    values = [result.get(m) for m in metrics]
    if any(v is None or not math.isfinite(v) for v in values):
        return TS.FAIL, None
    return TS.COMPLETE, values


outcome_state = _outcome  # (Optuna state, values) of a finished trial's last result: what a searcher learns


def make_sampler(search):
    """The Optuna sampler of a SearchSpec (algorithm, seed; population_size, n_startup_trials)."""
    algorithm, seed = search.algorithm, search.seed
    if algorithm == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if algorithm == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if algorithm == "nsga2":
        population = search.population_size or 50
        return optuna.samplers.NSGAIISampler(population_size=population, seed=seed)
    if algorithm == "gp":  # log-EHVI for several objectives; running trials and constraints taken into account
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=search.n_startup_trials or 10,
                                         warn_independent_sampling=False)
    raise ValueError(f"search.algorithm: expected one of random, tpe, nsga2, gp (an Optuna sampler), given {algorithm!r}")


def build_search(spec, exp: str | None = None, storage=None) -> tuple[TrialConfigs, int]:
    """(search algorithm, number of trials) for a campaign spec; exp: the campaign folder, where
    infeasible proposals are recorded (None: not recorded); storage: an Optuna storage for the study, named
    after the campaign (search.campaign.tracking.study_storage; None: in memory)."""
    search = spec.search
    base = base_config(spec)
    record = partial(_record_proposal, exp, spec.name) if exp else None
    wrapped = {"constraints": spec.constraints, "record": record, "measurer": _measurer(spec, exp)}
    if search.algorithm == "grid":
        grid = GridSearcher(spec.space, search.repeats, base["seed"])
        wrapper = TrialConfigs(grid, base, skip_duplicates=True, **wrapped)
        return _warmed(spec, wrapper), dimensions.count(spec.space) * search.repeats
    if search.algorithm == "ehvi":
        from qkvsearch.search.campaign.known_cost import KnownCostSearch

        return _warmed(spec, TrialConfigs(KnownCostSearch(spec), base, **wrapped)), search.num_trials
    searcher = CampaignOptunaSearch(
        space=partial(suggest_config, spec),  # define-by-run: returns the keys it chose
        metric=[o.metric for o in spec.objectives],
        mode=[o.mode for o in spec.objectives],
        sampler=make_sampler(search),
        seed=None,
        constraints=spec.constraints,
        study_name=spec.name if storage is not None else None,
        storage=storage,
    )
    return _warmed(spec, TrialConfigs(searcher, base, **wrapped)), search.num_trials


def _measurer(spec, exp: str | None) -> Measurer | None:
    """The campaign's Measurer when it measures something (None without a campaign folder: nothing runs)."""
    how = measure_settings(spec, exp) if exp else None
    if how is None or not how.metrics:
        return None
    res = spec.resources
    return Measurer(how, res.workers_per_trial, res.cpus_per_worker, res.gpus_per_worker)


def _warmed(spec, wrapper: TrialConfigs) -> TrialConfigs:
    if spec.search.warm_start:
        from qkvsearch.search.campaign.warm_start import warm_start

        warm_start(spec, wrapper)
    return wrapper


def _record_proposal(exp: str, campaign: str, proposal_id: str, trial_id: str, trial: dict, error: str) -> None:
    write_proposal(exp, campaign, proposal_id, trial_id, trial["config"], trial["cost"], error,
                   trial.get("measured_on"))


ESTIMATE_TRIALS = 40  # trials drawn per searcher by `infeasible_share`


def infeasible_share(spec, algorithm: str, trials: int = ESTIMATE_TRIALS) -> float:
    """The share of a searcher's proposals that would break the campaign's constraints, estimated by
    drawing ``trials`` trials without training: each trial is told COMPLETE with its cost objectives and
    0 for every training objective (all feasible trials alike, so only the constraints and the costs
    steer the sampler), infeasible proposals as in a campaign."""
    from dataclasses import replace

    search = replace(spec.search, algorithm=algorithm, num_trials=trials, warm_start=None,
                     population_size=max(2, min(50, trials // 2)) if algorithm == "nsga2" else None,
                     n_startup_trials=max(1, min(10, trials // 4)) if algorithm == "gp" else None)
    searcher, _ = build_search(replace(spec, search=search))
    searcher.set_search_properties(None, None, {})
    planned = {"qs_epochs_planned": 1.0, "epoch": 1.0}
    for i in range(trials):
        trial = searcher.suggest(f"estimate_{i:05d}")
        if trial is None or trial == Searcher.FINISHED:
            break
        known = {o.metric: 0.0 for o in spec.objectives}
        searcher.on_trial_complete(f"estimate_{i:05d}", {**known, **trial["cost"], **planned})
    return searcher.infeasible / max(1, searcher.proposals)
