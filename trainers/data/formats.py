"""Dataset formats read into sources (trainers.data.sources): CIFAR's python pickles, the embedded digits (and
their split for out-of-distribution tests), STL-10's binary files, Stanford Cars' devkit annotations, and
the image sets an OOD stage scores (search.campaign.stages). An ImageFolder is torchvision's
(trainers.data.datasets).

Files, as their authors ship them (data_path is the folder holding them, or its parent):
- CIFAR-10 / -100 (``cifar-10-batches-py/``, ``cifar-100-python/``): the python pickle version.
- STL-10 (``stl10_binary/``): train_X.bin / test_X.bin, uint8 (N, 3, 96, 96) with each channel stored
  column-major; train_y.bin / test_y.bin, uint8 labels 1..10. The unlabelled split is not read.
- Stanford Cars (torchvision's layout): devkit/cars_train_annos.mat and cars_test_annos_withlabels.mat,
  MATLAB structs ``annotations`` with fields fname and class (1..196); images in cars_train/ and cars_test/.
OOD sets (``stages.ood.datasets``, spaces.stages.OOD_FORMATS): a folder of images at any depth (LSUN,
iSUN, DTD, SVHN as images), the test split of CIFAR-style or STL-10 files, or embedded: ``noise`` (uniform
random images) and ``digits_heldout`` (the digit class kept out of ``digits_0to8``).
"""
from __future__ import annotations

import importlib.util
import os
import pickle
from pathlib import Path

import numpy as np
import torch

from qkvsearch.trainers.data.sources import (
    IMAGE_EXTENSIONS,
    DatasetError,
    PilSource,
    TensorSource,
    as_tensors,
    eval_transform,
    loader_processes,
)

DIGITS_SPLIT_SEED = 0       # the digits train/val split is the same for every trial
HELD_OUT_DIGIT = 9          # digits_0to8 leaves it out; the OOD set digits_heldout is made of it
# digits_clutter: canvas side, pieces of other digits per image, times each training / validation digit is drawn
CLUTTER_SIDE, CLUTTER_PIECES, CLUTTER_COPIES, CLUTTER_VAL_COPIES, CLUTTER_SEED = 32, 4, 3, 5, 0
NOISE_IMAGES = 500          # images of the noise OOD set
NOISE_SEED = 0
STL10_DIR, STL10_SIDE = "stl10_binary", 96
CARS_FILES = {"train": ("devkit/cars_train_annos.mat", "cars_train"),
              "val": ("cars_test_annos_withlabels.mat", "cars_test")}
CIFAR_FILES = {
    "cifar10": (["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"],
                ["test_batch"], b"labels", "data_batch_1..5 and test_batch", "cifar-10-batches-py"),
    "cifar100": (["train"], ["test"], b"fine_labels", "train and test", "cifar-100-python"),
}


# ---------------------------------------------------------------------------------------------- CIFAR


def _cifar_dir(ds, path):
    """The folder with the pickles: data_path itself or its <cifar-10-batches-py> subfolder."""
    sub = os.path.join(path, CIFAR_FILES[ds][4])
    return sub if os.path.isdir(sub) else path


def check_cifar(ds, path):
    train, test, label_key, expected, _ = CIFAR_FILES[ds]
    folder = _cifar_dir(ds, path)
    missing = [f for f in train + test if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise DatasetError(f"data_path: expected {folder!r} to hold {expected} "
                           f"(the python pickle version of {ds.upper()}); missing: {', '.join(missing)}")
    _read_cifar_file(os.path.join(folder, test[0]), label_key)  # the smallest file: format check


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


def cifar(cfg):
    ds = cfg["dataset"]
    train_files, test_files, label_key, _, _ = CIFAR_FILES[ds]
    folder = _cifar_dir(ds, cfg["data_path"])
    splits = []
    for files in (train_files, test_files):
        parts = [_read_cifar_file(os.path.join(folder, f), label_key) for f in files]
        splits.append(as_tensors(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])))
    _check_labels(splits[0][1], cfg)
    return splits


def _check_labels(labels, cfg):
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= cfg["num_classes"]):
        raise DatasetError(f"data_path: expected labels in 0..{cfg['num_classes'] - 1} in {cfg['data_path']!r}, "
                           f"found {int(labels.min())}..{int(labels.max())}")


# ---------------------------------------------------------------------------------------------- digits


def digits(cfg):
    """sklearn's 1,797 8x8 digits (values 0..16) as uint8 (N, 1, 8, 8), stratified split by val_fraction."""
    images, labels = _digit_images()
    val = _stratified_pick(labels, cfg["val_fraction"], DIGITS_SPLIT_SEED)
    return as_tensors(images[~val], labels[~val]), as_tensors(images[val], labels[val])


