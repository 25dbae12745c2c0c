"""Module paths of earlier layouts (qkvsearch._legacy) each import what they name: every public name of the module
that holds it now, reached through the old path, and `python -m qkvsearch.trainers.loop` runs the plain path as
before. A path that could not would be dropped from _legacy and from the docs (docs/pages/extending.md)."""
import importlib
import subprocess
import sys
import types

import pytest

from qkvsearch import _legacy

PATHS = sorted({**_legacy.MODULES, **_legacy.MOVED}.items())


@pytest.mark.parametrize(("old", "new"), PATHS, ids=[old for old, _ in PATHS])
def test_an_earlier_module_path_imports_every_name_of_its_new_home(old, new):
    home = importlib.import_module(new)
    earlier = importlib.import_module(old)
    names = [n for n in vars(home) if not n.startswith("_")]
    assert names and [n for n in names if not _same(getattr(earlier, n), getattr(home, n))] == []


def _same(old, new) -> bool:
    """The object itself, or for a submodule of a package: the old submodule path's alias of it (which the old
    package holds as its attribute once anything in the process imported that path)."""
    if old is new:
        return True
    return isinstance(new, types.ModuleType) and isinstance(old, types.ModuleType) and \
        _legacy._home(old.__name__) == new.__name__


@pytest.mark.parametrize(("package", "name"), sorted(_legacy.NAMES))
def test_an_earlier_name_on_a_package_that_replaced_a_module_is_found(package, name):
    assert getattr(importlib.import_module(package), name) is getattr(
        importlib.import_module(_legacy.NAMES[(package, name)]), name)


def test_the_earlier_plain_path_command_still_runs():
    out = subprocess.run([sys.executable, "-m", "qkvsearch.trainers.loop", "--help"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "--config" in out.stdout, out.stderr[-2000:]
