"""The campaign's searcher as Ray Tune sees it: ``Proposals`` turns what a searcher (search.searchers.base)
suggests into trials, and what trials end with into what the searcher learns, through the searcher's declared
hooks only.

A suggestion becomes the trial Tune holds (search.searchers.problem.build_trial: resolved config and cost,
computed once, in the campaign's driver). Then, in order:

- duplicates: a configuration whose training identity (spaces.keys.identity) and quantization policy were
  proposed before becomes a duplicate trial reusing that trial's outcome (search.campaign.driver), which the
  searcher then learns as this trial's result; an enumerating searcher (grid) skips it instead;
- one training, many policies: a configuration whose training identity was proposed before under another
  quantization policy trains nothing: it becomes a trial ``trained_by`` the trial that trains that identity,
  which quantizes and evaluates that trial's weights (search.campaign.policies). Until that training has ended,
  the proposal waits here under a name of its own (as a measured one does: no trial slot), and the searcher is
  asked for the next one meanwhile;
- constraints: a proposal whose cost (known before training) breaks one takes no trial slot: it is recorded
  (``record``: search.records.proposals), the searcher is told (``tell_infeasible``) and asked again, at most
  MAX_INFEASIBLE times per trial;
- measuring: with measured cost (a ``measurer``: search.campaign.measured.Measurer), a proposal whose model has
  not been measured waits under a name of its own while it is measured, and the searcher is asked for the next
  one meanwhile (up to the campaign's concurrency of proposals wait at once); once measured it meets the
  constraints on its measured cost as above, and becomes the trial of whichever trial id asks next (the
  searcher is told with ``rename``);
- an admitted proposal's cost reaches the searcher (``constrain``) before it becomes a trial, and again with
  the trial's last result when it ends (a trial reports its metrics, not its cost: search.campaign.driver).

Warm start: before the first proposal, an earlier campaign's results (search.searchers.earlier) become known
configurations here and are told to the searcher (``tell_earlier``).

State (search.searchers.state): Tune saves and restores this object with ``save``/``restore``, which write and
read plain data — this wrapper's bookkeeping and the searcher's own ``state()`` — never a pickle of either.
What Tune pickles of it into ``tuner.pkl`` is only its class and the state format's version (``__reduce__``);
a resumed campaign builds it anew from its spec (search.campaign.run) and restores that data into it.
"""
from __future__ import annotations

import hashlib
import json
import logging

from ray.tune.search import Searcher as TuneSearcher

from qkvsearch.search.searchers import state as saved
from qkvsearch.search.searchers.base import FINISHED, Searcher
from qkvsearch.search.searchers.outcomes import outcome_of_result
from qkvsearch.spaces.keys import identity, quant_policy
from qkvsearch.spaces.schema import violations

log = logging.getLogger(__name__)

MAX_INFEASIBLE = 100  # infeasible proposals per trial before one is run as a trial (that ends at once)


