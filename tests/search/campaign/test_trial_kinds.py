"""What a trial runs in its process follows its proposal's kind (search.searchers.ledger), read from one table
(search.campaign.driver.RUNS); a trial Tune saved before trials carried their kind is told by the key it held."""
import json

import pytest
from helpers import REPO

from qkvsearch.search.campaign.driver import RUNS, trial_kind
from qkvsearch.search.searchers import ledger as rules

SAVED = sorted((REPO / "tests" / "fixtures").glob("*/*/experiment_state-*.json"))


def test_every_kind_a_proposal_becomes_a_trial_as_has_a_run():
    # skipped and infeasible proposals take no trial; parked ones wait under a name of their own
    assert set(RUNS) == set(rules.KINDS) - {rules.SKIPPED, rules.INFEASIBLE, *rules.PARKED}


@pytest.mark.parametrize("trial, kind", [
    ({"config": {}, "cost": {}}, rules.NEW),
    ({"config": {}, "cost": {}, "duplicate_of": "a1", "known": None}, rules.DUPLICATE),
    ({"config": {}, "cost": {}, "trained_by": "a1"}, rules.POLICY),
    ({"config": {}, "cost": {}, "invalid": "no model"}, rules.INVALID),
    ({"config": {}, "cost": {}, "measure_error": "out of memory"}, rules.MEASURE_ERROR),
    ({"config": {}, "cost": {}, "kind": rules.POLICY, "trained_by": "a1"}, rules.POLICY),
])
def test_a_trial_saved_before_kinds_is_told_by_the_key_it_holds(trial, kind):
    assert trial_kind(trial) == kind


def test_the_trials_earlier_campaigns_saved_each_have_a_run():
    assert len(SAVED) >= 8
    kinds = set()
    for path in SAVED:
        for saved, _ in json.loads(path.read_text())["trial_data"]:
            trial = json.loads(saved)["config"]
            kinds.add(trial_kind(trial))
    assert kinds <= set(RUNS) and rules.NEW in kinds
