"""Where batches come from: a split in memory (``TensorSource``) or a torch Dataset read through a
DataLoader (``PilSource``), the timm transforms that make PIL images into tensors, and ``DatasetError``.

- TensorSource: the whole split in memory as uint8 (N, C, h, w); each batch is moved to the device,
  resized to img_size and normalised there (digits, cifar, synthetic without augmentation; all val sets
  of in-memory datasets). No PIL round trip.
- PilSource: a torch Dataset with a timm transform, read through a DataLoader (imagefolder, hfds, and the
  training split of in-memory datasets when augment / randaugment is on).
- ShardSource (trainers.data.shard_source): WebDataset tar shards read in sequence (wds).
Every source (``Source``) says what a rank's share of its split is (``part``: which samples of it, in which
order), and ``batches(share, batch_size, device, drop_last)`` reads that share: a source read by index
(``ReadByIndex``: TensorSource, PilSource) deals indices (train_shard, eval_shard); one read as shards in
sequence deals a ``Part`` (which rank of how many, which epoch) its own way (trainers.data.shard_deal).
The dataset formats that fill them: trainers.data.formats; which dataset a config names: trainers.data.datasets.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from qkvsearch.spaces.errors import BadInput

# loader_workers auto's decode-rate probe: this many samples or seconds at most, before the first batch
DECODE_PROBE_SAMPLES, DECODE_PROBE_S = 32, 2.0
# Samples of each split the check before any worker starts decodes (the first ones it reads): a mistake made
# throughout a set (labels of another kind or numbering, empty or foreign images) shows in them; one deeper in
# is named by the trial that reads it.
CHECKED_SAMPLES = 4
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# The splits a dataset stored by split (wds, hfds) may call its training and validation splits, tried in order
# (timm/imagenet-1k-wds and most Hugging Face sets: train and validation).
SPLIT_NAMES = {"train": ("train",), "val": ("validation", "val", "test")}
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class DatasetError(BadInput):
    """The dataset named by the config is missing or not in the expected format."""


def split_names(found, where: str, layout: str = "") -> dict[str, str]:
    """{"train": name, "val": name}: the first of each role's SPLIT_NAMES among the splits ``found`` (names) at
    ``where``; DatasetError naming the role's names and the splits found when one is missing."""
    chosen = {}
    for role, names in SPLIT_NAMES.items():
        name = next((n for n in names if n in found), None)
        if name is None:
            raise DatasetError(f"data_path: expected a split named {' or '.join(names)} in {where}{layout}, given "
                               f"splits {', '.join(map(str, found)) or 'none'}")
        chosen[role] = name
    return chosen


@dataclass(frozen=True)
class Part:
    """Which part of a split a rank reads: rank ``rank`` of ``world_size``; for training also the epoch's
    (seed, epoch), which decide its order (None: validation, the split in its stored order)."""

    world_size: int = 1
    rank: int = 0
    seed: int | None = None
    epoch: int | None = None

    @property
    def training(self) -> bool:
        return self.epoch is not None


class Source(Protocol):
    """What the training loop reads a split through: ``part`` gives a rank's share of the split (training:
    with the epoch's (seed, epoch), which decide its order; validation: seed and epoch None, the split in its
    stored order, the ranks covering it once between them), in the form the same source's ``batches``
    reads; ``batches`` yields its (x float (B, C, img_size, img_size), y int64 (B,)) batches on ``device``.

    What ``loader_workers: auto`` asks of a source (trainers.training.feeding), with the defaults of a split held
    in memory, which needs no loader process: ``loader_workers`` (the loader processes it reads through, set
    before its first batch; None: none, it reads from memory), ``decode_rate()`` (images/s one process decodes;
    None: nothing to decode) and ``most_workers(ranks)`` (the most loader processes per rank its data allows;
    None: no cap of its own). Every source subclasses this protocol, so that it inherits these defaults."""

    loader_workers: int | None = None

    def __len__(self) -> int: ...

    def part(self, world_size: int, rank: int, seed: int | None = None, epoch: int | None = None): ...

    def batches(self, share, batch_size: int, device: torch.device, drop_last: bool): ...

    def decode_rate(self) -> float | None:
        return None

    def most_workers(self, ranks: int) -> int | None:
        return None


# ---------------------------------------------------------------------------------------------
# Sources read by index: their shares follow DistributedSampler without padding