class Proposals(TuneSearcher):
    """searcher: the campaign's (search.searchers.SEARCHERS); build(sampled) -> trial; constraints: checked
    here, before a trial exists; record(proposal_id, trial_id, trial, error): an infeasible proposal;
    measurer: the campaign's measurements (None: nothing measured); earlier: () -> the warm start's
    EarlierTrials (None: no warm start); skip_duplicates: a grid's rule; recorded_cost(trial_id): a trial's
    cost from its record, for a trial this wrapper's saved state does not hold (saved by an earlier version)."""

    def __init__(self, searcher: Searcher, build, *, constraints=(), record=None, measurer=None, earlier=None,
                 skip_duplicates: bool = False, recorded_cost=None):
        # No metric for Tune: a trial reports its metrics, not its cost, and this wrapper adds the cost before
        # its searcher learns a result (Tune would otherwise demand every objective in every result).
        super().__init__(metric=None, mode=None)
        self.inner = searcher               # not ``searcher``: Tune saves a wrapper's searcher apart from it
        self.build, self.record, self.measurer, self.earlier = build, record, measurer, earlier
        self.recorded_cost = recorded_cost
        self.constraints = tuple(constraints)
        self.skip_duplicates = skip_duplicates
        self.first: dict[str, str] = {}        # identity -> the trial that trains it
        self.variants: dict[str, str] = {}     # identity and policy (_variant) -> the trial that evaluates it
        self.variant_of: dict[str, str] = {}   # trial id -> its variant (trials that train or evaluate a policy)
        self.variant_outcomes: dict[str, dict] = {}  # variant -> outcome, once its trial has ended
        self.for_trainer: list[tuple[str, dict]] = []  # (parked id, trial): a policy waiting for its training
        self.identity_of: dict[str, str] = {}  # trial id -> identity (trials that train)
        self.outcomes: dict[str, dict] = {}    # identity -> outcome, once its trial has ended
        self.warm: set[str] = set()            # identities an earlier campaign trained (warm start)
        self.started = False                   # the warm start was told (it is, before the first proposal)
        self.proposals = 0                     # configurations proposed (duplicates skipped by a grid excluded)
        self.infeasible = 0                    # of which broke a constraint and took no trial slot
        self.waiting: list[tuple[str, str, dict]] = []  # (parked id, measured key, trial): being measured
        self.ahead = 1                         # at most this many wait (the campaign's concurrency)
        self.live: set[str] = set()            # trials suggested and not yet ended
        self.costs: dict[str, dict] = {}       # trial id -> its cost, until it ends
        # () -> whether the campaign is stopping (a stop signal: search.campaign.run sets it); not saved
        self.stopping = _never

    # -- Tune's protocol ---------------------------------------------------------------------------------
    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # the problem fixed metrics and modes

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self.ahead = max(1, int(max_concurrent))
        return False  # Tune's ConcurrencyLimiter caps the live trials

    def suggest(self, trial_id: str):
        if not self.started:
            self._warm_start()
        trial = self._suggest(trial_id)
        if isinstance(trial, dict):
            self.live.add(trial_id)
        return TuneSearcher.FINISHED if trial == FINISHED else trial

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        if self.stopping() and not _own_ending(result, error):
            # Ended by the campaign's stop (Tune stops or fails what runs as it shuts down): the trial is
            # interrupted, resumes, and is learnt when it ends. Told now, a searcher whose study others keep
            # (a tracker's storage) would record a failure the resumed trial cannot undo.
            return
        self.live.discard(trial_id)
        outcome = outcome_of_result(result, error)
        if trial_id in self.identity_of:  # an ended trial leaves identity_of and variant_of: its outcome stays
            self.outcomes[self.identity_of.pop(trial_id)] = outcome
        if trial_id in self.variant_of:
            self.variant_outcomes[self.variant_of.pop(trial_id)] = outcome
        cost = self.costs.pop(trial_id, None)
        if cost is None and self.recorded_cost is not None:
            cost = self.recorded_cost(trial_id)
        if result and cost:  # the trial's exact cost over anything the result holds for it (NaN, say)
            result = {**result, **cost}
        self.inner.on_trial_complete(trial_id, result=result, error=error)

    # -- proposing ---------------------------------------------------------------------------------------
    def _warm_start(self) -> None:
        self.started = True
        if self.earlier is None:
            return
        known = self.earlier()
        for k in known:
            key = _key(k.key)
            if key in self.first:
                continue
            self.first[key] = k.trial
            self.outcomes[key] = {"status": k.status, "metrics": k.values}
            self.variants[_variant(key, k.config)] = k.trial
            self.variant_outcomes[_variant(key, k.config)] = self.outcomes[key]
            self.warm.add(key)
            self.inner.tell_earlier(k)
        log.info(f"search.warm_start: {len(known)} earlier trial(s) lie in this space")

    def _suggest(self, trial_id: str):
        if self.measurer is not None:
            measured = self._measured_trial(trial_id)
            if measured is not None:
                return measured
        trained = self._trained_policy(trial_id)
        if trained is not None:
            return trained
        rejected = 0
        while True:
            if (self.measurer is not None or self.for_trainer) and len(self.waiting) + len(self.for_trainer) >= self.ahead:
                return None  # Tune asks again once a measurement is done or a training has ended
            sampled = self.inner.suggest(trial_id)
            if sampled == FINISHED and (self.waiting or self.for_trainer):
                return None  # the proposals still waiting become the last trials
            if sampled is None or sampled == FINISHED:
                return sampled
            trial = self.build(sampled)
            if trial.get("invalid"):
                self.costs[trial_id] = {}
                return trial
            key = _key(identity(trial["config"]))
            if self.skip_duplicates and _variant(key, trial["config"]) in self.variants and key not in self.warm:
                continue
            self.proposals += 1
            found = None
            if self.measurer is not None:
                found = self.measurer.result(self.measurer.key(trial["config"]))
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
        parked, key = f"{trial_id}-measuring-{self.proposals}", self.measurer.key(trial["config"])
        self.inner.rename(trial_id, parked)
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
            self.inner.rename(parked, trial_id)
            trial = _with_measured(trial, self.measurer.result(key))
            broken = violations(self.constraints, trial["cost"])
            if broken and "measure_error" not in trial:
                self._reject(trial_id, trial, "; ".join(broken))
                continue
            admitted = self._admit(trial_id, trial)
            if admitted is not None:
                return admitted

    def _admit(self, trial_id: str, trial: dict):
        """A proposal that becomes trial_id's trial: the one that trains its configuration, one that evaluates
        another quantization policy of a configuration trained (``trained_by``), or a duplicate; None when a
        grid skips it, or while it waits for its configuration's training (``for_trainer``)."""
        key = _key(identity(trial["config"]))
        variant = _variant(key, trial["config"])
        if key in self.first and variant not in self.variants and key not in self.outcomes:
            parked = f"{trial_id}-training-{self.proposals}"
            self.inner.rename(trial_id, parked)
            self.for_trainer.append((parked, trial))
            return None
        self.inner.constrain(trial_id, trial["cost"])
        self.costs[trial_id] = trial["cost"]
        if variant not in self.variants:
            self.variants[variant] = trial_id
            self.variant_of[trial_id] = variant
            if key in self.first:
                return {**trial, "trained_by": self.first[key], "known": self.outcomes[key]}
            self.first[key] = trial_id
            self.identity_of[trial_id] = key
            return trial
        if not self.skip_duplicates:
            return {**trial, "duplicate_of": self.variants[variant], "known": self.variant_outcomes.get(variant)}
        del self.costs[trial_id]
        return None

    def _trained_policy(self, trial_id: str):
        """The first proposal waiting for a training that has ended, as trial_id's trial (it evaluates that
        training's weights under its own policy, or duplicates a proposal that does); None while none is."""
        for i, (parked, trial) in enumerate(self.for_trainer):
            if _key(identity(trial["config"])) in self.outcomes:
                del self.for_trainer[i]
                self.inner.rename(parked, trial_id)
                return self._admit(trial_id, trial)
        return None

    def _reject(self, trial_id: str, trial: dict, error: str) -> None:
        """An infeasible proposal: recorded, learnt by the searcher, no trial."""
        self.infeasible += 1
        if self.record is not None:
            self.record(f"{trial_id}-infeasible-{self.infeasible}", trial_id, trial, error)
        self.inner.tell_infeasible(trial_id, trial["cost"])

    # -- state -------------------------------------------------------------------------------------------
    def get_state(self) -> dict:
        """This wrapper's bookkeeping as plain data (its searcher's is apart: ``state``)."""
        return {"first": self.first, "identity_of": self.identity_of, "outcomes": self.outcomes,
                "variants": self.variants, "variant_of": self.variant_of, "variant_outcomes": self.variant_outcomes,
                "for_trainer": [list(w) for w in self.for_trainer],
                "warm": sorted(self.warm), "started": self.started, "proposals": self.proposals,
                "infeasible": self.infeasible, "waiting": [list(w) for w in self.waiting],
                "live": sorted(self.live), "costs": self.costs,
                "measured": self.measurer.state() if self.measurer else None}

    def set_state(self, state: dict) -> None:
        # Saved before identities were digests: converted (_key, _variant_key); ended trials leave identity_of.
        self.first = {_key(k): t for k, t in state["first"].items()}
        self.outcomes, self.warm = {_key(k): o for k, o in state["outcomes"].items()}, {_key(k) for k in state["warm"]}
        self.identity_of = {t: _key(k) for t, k in state["identity_of"].items() if _key(k) not in self.outcomes}
        # Saved before policies existed: every trial trained its configuration in full precision.
        self.variants = {_variant_key(v): t for v, t in (state.get("variants") or {}).items()} \
            or {_variant(k, {}): t for k, t in self.first.items()}
        self.variant_outcomes = {_variant_key(v): o for v, o in (state.get("variant_outcomes") or {}).items()} \
            or {_variant(k, {}): o for k, o in self.outcomes.items()}
        self.variant_of = {t: _variant_key(v) for t, v in (state.get("variant_of") or {}).items()} \
            or {t: _variant(k, {}) for t, k in self.identity_of.items()}
        self.variant_of = {t: v for t, v in self.variant_of.items() if v not in self.variant_outcomes}
        self.for_trainer = [(p, t) for p, t in state.get("for_trainer", [])]
        self.started, self.proposals = bool(state["started"]), int(state["proposals"])
        self.infeasible = int(state["infeasible"])
        self.waiting = [(p, k, t) for p, k, t in state["waiting"]]
        self.live, self.costs = set(state["live"]), dict(state.get("costs", {}))
        if self.measurer is not None and state.get("measured"):
            self.measurer.restore(state["measured"])

    def save(self, checkpoint_path: str) -> None:
        saved.write(checkpoint_path, self.inner.name, self.get_state(), self.inner.state())

    def restore(self, checkpoint_path: str) -> None:
        record = saved.read(checkpoint_path, self.inner.name)
        self.set_state(record["proposals"])
        self.inner.restore(record["searcher"])

    def __reduce__(self):
        """What tuner.pkl holds of this searcher: its state format's version; a resume builds it anew."""
        return saved.Unbuilt, (saved.VERSION,)


