"""Datasets by name, sharded per rank, as batches of normalised (B, C, img_size, img_size) tensors: the
checks before any worker starts, the sources of a config's dataset (trainers.data.sources; formats:
trainers.data.formats, WebDataset shards: trainers.data.shard_source, Parquet / Arrow folders:
trainers.data.hf_folder), sharding, and batch-level augmentation with its training loss.

Sharding: the training loop asks for a rank's share of a split through train_part / eval_part, and each
source says what that share is (sources.Source.part). A source read by index deals as DistributedSampler
without padding (sources.train_shard, eval_shard): the training order of an epoch is a permutation drawn
from (seed, epoch), cut to a multiple of world_size and dealt round-robin; validation indices are
range(rank, N, world_size), so the ranks cover the val set exactly once between them. A source read as
shards in sequence (wds) deals a sources.Part its own way, as many samples (trainers.data.shard_deal).
"""
from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from qkvsearch.spaces.datasets import DATASET_INFO
from qkvsearch.spaces.errors import reason
from qkvsearch.trainers.data import formats as more
from qkvsearch.trainers.data.formats import CIFAR_FILES
from qkvsearch.trainers.data.formats import (
    check_cifar as _check_cifar,  # the name search.campaign.stages reads
)
from qkvsearch.trainers.data.sources import (  # noqa: F401  (prepare_images, the deal by index: re-exported)
    CHECKED_SAMPLES,
    IMAGE_EXTENSIONS,
    ArrayImages,
    DatasetError,
    PilSource,
    Source,
    TensorSource,
    augments,
    eval_shard,
    eval_transform,
    loader_processes,
    prepare_images,
    train_shard,
    train_transform,
)

log = logging.getLogger(__name__)
SYNTHETIC_SIZES = (1024, 256)   # (train, val) images of the synthetic dataset
SYNTHETIC_RES = 32              # stored resolution; batches are resized to img_size


# ---------------------------------------------------------------------------------------------
# Validation before any worker starts


def check_dataset(cfg: dict, world_size: int | None = None) -> None:
    """Raise DatasetError naming the path and what was expected there. cfg: filled (spaces.keys.fill,
    which requires data_path for the datasets read from files); world_size: the ranks that will read it
    (None: this process group's, 1 outside one), which a dataset read as shards needs enough shards for."""
    reader, path = reader_of(cfg["dataset"]), cfg["data_path"]
    if reader.check is None:  # made in memory: nothing to read
        return
    if reader.shards:  # a folder or a bucket prefix, read through qkvsearch.storage
        reader.check(cfg, path, _ranks(world_size))
        return
    if "://" in path:  # as qkvsearch.storage tells a URI
        shards = ", ".join(name for name, r in READERS.items() if r.shards)
        raise DatasetError(f"data_path: expected a local folder holding {reader.expected} ({cfg['dataset']} is read "
                           f"from files; {shards} also from a bucket prefix), given {path!r}")
    if not os.path.isdir(path):
        raise DatasetError(f"data_path: expected a folder holding {reader.expected}, "
                           f"given {path!r}, which {'is not a folder' if os.path.exists(path) else 'does not exist'}")
    reader.check(cfg, path)


def data_here(path: str | None, field: str, launching: bool) -> bool:
    """Whether the data at ``path`` (a dataset's or a stage's, named ``field``) is checked now (check_dataset): a URI
    always (read through qkvsearch.storage, as every node reads it), a local path unless `validate` (``launching``
    False) runs on a machine without it, which only warns: the spec may be meant for a cluster whose nodes hold it."""
    from qkvsearch.storage import exists

    if path is None or launching or "://" in path or exists(path):
        return True
    log.warning(f"{field}: {path} does not exist on this machine; launch checks it where it runs")
    return False


def _check_imagefolder(cfg, path):
    for split in ("train", "val"):
        if not os.path.isdir(os.path.join(path, split)):
            raise DatasetError(f"data_path: expected {path!r} to hold train/ and val/ with one folder "
                               f"per class; missing {split}/")
    classes = {}
    for split in ("train", "val"):
        d = os.path.join(path, split)
        classes[split] = sorted(e.name for e in os.scandir(d) if e.is_dir() and not e.name.startswith("."))
        if len(classes[split]) < 2:
            raise DatasetError(f"data_path: expected {d!r} to hold one folder per class (at least 2), "
                               f"found {classes[split]}")
    if classes["train"] != classes["val"]:
        raise DatasetError(f"data_path: expected the same class folders in {path!r}/train and /val, "
                           f"given train={classes['train']} val={classes['val']}")
    first = {}
    for split in ("train", "val"):
        first[split] = [_first_image(os.path.join(path, split, c)) for c in classes[split]]
        empty = [c for c, image in zip(classes[split], first[split]) if image is None]
        if empty:
            raise DatasetError(f"data_path: expected images ({', '.join(IMAGE_EXTENSIONS)}) in every class folder "
                               f"of {os.path.join(path, split)!r}, given {len(empty)} without any: "
                               f"{', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}")
    n = cfg.get("num_classes")
    if n is not None and n != len(classes["train"]):
        raise DatasetError(f"num_classes: expected {len(classes['train'])} (class folders in "
                           f"{os.path.join(path, 'train')!r}), given {n}")
    for split in ("train", "val"):   # the first class folders' first images decode
        for image in first[split][:CHECKED_SAMPLES]:
            _check_image(image)