def train_shard(n: int, world_size: int, rank: int, seed: int, epoch: int) -> torch.Tensor:
    """This rank's training indices for an epoch: order from (seed, epoch), n // world_size of them (the
    permutation cut to a multiple of world_size, dealt round-robin)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g)
    per_rank = n // world_size
    return perm[:per_rank * world_size][rank::world_size]


def eval_shard(n: int, world_size: int, rank: int) -> torch.Tensor:
    """This rank's validation indices: every world_size-th image, no padding, no overlap."""
    return torch.arange(rank, n, world_size)


class ReadByIndex(Source):
    """A source whose ``batches`` reads the (N,) int64 indices it is given: its share of a split is the indices
    train_shard (training) or eval_shard (validation) deal to the rank."""

    def part(self, world_size: int, rank: int, seed: int | None = None, epoch: int | None = None) -> torch.Tensor:
        if epoch is None:
            return eval_shard(len(self), world_size, rank)
        return train_shard(len(self), world_size, rank, seed, epoch)


@dataclass
class TensorSource(ReadByIndex):
    """A split held in memory as uint8 (N, C, h, w) images and int64 (N,) labels.

    On a GPU the whole split is copied to the device once (CIFAR's 50,000 images are 150 MB as uint8):
    a batch is then an index into device memory, with no host copy or synchronisation per step.
    """

    images: torch.Tensor
    labels: torch.Tensor
    img_size: int
    in_chans: int

    def __len__(self):
        return len(self.labels)

    def batches(self, indices, batch_size, device, drop_last):
        """Yield (x float (B, in_chans, img_size, img_size) normalised on device, y int64 (B,))."""
        images, labels = self._on(device)
        indices = indices.to(images.device)
        stop = len(indices) - batch_size + 1 if drop_last else len(indices)
        for i in range(0, max(stop, 0), batch_size):
            idx = indices[i:i + batch_size]
            yield prepare_images(images[idx], self.img_size, self.in_chans), labels[idx]

    def _on(self, device):
        if device.type == "cuda" and self.images.device != device:
            self.images, self.labels = self.images.to(device), self.labels.to(device)
        if self.images.device.type == device.type:
            return self.images, self.labels
        return self.images.to(device), self.labels.to(device)


