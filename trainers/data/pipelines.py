"""The input paths a config's data can take (``data_pipeline``, spaces.keys.PIPELINES) and their sources.

- host: today's path: PIL decodes, timm's transforms augment and normalise, in DataLoader processes
  (trainers.data.sources, shard_source, hf_folder); float32 batches go to the device.
- device: loaders ship uint8 and the device augments (trainers.data.device_augment). A dataset stored encoded
  (imagefolder, cars, wds, hfds) is read from its prepared dataset (trainers.data.prepared), made once; one held in
  memory is indexed on the device.
- decode: image files (imagefolder, cars) read by index and decoded on the device (trainers.data.device_source).
- auto: device on CUDA (when the recipe runs there: timm's rand-* RandAugment), host on a CPU, so a CPU trial
  trains as before. Either path can be named on any device.
"""
from __future__ import annotations

import torch

from qkvsearch.spaces.datasets import DATASET_INFO


def input_path(cfg: dict, cuda: bool) -> str:
    """host | device | decode: the path ``cfg``'s data takes on a device that is CUDA or not."""
    chosen = cfg.get("data_pipeline") or "auto"
    if chosen != "auto":
        return chosen
    aa = cfg.get("randaugment")
    if not cuda or (aa and not str(aa).startswith("rand")):
        return "host"
    return "device"


def prepares(cfg: dict, cuda: bool) -> bool:
    """Whether ``cfg``'s trials read a prepared dataset (the device path over images stored encoded)."""
    return input_path(cfg, cuda) == "device" and DATASET_INFO[cfg["dataset"]].encoded


def device_sources(cfg: dict, path: str, prepared, arrays=None):
    """(train, val) sources of the device or decode path. prepared: where the prepared dataset is: its location, or
    a campaign's {"root": its root, "<short side>": location} (search.campaign.prepare); one this img_size lacks is
    prepared in this process (under the root, or trainers.data.prepared.default_root). arrays: a dataset held in
    memory, cfg -> its (train, val) uint8 arrays (trainers.data.datasets.DatasetReader.arrays)."""
    from qkvsearch.trainers.data import device_source as ds
    from qkvsearch.trainers.data.device_augment import Recipe
    from qkvsearch.trainers.data.sources import TensorSource, augments, loader_processes

    workers = loader_processes(cfg)
    train_recipe, val_recipe = Recipe.training(cfg), Recipe.evaluation(cfg)
    info = DATASET_INFO[cfg["dataset"]]
    if not info.encoded:   # held in memory: its arrays, augmented on the device
        train, val = arrays(cfg)
        train_src = TensorSource(*train, cfg["img_size"], cfg["in_chans"])
        val_src = TensorSource(*val, cfg["img_size"], cfg["in_chans"])
        return (ds.MemorySource(train_src, train_recipe) if augments(cfg) else train_src), val_src
    if path == "decode":
        from qkvsearch.trainers.data.image_items import file_items

        return tuple(ds.DecodeSource(recipe, workers, root=cfg["data_path"], items=file_items(cfg, role),
                                     policy=cfg["bad_images"])
                     for role, recipe in (("train", train_recipe), ("val", val_recipe)))
    from qkvsearch.trainers.data import prepared as prep
    from qkvsearch.trainers.data import prepared_reading as reading

    given = prepared.get(str(prep.short_side(cfg["img_size"]))) if isinstance(prepared, dict) else prepared
    if given is None:   # not prepared by a campaign for this img_size: here, once
        p = prep.plan(cfg, (prepared or {}).get("root") or prep.default_root())
        prep.ensure(p)
        given = p.location
    folder, manifest = reading.open_checked(given)
    prep.apply_policy(manifest, cfg["bad_images"], cfg["data_path"])
    return tuple(ds.PreparedSource(recipe, workers, split=reading.read_split(folder, manifest, role))
                 for role, recipe in (("train", train_recipe), ("val", val_recipe)))


def is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"
