"""Faults injected on purpose, to test how a campaign records failures: never part of a spec.

Tests set the environment variable ``QKVSEARCH_FAULTS`` in the process that starts a run (the campaign's
driver, or ``run_trainer``'s caller); the run carries what it read to its workers. Its value is JSON, a
list of rules; a rule applies to a trial whose config matches every key of its ``when``::

    [{"when": {"embedding": "sne"}, "nan_at_update": 2},     # that update's loss becomes NaN
     {"when": {"embedding": "psne"}, "fail_after_epoch": 1}]  # raise SimulatedFailure after epoch 1
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping

ENV = "QKVSEARCH_FAULTS"
ACTIONS = ("nan_at_update", "fail_after_epoch")


def read_faults() -> list[dict]:
    """The rules in $QKVSEARCH_FAULTS ([] when unset); ValueError naming the variable when malformed."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return []
    rules = json.loads(text)
    rules = [rules] if isinstance(rules, dict) else rules
    for rule in rules:
        if not isinstance(rule, dict) or set(rule) - {"when", *ACTIONS} or not isinstance(rule.get("when", {}), dict):
            raise ValueError(f"{ENV}: expected a list of {{when: {{key: value}}, {' | '.join(ACTIONS)}: int}}, "
                             f"given {text[:200]!r}")
    return rules


def faults_for(cfg: Mapping, rules: list[dict]) -> dict:
    """{action: int or None} for the trial with config ``cfg``: the first matching rule per action."""
    out = dict.fromkeys(ACTIONS)
    for rule in rules:
        if all(cfg.get(k) == v for k, v in rule.get("when", {}).items()):
            for action in ACTIONS:
                if out[action] is None and rule.get(action) is not None:
                    out[action] = int(rule[action])
    return out