def prepare_images(x, img_size, in_chans):
    """uint8 (B, c, h, w) -> float (B, in_chans, img_size, img_size), ImageNet-normalised."""
    x = x.float().div_(255.0)
    if x.shape[-1] != img_size or x.shape[-2] != img_size:
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
    if x.shape[1] != in_chans:  # grayscale digits -> in_chans copies
        x = x.expand(-1, in_chans, -1, -1)
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if in_chans == 3 else ((0.5,) * in_chans, (0.25,) * in_chans)
    mean = torch.tensor(mean, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(std, device=x.device).view(1, -1, 1, 1)
    return (x - mean) / std


class ArrayImages(torch.utils.data.Dataset):
    """uint8 (N, C, h, w) images as PIL RGB images through a transform (augmented training)."""

    def __init__(self, images, labels, transform):
        self.images, self.labels, self.transform = images.numpy(), labels.numpy(), transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        from PIL import Image

        a = self.images[i].transpose(1, 2, 0)  # (h, w, C)
        img = Image.fromarray(a[:, :, 0] if a.shape[2] == 1 else a).convert("RGB")
        return self.transform(img), int(self.labels[i])


class _SeededItems(torch.utils.data.Dataset):
    """dataset[(i, seed)] = dataset[i] with random, numpy and torch seeded from (seed, i) first.

    The augmentation of an image then depends on the epoch's seed and the image alone, not on which
    loader process reads it or how long that process has lived: persistent loader processes replay an
    epoch exactly, after a resume too.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        i, seed = key
        seed_sample(seed, i)
        return self.dataset[i]


def seed_sample(seed: int, i: int) -> None:
    """Seed random, numpy and torch from (seed, i) before sample i is transformed: its augmentation then
    depends on the epoch's seed and the sample alone, not on the loader process that reads it."""
    s = np.random.SeedSequence([seed, i]).generate_state(2)
    random.seed(int(s[0]))
    np.random.seed(s)
    torch.manual_seed(int(s[0]) << 32 | int(s[1]))


class _EpochSampler(torch.utils.data.Sampler):
    """The (index, seed) keys of the current epoch; set before each pass over a persistent DataLoader
    (the sampler is read in the main process, so loader processes need not restart)."""

    def __init__(self):
        self.keys: list[tuple[int, int]] = []

    def __iter__(self):
        return iter(self.keys)

    def __len__(self):
        return len(self.keys)


@dataclass
class PilSource(ReadByIndex):
    """A torch Dataset yielding (normalised (C, H, W) tensor, label), read via a DataLoader.

    One DataLoader per (batch size, drop_last, device type), kept across epochs: its loader processes
    persist (no fork and dataset pickling per epoch); on CUDA batches come in pinned memory and are
    copied without blocking the host.
    """

    dataset: torch.utils.data.Dataset
    loader_workers: int
    _loaders: dict = field(default_factory=dict, repr=False)

    def __len__(self):
        return len(self.dataset)

    def batches(self, indices, batch_size, device, drop_last):
        sampler, loader = self._loader(batch_size, drop_last, device)
        seed = int(torch.initial_seed())  # set per (seed, rank, epoch) by the engine
        sampler.keys = [(i, seed) for i in indices.tolist()]
        for x, y in loader:
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def decode_rate(self) -> float:
        """Images/s one process reads into training tensors (sources.decode_rate), over the first items."""
        return decode_rate(lambda i: self.dataset[i % len(self.dataset)])

    def _loader(self, batch_size, drop_last, device):
        key = (batch_size, drop_last, device.type)
        if key not in self._loaders:
            sampler = _EpochSampler()
            workers = self.loader_workers
            loader = torch.utils.data.DataLoader(
                _SeededItems(self.dataset), batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                num_workers=workers, persistent_workers=workers > 0, pin_memory=device.type == "cuda")
            self._loaders[key] = sampler, loader
        return self._loaders[key]


def loader_processes(cfg: dict) -> int:
    """A config's DataLoader processes per worker: ``loader_workers``, where ``auto`` starts at 0 until the run
    sizes its loaders (trainers.training.feeding) before its first batch."""
    workers = cfg["loader_workers"]
    return 0 if workers == "auto" else workers


def decode_rate(decode_one, max_samples: int = DECODE_PROBE_SAMPLES, max_s: float = DECODE_PROBE_S) -> float:
    """Images/s one process decodes (read, decode, transform): ``decode_one(i)`` timed for i = 0, 1, ... until
    ``max_samples`` or ``max_s``, the first call (file handles, lazy imports) left out."""
    decode_one(0)
    start, n = time.perf_counter(), 0
    while n < max_samples and time.perf_counter() - start < max_s:
        decode_one(1 + n)
        n += 1
    return n / max(time.perf_counter() - start, 1e-9) if n else float("inf")


def as_tensors(images, labels):
    return torch.from_numpy(np.ascontiguousarray(images)), torch.as_tensor(labels, dtype=torch.int64)


ERASING_MODE = "pixel"   # random erasing fills with per-pixel normal noise (timm's train.py and DeiT)


def augments(cfg) -> bool:
    """Whether a config's training images are augmented per image (else read as the evaluation reads them)."""
    return bool(cfg["augment"] or cfg["randaugment"] or cfg.get("random_erasing"))


def train_transform(cfg):
    """timm training transform: random resized crop, flip, optional auto_augment, optional random erasing
    (PIL -> tensor)."""
    from timm.data import create_transform

    if cfg["randaugment"]:
        _posterize_keeps_a_bit()
    return create_transform(input_size=(3, cfg["img_size"], cfg["img_size"]), is_training=True,
                            auto_augment=cfg["randaugment"], mean=IMAGENET_MEAN, std=IMAGENET_STD,
                            re_prob=cfg.get("random_erasing") or 0.0, re_mode=ERASING_MODE)


def _posterize_keeps_a_bit():
    """timm's PosterizeIncreasing asks for 0 bits at level 10 (reachable with magnitude noise, e.g.
    rand-m9-mstd0.5-inc1); the installed Pillow rejects bits < 1 and the worker would crash at a random
    step. Clamp to 1 bit, the nearest image Pillow allows."""
    from PIL import ImageOps
    from timm.data import auto_augment

    def posterize(img, bits_to_keep, **_):
        return img if bits_to_keep >= 8 else ImageOps.posterize(img, max(1, int(bits_to_keep)))

    for name in ("Posterize", "PosterizeIncreasing", "PosterizeOriginal"):
        auto_augment.NAME_TO_OP[name] = posterize


def eval_transform(cfg):
    """timm eval transform: resize + centre crop (PIL -> tensor)."""
    from timm.data import create_transform

    return create_transform(input_size=(3, cfg["img_size"], cfg["img_size"]), is_training=False,
                            mean=IMAGENET_MEAN, std=IMAGENET_STD)
