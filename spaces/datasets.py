"""The datasets a campaign can read: what each is, declared once (the ``dataset`` key's values, the readers in
trainers.data.datasets, the stages' datasets)."""
from __future__ import annotations

import os
from dataclasses import dataclass


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


DATASET_INFO: dict[str, Dataset] = {
    "digits": Dataset(10, 32, False, False),       # scikit-learn's 8x8 digits, upsampled
    "synthetic": Dataset(10, 32, False, False),    # random class-coloured images (smoke tests)
    "cifar10": Dataset(10, 32, True, True),        # the authors' python-pickle folder
    "cifar100": Dataset(100, 32, True, True),
    "imagefolder": Dataset(None, 224, True, True, encoded=True, files=True),  # <path>/train/<class>/*.jpg and <path>/val/<class>/...
    "stl10": Dataset(10, 96, True, True),          # STL-10's binary files (trainers.data.formats)
    "cars": Dataset(196, 224, True, True, encoded=True, files=True),         # Stanford Cars: devkit annotations and images
    "digits_0to8": Dataset(9, 32, False, False),   # digits without the 9s (an OOD stage's digits_heldout)
    "digits_clutter": Dataset(10, 32, False, False),  # a digit among pieces of others, at random places (harder)
    "wds": Dataset(None, 224, True, True, dealt=True, encoded=True),  # WebDataset tar shards + timm's _info.json; a folder or s3:// gs://
    "hfds": Dataset(None, 224, True, True, encoded=True),        # Parquet / Arrow files datasets.load_dataset reads (image, label)
}
DATASETS = tuple(DATASET_INFO)


def count_class_folders(data_path) -> int:
    """imagefolder: the number of class folders under <data_path>/train, 0 when unreadable."""
    train = os.path.join(os.fspath(data_path), "train") if data_path else None
    if not train or not os.path.isdir(train):
        return 0
    return sum(1 for e in os.scandir(train) if e.is_dir() and not e.name.startswith("."))