def _ranks(world_size: int | None) -> int:
    if world_size is not None:
        return world_size
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _check_shards(cfg, path, world_size):
    from qkvsearch.trainers.data.shard_index import check_shards
    from qkvsearch.trainers.data.shard_source import check_samples

    if cfg["num_classes"] is None:
        raise DatasetError("num_classes: required for dataset wds (its labels are 0..num_classes-1)")
    check_samples(check_shards(path, world_size, loader_processes(cfg)), cfg["num_classes"])


def _first_image(folder: str) -> str | None:
    """The first image file of a class folder in torchvision's ImageFolder order (at any depth), None without one."""
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        images = sorted(f for f in files if f.lower().endswith(IMAGE_EXTENSIONS))
        if images:
            return os.path.join(root, images[0])
    return None


def _check_image(path: str) -> None:
    """DatasetError naming the file unless it decodes as an image (as the trial's loader opens it)."""
    from PIL import Image

    try:
        if os.path.getsize(path) == 0:
            raise ValueError("an empty file (0 bytes)")
        with Image.open(path) as img:
            img.load()
    except Exception as err:  # any failure here means "this file is no image": say which
        raise DatasetError(f"data_path: expected an image in {path!r}, given a file that cannot be read "
                           f"({reason(err)})") from err


# ---------------------------------------------------------------------------------------------
# Sources


# ---------------------------------------------------------------------------------------------
# Loading


def load_data(cfg: dict, device=None, prepared=None):
    """-> (train source, val source) for a resolved config, on the input path ``data_pipeline`` takes on ``device``
    (trainers.data.pipelines; None: a CPU's). prepared: where the campaign prepared the dataset (None: prepared in
    this process when the path needs it). Call check_dataset first."""
    from qkvsearch.trainers.data.pipelines import device_sources, input_path, is_cuda

    path = input_path(cfg, is_cuda(device))
    if path == "host":
        return reader_of(cfg["dataset"]).load(cfg)
    return device_sources(cfg, path, prepared, reader_of(cfg["dataset"]).arrays)


def _from_arrays(read):
    """A reader of (train, val) arrays as (train source, val source): tensors, or PIL images through timm's
    training transform when the config augments."""
    def load(cfg):
        train, val = read(cfg)
        val_src = TensorSource(*val, cfg["img_size"], cfg["in_chans"])
        if augments(cfg):
            return PilSource(ArrayImages(*train, train_transform(cfg)), loader_processes(cfg)), val_src
        return TensorSource(*train, cfg["img_size"], cfg["in_chans"]), val_src

    return load


def _train_tf(cfg):
    """The training split's transform: timm's augmenting one when the config augments, else the eval one."""
    return train_transform(cfg) if augments(cfg) else eval_transform(cfg)


def _shards(cfg):
    from qkvsearch.trainers.data.shard_source import shard_sources

    return shard_sources(cfg, _train_tf(cfg), eval_transform(cfg))


def _hf_folder(cfg):
    from qkvsearch.trainers.data.hf_folder import hf_sources

    return hf_sources(cfg, _train_tf(cfg), eval_transform(cfg))


def _check_hf_folder(cfg, path):
    from qkvsearch.trainers.data.hf_folder import check_hf_folder

    check_hf_folder(cfg, path)


def _cars(cfg):
    return more.cars(cfg, _train_tf(cfg))


def _synthetic(cfg):
    """Random uint8 images and labels of fixed size (speed tests; nothing to learn)."""
    g = torch.Generator().manual_seed(0)
    res, c, k = min(SYNTHETIC_RES, cfg["img_size"]), cfg["in_chans"], cfg["num_classes"]
    out = []
    for n in SYNTHETIC_SIZES:
        out.append((torch.randint(0, 256, (n, c, res, res), generator=g, dtype=torch.uint8),
                    torch.randint(0, k, (n,), generator=g)))
    return out


