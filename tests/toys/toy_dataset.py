"""A dataset format of the test's own, added as a user adds one: this reader and its row in spaces.datasets
(tests/test_extending.py). ``<data.path>/images.npz`` holds uint8 images (N, C, h, w) and int labels of a train and
a validation split: x_train, y_train, x_val, y_val."""
from __future__ import annotations

import os

import numpy as np
import torch

from qkvsearch.trainers.data.datasets import DatasetReader
from qkvsearch.trainers.data.sources import DatasetError, TensorSource

FILE = "images.npz"


def _load(cfg):
    arrays = np.load(os.path.join(cfg["data_path"], FILE))
    return tuple(TensorSource(torch.from_numpy(arrays[f"x_{split}"]), torch.from_numpy(arrays[f"y_{split}"]).long(),
                              cfg["img_size"], cfg["in_chans"]) for split in ("train", "val"))


def _check(cfg, path):
    if not os.path.isfile(os.path.join(path, FILE)):
        raise DatasetError(f"data_path: expected a folder holding {FILE}, given {path!r}, which has none")


NPZ = DatasetReader(_load, _check, FILE)
