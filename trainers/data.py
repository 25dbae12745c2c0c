"""Datasets by name, sharded per rank, as batches of normalised (B, C, img_size, img_size) tensors.

Two kinds of source:
- TensorSource: the whole split in memory as uint8 (N, C, h, w); each batch is moved to the device,
  resized to img_size and normalised there (digits, cifar, synthetic without augmentation; all val sets
  of in-memory datasets). No PIL round trip.
- PilSource: a torch Dataset with a timm transform, read through a DataLoader (imagefolder, and the
  training split of in-memory datasets when augment / randaugment is on).

Sharding follows DistributedSampler without padding: the training order of an epoch is a permutation
drawn from (seed, epoch), cut to a multiple of world_size and dealt round-robin; validation indices are
range(rank, N, world_size), so the ranks cover the val set exactly once between them.
"""
from __future__ import annotations

import os
import pickle
import random
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from qkvsearch.spaces.errors import BadInput

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SYNTHETIC_SIZES = (1024, 256)   # (train, val) images of the synthetic dataset
SYNTHETIC_RES = 32              # stored resolution; batches are resized to img_size
CIFAR_FILES = {
    "cifar10": (["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"],
                ["test_batch"], b"labels", "data_batch_1..5 and test_batch", "cifar-10-batches-py"),
    "cifar100": (["train"], ["test"], b"fine_labels", "train and test", "cifar-100-python"),
}
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class DatasetError(BadInput):
    """The dataset named by the config is missing or not in the expected format."""


# ---------------------------------------------------------------------------------------------
# Validation before any worker starts


def check_dataset(cfg: dict) -> None:
    """Raise DatasetError naming the path and what was expected there. cfg: filled (spaces.keys.fill,
    which requires data_path for the datasets read from files)."""
    from qkvsearch.trainers import data_sources as more

    ds, path = cfg["dataset"], cfg["data_path"]
    if ds in ("digits", "digits_0to8", "synthetic"):
        return
    if not os.path.isdir(path):
        raise DatasetError(f"data_path: expected a folder holding {_expected(ds)}, "
                           f"given {path!r}, which {'is not a folder' if os.path.exists(path) else 'does not exist'}")
    if ds in CIFAR_FILES:
        _check_cifar(ds, path)
    elif ds in ("stl10", "cars"):
        {"stl10": more.check_stl10, "cars": more.check_cars}[ds](path)
    else:
        _check_imagefolder(cfg, path)


def _expected(ds):
    if ds in CIFAR_FILES:
        return f"{CIFAR_FILES[ds][3]} (the python pickle version of {ds.upper()})"
    if ds in ("stl10", "cars"):
        return {"stl10": "STL-10's binary files", "cars": "Stanford Cars' devkit and images"}[ds]
    return "train/ and val/ with one folder per class"


def _cifar_dir(ds, path):
    """The folder with the pickles: data_path itself or its <cifar-10-batches-py> subfolder."""
    sub = os.path.join(path, CIFAR_FILES[ds][4])
    return sub if os.path.isdir(sub) else path


