"""The datasets a campaign can read: what each is, declared once (the ``dataset`` key's values, the readers in
trainers.data.datasets, the stages' datasets), the input paths and bad-image policies (``data_pipeline``,
``bad_images``), and the rules that tie a trial config's keys to its dataset (``fill_from_dataset``). A dataset is
its reader and its row here."""
from __future__ import annotations

import os
from dataclasses import dataclass

from qkvsearch.spaces.errors import ConfigError, config_error

MAX_CLASSES = 10**6   # num_classes' bound (spaces.checks: every int has one): past any set (ImageNet-21k: 21,843)


@dataclass(frozen=True)
class Dataset:
    classes: int | None      # None: counted from the class folders (imagefolder), or model.num_classes (wds, hfds)
    img_size: int            # default input size, px
    needs_path: bool         # read from data.path
    rgb: bool                # images have 3 channels (in_chans must be 3)
    # its files are dealt to ranks x loader processes, so loader_workers changes the order samples are read in;
    # read by index otherwise (the order is drawn from the seed alone: loader_workers changes no training)
    dealt: bool = False
    # its images are stored encoded (image files, tar members, a bytes column): the device input path decodes them
    # once into a prepared dataset, the decode path on the device (spaces.keys.PIPELINES); else held in memory
    encoded: bool = False
    files: bool = False      # one image file per sample, read by index: the decode path reads them (imagefolder, cars)
    # "module:name" of its trainers.data.datasets.DatasetReader, imported when a trial reads it; "": the one of its
    # name in trainers.data.datasets.READERS (the readers the project ships)
    reader: str = ""


DATASET_INFO: dict[str, Dataset] = {
    "digits": Dataset(10, 32, False, False),       # scikit-learn's 8x8 digits, upsampled
    "synthetic": Dataset(10, 32, False, False),    # random class-coloured images (smoke tests)
    "cifar10": Dataset(10, 32, True, True),        # the authors' python-pickle folder
    "cifar100": Dataset(100, 32, True, True),
    "imagefolder": Dataset(None, 224, True, True, encoded=True, files=True),  # <path>/train/<class>/*.jpg and
                                                                              # <path>/val/<class>/...
    "stl10": Dataset(10, 96, True, True),          # STL-10's binary files (trainers.data.formats)
    "cars": Dataset(196, 224, True, True, encoded=True, files=True),         # Stanford Cars:
                                                                             # devkit annotations and images
    "digits_0to8": Dataset(9, 32, False, False),   # digits without the 9s (an OOD stage's digits_heldout)
    "digits_clutter": Dataset(10, 32, False, False),  # a digit among pieces of others, at random places (harder)
    "wds": Dataset(None, 224, True, True, dealt=True, encoded=True),  # WebDataset tar shards + timm's _info.json;
                                                                      # a folder or s3:// gs://
    "hfds": Dataset(None, 224, True, True, encoded=True),        # Parquet / Arrow files datasets.load_dataset reads
                                                                 # (image, label)
}
DATASETS = tuple(DATASET_INFO)
PIPELINES = ("auto", "host", "device", "decode")   # the input paths (trainers.data.pipelines)
BAD_IMAGE_POLICIES = ("refuse", "skip")


def count_class_folders(data_path) -> int:
    """imagefolder: the number of class folders under <data_path>/train, 0 when unreadable."""
    train = os.path.join(os.fspath(data_path), "train") if data_path else None
    if not train or not os.path.isdir(train):
        return 0
    return sum(1 for e in os.scandir(train) if e.is_dir() and not e.name.startswith("."))


def fill_from_dataset(cfg: dict) -> None:
    """img_size and num_classes from the dataset when null; the rules that tie model keys to the data (ConfigError;
    spaces.keys.fill runs them on every trial config)."""
    ds = DATASET_INFO[cfg["dataset"]]
    if ds.needs_path and cfg["data_path"] is None:
        raise ConfigError(f"data_path: required for dataset {cfg['dataset']} (the dataset's root folder)")
    if cfg.get("img_size") is None:
        cfg["img_size"] = ds.img_size
    if ds.rgb and cfg.get("in_chans", 3) != 3:
        raise config_error("in_chans", f"3 for dataset {cfg['dataset']} (RGB images)", cfg["in_chans"])
    if (cfg.get("augment") or cfg.get("randaugment")) and cfg.get("in_chans", 3) != 3:
        raise config_error("in_chans", "3 when augment or randaugment is on (timm transforms make RGB images)",
                           cfg["in_chans"])
    pipeline = cfg.get("data_pipeline", "auto")
    if pipeline == "decode" and not ds.files:
        why = "its images are held in memory: nothing to decode" if not ds.encoded else \
            "decode reads one image file per sample by index (imagefolder, cars); device prepares it"
        raise config_error("data_pipeline", f"auto, host or device for dataset {cfg['dataset']} ({why})", pipeline)
    aa = cfg.get("randaugment")
    if pipeline in ("device", "decode") and aa and not str(aa).startswith("rand"):
        raise config_error("data_pipeline", f"host or auto with randaugment {aa} (the device path runs timm's "
                           "rand-* RandAugment only)", pipeline)
    if ds.classes is not None:
        if cfg.get("num_classes") is None:
            cfg["num_classes"] = ds.classes
        elif cfg["num_classes"] != ds.classes:
            raise config_error("num_classes", f"{ds.classes} for dataset {cfg['dataset']}", cfg["num_classes"])
    elif cfg.get("num_classes") is None:
        n = count_class_folders(cfg["data_path"])
        if n >= 2:  # fewer: the dataset check says what is wrong with the folder
            cfg["num_classes"] = n
