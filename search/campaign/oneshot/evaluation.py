"""Scoring subnets on Ray: a pool of actors, each loading the supernet's checkpoint once
(trainers.supernet.scoring.SubnetScorer) and scoring the batches of subnets the campaign's searcher proposes,
as ``simulate`` drives a searcher over a table: no Tune trial per subnet, so thousands of subnets cost the driver
no per-trial state.

The searcher (search.searchers.SEARCHERS: the ``search`` section's, over the space) learns each subnet's inherited
top-1 with its counted cost, as it would a trial's; a subnet proposed again (its training identity and policy) is
told its known result and not scored twice. Each batch is recorded once scored (search.records.inherited): a
driver stopped here and resumed scores no recorded subnet again; the searcher built anew is told the recorded
ones (``Searcher.tell_earlier``) before it proposes more. The selected subnets are then written as stand-alone
checkpoints (``export_subnets``) by an actor of the same pool (``ScorerPool``): the supernet is not loaded again
in one more process.
"""
from __future__ import annotations

import logging

import ray

from qkvsearch.search.records import inherited
from qkvsearch.search.searchers import make_searcher
from qkvsearch.search.searchers.base import FINISHED, EarlierTrial
from qkvsearch.search.searchers.problem import build_trial, spec_problem
from qkvsearch.spaces import base_config
from qkvsearch.storage import exists

log = logging.getLogger(__name__)
BATCH = 8            # most subnets per actor call: the actor's time to score them dwarfs the call's
MAX_PROPOSALS = 50   # proposals in a row that are known already before the searcher is taken as done


class _Scorer:
    """A Ray actor: one supernet loaded once, subnets scored one after another."""

    def __init__(self, plan: dict, checkpoint: str, cfg: dict, bn_batches: int, threads: int):
        import torch

        from qkvsearch.trainers.engine import load_state
        from qkvsearch.trainers.supernet.scoring import SubnetScorer
        from qkvsearch.trainers.supernet.training import SupernetPlan

        torch.set_num_threads(threads)
        self.scorer = SubnetScorer(SupernetPlan.from_dict(plan), load_state(checkpoint), cfg, bn_batches)

    def score(self, configs: list[dict]) -> list[dict]:
        return [self.scorer.score(c) for c in configs]

    def export(self, configs: list[dict], paths: list[str], supernet_id: str) -> None:
        """Each subnet as a stand-alone checkpoint (search.records.inherited.subnet_file)."""
        import io

        import torch

        from qkvsearch.storage import write_bytes

        for cfg, path in zip(configs, paths):
            buf = io.BytesIO()
            torch.save({"model": self.scorer.extract(cfg), "config": cfg, "supernet": supernet_id}, buf)
            write_bytes(path, buf.getvalue())


