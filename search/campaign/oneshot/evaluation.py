"""Scoring subnets on Ray: the campaign's searcher proposes, the campaign's proposal rules judge
(search.searchers.ledger: invalid, infeasible, measured costs, duplicates), and a pool of actors
(search.campaign.oneshot.scorers) scores the batches admitted, as ``simulate`` drives a searcher over a table:
no Tune trial per subnet, so thousands of subnets cost the driver no per-trial state.

The searcher (search.searchers.SEARCHERS: the ``search`` section's, over the space) learns each subnet's inherited
top-1 with its cost, as it would a trial's. A subnet proposed again (its training identity and policy) is told
its known result and not scored twice. A proposal whose cost breaks a constraint is never scored: it is recorded
(search.records.proposals) and the searcher told. Measured costs (latency, throughput, memory: the campaign's
objectives or constraints, spaces.measure) are measured once per measured key (model shape and policy) through
the campaign's measurement path (search.campaign.measured) while the actors are idle: proposals wait for their
measurement, then are judged on it, so measured metrics are objectives and constraints here as in a campaign of
trials. A subnet the supernet cannot score (an error in its actor) is recorded as failed, and the scoring goes on.

Each batch is recorded once scored (search.records.inherited): a driver stopped here and resumed scores no
recorded subnet again; the searcher built anew is told the recorded ones (``Searcher.tell_earlier``) before it
proposes more. The selected subnets are then written as stand-alone checkpoints (``export_subnets``) by an actor
of the same pool: the supernet is not loaded again in one more process.
"""
from __future__ import annotations

import logging

import ray

from qkvsearch.search.campaign.assemble import campaign_measurer, record_proposal
from qkvsearch.search.campaign.oneshot.plan import space_hash
from qkvsearch.search.campaign.oneshot.predictor import CostPredictor, agreement
from qkvsearch.search.campaign.oneshot.retrain import none_chosen, select, selected_records, selection
from qkvsearch.search.campaign.oneshot.scorers import ScorerPool
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.records import inherited
from qkvsearch.search.records.inherited import PREDICTED
from qkvsearch.search.searchers import ledger as rules
from qkvsearch.search.searchers import make_searcher
from qkvsearch.search.searchers.base import FINISHED, EarlierTrial
from qkvsearch.search.searchers.ledger import Ledger
from qkvsearch.search.searchers.outcomes import scored_result
from qkvsearch.search.searchers.problem import build_trial, spec_problem
from qkvsearch.search.searchers.proposals import _key
from qkvsearch.spaces import base_config
from qkvsearch.storage import exists, write_json

log = logging.getLogger(__name__)
BATCH = 8            # most subnets per actor call: the actor's time to score them dwarfs the call's
MAX_PROPOSALS = 50   # proposals in a row that are known already before the searcher is taken as done
CONTROL = "control"  # an evaluation's ``selected_for``: scored after the search, for the control sample