def digits_0to8(cfg):
    """digits without HELD_OUT_DIGIT (9 classes, the same split as digits): an in-distribution set whose
    out-of-distribution twin is digits_heldout."""
    (xt, yt), (xv, yv) = digits(cfg)
    keep_t, keep_v = yt != HELD_OUT_DIGIT, yv != HELD_OUT_DIGIT
    return (xt[keep_t], yt[keep_t]), (xv[keep_v], yv[keep_v])


def digits_clutter(cfg, val_copies: int = CLUTTER_VAL_COPIES):
    """A harder task made from the digits, offline and deterministic: each image is a CLUTTER_SIDE^2 canvas holding
    one digit (8x8, scaled x2) at a random place among CLUTTER_PIECES pieces of other digits (4x4 crops, scaled
    x2), overlaid by maximum, the label the whole digit's. The digits split as ``digits`` does, and each side's
    clutter comes from its own side only; each training digit is drawn CLUTTER_COPIES times, each validation digit
    ``val_copies`` times (the dataset's: CLUTTER_VAL_COPIES), at other places among other pieces (1,800 validation
    images: the binomial noise of a top-1 near 70 % is about 1.1 points, against 2.4 over the 360 digits alone).
    Image j of a side is a copy of that side's digit j mod n (n digits, the copies one after another); a larger
    ``val_copies`` extends the dataset's validation split (its first CLUTTER_VAL_COPIES x n images are those).
    -> uint8 (N, 1, 32, 32)."""
    images, labels = _digit_images()
    val = _stratified_pick(labels, cfg["val_fraction"], DIGITS_SPLIT_SEED)
    out = []
    for side, copies, seed in ((~val, CLUTTER_COPIES, CLUTTER_SEED), (val, val_copies, CLUTTER_SEED + 1)):
        x, y = images[side][:, 0], labels[side]
        rng = np.random.default_rng(seed)
        idx = np.tile(np.arange(len(y)), copies)
        canvas = np.zeros((len(idx), CLUTTER_SIDE, CLUTTER_SIDE), dtype=np.uint8)
        for i, k in enumerate(idx):
            for _ in range(CLUTTER_PIECES):   # pieces of other digits first; the digit is drawn over them
                piece = x[rng.integers(len(y))]
                r, c = rng.integers(0, 5, size=2)
                _overlay(canvas[i], piece[r:r + 4, c:c + 4].repeat(2, 0).repeat(2, 1), rng)
            _overlay(canvas[i], x[k].repeat(2, 0).repeat(2, 1), rng)
        out.append(as_tensors(canvas[:, None], y[idx]))
    return tuple(out)


def _overlay(canvas: np.ndarray, patch: np.ndarray, rng) -> None:
    """Draw ``patch`` at a uniformly random place of ``canvas`` (in place), brighter pixels winning."""
    r, c = (rng.integers(0, canvas.shape[i] - patch.shape[i] + 1) for i in (0, 1))
    view = canvas[r:r + patch.shape[0], c:c + patch.shape[1]]
    np.maximum(view, patch, out=view)


def _digit_images():
    pixels, labels = _digits_file()
    return np.round(pixels * (255.0 / 16.0)).astype(np.uint8)[:, None], labels  # (1797, 1, 8, 8)


def _digits_file():
    """The digits file scikit-learn ships (what load_digits reads), read without importing sklearn:
    its import costs seconds in every freshly started worker. -> (1797, 8, 8) float, (1797,) int64."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("dataset: 'digits' needs scikit-learn installed (it ships the images)")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)  # (1797, 65): 64 pixels, then the label
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


def _stratified_pick(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Seeded boolean mask of ceil(fraction * N) items, shared among classes in proportion to their size
    (largest remainders get the leftover items), as scikit-learn's stratified split sizes it."""
    classes, counts = np.unique(labels, return_counts=True)
    exact = fraction * counts
    quota = np.floor(exact).astype(int)
    leftover = int(np.ceil(fraction * len(labels))) - quota.sum()
    quota[np.argsort(-(exact - quota), kind="stable")[:leftover]] += 1
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(labels), dtype=bool)
    for c, k in zip(classes, quota):
        mask[rng.permutation(np.flatnonzero(labels == c))[:k]] = True
    return mask


# ---------------------------------------------------------------------------------------------- STL-10


def _stl10_dir(path: str) -> str:
    sub = os.path.join(path, STL10_DIR)
    return sub if os.path.isdir(sub) else path