class ScorerPool:
    """Scorer actors over one trained supernet, started when first asked for (a resumed driver past the scoring
    starts one only if it still has subnets to export) and killed on close (``with``): their CPUs go back before
    the retraining's trials start."""

    def __init__(self, spec, plan: dict, checkpoint: str, teacher_cfg: dict, size: int):
        res = spec.resources
        self._start = lambda: ray.remote(num_cpus=res.cpus_per_worker, num_gpus=res.gpus_per_worker)(_Scorer).remote(
            plan, checkpoint, teacher_cfg, spec.supernet.bn_batches, max(1, int(res.cpus_per_worker)))
        self.size = max(1, size)
        self.actors: list = []

    def get(self, n: int | None = None) -> list:
        """The first ``n`` actors (default: the pool's size), started as needed."""
        n = self.size if n is None else n
        self.actors += [self._start() for _ in range(n - len(self.actors))]
        return self.actors[:n]

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []

    def __enter__(self) -> ScorerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def evaluate(spec, exp: str, scorers: ScorerPool, supernet_id: str, space: str) -> list[dict]:
    """Score ``spec.search.num_trials`` subnets (counting those recorded before) on the pool's actors; -> every
    evaluation."""
    records = inherited.read_evaluations(exp)
    known = {inherited.subnet_identity(r["config"]): r for r in records}
    searcher = make_searcher(spec.search.algorithm, spec_problem(spec))
    for r in records:
        searcher.tell_earlier(EarlierTrial(inherited.subnet_identity(r["config"]), r["subnet_id"], r["keys"], "completed",
                                           r["metrics"], r["cost"]))
    target = spec.search.num_trials
    if len(known) >= target:
        return records
    pool = scorers.get()
    base, n_batch, idle, pending = base_config(spec), inherited.batches_written(exp), list(pool), {}
    claimed = set(known)  # identities scored or being scored: none is proposed to an actor twice
    ids = _Ids(records)
    done = False
    while pending or (not done and len(claimed) < target):
        while idle and not done and len(claimed) < target:
            share = -(-(target - len(claimed)) // len(pool))  # the rest spread over the actors
            batch = _propose(searcher, base, known, claimed, min(BATCH, share), ids)
            if not batch:
                done = True
                break
            actor = idle.pop()
            pending[actor.score.remote([t["config"] for t in batch])] = (actor, batch)
        if not pending:
            break
        ready, _ = ray.wait(list(pending), num_returns=1)
        actor, batch = pending.pop(ready[0])
        idle.append(actor)
        scored = [{"subnet_id": t["subnet_id"], "keys": t["keys"], "config": t["config"], "cost": t["cost"],
                   "metrics": m, "supernet": supernet_id, "space": space}
                  for t, m in zip(batch, ray.get(ready[0]))]
        inherited.write_batch(exp, n_batch, scored)
        n_batch += 1
        for r in scored:
            known[inherited.subnet_identity(r["config"])] = r
            records.append(r)
            searcher.on_trial_complete(r["subnet_id"], _result(r))
        log.info(f"subnets scored: {len(known)}/{target}")
    return records


def export_subnets(exp: str, scorers: ScorerPool, supernet_id: str, records: list[dict]) -> dict[str, str]:
    """Write each of ``records`` (evaluations) as a stand-alone checkpoint, unless written before (a resumed
    driver); -> {subnet_id: its file}. One actor: a selection is a handful of subnets."""
    files = {r["subnet_id"]: inherited.subnet_file(exp, r["subnet_id"]) for r in records}
    todo = [r for r in records if not exists(files[r["subnet_id"]])]
    if todo:
        (actor,) = scorers.get(1)
        ray.get(actor.export.remote([r["config"] for r in todo], [files[r["subnet_id"]] for r in todo], supernet_id))
        log.info(f"{len(todo)} selected subnet(s) written as stand-alone checkpoints under {exp}/{inherited.SUBNETS_DIR}")
    return files


class _Ids:
    """Subnet ids, one per proposal, never one twice (a resumed driver goes on after the recorded ones)."""

    def __init__(self, records: list[dict]):
        self.next = 1 + max((int(r["subnet_id"].rsplit("_", 1)[1]) for r in records), default=-1)

    def __call__(self) -> str:
        self.next += 1
        return f"subnet_{self.next - 1:06d}"


def _propose(searcher, base: dict, known: dict, claimed: set, n: int, ids: _Ids) -> list[dict]:
    """Up to n new subnets ({"subnet_id", "keys", "config", "cost"}) from the searcher, each claimed; one
    scored already is told its result at once, one being scored (or no model) is told it failed."""
    out, repeats = [], 0
    while len(out) < n and repeats < MAX_PROPOSALS + len(known):  # a grid proposes the recorded ones again
        sid = ids()
        keys = searcher.suggest(sid)
        if keys is None or keys == FINISHED:
            break
        trial = build_trial(base, keys)
        key = None if trial.get("invalid") else inherited.subnet_identity(trial["config"])
        if key is None or key in claimed:
            repeats += 1
            searcher.on_trial_complete(sid, _result(known[key]) if key in known else None,
                                       error=key not in known)
            continue
        claimed.add(key)
        searcher.constrain(sid, trial["cost"])
        out.append({"subnet_id": sid, "keys": keys, **trial})
    return out


def _result(record: dict) -> dict:
    """An evaluation as a searcher learns a completed trial's last result."""
    return {**record["metrics"], **record["cost"], "epoch": 1.0, "qs_epochs_planned": 1.0}
