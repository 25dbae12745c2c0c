"""The proposal rules (search.searchers.ledger), one set for Tune's trials, ``simulate`` and one-shot scoring: what
each proposal becomes, in their order, recorded as plain data whose kind is a field."""
from __future__ import annotations

import json

from qkvsearch.search.searchers import ledger as rules
from qkvsearch.search.searchers.ledger import Ledger
from qkvsearch.spaces.schema import Constraint


def _trial(gmacs: float, **more) -> dict:
    return {"config": {"gmacs_of": gmacs}, "cost": {"gmacs": gmacs}, **more}


def test_the_rules_in_their_order():
    ledger = Ledger([Constraint("gmacs", max=1.0)])
    assert ledger.propose("p0", _trial(0.5, invalid="no model"), None, None)["kind"] == rules.INVALID
    assert ledger.propose("p1", _trial(2.0), "k1", "k1")["kind"] == rules.INFEASIBLE
    assert ledger.propose("p2", _trial(0.5), "k2", "k2")["kind"] == rules.NEW
    assert ledger.propose("p3", _trial(0.5), "k2", "k2")["kind"] == rules.DUPLICATE
    assert ledger.propose("p4", _trial(2.0), "k2", "k2", enforce=False)["kind"] == rules.DUPLICATE  # past the bound
    assert (ledger.proposals, ledger.infeasible) == (4, 1)   # an invalid one is no configuration
    assert {r["id"]: r["kind"] for r in ledger.records.values()} == {
        "p0": rules.INVALID, "p2": rules.NEW, "p3": rules.DUPLICATE, "p4": rules.DUPLICATE}
    assert ledger.records["p3"]["of"] == "p2" and ledger.known(ledger.records["p3"]) is None   # p2 still runs
    ended, waiting = ledger.end("p2", {"status": "completed", "metrics": {"top1": 50.0}})
    assert ended["cost"] == {"gmacs": 0.5} and [w["id"] for w in waiting] == ["p3", "p4"]
    assert ledger.known(ledger.records["p3"])["metrics"] == {"top1": 50.0}
    ledger.end("p3", {})
    assert "p3" not in ledger.records and ledger.records["p2"]["outcome"]["status"] == "completed"


def test_an_enumerating_searcher_passes_over_what_was_trained_counting_an_earlier_campaigns_trainings():
    ledger = Ledger(skip_duplicates=True)
    assert ledger.earlier("old_t3", "k9", "k9", {"status": "completed", "metrics": {}})
    assert not ledger.earlier("old_t4", "k9", "k9", {"status": "completed", "metrics": {}})   # known already
    assert ledger.propose("p0", _trial(0.5), "k1", "k1")["kind"] == rules.NEW
    assert ledger.propose("p1", _trial(0.5), "k1", "k1")["kind"] == rules.SKIPPED
    assert ledger.propose("p2", _trial(0.5), "k9", "k9")["kind"] == rules.SKIPPED
    assert ledger.proposals == 2   # its own repeat is no proposal; an earlier campaign's configuration is
    sampled = Ledger()
    sampled.earlier("old_t3", "k9", "k9", {"status": "completed", "metrics": {}})
    warm = sampled.propose("p0", _trial(0.5), "k9", "k9")
    assert warm["kind"] == rules.DUPLICATE and warm["of"] == "old_t3" and sampled.known(warm)["status"] == "completed"


def test_a_measured_cost_is_waited_for_then_judged():
    ledger = Ledger([Constraint("latency_ms", max=5.0)])
    rec = ledger.propose("p0", _trial(0.5, measured_key="m0"), "k0", "k0", measure=True)
    assert rec["kind"] == rules.MEASURING and ledger.parked(rules.MEASURING)[0]["measured"] == "m0"
    slow = ledger.measured("p0", "t1", ({"latency_ms": 9.0}, {"how": "cpu"}))
    assert slow["kind"] == rules.INFEASIBLE and "latency_ms" in slow["error"] and not ledger.parked(rules.MEASURING)
    ledger.propose("p1", _trial(0.5, measured_key="m1"), "k1", "k1", measure=True)
    fast = ledger.measured("p1", "t2", ({"latency_ms": 2.0}, {"how": "cpu"}))
    assert fast["kind"] == rules.NEW and fast["id"] == "t2" and fast["trial"]["cost"]["latency_ms"] == 2.0
    assert fast["trial"]["measured_on"] == {"how": "cpu"}
    failed = ledger.propose("p2", _trial(0.5), "k2", "k2", found="measuring: out of memory")
    assert failed["kind"] == rules.MEASURE_ERROR and ledger.first["k2"] == "p2"   # its failure is reused
    ledger.end("p2", {"status": "failed", "metrics": {}})
    assert ledger.propose("p3", _trial(0.5), "k2", "k2")["kind"] == rules.DUPLICATE


def test_policies_share_a_training_and_wait_for_it_unless_each_variant_is_work_of_its_own():
    shared = Ledger()
    assert shared.propose("t0", _trial(0.5), "k", "k{}")["kind"] == rules.NEW
    assert shared.propose("t1", _trial(0.5), "k", 'k{"quant_mlp": "int8"}')["kind"] == rules.WAITING
    assert shared.ready() is None
    shared.end("t0", {"status": "completed", "metrics": {"top1": 1.0}})
    (waiting,) = [shared.ready()]
    policy = shared.trained(waiting["id"], "t2")
    assert policy["kind"] == rules.POLICY and policy["of"] == "t0" and shared.known(policy)["metrics"] == {"top1": 1.0}
    own = Ledger(share_training=False)   # one-shot: each policy of a subnet is scored
    own.propose("s0", _trial(0.5), "k{}", "k{}")
    assert own.propose("s1", _trial(0.5), 'k{"quant_mlp": "int8"}', 'k{"quant_mlp": "int8"}')["kind"] == rules.NEW


def test_the_ledger_is_plain_data_and_restores_its_indexes():
    ledger = Ledger()
    ledger.earlier("old", "k0", "k0", {"status": "completed", "metrics": {}})
    ledger.propose("t0", _trial(0.5), "k1", "k1{}")
    ledger.propose("t1", _trial(0.5, measured_key="m"), "k2", "k2{}", measure=True)
    ledger.rename("t1", "t1-measuring-3")
    again = Ledger()
    again.restore(json.loads(json.dumps(ledger.state())))
    assert again.records == ledger.records and again.first == ledger.first == {"k0": "old", "k1": "t0"}
    assert again.variants == {"k0": "old", "k1{}": "t0"} and [r["id"] for r in again.parked(rules.MEASURING)] \
        == ["t1-measuring-3"]
    assert again.propose("t2", _trial(0.5), "k1", "k1{}")["kind"] == rules.DUPLICATE
