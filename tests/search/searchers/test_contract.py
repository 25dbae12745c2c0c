"""Contract tests over the searcher registry (search.searchers.SEARCHERS), as timm's tests run over its model
registry: every name a campaign file may give has a searcher; every hook the proposal wrapper calls is declared
on the base class; and every searcher, stopped with a trial still running and rebuilt from its plain saved
state, proposes exactly what it would have proposed without the stop."""
from __future__ import annotations

import ast
import inspect
import json

import pytest

from qkvsearch.search.campaign.assemble import build_search
from qkvsearch.search.searchers import SEARCHERS, searcher_class
from qkvsearch.search.searchers import base as base_module
from qkvsearch.search.searchers import proposals as proposals_module
from qkvsearch.search.searchers.base import Searcher
from qkvsearch.spaces import load_campaign
from qkvsearch.spaces.search_options import ALGORITHMS

SPEC = {"name": "c", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16}, "train": {"epochs": 1},
        "space": {"embedding": ["linear", "sne", "psne", "fsne"], "hidden_width": [0.25, 0.5, 1.0],
                  "code_size": [4, 8]},
        "objectives": ["top1", {"metric": "params_m", "mode": "min"}],
        "constraints": {"params_m": {"max": 3.0}}}


def test_every_algorithm_a_campaign_may_name_has_a_searcher():
    assert set(SEARCHERS) == set(ALGORITHMS)
    for name in SEARCHERS:
        cls = searcher_class(name)
        assert issubclass(cls, Searcher) and cls.name == name
        for hook in ("suggest", "on_trial_complete", "state", "restore"):  # what the base leaves to each
            assert getattr(cls, hook) is not getattr(Searcher, hook), f"{name} does not implement {hook}"
    with pytest.raises(ValueError, match="search.algorithm: expected one of "
                                         "grid, random, tpe, nsga2, gp, ehvi, mfehvi"):
        searcher_class("bayes")


def test_the_wrapper_calls_only_hooks_the_base_class_declares():
    declared = {n for n, _ in inspect.getmembers(Searcher, inspect.isfunction)}
    called = {node.attr for node in ast.walk(ast.parse(inspect.getsource(proposals_module)))
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "inner"}
    assert called and called <= declared | {"problem", "name"}, called - declared
    assert "hasattr(" not in inspect.getsource(proposals_module) + inspect.getsource(base_module)


def _spec(algorithm: str):
    search = {"algorithm": algorithm, "seed": 2}
    if algorithm != "grid":
        search.update(num_trials=8)
    if algorithm in ("gp", "ehvi", "mfehvi"):
        search.update(n_startup_trials=3)
    return load_campaign({**SPEC, "search": search})


def _result(trial: dict) -> dict:
    cfg = trial["config"]
    top1 = 50 + 10 * (cfg.get("hidden_width") or 0) + (cfg.get("code_size") or 0) + len(cfg["embedding"])
    return {"top1": float(top1), **trial["cost"], "epoch": 1.0, "qs_epochs_planned": 1.0}


def _drive(searcher, start: int, stop: int, running: dict) -> list[str]:
    """Ask for trials start..stop-1, one running beside the next; each ends when the one after it starts."""
    out = []
    for i in range(start, stop):
        trial = searcher.suggest(f"t{i}")
        if not isinstance(trial, dict):
            out.append(str(trial))
            continue
        out.append(json.dumps(trial["config"], sort_keys=True, default=str) + str(trial.get("duplicate_of")))
        for tid, earlier in list(running.items()):
            searcher.on_trial_complete(tid, _result(earlier))
            del running[tid]
        running[f"t{i}"] = trial
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_restored_searcher_proposes_what_it_would_have_without_the_stop(algorithm, tmp_path):
    spec = _spec(algorithm)
    n = min(8, spec.search.num_trials)
    whole = build_search(spec)
    expected = _drive(whole, 0, n, {})

    first, running = build_search(spec), {}
    before = _drive(first, 0, n // 2, running)
    path = tmp_path / "searcher-state-x.pkl"  # Tune's name for it; the content is plain JSON
    first.save(str(path))
    assert json.loads(path.read_text())["format"] == "qkvsearch-searcher-state"
    again = build_search(spec)  # built anew from the spec, as a resumed driver builds it
    again.restore(str(path))
    assert again.live == set(running) and again.infeasible == first.infeasible
    after = _drive(again, n // 2, n, running)
    assert before + after == expected
