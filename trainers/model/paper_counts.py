"""The Vision X-formers paper's CIFAR-10 parameter counts (Jeevan & Sethi 2021) beside ours: its counting
rule and its printed figures.

The paper counted with ``torchsummary``: the ``weight`` and the ``bias`` of every module whose forward
runs, once per call (the model itself, nn.Sequential and nn.ModuleList are not hooked). Bare
nn.Parameters, such as a learned position table, the class token and Linformer's sequence projection,
are not counted. ``summary_params(model, x)`` applies that rule with forward hooks;
``paper_rule_params(config)`` applies it to the model of a resolved trial config, built on the meta
device. ``paper_params(config)`` is the paper's printed count of the design the config is, at the
paper's size (results/reference/vision_xformers_cifar10.csv, package data ``qkvsearch.reference``),
or None. ``paper_figures(config)`` gives both, for ``qkvsearch cost``.

A config is one of the paper's designs when it builds what the paper's code builds: its Linformer with one
key/value head shared by the query heads (``linformer_shared_kv``) beside learned positions and one per query
head (``linformer_shared_kv_heads``) beside RoPE, as its ViL.py and ViLRoPE.py set ``one_kv_head``; and q/k/v
projections without a bias in its ViT, Linformer and Nystromformer, with one in its Performer (performer-pytorch's
default then), as ``PAPER_QKV_BIAS`` says (``qkv_bias``; null is timm's own, a bias). FNet and the MLP-Mixer have
no q/k/v projection.
"""
from __future__ import annotations

import csv
import inspect
from functools import cache
from importlib import resources

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from qkvsearch.spaces.choices import MIXER, VIT
from qkvsearch.spaces.keys import ATTENTION_SIZE_KEY, model_family
from qkvsearch.trainers.model.cost import input_size
from qkvsearch.trainers.model.models import build_model

__all__ = ["paper_figures", "paper_params", "paper_row", "paper_rule_params", "reference_rows", "summary_params"]

PAPER_CSV = resources.files("qkvsearch.reference") / "vision_xformers_cifar10.csv"

# The paper's designs in trial keys: its model column (attention, or the MLP-Mixer family), stem, positions.
PAPER_MODELS = {"softmax": "vit", "performer": "performer", "linformer_shared_kv": "linformer",
                "linformer_shared_kv_heads": "linformer", "nystrom": "nystrom", "fnet": "fnet"}
# Its Linformer's key/value heads by its positions: one shared head (ViL.py), one per query head (ViLRoPE.py).
PAPER_LINFORMER = {"learned": "linformer_shared_kv", "rope1d": "linformer_shared_kv_heads"}
# Whether its q/k/v projections have a bias, per attention (those with q/k/v projections).
PAPER_QKV_BIAS = {"softmax": False, "performer": True, "linformer_shared_kv": False,
                  "linformer_shared_kv_heads": False, "nystrom": False}
TIMM_QKV_BIAS = inspect.signature(VisionTransformer).parameters["qkv_bias"].default   # what a null qkv_bias builds
MIXER_MODEL = "mlp_mixer"
PAPER_STEMS = {"linear": "linear", "conv_plain": "conv"}
PAPER_POSITIONS = {"learned": "learned", "rope1d": "rope"}
# Its CIFAR-10 size (its code): 32 px at patch 1 (1024 patches), d 128, depth 4, 10 classes; the X-formers
# with 4 heads of 32 and an MLP of 256, Performer int(dh ln dh) = 110 features, Linformer k 64, Nystromformer
# 64 landmarks, the q/k/v embedding as the model's own (linear); the MLP-Mixer with token-mixing 1024 and
# channel-mixing 128.
PAPER_SIZE = {"img_size": 32, "patch_size": 1, "embed_dim": 128, "depth": 4, "num_classes": 10, "in_chans": 3}
XFORMER_SIZE = {"num_heads": 4, "mlp_ratio": 2.0, "embedding": "linear", "key": "shared",
                "attn_features": 110, "attn_proj_len": 64, "attn_landmarks": 64}
MIXER_SIZE = {"mlp_ratio": 1.0, "token_mlp_ratio": 8.0}


def summary_params(model: nn.Module, x: torch.Tensor) -> int:
    """Parameters by torchsummary's rule: weight and bias of each module called in ``model(x)``, per call."""
    counted = []

    def hook(module, _args, _out):
        counted.append(sum(t.numel() for t in (getattr(module, "weight", None), getattr(module, "bias", None))
                           if isinstance(t, torch.Tensor)))

    hooks = [m.register_forward_hook(hook) for m in model.modules()
             if m is not model and not isinstance(m, (nn.Sequential, nn.ModuleList))]
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        for h in hooks:
            h.remove()
    return sum(counted)


def paper_rule_params(config: dict) -> int:
    """The paper's count (``summary_params``) of ``build_model(config)``, built on the meta device."""
    with torch.device("meta"):
        model = build_model(config)
        h, w = input_size(model, config.get("img_size"))
        return summary_params(model, torch.zeros(1, config.get("in_chans", 3), h, w))


@cache
def reference_rows() -> tuple[dict, ...]:
    """The paper's tables as printed (reference CSV): table, model, stem, pos_embed, params (int or None), ..."""
    with PAPER_CSV.open() as f:
        rows = [dict(r) for r in csv.DictReader(line for line in f if not line.startswith("#"))]
    for r in rows:
        r["params"] = int(r["params"]) if r["params"] else None
    return tuple(rows)


def paper_row(config: dict) -> dict | None:
    """The paper's row of the design a resolved config is, at the paper's size; None for any other config."""
    family = model_family(config.get("model"))
    if family not in (VIT, MIXER) or any(config.get(k) != v for k, v in PAPER_SIZE.items()):
        return None
    if family == MIXER:
        name, pos, size = MIXER_MODEL, "none", MIXER_SIZE
    else:
        attention = config.get("attention")
        name, pos = PAPER_MODELS.get(attention), PAPER_POSITIONS.get(config.get("pos_embed"))
        if name == PAPER_MODELS["linformer_shared_kv"] and attention != PAPER_LINFORMER.get(config.get("pos_embed")):
            return None
        bias = TIMM_QKV_BIAS if config.get("qkv_bias") is None else config["qkv_bias"]
        if attention in PAPER_QKV_BIAS and bias != PAPER_QKV_BIAS[attention]:
            return None
        sized = ATTENTION_SIZE_KEY.get(attention)
        size = {k: v for k, v in XFORMER_SIZE.items() if not k.startswith("attn_") or k == sized}
    stem = PAPER_STEMS.get(config.get("patch_embed"))
    if name is None or pos is None or stem is None or any(config.get(k) != v for k, v in size.items()):
        return None
    return next((r for r in reference_rows() if (r["model"], r["stem"], r["pos_embed"]) == (name, stem, pos)), None)


def paper_params(config: dict) -> int | None:
    """The paper's printed count of the design ``config`` is (its Table 1), or None."""
    row = paper_row(config)
    return row["params"] if row else None


def paper_figures(config: dict) -> dict | None:
    """{"params_rule": the paper's rule on our model, "params_paper": its printed count or None} for a
    config that is one of the paper's designs; None otherwise."""
    row = paper_row(config)
    if row is None:
        return None
    return {"params_rule": paper_rule_params(config), "params_paper": row["params"]}
