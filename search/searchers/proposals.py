"""The campaign's searcher as Ray Tune sees it: ``Proposals`` turns what a searcher (search.searchers.base)
suggests into trials, and what trials end with into what the searcher learns, through the searcher's declared
hooks only.

A suggestion becomes the trial Tune holds (search.searchers.problem.build_trial: resolved config and cost,
computed once, in the campaign's driver). What it becomes is the campaign's proposal rules'
(search.searchers.ledger: one record per proposal, its kind a field, the rules shared with ``simulate`` and
one-shot scoring); here, in order:

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
read plain data — the ledger's records and the searcher's own ``state()`` — never a pickle of either. A state
saved before the ledger (its bookkeeping in parallel maps: ``first``, ``variants``, ``outcomes``, ...) is read
into records (``_ledger_of``).
What Tune pickles of it into ``tuner.pkl`` is only its class and the state format's version (``__reduce__``);
a resumed campaign builds it anew from its spec (search.campaign.run) and restores that data into it.
"""
from __future__ import annotations

import hashlib
import json
import logging

from ray.tune.search import Searcher as TuneSearcher

from qkvsearch.search.searchers import ledger as rules
from qkvsearch.search.searchers import state as saved
from qkvsearch.search.searchers.base import FINISHED, Searcher
from qkvsearch.search.searchers.ledger import Ledger
from qkvsearch.search.searchers.outcomes import outcome_of_result
from qkvsearch.spaces.keys import identity, quant_policy
from qkvsearch.spaces.upgrade import upgraded

log = logging.getLogger(__name__)

