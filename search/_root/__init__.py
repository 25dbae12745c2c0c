"""qkvsearch: distributed search over the query/key/value embedding of vision transformers.

The source folders ``search/``, ``spaces/`` and ``trainers/`` install as ``qkvsearch.search``,
``qkvsearch.spaces`` and ``qkvsearch.trainers``; this module is the package root (pyproject.toml maps
it). After ``import qkvsearch`` timm knows the ``qkv_<timm name>`` models::

    import qkvsearch, timm
    model = timm.create_model("qkv_xcit_nano_12_p16_224", embedding="fsne", code_size=8)

Public API: ``build_model(cfg)``, ``model_cost(cfg)``, ``load_campaign(path)``.

Importing the package stays light (no torch, no timm): Ray's controller and trial processes import
``qkvsearch.*`` modules on the path to a trial's first step. The models are registered when timm is
imported (at once if it already is).
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys

from qkvsearch import _legacy

__all__ = ["build_model", "load_campaign", "model_cost"]


def __getattr__(name: str):
    if name == "build_model":
        from qkvsearch.trainers.model.models import build_model

        return build_model
    if name == "model_cost":
        from qkvsearch.trainers.model.cost import model_cost

        return model_cost
    if name == "load_campaign":
        from qkvsearch.spaces import load_campaign

        return load_campaign
    raise AttributeError(f"module 'qkvsearch' has no attribute {name!r}")


def _register_models() -> None:
    import qkvsearch.trainers.model.registry  # noqa: F401  (registers qkv_* with timm on import)


# Loaded by timm where installed, for its training scripts' summary logging (timm.utils.summary), which qkvsearch
# never calls. Importing it costs ~0.3 CPU-s and 20 MB in every process that imports timm (a Train worker, a
# scorer, a measurement, a driver; benchmarks/README.md), and W&B makes two temp folders at import that a process
# ending without its exit handlers (as Ray's workers do) leaves in /tmp. qkvsearch's W&B tracker imports it
# itself, where a campaign tracks to W&B.
TIMM_OPTIONAL_SKIPPED = ("wandb",)


@contextlib.contextmanager
def _absent(names):
    """While inside, ``import <name>`` raises ImportError for each of ``names`` not imported already."""
    hidden = [n for n in names if n not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # the import system's mark of a module known to be missing
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]


class _RegisterAfterTimm(importlib.abc.MetaPathFinder):
    """Finds timm like the rest of sys.meta_path, then registers our models once timm has loaded; timm loads
    without its optional trackers (TIMM_OPTIONAL_SKIPPED)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "timm":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("timm")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            with _absent(TIMM_OPTIONAL_SKIPPED):
                exec_module(module)
            _register_models()

        spec.loader.exec_module = exec_then_register
        return spec


_legacy.install()  # earlier module paths (search's and trainers' flat layouts) stay importable

if "timm" in sys.modules:
    _register_models()
elif not any(isinstance(f, _RegisterAfterTimm) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterTimm())
