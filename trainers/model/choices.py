"""The registries: each choice table of spaces.choices with its names resolved to the classes that build
them (``MIXERS["performer"]`` is ``trainers.model.attention.performer.Performer``).

spaces holds the one table of names, each with its class as a ``"module:Class"`` string (spaces lies
below trainers and loads neither torch nor timm); a registry here imports a class the first time its name
is looked up, so importing one choice never imports the others' modules. An unknown name raises the
ConfigError of its key, listing the known names.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from functools import lru_cache

from qkvsearch.spaces.choices import FAMILIES as FAMILY_TABLE
from qkvsearch.spaces.choices import PRECISION_CHOICES, TABLES, TIMM, VIT
from qkvsearch.spaces.errors import show
from qkvsearch.spaces.keys import ConfigError
from qkvsearch.spaces.keys import model_family as _family

__all__ = ["EMBEDDINGS", "FAMILIES", "KEY_TYPES", "MIXERS", "POSITIONS", "PRECISIONS", "STEMS", "Registry",
           "embedding_classes", "family_name", "family_of"]


def _load(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class Registry(Mapping):
    """name -> class of one choice key, resolved on first use; iterates in the table's order."""

    def __init__(self, key: str, targets: Mapping[str, str]):
        self.key, self._targets, self._classes = key, dict(targets), {}

    def __getitem__(self, name: str) -> type:
        if name not in self._targets:
            raise ConfigError(f"{self.key}: expected one of {', '.join(self._targets)}, given {show(name)}")
        if name not in self._classes:
            self._classes[name] = _load(self._targets[name])
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)


def _registry(key: str) -> Registry:
    return Registry(key, {n: c.target for n, c in TABLES[key].items()})


EMBEDDINGS = _registry("embedding")
MIXERS = _registry("attention")
POSITIONS = _registry("pos_embed")
STEMS = _registry("patch_embed")
KEY_TYPES = _registry("key")
FAMILIES = Registry("model", {n: f.target for n, f in FAMILY_TABLE.items()})
PRECISIONS = Registry("quant", {n: c.target for n, c in PRECISION_CHOICES.items()})   # every quant_* key


# timm modules whose models are VisionTransformer (or a subclass): the ViT family's host; any other timm transformer
# the name family leaves to ViT is served as itself (hosts.Timm)
VIT_MODULES = ("vision_transformer", "deit", "vision_transformer_hybrid")


def timm_module(model: str) -> str:
    """The timm module that defines a model name ("swin_transformer"), or "timm" for a name timm does not know."""
    from timm.models import get_arch_name, is_model, model_entrypoint

    from qkvsearch.spaces.checks import REGISTERED_PREFIX

    name = get_arch_name(model.removeprefix(REGISTERED_PREFIX))
    if not is_model(name):
        return "timm"
    entrypoint = model_entrypoint(name)   # qkvsearch's shrunk models say whose model they are
    return getattr(entrypoint, "timm_module", entrypoint.__module__.rpartition(".")[2])


@lru_cache(maxsize=1024)
def family_name(model: str) -> str:
    """The family of a timm model name: spaces.keys.model_family's, where timm's module of a ``vit`` name tells a
    VisionTransformer from any other timm transformer (``timm``)."""
    name = _family(model)
    if name == VIT:
        if timm_module(model) not in VIT_MODULES:
            return TIMM
    return name


def family_of(model: str) -> type:
    """The host class (trainers.model.hosts) of a timm model name's family."""
    return FAMILIES[family_name(model) if isinstance(model, str) else _family(model)]


def embedding_classes() -> tuple[type, ...]:
    """Every q/k/v embedding's class (the modules a model's embeddings are instances of)."""
    return tuple(EMBEDDINGS[name] for name in EMBEDDINGS)
