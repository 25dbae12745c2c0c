"""Which timm models take which q/k/v embedding: the probe of one timm entrypoint, as a user meets it.

``probe(name)`` builds timm's model on the meta device and looks for its q/k/v sites (trainers.model.sites). A
model with none and no attention the embedding cannot take is out of scope (a CNN, an MLP). Otherwise, for each
embedding, it asks what a user's first config asks, ``{"model": name, "embedding": e, "num_classes": 10}``, of
``model_cost`` and of ``build_model`` on the meta device, runs the built model's forward under the flop counter
and compares the counts (for ``linear``, timm's model, whose forward ``model_cost`` counted itself: its
parameters). Each embedding ends ``built`` (with whether the counts agree), ``refused`` (a
ConfigError: its message names the model, the key and why) or ``crashed`` (anything else: a bug to fix).

benchmarks/probe_hosts.py probes every timm entrypoint this way and writes the coverage page of the docs;
tests/trainers/test_hosts.py probes one entrypoint of each family and checks the page agrees.
"""
from __future__ import annotations

import torch

from qkvsearch.spaces.keys import EMBEDDINGS, ConfigError

__all__ = ["BUILT", "CRASHED", "OUT_OF_SCOPE", "REFUSED", "probe"]

BUILT, REFUSED, CRASHED, OUT_OF_SCOPE = "built", "refused", "crashed", "no q/k/v attention"
NUM_CLASSES = 10


def _count(model: torch.nn.Module) -> tuple[int, int]:
    from qkvsearch.trainers.model.cost import count_macs

    return sum(p.numel() for p in model.parameters()), count_macs(model, 3, None)


def probe(name: str, embeddings: tuple[str, ...] = EMBEDDINGS) -> dict:
    """One entrypoint's row: its timm module, its sites' adapters, and each embedding's outcome."""
    import timm

    from qkvsearch.trainers.model.choices import timm_module
    from qkvsearch.trainers.model.cost import model_cost
    from qkvsearch.trainers.model.meta import skip_meta_init
    from qkvsearch.trainers.model.models import build_model
    from qkvsearch.trainers.model.sites import scan

    row: dict = {"model": name, "module": timm_module(name)}
    try:
        with torch.device("meta"), skip_meta_init():
            host = timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES)
    except Exception as err:   # noqa: BLE001  (timm itself: recorded, the model is out of scope)
        return {**row, "scope": f"timm does not build it on the meta device ({type(err).__name__}: {err})"}
    found = scan(host)
    del host
    if not found.sites and not found.unserved:
        return {**row, "scope": OUT_OF_SCOPE}
    row |= {"sites": len(found.sites), "adapters": sorted({s.adapter for s in found.sites}),
            "unserved": sorted({f"{u.cls.__name__}: {u.why}" for u in found.unserved})}
    for embedding in embeddings:
        cfg = {"model": name, "embedding": embedding, "num_classes": NUM_CLASSES}
        try:
            cost = model_cost(cfg)
            with torch.device("meta"):
                model = build_model(cfg)
            if embedding == "linear":   # timm's model itself, whose forward model_cost counted: its parameters
                params, macs = sum(p.numel() for p in model.parameters()), round(cost["gmacs"] * 1e9)
            else:
                params, macs = _count(model)
            row[embedding] = {"status": BUILT, "params": params, "gmacs": macs / 1e9,
                              "counts_equal": params == cost["params"] and macs == round(cost["gmacs"] * 1e9)}
        except ConfigError as err:
            row[embedding] = {"status": REFUSED, "why": str(err)}
        except Exception as err:   # noqa: BLE001  (what the probe is for: every one is a bug)
            row[embedding] = {"status": CRASHED, "error": f"{type(err).__name__}: {err}"}
    return row