MAX_INFEASIBLE = 100  # infeasible proposals per trial before one is run as a trial (that ends infeasible)


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
        self.ledger = Ledger(constraints, skip_duplicates=skip_duplicates)
        self.started = False                   # the warm start was told (it is, before the first proposal)
        self.ahead = 1                         # at most this many wait (the campaign's concurrency)
        # () -> whether the campaign is stopping (a stop signal: search.campaign.run sets it); not saved
        self.stopping = _never

    @property
    def proposals(self) -> int:
        return self.ledger.proposals

    @property
    def infeasible(self) -> int:
        return self.ledger.infeasible

    @property
    def live(self) -> set[str]:
        return {r["id"] for r in self.ledger.records.values() if r["live"] and r["kind"] not in rules.PARKED}

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
        return TuneSearcher.FINISHED if trial == FINISHED else trial

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        if self.stopping() and not _own_ending(result, error):
            # Ended by the campaign's stop (Tune stops or fails what runs as it shuts down): the trial is
            # interrupted, resumes, and is learnt when it ends. Told now, a searcher whose study others keep
            # (a tracker's storage) would record a failure the resumed trial cannot undo.
            return
        recorded = (lambda: self.recorded_cost(trial_id)) if self.recorded_cost is not None else None
        self.ledger.finish(self.inner, trial_id, result, error, outcome=outcome_of_result(result, error),
                           cost=recorded)

    # -- proposing ---------------------------------------------------------------------------------------
    def _warm_start(self) -> None:
        self.started = True
        if self.earlier is None:
            return
        known = self.earlier()
        for k in known:
            key = _key(k.key)
            if self.ledger.earlier(k.trial, key, _variant(key, k.config), {"status": k.status, "metrics": k.values}):
                self.inner.tell_earlier(k)
        log.info(f"search.warm_start: {len(known)} earlier trial(s) lie in this space")

    def _waiting(self) -> int:
        return sum(1 for r in self.ledger.records.values() if r["kind"] in rules.PARKED)

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
            waiting = self._waiting()
            if (self.measurer is not None or waiting) and waiting >= self.ahead:
                return None  # Tune asks again once a measurement is done or a training has ended
            sampled = self.inner.suggest(trial_id)
            if sampled == FINISHED and waiting:
                return None  # the proposals still waiting become the last trials
            if sampled is None or sampled == FINISHED:
                return sampled
            trial = self.build(sampled)
            key = None if trial.get("invalid") else _key(identity(trial["config"]))
            found, measure = None, self.measurer is not None and key is not None
            if measure:
                found, trial = self.measurer.look_up(trial)
            rec = self.ledger.propose(trial_id, trial, key, key and _variant(key, trial["config"]), found=found,
                                      measure=measure, enforce=rejected < MAX_INFEASIBLE)
            rejected += rec["kind"] == rules.INFEASIBLE   # past the bound it runs as a trial that ends infeasible
            trial = self._dispatch(trial_id, rec)
            if trial is not None:
                return trial

    def _dispatch(self, trial_id: str, rec: dict):
        """What a judged proposal becomes, once the searcher is told (search.searchers.ledger): Tune's trial for
        ``trial_id``, or None when it takes no trial now (infeasible and recorded, skipped, or parked under a name
        of its own while it is measured or waits for a training)."""
        kind = rec["kind"]
        if kind == rules.INFEASIBLE and self.record is not None:
            self.record(f"{trial_id}-infeasible-{self.infeasible}", trial_id, rec["trial"], rec["error"])
        if self.ledger.tell(self.inner, rec) is None:
            if kind in rules.PARKED:
                parked = f"{trial_id}-{'measuring' if kind == rules.MEASURING else 'training'}-{self.proposals}"
                self.ledger.rename(trial_id, parked)
                self.inner.rename(trial_id, parked)
                if kind == rules.MEASURING:
                    self.measurer.start(rec["measured"], rec["trial"]["config"], idle=not self.live)
            return None
        trial = {k: v for k, v in rec["trial"].items() if k != "measured_key"}
        if kind == rules.POLICY:
            return {**trial, "kind": kind, "trained_by": rec["of"], "known": self.ledger.known(rec)}
        if kind == rules.DUPLICATE:
            return {**trial, "kind": kind, "duplicate_of": rec["of"], "known": self.ledger.known(rec)}
        return {**trial, "kind": kind}

    def _measured_trial(self, trial_id: str):
        """The first waiting proposal whose measurement is done and that meets the constraints, as trial_id's
        trial; those that break one are rejected on the way. None while none is ready."""
        waiting = self.ledger.parked(rules.MEASURING)
        for rec in waiting:  # again after a restore; at once (idle) once no trial is live
            self.measurer.start(rec["measured"], rec["trial"]["config"], idle=not self.live)
        self.measurer.poll()
        for rec in waiting:
            found = self.measurer.result(rec["measured"])
            if found is None:
                continue
            self.inner.rename(rec["id"], trial_id)
            trial = self._dispatch(trial_id, self.ledger.measured(rec["id"], trial_id, found))
            if trial is not None:
                return trial
        return None

    def _trained_policy(self, trial_id: str):
        """The first proposal waiting for a training that has ended, as trial_id's trial (it evaluates that
        training's weights under its own policy, or duplicates a proposal that does); None while none is."""
        rec = self.ledger.ready()
        if rec is None:
            return None
        self.inner.rename(rec["id"], trial_id)
        return self._dispatch(trial_id, self.ledger.trained(rec["id"], trial_id))

    # -- state -------------------------------------------------------------------------------------------
    def get_state(self) -> dict:
        """This wrapper's bookkeeping as plain data (its searcher's is apart: ``state``)."""
        return {"ledger": self.ledger.state(), "started": self.started,
                "measured": self.measurer.state() if self.measurer else None}

    def set_state(self, state: dict) -> None:
        self.ledger.restore(state["ledger"] if "ledger" in state else _ledger_of(state))
        self.started = bool(state["started"])
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


