"""Module paths of the flat layout before ``search/`` had layers, kept importable for what a campaign
folder pickled with them: Ray Tune pickles class paths into ``tuner.pkl`` (the recorder, the stop
callback, the scheduler, the searcher, the trial namer), so a campaign launched before the move must
still ``resume``. Nothing else imports these names: new campaigns pickle the new paths.

An old module path resolves to a module whose attributes are those of its new home; an old name on a
package that now stands where a module stood (``records``, ``campaign``) resolves through that
package's ``__getattr__``.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
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
# (package that replaced a module, name) -> the module that holds the name now
NAMES = {
    ("qkvsearch.search.records", "TrialRecorder"): "qkvsearch.search.campaign.recording",
    ("qkvsearch.search.campaign", "_Describe"): "qkvsearch.search.campaign.run",
}
# package that replaced a module -> the module that holds every old name of it (the flat search.searchers)
PACKAGES = {"qkvsearch.search.searchers": "qkvsearch.search.searchers.legacy"}


def attribute(package: str, name: str):
    """The object an old pickle names as ``<package>.<name>``; AttributeError when it names none."""
    home = NAMES.get((package, name)) or PACKAGES.get(package)
    if home is None or name.startswith("__"):
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        target = self.target
        module.__getattr__ = lambda name: getattr(importlib.import_module(target), name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MODULES:
            return importlib.machinery.ModuleSpec(fullname, _Alias(MODULES[fullname]))
        return None


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())  # last: only names no file answers