def _never() -> bool:
    return False


def _own_ending(result: dict | None, error: bool) -> bool:
    """Whether a trial ended on its own (its last planned epoch, or a status it reported: duplicate, infeasible,
    diverged...), rather than stopped or failed from outside before its last epoch."""
    return bool(result) and not error and outcome_of_result(result, error)["status"] != "stopped_early"


def _key(identity_text: str) -> str:
    """What a training identity (spaces.keys.identity: a resolved config as JSON, ~0.8 kB) is remembered by: its
    digest. Every configuration of a campaign is remembered (its duplicates reuse its outcome) and saved with
    Tune's experiment state at every save. A digest already (a saved state) is returned as it is."""
    if not identity_text.startswith("{"):
        return identity_text
    return hashlib.blake2b(identity_text.encode("utf-8"), digest_size=16).hexdigest()


def _variant_key(variant: str) -> str:
    """A saved variant (an identity, then its policy as JSON) with its identity as a digest."""
    if not variant.startswith("{"):
        return variant
    _, end = json.JSONDecoder().raw_decode(variant)
    return _key(variant[:end]) + variant[end:]


def _variant(key: str, config: dict) -> str:
    """A training identity under a config's quantization policy (the parts in full precision left out)."""
    return key + json.dumps(quant_policy(config), sort_keys=True)


def _with_measured(trial: dict, found) -> dict:
    """A proposal with its model's measurement: (metrics, record) join its cost and ``measured_on``; an error
    text becomes ``measure_error`` (its trial ends failed without training)."""
    if isinstance(found, str):
        return {**trial, "measure_error": found}
    metrics, record = found
    return {**trial, "cost": {**trial["cost"], **metrics}, "measured_on": record}
