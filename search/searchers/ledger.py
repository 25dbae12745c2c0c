"""Proposals as plain-data records, the one set of rules that decides what each becomes, and what the searcher is
told of each.

Every loop that turns a searcher's suggestions into work asks a ``Ledger`` what each proposal is, and lets it tell
the searcher (``tell``, then ``finish`` once its work ended): Tune's trials (search.searchers.proposals), a
table's replay (search.simulation.searchers) and one-shot scoring (search.campaign.oneshot.evaluation). They
differ only in where results come from. The rules, in their order:

    invalid       no model can be made of it (a table: the table lacks it): no work of its own
    skipped       proposed before, under a searcher that enumerates (grid): asked again, nothing learnt
    infeasible    its cost (counted, or measured) breaks a constraint: no work; the searcher is told
                  (``tell_infeasible``); only counted, past MAX_INFEASIBLE a caller may admit it anyway
    measuring     a measured cost it needs is not known: it waits under a name of its own while its model is
                  measured, then is judged again (``measured``)
    measure_error its model's measurement failed: work that fails at once, naming the error
    waiting       another policy of a configuration whose training has not ended (policies share one
                  training): it waits for that training, then is judged again (``trained``)
    new           its own work: a training, a score
    policy        another quantization policy of a configuration trained: evaluates that training's weights
    duplicate     the same configuration (and policy) as an earlier proposal: reuses its outcome

A proposal is known by a ``key`` (what is trained: a training identity's digest, a table's row, a subnet) and
a ``variant`` (what is evaluated: the key under a quantization policy; the key itself where every variant is
work of its own). A record is plain data, saved as it is:

    {"id": the proposal's name (a trial id, or a name it waits under), "kind", "key", "variant",
     "of": the proposal whose work it takes (duplicate, policy), "live": it runs or waits, "outcome": once it
     ended ({"status", "metrics"}), "cost": its cost while live, "trial": what it becomes, while it waits,
     "measured": the measurement it waits for, "warm": an earlier campaign's (a warm start)}

Records of work that outcomes are reused from (new, policy) stay; the others leave once they end.

What the searcher is told of each kind (``tell``): infeasible, ``tell_infeasible`` with its cost; skipped and the
parked ones, nothing yet; every other kind but invalid, ``constrain`` with its cost. Where a proposal without
work of its own ends at once (``at_once``: scoring, a table), an invalid one ends failed and a duplicate with
its original's outcome, as soon as that is known; where every proposal becomes a trial (Tune), they become
trials that end so. Once work ended (``finish``), the searcher learns its result, and so does each duplicate that
waited for it.
"""
from __future__ import annotations

from qkvsearch.spaces.schema import violations

INVALID, SKIPPED, INFEASIBLE, MEASURING, MEASURE_ERROR, WAITING, NEW, POLICY, DUPLICATE = (
    "invalid", "skipped", "infeasible", "measuring", "measure_error", "waiting", "new", "policy", "duplicate")
KINDS = (INVALID, SKIPPED, INFEASIBLE, MEASURING, MEASURE_ERROR, WAITING, NEW, POLICY, DUPLICATE)
KEPT = (NEW, POLICY, MEASURE_ERROR)   # outcomes reused (a failed measurement's too): kept once ended
PARKED = (MEASURING, WAITING)


