"""Module paths of earlier layouts, kept importable: the flat ``search/`` before it had layers, and the flat
``trainers/`` before its sub-packages by role. A campaign folder holds what was pickled with them: Ray Tune
pickles class paths into ``tuner.pkl`` (the recorder, the stop callback, the scheduler, the searcher, the
trial namer), so a campaign launched before a move must still ``resume``; and scripts, notebooks and
``python -m qkvsearch.trainers.loop`` name the old modules. New code and new campaigns use the new paths.

An old module path resolves to a module whose attributes are those of its new home; an old name on a
package that now stands where a module stood (``records``, ``campaign``) resolves through that
package's ``__getattr__``.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

# old module -> new module: every attribute of the old one is found on the new one
MODULES = {
    "qkvsearch.search.storage": "qkvsearch.storage",
    "qkvsearch.search.schedulers": "qkvsearch.search.scheduling.tune_schedulers",
    "qkvsearch.search.interrupts": "qkvsearch.search.campaign.interrupts",
    "qkvsearch.search.driver": "qkvsearch.search.campaign.driver",
    "qkvsearch.search.bridge": "qkvsearch.search.campaign.bridge",
    # searchers whose objects were pickled whole: read as placeholders (search.searchers.legacy)
    "qkvsearch.search.campaign.searchers": "qkvsearch.search.searchers.legacy",
    "qkvsearch.search.campaign.known_cost": "qkvsearch.search.searchers.legacy",
}
# trainers/ by role: old module (or package, with everything under it) -> its home now
_TRAINERS = {
    "model": ("models", "hosts", "architecture", "choices", "embeddings", "embedding_forms", "registry", "cost",
              "paper_counts", "quantize", "attention"),
    "data": ("sources", "shard_index", "shard_deal", "shard_source", "hf_folder"),
    "training": ("engine", "checkpoints", "faults", "errors", "cli"),
    "ray_train": ("loop",),
    "deploy": ("measure", "policy_eval"),
    "stages": ("transfer", "ood_metrics"),
}
MOVED = {f"qkvsearch.trainers.{old}": f"qkvsearch.trainers.{role}.{old}" for role, olds in _TRAINERS.items()
         for old in olds}
MOVED["qkvsearch.trainers.data_sources"] = "qkvsearch.trainers.data.formats"
MOVED["qkvsearch.trainers.training.loop"] = "qkvsearch.trainers.ray_train.loop"   # before ray_train/ had a role
# (package that replaced a module, name) -> the module that holds the name now
NAMES = {
    ("qkvsearch.search.records", "TrialRecorder"): "qkvsearch.search.campaign.recording",
    ("qkvsearch.search.campaign", "_Describe"): "qkvsearch.search.campaign.run",
}
# package that replaced a module -> the module that holds every old name of it (the flat search.searchers)
PACKAGES = {"qkvsearch.search.searchers": "qkvsearch.search.searchers.legacy",
            "qkvsearch.trainers.data": "qkvsearch.trainers.data.datasets"}


def attribute(package: str, name: str):
    """The object an old pickle names as ``<package>.<name>``; AttributeError when it names none."""
    home = NAMES.get((package, name)) or PACKAGES.get(package)
    if home is None or name.startswith("__") or importlib.util.find_spec(f"{package}.{name}") is not None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")  # (a submodule: imported as one)
    return getattr(importlib.import_module(home), name)


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        target = self.target
        module.__getattr__ = lambda name: getattr(importlib.import_module(target), name)

    def get_code(self, fullname):
        """The new module's code, for ``python -m <old path>`` (runpy runs it as __main__)."""
        return importlib.util.find_spec(self.target).loader.get_code(self.target)


def _home(fullname: str) -> str | None:
    """The module an old path stands for now: MODULES, or MOVED for the module or package it is in."""
    if fullname in MODULES:
        return MODULES[fullname]
    for old, new in MOVED.items():
        if fullname == old or fullname.startswith(old + "."):
            return new + fullname[len(old):]
    return None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        home = _home(fullname)
        if home is None:
            return None
        new = importlib.util.find_spec(home)
        # an old package's path stays a package, so that its old submodule paths are asked of this finder
        return importlib.machinery.ModuleSpec(fullname, _Alias(home),
                                              is_package=new is not None and new.submodule_search_locations is not None)


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())  # last: only names no file answers