def check_stl10(path: str) -> None:
    folder = _stl10_dir(path)
    names = [f"{s}_{k}.bin" for s in ("train", "test") for k in ("X", "y")]
    missing = [f for f in names if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise DatasetError(f"data_path: expected {folder!r} to hold {', '.join(names)} (STL-10's binary "
                           f"version); missing: {', '.join(missing)}")
    _read_stl10(folder, "test")  # the sizes must agree: format check


def _read_stl10(folder: str, split: str):
    """-> (images uint8 (N, 3, 96, 96), labels int64 (N,) in 0..9) of one split."""
    xf, yf = (os.path.join(folder, f"{split}_{k}.bin") for k in ("X", "y"))
    raw = np.fromfile(xf, dtype=np.uint8)
    labels = np.fromfile(yf, dtype=np.uint8).astype(np.int64) - 1
    per_image = 3 * STL10_SIDE * STL10_SIDE
    if raw.size % per_image or raw.size // per_image != len(labels) or (len(labels) and labels.min() < 0):
        raise DatasetError(f"data_path: expected {xf!r} to hold N x {per_image} bytes and {yf!r} N labels "
                           f"in 1..10, given {raw.size} bytes and {len(labels)} labels")
    images = raw.reshape(-1, 3, STL10_SIDE, STL10_SIDE).transpose(0, 1, 3, 2)  # stored column-major
    return np.ascontiguousarray(images), labels


def stl10(cfg):
    folder = _stl10_dir(cfg["data_path"])
    return [as_tensors(*_read_stl10(folder, split)) for split in ("train", "test")]


# ---------------------------------------------------------------------------------------------- Stanford Cars


def check_cars(path: str) -> None:
    for annos, images in CARS_FILES.values():
        for need in (annos, images):
            if not os.path.exists(os.path.join(path, need)):
                raise DatasetError(f"data_path: expected {path!r} to hold Stanford Cars' devkit layout "
                                   f"({', '.join(a for a, _ in CARS_FILES.values())}, cars_train/, cars_test/); "
                                   f"missing: {need}")
    _read_cars_annotations(path, "val")


def _read_cars_annotations(path: str, split: str) -> list[tuple[str, int]]:
    """(image path, label 0..195) of one split, from its devkit .mat file."""
    from scipy.io import loadmat

    annos, images = CARS_FILES[split]
    file = os.path.join(path, annos)
    try:
        table = loadmat(file, squeeze_me=True)["annotations"]
        items = [(os.path.join(path, images, str(a["fname"])), int(a["class"]) - 1) for a in np.atleast_1d(table)]
    except Exception as e:  # any failure here means "not the devkit's struct": say which file and why
        raise DatasetError(f"data_path: expected {file!r} to be a MATLAB file with a struct array "
                           f"'annotations' (fields fname, class), could not read it: {e}") from e
    return items


class _ImageList(torch.utils.data.Dataset):
    """(path, label) items read as PIL RGB images through a transform."""

    def __init__(self, items, transform):
        self.items, self.transform = items, transform

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as img:
            return self.transform(img.convert("RGB")), label


def cars(cfg, train_transform):
    """-> (train, val) PilSources over the devkit's images (the test split, labelled, as val)."""
    root, workers = cfg["data_path"], loader_processes(cfg)
    return (PilSource(_ImageList(_read_cars_annotations(root, "train"), train_transform), workers),
            PilSource(_ImageList(_read_cars_annotations(root, "val"), eval_transform(cfg)), workers))


# ---------------------------------------------------------------------------------------------- OOD sets


def image_files(folder: str) -> list[str]:
    """Every image under folder, at any depth, in a stable order."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        found += [os.path.join(root, f) for f in sorted(files) if f.lower().endswith(IMAGE_EXTENSIONS)]
    return found


def ood_source(fmt: str, path: str | None, cfg: dict):
    """The images of one OOD set as a source (labels all -1), for a model fed cfg's img_size / in_chans.
    fmt: one of spaces.stages.OOD_FORMATS."""
    size, chans = cfg["img_size"], cfg["in_chans"]
    if fmt == "imagefolder":
        files = image_files(path)
        if not files:
            raise DatasetError(f"stages.ood.datasets: expected images ({', '.join(IMAGE_EXTENSIONS)}) under "
                               f"{path!r}, given a folder without any")
        return PilSource(_ImageList([(f, -1) for f in files], eval_transform(cfg)), loader_processes(cfg))
    if fmt in CIFAR_FILES:
        _, test, label_key, _, _ = CIFAR_FILES[fmt]
        images, _ = _read_cifar_file(os.path.join(_cifar_dir(fmt, path), test[0]), label_key)
    elif fmt == "stl10":
        images, _ = _read_stl10(_stl10_dir(path), "test")
    elif fmt == "noise":
        images = np.random.default_rng(NOISE_SEED).integers(0, 256, (NOISE_IMAGES, chans, size, size), dtype=np.uint8)
    else:  # digits_heldout
        images, labels = _digit_images()
        images = images[labels == HELD_OUT_DIGIT]
    return TensorSource(*as_tensors(images, np.full(len(images), -1)), size, chans)