def _ledger_of(state: dict) -> dict:
    """The ledger (its records) of a state saved before it: the wrapper's parallel maps (a trainer per
    identity, an evaluator per variant, outcomes by both, proposals waiting for a measurement or a training,
    live trials and their costs), identities as saved then (text before they were digests: ``_key``), and
    before policies existed no variants (every trial trained its configuration in full precision)."""
    first = {_saved_key(k): t for k, t in state["first"].items()}
    outcomes = {_saved_key(k): o for k, o in state["outcomes"].items()}
    variants = {_variant_key(v): t for v, t in (state.get("variants") or {}).items()} \
        or {_variant(k, {}): t for k, t in first.items()}
    variant_outcomes = {_variant_key(v): o for v, o in (state.get("variant_outcomes") or {}).items()} \
        or {_variant(k, {}): o for k, o in outcomes.items()}
    warm = {_saved_key(k) for k in state["warm"]}
    live, costs = set(state["live"]), dict(state.get("costs", {}))
    records: dict[str, dict] = {}

    def add(pid, kind, key, variant, of=None, outcome=None, trial=None, measured=None):
        records[pid] = {"id": pid, "kind": kind, "key": key, "variant": variant, "of": of,
                        "live": pid in live or kind in rules.PARKED, "outcome": outcome,
                        "cost": costs.get(pid) if pid in live else (trial or {}).get("cost"),
                        "trial": trial, "measured": measured, "warm": key in warm and kind == rules.NEW}

    trainer_of = {t: k for k, t in first.items()}
    for variant, tid in variants.items():
        key = variant[:_DIGEST_CHARS]
        if tid in trainer_of:
            add(tid, rules.NEW, trainer_of[tid], variant, outcome=outcomes.get(trainer_of[tid]))
        else:
            add(tid, rules.POLICY, key, variant, of=first.get(key), outcome=variant_outcomes.get(variant))
    for key, tid in first.items():  # a trainer whose variant the saved maps lack
        if tid not in records:
            add(tid, rules.NEW, key, _variant(key, {}), outcome=outcomes.get(key))
    for parked, trial in state.get("for_trainer", []):
        key = _key(identity(upgraded(trial["config"])))
        add(parked, rules.WAITING, key, _variant(key, trial["config"]), trial=trial)
    for parked, mkey, trial in state["waiting"]:
        key = _key(identity(upgraded(trial["config"])))
        add(parked, rules.MEASURING, key, _variant(key, trial["config"]), trial=trial, measured=mkey)
    for tid in live - set(records):  # live trials that train nothing of their own (duplicates, invalid ones)
        add(tid, rules.DUPLICATE, None, None)
    return {"records": list(records.values()), "proposals": int(state["proposals"]),
            "infeasible": int(state["infeasible"])}


def _never() -> bool:
    return False


def _own_ending(result: dict | None, error: bool) -> bool:
    """Whether a trial ended on its own (its last planned epoch, or a status it reported: duplicate, infeasible,
    diverged...), rather than stopped or failed from outside before its last epoch."""
    return bool(result) and not error and outcome_of_result(result, error)["status"] != "stopped_early"


_DIGEST_CHARS = 32   # a training identity's digest: blake2b of 16 bytes, in hex


def _key(identity_text: str) -> str:
    """What a training identity (spaces.keys.identity: a resolved config as JSON, ~0.8 kB) is remembered by: its
    digest. Every configuration of a campaign is remembered (its duplicates reuse its outcome) and saved with
    Tune's experiment state at every save. A digest already (a saved state) is returned as it is."""
    if not identity_text.startswith("{"):
        return identity_text
    return hashlib.blake2b(identity_text.encode("utf-8"), digest_size=16).hexdigest()


def _saved_key(saved: str) -> str:
    """An identity a state saved as text (before digests): read as today's config of that training (keys added
    since as they were before: spaces.upgrade), then its digest. Digests came after every key an identity holds
    today existed (quantization keys are not in it), so a digest is today's."""
    return _key(identity(upgraded(json.loads(saved)))) if saved.startswith("{") else saved


def _variant_key(variant: str) -> str:
    """A saved variant (an identity, then its policy as JSON) with its identity as a digest."""
    if not variant.startswith("{"):
        return variant
    _, end = json.JSONDecoder().raw_decode(variant)
    return _saved_key(variant[:end]) + variant[end:]


def _variant(key: str, config: dict) -> str:
    """A training identity under a config's quantization policy (the parts in full precision left out)."""
    return key + json.dumps(quant_policy(config), sort_keys=True)