def _check_cifar(ds, path):
    train, test, label_key, expected, _ = CIFAR_FILES[ds]
    folder = _cifar_dir(ds, path)
    missing = [f for f in train + test if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise DatasetError(f"data_path: expected {folder!r} to hold {expected} "
                           f"(the python pickle version of {ds.upper()}); missing: {', '.join(missing)}")
    _read_cifar_file(os.path.join(folder, test[0]), label_key)  # the smallest file: format check


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
    for split in ("train", "val"):
        empty = [c for c in classes[split] if not _has_image(os.path.join(path, split, c))]
        if empty:
            raise DatasetError(f"data_path: expected images ({', '.join(IMAGE_EXTENSIONS)}) in every class folder "
                               f"of {os.path.join(path, split)!r}, given {len(empty)} without any: "
                               f"{', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}")
    n = cfg.get("num_classes")
    if n is not None and n != len(classes["train"]):
        raise DatasetError(f"num_classes: expected {len(classes['train'])} (class folders in "
                           f"{os.path.join(path, 'train')!r}), given {n}")


def _has_image(folder: str) -> bool:
    """Whether a class folder holds at least one image file, at any depth (as torchvision's ImageFolder)."""
    for _root, _dirs, files in os.walk(folder):
        if any(f.lower().endswith(IMAGE_EXTENSIONS) for f in files):
            return True
    return False


class _CifarUnpickler(pickle.Unpickler):
    """CIFAR pickles hold dicts of bytes, lists and numpy arrays: refuse any other class."""

    def find_class(self, module, name):
        if module.split(".")[0] == "numpy" and name in ("_reconstruct", "ndarray", "dtype", "scalar"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR pickle")


def _read_cifar_file(file, label_key):
    """-> (images uint8 (N, 3, 32, 32), labels int64 (N,)) of one CIFAR pickle."""
    try:
        with open(file, "rb") as f:
            d = _CifarUnpickler(f, encoding="bytes").load()
        data = np.asarray(d[b"data"], dtype=np.uint8)
        labels = np.asarray(d[label_key], dtype=np.int64)
        images = data.reshape(len(data), 3, 32, 32)
    except Exception as e:  # any failure here means "not a CIFAR pickle": say which file and why
        raise DatasetError(f"data_path: expected {file!r} to be a CIFAR python pickle with keys "
                           f"b'data' (N x 3072 uint8) and {label_key!r}, could not read it: {e}") from e
    if len(labels) != len(images):
        raise DatasetError(f"data_path: {file!r} holds {len(images)} images but {len(labels)} labels")
    return images, labels


# ---------------------------------------------------------------------------------------------
# Sources


@dataclass
class TensorSource:
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


class _ArrayImages(torch.utils.data.Dataset):
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
        s = np.random.SeedSequence([seed, i]).generate_state(2)
        random.seed(int(s[0]))
        np.random.seed(s)
        torch.manual_seed(int(s[0]) << 32 | int(s[1]))
        return self.dataset[i]


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
class PilSource:
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


# ---------------------------------------------------------------------------------------------
# Loading


def load_data(cfg: dict):
    """-> (train source, val source) for a resolved config. Call check_dataset first."""
    from qkvsearch.trainers import data_sources as more

    ds = cfg["dataset"]
    if ds == "imagefolder":
        return _load_imagefolder(cfg)
    if ds == "cars":
        return more.cars(cfg, train_transform(cfg) if (cfg["augment"] or cfg["randaugment"]) else eval_transform(cfg))
    readers = {"digits": more.digits, "digits_0to8": more.digits_0to8, "synthetic": _synthetic, "stl10": more.stl10}
    train, val = readers.get(ds, _cifar)(cfg)
    val_src = TensorSource(*val, cfg["img_size"], cfg["in_chans"])
    if cfg["augment"] or cfg["randaugment"]:
        tf = train_transform(cfg)
        return PilSource(_ArrayImages(*train, tf), cfg["loader_workers"]), val_src
    return TensorSource(*train, cfg["img_size"], cfg["in_chans"]), val_src


def _synthetic(cfg):
    """Random uint8 images and labels of fixed size (speed tests; nothing to learn)."""
    g = torch.Generator().manual_seed(0)
    res, c, k = min(SYNTHETIC_RES, cfg["img_size"]), cfg["in_chans"], cfg["num_classes"]
    out = []
    for n in SYNTHETIC_SIZES:
        out.append((torch.randint(0, 256, (n, c, res, res), generator=g, dtype=torch.uint8),
                    torch.randint(0, k, (n,), generator=g)))
    return out


def _cifar(cfg):
    ds = cfg["dataset"]
    train_files, test_files, label_key, _, _ = CIFAR_FILES[ds]
    folder = _cifar_dir(ds, cfg["data_path"])
    splits = []
    for files in (train_files, test_files):
        parts = [_read_cifar_file(os.path.join(folder, f), label_key) for f in files]
        splits.append(_tensors(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])))
    _check_labels(splits[0][1], cfg)
    return splits


def _tensors(images, labels):
    return torch.from_numpy(np.ascontiguousarray(images)), torch.as_tensor(labels, dtype=torch.int64)


def _check_labels(labels, cfg):
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= cfg["num_classes"]):
        raise DatasetError(f"data_path: expected labels in 0..{cfg['num_classes'] - 1} in {cfg['data_path']!r}, "
                           f"found {int(labels.min())}..{int(labels.max())}")


def _load_imagefolder(cfg):
    from torchvision.datasets import ImageFolder

    root = cfg["data_path"]
    tf_train = train_transform(cfg) if (cfg["augment"] or cfg["randaugment"]) else eval_transform(cfg)
    train = ImageFolder(os.path.join(root, "train"), transform=tf_train)
    val = ImageFolder(os.path.join(root, "val"), transform=eval_transform(cfg))
    return PilSource(train, cfg["loader_workers"]), PilSource(val, cfg["loader_workers"])


def train_transform(cfg):
    """timm training transform: random resized crop, flip, optional auto_augment (PIL -> tensor)."""
    from timm.data import create_transform

    if cfg["randaugment"]:
        _posterize_keeps_a_bit()
    return create_transform(input_size=(3, cfg["img_size"], cfg["img_size"]), is_training=True,
                            auto_augment=cfg["randaugment"], mean=IMAGENET_MEAN, std=IMAGENET_STD)


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


# ---------------------------------------------------------------------------------------------
# Sharding


def train_shard(n: int, world_size: int, rank: int, seed: int, epoch: int) -> torch.Tensor:
    """This rank's training indices for an epoch: order from (seed, epoch), n // world_size of them."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g)
    per_rank = n // world_size
    return perm[:per_rank * world_size][rank::world_size]


def eval_shard(n: int, world_size: int, rank: int) -> torch.Tensor:
    """This rank's validation indices: every world_size-th image, no padding, no overlap."""
    return torch.arange(rank, n, world_size)


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
