"""Campaign folders saved before searcher state was plain data (search.searchers.state): their pickles, read.

Until then Tune pickled the searcher's objects whole: ``tuner.pkl`` (the searcher as launched),
``search_gen_state-*.json`` (the proposal wrapper ``TrialConfigs``'s attributes) and ``searcher-state-*.pkl``
(the searcher's own attributes: an Optuna study, ehvi's progress, grid's count as JSON). The classes they name
are kept here as ``Pickled`` placeholders, importable at the old module paths (qkvsearch._legacy), which take any
attributes an old pickle gives them; ``convert`` turns those attributes into today's plain state, which the
searcher built anew from the campaign's spec restores. Nothing else reads these names.
"""
from __future__ import annotations

import glob
import json
import os

from qkvsearch.search.searchers.optuna_samplers import plain_trial, random_states

WRAPPER_STATE = "search_gen_state-*.json"   # Tune's SearchGenerator.CKPT_FILE_TMPL (a cloudpickle)


class Pickled:
    """An object of a class qkvsearch no longer has, as an old pickle holds it: its attributes, nothing more."""

    def __setstate__(self, state) -> None:
        if isinstance(state, tuple):  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        self.__dict__.update(state or {})


# The searcher classes of earlier versions (search.campaign.searchers, search.campaign.known_cost, and the flat
# search.searchers before that).
class TrialConfigs(Pickled):
    pass


class CampaignOptunaSearch(Pickled):
    pass


class GridSearcher(Pickled):
    pass


class KnownCostSearch(Pickled):
    pass


class KnownCostEHVI(Pickled):
    pass


class Teller(Pickled):
    pass


def _record_proposal(*args, **kwargs) -> None:
    """The infeasible-proposal writer an old wrapper held (a resumed campaign gets today's)."""


def _load(path: str):
    import ray.cloudpickle as pickle

    with open(path, "rb") as f:
        return pickle.load(f)


def convert(path: str, algorithm: str, data: bytes | None = None) -> dict:
    """{"proposals", "searcher"}: today's plain state from the old searcher state file at ``path`` and the
    wrapper state Tune saved beside it."""
    folder = os.path.dirname(path)
    found = glob.glob(os.path.join(folder, WRAPPER_STATE))
    wrapper = _load(max(found)).get("name:TrialConfigs", {}) if found else {}
    inner = json.loads(data) if data is not None and data.lstrip().startswith(b"{") else _load(path)
    if algorithm == "grid":
        searcher = {"next": int(inner["next"])}
    elif algorithm == "ehvi":
        searcher = _ehvi(inner if isinstance(inner, dict) else vars(inner))
    else:
        searcher = _optuna(inner if isinstance(inner, dict) else vars(inner))
    return {"proposals": _wrapper(wrapper), "searcher": searcher}


def _wrapper(w: dict) -> dict:
    """The proposal wrapper's bookkeeping (attributes an older version lacked start empty)."""
    measurer = w.get("measurer")
    return {"first": dict(w.get("first", {})), "identity_of": dict(w.get("identity_of", {})),
            "outcomes": dict(w.get("outcomes", {})), "warm": sorted(w.get("warm", ())), "started": True,
            "proposals": int(w.get("proposals", 0)), "infeasible": int(w.get("infeasible", 0)),
            "waiting": [list(x) for x in w.get("waiting", [])], "live": sorted(w.get("live", ())),
            "measured": measurer.state() if measurer is not None and hasattr(measurer, "state") else None}


def _optuna(inner: dict) -> dict:
    import optuna

    study = inner["_ot_study"]
    trials = study.get_trials(deepcopy=False)
    running = {t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING}
    teller = inner.get("teller")
    told = vars(teller) if teller is not None else {}
    # A study kept in a tracker's storage comes back connected to it: its trials are read there, so a
    # resumed study that now lives elsewhere (a relative path, now inside the campaign folder) starts with them.
    return {"trials": [plain_trial(t) for t in trials],
            "proposed": {tid: t.number for tid, t in inner.get("_ot_trials", {}).items() if t.number in running},
            "worst": dict(told.get("worst", {})),
            "waiting": [[ot.number, dict(cost)] for _, ot, cost in told.get("waiting", [])],
            "rng": random_states(inner["_sampler"]) if inner.get("_sampler") is not None else {}}


def _ehvi(inner: dict) -> dict:
    progress = inner.get("progress")
    core = inner.get("core")
    if progress is None and core is not None:  # pickled whole, before its progress was kept apart
        progress = vars(core)
    if not progress:
        return {"core": None, "proposed": {}}
    kernel = progress.get("kernel")
    return {"by_index": True,
            "core": {"results": [[int(i), float(v)] for i, v in progress["results"].items()],
                     "tried": sorted(int(i) for i in progress["tried"]),
                     "running": sorted(int(i) for i in progress["running"]),
                     "rng": progress["rng"].bit_generator.state,
                     "kernel": None if kernel is None else [float(t) for t in kernel.theta]},
            "proposed": {tid: int(i) for tid, i in inner.get("trial_of", {}).items()}}
