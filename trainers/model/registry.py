"""The ``qkv_<timm name>`` models, registered with timm: ``timm.create_model("qkv_xcit_nano_12_p16_224",
embedding="fsne", code_size=8)`` builds timm's model with that q/k/v embedding (trainers.model.models).

Also a few shrunk timm models a laptop's CPU trains in minutes (``SMALL_MODELS``), registered as timm entrypoints
of their own: ``swin_pico_patch2_window4_32``, a two-stage Swin for 32 px images (the swin-digits preset).

Importing this module imports timm and nothing of ours that imports timm, so it can run while timm
itself finishes importing (``import qkvsearch`` registers the models that way).
"""
from __future__ import annotations

import timm
from timm.models import register_model

from qkvsearch.spaces.checks import REGISTERED_PREFIX
from qkvsearch.spaces.keys import names

__all__: list[str] = []  # timm adds each registered entrypoint's name


def register_qkv_model(name: str) -> str:
    """Register ``qkv_<name>`` with timm (idempotent); returns the registered name.

    Keyword arguments of ``timm.create_model("qkv_<name>", ...)`` that are embedding keys (embedding,
    hidden_width, code_size, code_sharing, activation, embed_class_attn, width) choose the embedding;
    the attention-design keys (attention, attn_features, attn_proj_len, attn_landmarks, pos_embed,
    patch_embed, key, key_charts, key_aggregation, key_context) the architecture (trainers.model.architecture);
    the others (the macro shape: depth, embed_dim, num_heads, mlp_ratio, patch_size) go to timm's ``<name>``.
    """
    reg = REGISTERED_PREFIX + name
    if reg in globals() and timm.is_model(reg):
        return reg

    def entrypoint(pretrained: bool = False, **kwargs):
        from qkvsearch.spaces.blocks import base_key
        from qkvsearch.spaces.keys import DESIGN_KEYS, fill
        from qkvsearch.trainers.model.architecture import Arch
        from qkvsearch.trainers.model.models import (  # timm has finished importing by now
            apply_embedding,
            create_host,
        )

        embedding_keys = {k: kwargs.pop(k) for k in [*kwargs] if base_key(k) in (*names("embedding"), "width")}
        # per-block keys too: timm.create_model(..., **{"embedding.0": "sne"})
        design = {k: kwargs.pop(k) for k in DESIGN_KEYS if k in kwargs}
        if pretrained or not design:
            model = timm.create_model(name, pretrained=pretrained, **kwargs)
        else:
            arch = Arch.from_cfg(fill({"model": name, **design, **embedding_keys}, ("model", "embedding")))
            model = create_host(name, arch, kwargs)
        return apply_embedding(model, **embedding_keys)

    entrypoint.__name__ = entrypoint.__qualname__ = reg
    entrypoint.__doc__ = f"timm {name} with a chosen q/k/v embedding (see trainers.model.models)."
    globals()[reg] = entrypoint  # timm lists it in this module's __all__, so it must exist here
    register_model(entrypoint)
    return reg


_DEFAULT_HOSTS = [f"{f}_{s}_patch16_224" for f in ("vit", "deit") for s in ("tiny", "small", "base")]
for _name in timm.list_models("xcit_*") + _DEFAULT_HOSTS:
    register_qkv_model(_name)


# name -> (timm module, its model builder, the shape, the input size): each registered as a timm entrypoint
SMALL_MODELS = {
    "swin_pico_patch2_window4_32": (
        "swin_transformer", "_create_swin_transformer",
        dict(img_size=32, patch_size=2, window_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4)), 32),
}


def register_small_model(name: str, spec: tuple | None = None) -> str:
    """Register one of SMALL_MODELS (or ``spec``, one like theirs) with timm (idempotent): timm's own class, built
    at a shape of our choosing by its module's builder."""
    if name in globals() and timm.is_model(name):
        return name
    module, builder, shape, size = spec or SMALL_MODELS[name]

    def entrypoint(pretrained: bool = False, **kwargs):
        import importlib

        if pretrained:
            raise ValueError(f"{name}: qkvsearch's shrunk {module} model has no pretrained weights")
        build = builder if callable(builder) else getattr(importlib.import_module(f"timm.models.{module}"), builder)
        cfg = dict(architecture=name, input_size=(3, size, size), num_classes=1000, mean=(0.485, 0.456, 0.406),
                   std=(0.229, 0.224, 0.225), first_conv="patch_embed.proj", classifier="head.fc")
        cfg |= kwargs.pop("pretrained_cfg", None) or {}   # timm.create_model passes its own (None)
        return build(name, pretrained=False, pretrained_cfg=cfg, **{**shape, **kwargs})

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__doc__ = f"timm's {module} model shrunk by qkvsearch: {shape} at {size} px (no pretrained weights)."
    entrypoint.timm_module = module   # the family it is a model of (trainers.model.choices.timm_module)
    globals()[name] = entrypoint
    register_model(entrypoint)
    return name


for _name in SMALL_MODELS:
    register_small_model(_name)