class Ledger:
    """constraints: spaces.schema.Constraint on costs; skip_duplicates: an enumerating searcher's rule;
    share_training: policies of one key share its training (else every variant is work of its own); at_once: a
    proposal without work of its own (invalid, a duplicate) ends as soon as its outcome is known, rather than
    becoming work that ends so (module docstring)."""

    def __init__(self, constraints=(), *, skip_duplicates: bool = False, share_training: bool = True,
                 at_once: bool = False):
        self.constraints = tuple(constraints)
        self.skip_duplicates, self.share_training, self.at_once = skip_duplicates, share_training, at_once
        self.records: dict[str, dict] = {}
        self.first: dict[str, str] = {}      # key -> the record that trains it (index of records)
        self.variants: dict[str, str] = {}   # variant -> the record that evaluates it
        self.proposals = 0                   # configurations judged (duplicates a grid skips excluded)
        self.infeasible = 0                  # of which broke a constraint

    # -- the rules --------------------------------------------------------------------------------------
    def propose(self, pid: str, trial: dict, key: str | None, variant: str | None, *, found=None,
                measure: bool = False, enforce: bool = True) -> dict:
        """Judge a new proposal (module docstring); -> its record (stored unless skipped or infeasible).
        trial: {"config", "cost", ...} ("invalid": no model); found: its measurement ((metrics, how), an
        error text, or None: not measured); measure: a measured cost is needed before it is admitted;
        enforce: constraints refuse it (else it is admitted whatever its cost: a caller's bound)."""
        if trial.get("invalid") or key is None:
            return self._store(pid, INVALID, trial, key, variant)
        warm = self.records.get(self.first.get(key), {}).get("warm", False)
        if self.skip_duplicates and variant in self.variants and not warm:
            return {"id": pid, "kind": SKIPPED, "trial": trial}
        self.proposals += 1
        trial = _with_measured(trial, found)
        if enforce and violations(self.constraints, trial["cost"]) and MEASURE_ERROR not in trial:
            self.infeasible += 1
            return {"id": pid, "kind": INFEASIBLE, "trial": trial,
                    "error": "; ".join(violations(self.constraints, trial["cost"]))}
        if measure and found is None:
            return self._store(pid, MEASURING, trial, key, variant, parked=True)
        return self._admit(pid, trial, key, variant)

    def measured(self, parked: str, pid: str, found) -> dict:
        """A proposal that waited for its measurement, judged again with it under the name ``pid``."""
        rec = self.records.pop(parked)
        trial = _with_measured(rec["trial"], found)
        broken = violations(self.constraints, trial["cost"])
        if broken and MEASURE_ERROR not in trial:
            self.infeasible += 1
            return {"id": pid, "kind": INFEASIBLE, "trial": trial, "error": "; ".join(broken)}
        return self._admit(pid, trial, rec["key"], rec["variant"])

    def trained(self, parked: str, pid: str) -> dict:
        """A proposal that waited for its configuration's training, judged again under the name ``pid``."""
        rec = self.records.pop(parked)
        return self._admit(pid, rec["trial"], rec["key"], rec["variant"])

    def _admit(self, pid: str, trial: dict, key: str, variant: str) -> dict:
        trainer = self.first.get(key) if self.share_training else None
        if trainer is not None and variant not in self.variants and self.records[trainer]["outcome"] is None:
            return self._store(pid, WAITING, trial, key, variant, parked=True)
        if variant not in self.variants:
            kind = MEASURE_ERROR if MEASURE_ERROR in trial else POLICY if trainer is not None else NEW
            rec = self._store(pid, kind, trial, key, variant, of=trainer)
            self.variants[variant] = pid
            if kind != POLICY:
                self.first.setdefault(key, pid)
            return rec
        if self.skip_duplicates:
            return {"id": pid, "kind": SKIPPED, "trial": trial}
        return self._store(pid, DUPLICATE, trial, key, variant, of=self.variants[variant])

    def _store(self, pid: str, kind: str, trial: dict, key, variant, *, of=None, parked: bool = False) -> dict:
        rec = {"id": pid, "kind": kind, "key": key, "variant": variant, "of": of, "live": True, "outcome": None,
               "cost": dict(trial.get("cost") or {}), "trial": trial if parked else None,
               "measured": trial.get("measured_key") if parked else None, "warm": False}
        self.records[pid] = rec
        return {**rec, "trial": trial}

    # -- what a record's work takes ---------------------------------------------------------------------
    def known(self, rec: dict) -> dict | None:
        """The outcome a policy (its training's) or a duplicate (its original's) reuses; None while running."""
        if rec["kind"] == POLICY:
            return self.records[self.first[rec["key"]]]["outcome"]
        if rec["kind"] == DUPLICATE:
            return self.records[rec["of"]]["outcome"] if rec["of"] in self.records else None
        return None

    def parked(self, kind: str) -> list[dict]:
        """The records waiting (MEASURING or WAITING), oldest first."""
        return [r for r in self.records.values() if r["kind"] == kind]

    def ready(self) -> dict | None:
        """The oldest record WAITING whose training has ended, or None."""
        return next((r for r in self.parked(WAITING) if self.records[self.first[r["key"]]]["outcome"] is not None),
                    None)

    def rename(self, old: str, new: str) -> None:
        rec = self.records.pop(old)
        self.records[new] = {**rec, "id": new}
        for index in (self.first, self.variants):
            for k, v in index.items():
                if v == old:
                    index[k] = new

    # -- what the searcher is told ----------------------------------------------------------------------
    def tell(self, searcher, rec: dict) -> dict | None:
        """Tell ``searcher`` (search.searchers.base.Searcher) what the judged proposal ``rec`` is (module
        docstring); -> rec when it is work to do, None when it is not (told already, or to be told later)."""
        kind, pid, trial = rec["kind"], rec["id"], rec["trial"]
        if kind == SKIPPED or kind in PARKED:
            return None
        if kind == INFEASIBLE:
            searcher.tell_infeasible(pid, trial["cost"])
            return None
        if kind != INVALID:
            searcher.constrain(pid, trial["cost"])
        if not self.at_once or kind not in (INVALID, DUPLICATE):
            return rec
        known = {"result": None, "error": True} if kind == INVALID else self.known(rec)
        if known is not None:   # else it is told once its original ends (``finish``)
            self.finish(searcher, pid, known["result"], known["error"])
        return None

    def finish(self, searcher, pid: str, result: dict | None, error: bool, *, outcome: dict | None = None,
               cost=None) -> None:
        """``pid``'s work ended: the ledger keeps ``outcome`` (default {"result", "error"}: what its duplicates
        learn), the searcher learns ``result`` with the proposal's cost (``cost()`` where the ledger holds none),
        and so does each duplicate that waited for it where those end at once."""
        rec, waiting = self.end(pid, {"result": result, "error": error} if outcome is None else outcome)
        known = rec["cost"] if rec is not None else None
        if known is None and cost is not None:
            known = cost()
        if result and known:  # the exact cost over anything the result holds for it (NaN, say)
            result = {**result, **known}
        searcher.on_trial_complete(pid, result, error=error)
        for dup in waiting if self.at_once else ():
            self.end(dup["id"], {})
            searcher.on_trial_complete(dup["id"], result, error=error)

    # -- endings ----------------------------------------------------------------------------------------
    def end(self, pid: str, outcome: dict) -> tuple[dict | None, list[dict]]:
        """Record that ``pid``'s work ended with ``outcome``; -> (its record as it was, cost included, or None
        when the ledger holds none; the duplicates of it that were waiting for it, still live)."""
        rec = self.records.get(pid)
        if rec is None:
            return None, []
        if rec["kind"] in KEPT:
            self.records[pid] = {**rec, "live": False, "cost": None, "outcome": outcome}
        else:
            del self.records[pid]
        waiting = [r for r in self.records.values() if r["kind"] == DUPLICATE and r["of"] == pid and r["live"]]
        return rec, waiting

    def earlier(self, trial_id: str, key: str, variant: str, outcome: dict) -> bool:
        """An earlier campaign's ended training of ``key`` (a warm start); False when the key is known."""
        if key in self.first:
            return False
        self.records[trial_id] = {"id": trial_id, "kind": NEW, "key": key, "variant": variant, "of": None,
                                  "live": False, "outcome": outcome, "cost": None, "trial": None, "measured": None,
                                  "warm": True}
        self.first[key], self.variants[variant] = trial_id, trial_id
        return True

    # -- state ------------------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"records": list(self.records.values()), "proposals": self.proposals, "infeasible": self.infeasible}

    def restore(self, state: dict) -> None:
        self.records = {r["id"]: dict(r) for r in state["records"]}
        self.proposals, self.infeasible = int(state["proposals"]), int(state["infeasible"])
        self.first, self.variants = {}, {}
        for r in self.records.values():
            if r["kind"] in KEPT:
                self.variants.setdefault(r["variant"], r["id"])
                if r["kind"] != POLICY:
                    self.first.setdefault(r["key"], r["id"])


def _with_measured(trial: dict, found) -> dict:
    """A proposal with its model's measurement: (metrics, record) join its cost and ``measured_on``; an error
    text becomes ``measure_error`` (its work ends failed at once)."""
    if found is None:
        return trial
    if isinstance(found, str):
        return {**trial, MEASURE_ERROR: found}
    metrics, record = found
    return {**trial, "cost": {**trial["cost"], **metrics}, "measured_on": record}