def _load_imagefolder(cfg):
    from torchvision.datasets import ImageFolder

    root = cfg["data_path"]
    train = ImageFolder(os.path.join(root, "train"), transform=_train_tf(cfg))
    val = ImageFolder(os.path.join(root, "val"), transform=eval_transform(cfg))
    return PilSource(train, loader_processes(cfg)), PilSource(val, loader_processes(cfg))


@dataclass(frozen=True)
class DatasetReader:
    """How one dataset (spaces.datasets.DATASET_INFO: its classes, size, whether it reads data_path) is read.
    load(cfg) -> (train source, val source); check(cfg, path): raise DatasetError unless data_path holds it
    (None: made in memory); expected: what data_path must hold, for messages; shards: read as shards dealt
    to ranks and loader processes: data_path may also be a bucket prefix (s3://, gs://), and the check is
    check(cfg, path, world_size)."""

    load: Callable
    check: Callable | None = None
    expected: str = ""
    shards: bool = False
    arrays: Callable | None = None   # a dataset held in memory: cfg -> ((images, labels), (images, labels)) uint8


def _cifar_check(cfg, path):
    _check_cifar(cfg["dataset"], path)


def reader_of(dataset: str) -> DatasetReader:
    """The reader its row names (spaces.datasets.Dataset.reader), or the one of its name the project ships."""
    home = DATASET_INFO[dataset].reader
    if not home:
        return READERS[dataset]
    module, _, name = home.partition(":")
    return getattr(importlib.import_module(module), name)


def _in_memory(read, check=None, expected="") -> DatasetReader:
    return DatasetReader(_from_arrays(read), check, expected, arrays=read)


# dataset -> its reader, for each row of spaces.datasets.DATASET_INFO that names none (a test holds them equal)
READERS: dict[str, DatasetReader] = {
    "digits": _in_memory(more.digits),
    "digits_0to8": _in_memory(more.digits_0to8),
    "digits_clutter": _in_memory(more.digits_clutter),
    "synthetic": _in_memory(_synthetic),
    **{ds: _in_memory(more.cifar, _cifar_check, f"{files[3]} (the python pickle version of {ds.upper()})")
       for ds, files in CIFAR_FILES.items()},
    "stl10": _in_memory(more.stl10, lambda cfg, path: more.check_stl10(path), "STL-10's binary files"),
    "cars": DatasetReader(_cars, lambda cfg, path: more.check_cars(path), "Stanford Cars' devkit and images"),
    "imagefolder": DatasetReader(_load_imagefolder, _check_imagefolder, "train/ and val/ with one folder per class"),
    "wds": DatasetReader(_shards, _check_shards, "WebDataset tar shards and timm's _info.json", shards=True),
    "hfds": DatasetReader(_hf_folder, _check_hf_folder, "Parquet or Arrow files of a train and a validation split"),
}


# ---------------------------------------------------------------------------------------------
# Sharding


def train_part(source: Source, world_size: int, rank: int, seed: int, epoch: int):
    """This rank's share of the training split ``source`` for epoch ``epoch`` (0-based), in the order
    (seed, epoch) draws, as ``source.batches`` reads it: train_shard's indices for a source read by index, a
    sources.Part for one read as shards. Every rank's share holds len(source) // world_size samples."""
    return source.part(world_size, rank, seed, epoch)


def eval_part(source: Source, world_size: int, rank: int):
    """This rank's share of the validation split ``source``, as ``source.batches`` reads it: eval_shard's
    indices, or a sources.Part; the ranks' shares cover the split once between them."""
    return source.part(world_size, rank)


# ---------------------------------------------------------------------------------------------
# Batch-level augmentation and the matching training loss


def build_mixup(cfg: dict):
    """timm Mixup/CutMix on device batches (also applies label smoothing), or None when both are off."""
    if cfg["mixup"] <= 0 and cfg["cutmix"] <= 0:
        return None
    from timm.data import Mixup

    return Mixup(mixup_alpha=cfg["mixup"], cutmix_alpha=cfg["cutmix"],
                 label_smoothing=cfg["label_smoothing"], num_classes=cfg["num_classes"])


def train_criterion(cfg: dict):
    """Soft-target CE after Mixup/CutMix, label-smoothing CE, or plain CE."""
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    if cfg["mixup"] > 0 or cfg["cutmix"] > 0:
        return SoftTargetCrossEntropy()
    if cfg["label_smoothing"] > 0:
        return LabelSmoothingCrossEntropy(smoothing=cfg["label_smoothing"])
    return torch.nn.CrossEntropyLoss()
