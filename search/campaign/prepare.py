"""A campaign's prepared datasets (trainers.data.prepared): made once, before its trials start, by Ray tasks spread
over the cluster's CPUs (one task a unit of source images), under ``<storage>/qs_prepared/<key>``, where later
and resumed campaigns on the same storage find them; checked every time a campaign starts, a damaged shard
prepared again. ``validate`` says what would be prepared, how large, and where (``describe``).

A campaign prepares when its trials take the device input path over images stored encoded
(trainers.data.pipelines.prepares: ``data.pipeline`` device, or auto on GPU workers); one per prepared short side
its trials can have (the model's img_size, and those its space lists).
"""
from __future__ import annotations

import logging

from qkvsearch.spaces.errors import reason

log = logging.getLogger(__name__)


def _configs(spec) -> list[dict]:
    """One filled config per img_size the campaign's trials can have (the base config's, and the space's values)."""
    from qkvsearch.spaces import base_config
    from qkvsearch.spaces.keys import fill

    base = fill(base_config(spec))
    sizes = [base["img_size"]]
    for d in spec.space.dimensions:
        if d.key == "img_size":
            sizes += [v for v in d.values if isinstance(v, int) and v not in sizes]
    return [fill({**base_config(spec), "img_size": s}) for s in sizes]


def root(spec) -> str:
    import os

    from qkvsearch.trainers.data.prepared import PREPARED_DIR

    storage = spec.storage if "://" in spec.storage else os.path.abspath(spec.storage)
    return f"{storage.rstrip('/')}/{PREPARED_DIR}"


# (the configs' data keys, root, GPUs) -> their plans: a driver lists a source once (launch, then its run)
_LISTED: dict[str, list] = {}


def plans(spec, fresh: bool = False) -> list:
    """The prepared datasets (trainers.data.prepared.Plan) the campaign's trials read; [] when they read none.
    The source is listed once per driver process (``fresh``: again)."""
    import json

    from qkvsearch.trainers.data import prepared
    from qkvsearch.trainers.data.pipelines import prepares

    cuda = spec.resources.gpus_per_worker > 0
    configs = [cfg for cfg in _configs(spec) if prepares(cfg, cuda)]
    key = json.dumps([[{k: c.get(k) for k in ("dataset", "data_path", "img_size")} for c in configs], root(spec)])
    if fresh or key not in _LISTED:
        out = {}
        for cfg in configs:
            p = prepared.plan(cfg, root(spec))
            out.setdefault(p.location, p)
        _LISTED[key] = list(out.values())
    return _LISTED[key]


def ray_map(fn, calls: list[tuple]) -> list:
    """fn(*call) for each call as Ray tasks of one CPU each, spread over the cluster; results in order."""
    import ray

    task = ray.remote(num_cpus=1)(fn).options(scheduling_strategy="SPREAD")
    return ray.get([task.remote(*call) for call in calls])


def prepare_for(spec) -> dict | None:
    """Prepare (or check) the campaign's prepared datasets on the connected Ray; -> what its trials are given
    (trainers.data.pipelines.device_sources' ``prepared``: {"root": root, "<short side>": location}), or None when
    its trials read none. The bad_images policy is applied here, before any trial starts."""
    from qkvsearch.spaces import base_config
    from qkvsearch.trainers.data import prepared

    found = plans(spec)
    if not found:
        return None
    policy, data_path = base_config(spec).get("bad_images") or "refuse", spec.data.path
    out = {"root": root(spec)}
    for p in found:
        manifest = prepared.ensure(p, ray_map)
        prepared.apply_policy(manifest, policy, data_path)
        out[str(p.short)] = p.location
    return out


def describe(spec) -> list[str]:
    """validate's lines on the campaign's input path: what would be prepared, how large, where, and whether it is
    there already."""
    from qkvsearch.spaces import base_config
    from qkvsearch.spaces.keys import fill
    from qkvsearch.trainers.data import prepared
    from qkvsearch.trainers.data.pipelines import input_path

    cfg = fill(base_config(spec))
    cuda = spec.resources.gpus_per_worker > 0
    path = input_path(cfg, cuda)
    head = f"input path: {path} ({'GPU' if cuda else 'CPU'} workers, data.pipeline {cfg['data_pipeline']})"
    try:
        found = plans(spec, fresh=True)
    except Exception as err:  # noqa: BLE001  (the data check has spoken: say what cannot be known here)
        return [head, f"  prepared dataset: not known here ({reason(err)})"]
    lines = [head]
    for p in found:
        images = {r: p.listing.images(r) for r in ("train", "val")}
        manifest = prepared.read_manifest(p.location)
        state = "ready (checked when the campaign starts)" if manifest else "to be prepared when the campaign starts"
        lines.append(f"  prepared dataset: {images['train']:,} training + {images['val']:,} validation images of "
                     f"{p.data_path}, short side {p.short} px as {p.format}, about "
                     f"{p.estimated_bytes() / 1e9:.2f} GB, at {p.location}: {state}")
    return lines