class Scoring:
    """One campaign's scoring: its searcher, its ledger and its measurements, over the recorded evaluations."""

    def __init__(self, campaign: OpenedCampaign, scorers: ScorerPool, supernet_id: str, space: str,
                 known: dict | None = None):
        """known: subnet key -> (its inherited metrics, the folder that scored it): scores of the same supernet's
        subnets recorded for another deployment target, recorded here without scoring them again."""
        self.campaign, self.scorers = campaign, scorers
        self.supernet_id, self.space, self.known = supernet_id, space, known or {}
        self.base = base_config(campaign.spec)
        self.records = inherited.read_evaluations(campaign.exp)
        self.ledger = Ledger(campaign.spec.constraints, share_training=False, at_once=True)
        self.measurer = campaign_measurer(campaign)
        self.batches = inherited.batches_written(campaign.exp)
        self.ids = _Ids(self.records)
        self.predictor = CostPredictor(self.measurer.how.metrics, campaign.spec.measure.predict_after) \
            if self.measurer is not None else None
        for r in self.records:
            self.ledger.earlier(r["subnet_id"], subnet_key(r["config"]), subnet_key(r["config"]), _outcome(r))
            self._learn(r["config"], r["cost"], r)

    # -- the search ----------------------------------------------------------------------------------------
    def search(self) -> list[dict]:
        """Score ``search.num_trials`` subnets (counting those recorded before); -> every evaluation."""
        searched = [r for r in self.records if r.get("selected_for") != CONTROL]
        target = self.campaign.spec.search.num_trials
        if len(searched) >= target:
            return self.records
        searcher = make_searcher(self.campaign.spec.search.algorithm, spec_problem(self.campaign.spec))
        for r in searched:
            searcher.tell_earlier(EarlierTrial(inherited.subnet_identity(r["config"]), r["subnet_id"], r["keys"],
                                               r.get("status", "completed"), r["metrics"], r["cost"]))
        pool = self.scorers.get()
        idle, pending, ready = list(pool), {}, []
        done = False
        while pending or ready or (not done and self._searched() < target):
            claimed = self._searched() + sum(len(b) for _, b in pending.values()) + len(ready)
            while not done and len(ready) < BATCH * len(pool) and claimed + self._waiting() < target:
                got = self._propose(searcher)
                if got is None:
                    done = True
                elif got:
                    ready.append(got)
                    claimed += 1
            if not pending and not ready and self._waiting():
                ready += self._measure_parked(searcher)   # every actor idle: the measurer has the device
                continue
            while idle and ready:
                share = max(1, -(-len(ready) // len(idle)))
                batch, ready = ready[:min(BATCH, share)], ready[min(BATCH, share):]
                actor = idle.pop()
                pending[actor.score.remote([t["config"] for t in batch])] = (actor, batch)
            if not pending:
                continue
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            actor, batch = pending.pop(ref)
            idle.append(actor)
            self._record(batch, ray.get(ref), searcher)
            log.info(f"subnets scored: {self._searched()}/{target}")
        return self.records

    def _searched(self) -> int:
        return sum(1 for r in self.records if r.get("selected_for") != CONTROL)

    def _waiting(self) -> int:
        return len(self.ledger.parked(rules.MEASURING))

    def _propose(self, searcher) -> dict | None | bool:
        """The next proposal to score ({"subnet_id", "keys", "config", "cost"}), False when this proposal is
        not to be scored (known, infeasible, invalid, or waiting for its measurement), None when the searcher is
        done (finished, or MAX_PROPOSALS in a row known already)."""
        for _ in range(MAX_PROPOSALS + len(self.records)):  # a grid proposes the recorded ones again
            sid = self.ids()
            keys = searcher.suggest(sid)
            if keys is None or keys == FINISHED:
                return None
            trial = {**build_trial(self.base, keys), "keys": keys}
            key = None if trial.get("invalid") else subnet_key(trial["config"])
            found, measure = None, self.measurer is not None and key is not None
            if measure:
                found, trial = self.measurer.look_up(trial)
                if found is None and self.predictor.ready():
                    found = (self.predictor.predict(trial["config"], trial["cost"]),
                             {PREDICTED: list(self.predictor.metrics)})
            rec = self.ledger.propose(sid, trial, key, key, found=found, measure=measure)
            got = self._dispatch(searcher, rec)
            if got is not False or rec["kind"] == rules.MEASURING:
                return got
        return None

    def _dispatch(self, searcher, rec: dict):
        """What a judged proposal becomes here, once the searcher is told (search.searchers.ledger): the subnet to
        score, or False (nothing to score: told now, or to be told once what it waits for is known)."""
        sid, trial = rec["id"], rec["trial"]
        if rec["kind"] == rules.INFEASIBLE:
            record_proposal(self.campaign.exp, self.campaign.spec.name, f"{sid}-infeasible", sid, trial, rec["error"])
        if self.ledger.tell(searcher, rec) is None:
            return False
        if rec["kind"] == rules.MEASURE_ERROR:
            self._record([{"subnet_id": sid, **trial}], [{"error": trial[rules.MEASURE_ERROR]}], searcher)
            return False
        todo = {"subnet_id": sid, **{k: v for k, v in trial.items() if k != "measured_key"}}
        known = self.known.get(subnet_key(trial["config"]))
        if known is None:
            return todo
        self._record([{**todo, "scored_in": known[1]}], [{"metrics": known[0]}], searcher)
        return False

    def _measure_parked(self, searcher) -> list[dict]:
        """Measure every proposal waiting for its measurement (the actors are idle), then judge each on it."""
        parked = self.ledger.parked(rules.MEASURING)
        for rec in parked:
            self.measurer.start(rec["measured"], rec["trial"]["config"], idle=True)
        self.measurer.wait()
        out = []
        for rec in parked:
            found = self.measurer.result(rec["measured"])
            if not isinstance(found, str):
                self._learn(rec["trial"]["config"], rec["trial"]["cost"], {"cost": found[0]})
            judged = self.ledger.measured(rec["id"], rec["id"], found)
            got = self._dispatch(searcher, judged)
            if got:
                out.append(got)
        return out

    def _record(self, batch: list[dict], results: list[dict], searcher) -> list[dict]:
        """Write a scored batch (search.records.inherited) and tell the searcher; -> its evaluations."""
        scored = [{"subnet_id": t["subnet_id"], "keys": t["keys"], "config": t["config"], "cost": t["cost"],
                   "metrics": r.get("metrics", {}), "status": "failed" if "error" in r else "completed",
                   **({"error": r["error"]} if "error" in r else {}),
                   **({"measured_on": t["measured_on"]} if t.get("measured_on") else {}),
                   **({PREDICTED: t["measured_on"][PREDICTED]} if PREDICTED in (t.get("measured_on") or {}) else {}),
                   **({"scored_in": t["scored_in"]} if t.get("scored_in") else {}),
                   **({"selected_for": t["selected_for"]} if t.get("selected_for") else {}),
                   "supernet": self.supernet_id, "space": self.space}
                  for t, r in zip(batch, results)]
        inherited.write_batch(self.campaign.exp, self.batches, scored)
        self.batches += 1
        for r in scored:
            self.records.append(r)
            if r.get("status") == "failed":
                log.warning(f"{r['subnet_id']} could not be scored: {r['error'].splitlines()[-1]}")
            if searcher is None:   # a control subnet, scored after the search
                self.ledger.end(r["subnet_id"], _outcome(r))
            else:
                self.ledger.finish(searcher, r["subnet_id"], **_outcome(r))
        return scored

    def _learn(self, config: dict, cost: dict, record: dict) -> None:
        """A measured shape for the predictor (a predicted cost teaches it nothing)."""
        if self.predictor is not None and PREDICTED not in record:
            self.predictor.add(self.measurer.key(config), config, cost, record["cost"])

    # -- after the search -------------------------------------------------------------------------------
    def choose(self) -> tuple[dict, list[dict]]:
        """The whole scoring phase: the search, the chosen subnets' predicted costs measured for real (with
        ``measure.predict_after``), the selection (search.campaign.oneshot.retrain) and its control subnets
        scored; -> (the selection, every evaluation)."""
        spec = self.campaign.spec
        records = self.search()
        if spec.measure.predict_after:   # the subnets chosen on predicted costs, measured for real
            records = self.confirm(lambda rs: select(spec, rs)["chosen"])
        chosen = selection(self.campaign, records, self.feasible)
        return chosen, self.score_selected(chosen)

    def confirm(self, chosen_of) -> list[dict]:
        """Measure for real every subnet ``chosen_of(records)`` (space keys) picks whose cost was predicted,
        until the subnets it picks were all measured (each round measures at least one); -> every evaluation,
        the measured costs in place of the predicted (search.records.inherited.write_measured)."""
        while True:
            picked = {inherited.keys_text(k) for k in chosen_of(self.records)}
            todo = [r for r in self.records if inherited.keys_text(r["keys"]) in picked and r.get(PREDICTED)]
            if not todo:
                return self.records
            found = {r["subnet_id"]: self._measured(r["config"]) for r in todo}
            inherited.write_measured(self.campaign.exp, {sid: {"cost": f[0], "measured_on": f[1]} if not
                                                         isinstance(f, str) else {"error": f}
                                                         for sid, f in found.items()})
            self.records = inherited.read_evaluations(self.campaign.exp)
            for r in todo:
                if not isinstance(found[r["subnet_id"]], str):
                    self._learn(r["config"], r["cost"], {"cost": found[r["subnet_id"]][0]})

    def predictor_report(self) -> dict:
        """What the predictor did: shapes measured, evaluations predicted and confirmed (measured since), its error
        on held-out measured shapes and on the confirmed subnets (their predictions against their measurements)."""
        if self.predictor is None:
            return {}
        confirmed = [r for r in self.records if r.get("predicted_cost")]
        return {"predict_after": self.predictor.after, "shapes_measured": len(self.predictor.samples),
                "predicted": sum(1 for r in self.records if r.get(PREDICTED)), "confirmed": len(confirmed),
                "held_out": self.predictor.held_out(),
                "confirmed_error": {m: {"subnets": len(pairs), **agreement(*zip(*pairs))}
                                    for m in self.predictor.metrics
                                    if (pairs := [(r["predicted_cost"][m], r["cost"][m]) for r in confirmed
                                                  if m in r["predicted_cost"]])}}

    def feasible(self, keys: dict, config: dict, cost: dict) -> bool:
        """Whether a configuration drawn for the control sample meets the constraints, measured where a
        constraint is on a measured cost (the actors are idle)."""
        from qkvsearch.spaces.schema import violations

        if violations(self.campaign.spec.constraints, cost) or self.measurer is None:
            return not violations(self.campaign.spec.constraints, cost)
        found = self._measured(config)
        return not isinstance(found, str) and not violations(self.campaign.spec.constraints, {**cost, **found[0]})

    def score_selected(self, selection: dict) -> list[dict]:
        """Score the control subnets not scored yet (drawn from the space, most were not proposed); -> every
        evaluation."""
        by_keys = {inherited.keys_text(r["keys"]) for r in self.records}
        todo = []
        for keys in selection["control"]:
            if inherited.keys_text(keys) not in by_keys:
                by_keys.add(inherited.keys_text(keys))
                trial = {**build_trial(self.base, keys), "keys": keys, "subnet_id": self.ids(), "selected_for": CONTROL}
                if self.measurer is not None:
                    found = self._measured(trial["config"])
                    if not isinstance(found, str):
                        trial = {**trial, "cost": {**trial["cost"], **found[0]}, "measured_on": found[1]}
                todo.append(trial)
        if todo:
            pool = self.scorers.get()
            refs = {}
            for i, actor in enumerate(pool):
                part = todo[i::len(pool)]
                if part:
                    refs[actor.score.remote([t["config"] for t in part])] = part
            for ref, part in refs.items():
                self._record(part, ray.get(ref), None)
            log.info(f"control subnets scored: {len(todo)}")
        return self.records

    def _measured(self, config: dict):
        key = self.measurer.key(config)
        self.measurer.start(key, config, idle=True)
        self.measurer.wait()
        return self.measurer.result(key)


def score_target(target, scorers: ScorerPool, supernet_id: str, known: dict) -> None:
    """A target's scoring, selection and export (search.campaign.oneshot.targets.Target), each resumed from its
    records; known: scores other targets recorded (``Scoring``), this target's own added once scored."""
    tc = target.campaign
    log.info(f"{target.label}scoring subnets with the weights they inherit from {supernet_id} ({tc.exp})")
    scoring = Scoring(tc, scorers, supernet_id, space_hash(tc.spec), known)
    chosen, records = scoring.choose()
    if scoring.predictor is not None:
        write_json(f"{tc.exp}/{inherited.PREDICTOR_FILE}", {"target": target.name, **scoring.predictor_report()})
    learn_scores(known, records, tc.exp)
    chosen_records, control_records = selected_records(records, chosen)
    export_subnets(tc.exp, scorers, supernet_id, chosen_records + control_records)
    if chosen["chosen"]:
        log.info(f"{target.label}{len(chosen['chosen'])} subnet(s) chosen and exported")
    else:
        log.warning(f"{target.label}no subnet chosen: {none_chosen(records)}")


def learn_scores(known: dict, records: list[dict], folder: str) -> None:
    """Scores another target may take (subnet key -> (its metrics, the folder that scored it)): those this folder
    scored itself, not taken from another."""
    for r in records:
        if r.get("status", "completed") == "completed" and not r.get("scored_in"):
            known.setdefault(subnet_key(r["config"]), (r["metrics"], folder))


def export_subnets(exp: str, scorers: ScorerPool, supernet_id: str, records: list[dict]) -> dict[str, str]:
    """Write each of ``records`` (evaluations) as a stand-alone checkpoint, unless written before (a resumed
    driver); -> {subnet_id: its file}. One actor: a selection is a handful of subnets."""
    files = {r["subnet_id"]: inherited.subnet_file(exp, r["subnet_id"]) for r in records}
    todo = [r for r in records if not exists(files[r["subnet_id"]])]
    if todo:
        (actor,) = scorers.get(1)
        ray.get(actor.export.remote([r["config"] for r in todo], [files[r["subnet_id"]] for r in todo], supernet_id))
        log.info(f"{len(todo)} selected subnet(s) written as stand-alone checkpoints "
                 f"under {exp}/{inherited.SUBNETS_DIR}")
    return files


class _Ids:
    """Subnet ids, one per proposal, never one twice (a resumed driver goes on after the recorded ones)."""

    def __init__(self, records: list[dict]):
        self.next = 1 + max((int(r["subnet_id"].rsplit("_", 1)[1]) for r in records), default=-1)

    def __call__(self) -> str:
        self.next += 1
        return f"subnet_{self.next - 1:06d}"


def subnet_key(config: dict) -> str:
    """What the ledger knows a subnet by: its identity and policy (one scored per policy), as a digest."""
    return _key(inherited.subnet_identity(config))


def _outcome(record: dict) -> dict:
    """An evaluation's outcome as the ledger keeps it: {"result": the last result a searcher learns (None: it
    failed), "error"}."""
    completed = record.get("status", "completed") == "completed"
    return {"result": scored_result({**record["metrics"], **record["cost"]}) if completed else None,
            "error": not completed}
