"""Searchers, a layer of their own: what proposes the configurations a campaign trains, and learns from
how each trial ended. The campaign (search.campaign) assembles one; `qkvsearch simulate`
(search.simulation) replays one on recorded curves; neither is imported here.

    base             the hooks every searcher has (Searcher) and the problem it searches (Problem)
    grid             grid: every configuration in order
    optuna_samplers  random, tpe, nsga2, gp: an Optuna sampler asking and telling a study
    ehvi             ehvi: a model of the training objective, EHVI with the costs counted or measured before
                     training (ehvi_core: the search over candidates; surrogate: the models; hvi: the EHVI)
    mfehvi           mfehvi: ehvi whose model learns every epoch a trial reached (for MO-ASHA)
    outcomes         how a finished trial ended, as every searcher learns it
    problem          a campaign spec's problem; a suggestion made into a trial (build_trial)
    earlier          a warm start's results from an earlier campaign
    proposals        Proposals, the searcher as Ray Tune drives it: duplicates, constraints, measuring
    repeated         search.repeats for a searcher that does not repeat its proposals itself (all but grid)
    state, legacy    the saved state as versioned plain data; pickles of earlier versions read

``SEARCHERS`` (spaces.search_options, where a campaign file's names are declared) maps each name to its class,
imported when asked for (Ray Tune's search/__init__.py pattern).
"""
from __future__ import annotations

import importlib

from qkvsearch.spaces.search_options import SEARCHERS


def searcher_class(name: str):
    """The searcher class registered under ``name``; ValueError listing the names otherwise."""
    if name not in SEARCHERS:
        raise ValueError(f"search.algorithm: expected one of {', '.join(SEARCHERS)}, given {name!r}")
    module, _, cls = SEARCHERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def make_searcher(name: str, problem):
    """A new searcher of that name for the problem (search.searchers.base.Problem). With ``problem.repeats`` > 1, one
    that does not repeat its proposals itself is wrapped to (search.searchers.repeated), and plans
    num_trials / repeats proposals."""
    cls = searcher_class(name)
    if problem.repeats <= 1 or cls.repeats_itself:
        return cls(problem)
    from dataclasses import replace

    from qkvsearch.search.searchers.repeated import Repeated

    proposals = None if problem.num_trials is None else max(1, problem.num_trials // problem.repeats)
    return Repeated(cls(replace(problem, num_trials=proposals)), problem.repeats, problem.train_seed)


def __getattr__(name: str):
    from qkvsearch import _legacy  # class names of the flat layout's search.searchers module

    return _legacy.attribute(__name__, name)
