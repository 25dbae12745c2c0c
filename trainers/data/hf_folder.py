"""A local folder of Parquet or Arrow files as Hugging Face ``datasets.load_dataset`` reads it (the ``hfds``
dataset): splits by file name (``train-00000-of-00004.parquet``, ``validation-...``) or by folder (train/,
validation/), an ``image`` column (datasets' Image: {bytes, path}, or bytes) and a ``label`` column (class
indices 0..num_classes-1), the column names timm's hfds reader defaults to.

The check reads the folder's file list (load_dataset_builder, which prepares nothing), each split's columns,
its labels (one on every row) and its first CHECKED_SAMPLES images (decoded), before any worker starts. The
splits are then read through load_dataset (Arrow, memory-mapped; its cache converts Parquet once) as
PilSources: read by index, dealt as the other indexed datasets.
A row that cannot be decoded raises DatasetError naming the folder, split and row.
"""
from __future__ import annotations

import io
import os

import torch

from qkvsearch.spaces.errors import reason
from qkvsearch.trainers.data.sources import (
    CHECKED_SAMPLES,
    DatasetError,
    PilSource,
    loader_processes,
    split_names,
)

IMAGE_COLUMN, LABEL_COLUMN = "image", "label"


def _datasets():
    try:
        import datasets
    except ImportError as err:
        raise DatasetError(f"dataset: hfds needs the datasets package (pip install 'qkvsearch[data]'): "
                           f"{reason(err)}") from None
    datasets.disable_progress_bars()  # a bar per split on every rank's stderr otherwise
    return datasets


def split_files(path: str) -> dict[str, tuple[str, list[str]]]:
    """role (train, val) -> (the folder's split of that role, its files); DatasetError when the folder is
    missing, not one load_dataset reads, or lacks a split."""
    if not os.path.isdir(path):
        raise DatasetError(f"data_path: expected a folder of Parquet or Arrow files (hfds), given {path!r}, which "
                           f"{'is not a folder' if os.path.exists(path) else 'does not exist'}")
    try:
        found = {str(k): list(v) for k, v in _datasets().load_dataset_builder(path).config.data_files.items()}
    except Exception as err:  # any failure here means "not a folder load_dataset reads": say why
        raise DatasetError(f"data_path: expected {path!r} to hold Parquet or Arrow files datasets.load_dataset "
                           f"reads, could not read it: {reason(err)}") from err
    names = split_names(found, repr(path), " (files named <split>-*.parquet or a <split>/ folder)")
    return {role: (name, found[name]) for role, name in names.items()}


def check_hf_folder(cfg: dict, path: str) -> None:
    """The folder's splits, their columns, rows in each, a label within 0..num_classes-1 on every row (num_classes
    required), and the first CHECKED_SAMPLES images of each split decoded."""
    if cfg["num_classes"] is None:
        raise DatasetError("num_classes: required for dataset hfds (its labels are 0..num_classes-1)")
    for role, (name, files) in split_files(path).items():
        rows = 0
        for file in files:
            labels = _label_column(file, name)
            rows += len(labels)
            missing = sum(v is None for v in labels)
            if missing:
                raise DatasetError(f"data_path: expected a label on every row of {file} (split {name}), given "
                                   f"{missing} row(s) without one")
            low, high = (min(labels), max(labels)) if labels else (0, 0)
            if low < 0 or high >= cfg["num_classes"]:
                raise DatasetError(f"data_path: expected labels in 0..{cfg['num_classes'] - 1} (num_classes) in "
                                   f"{file}, found {low}..{high}")
            if labels and rows == len(labels):   # the split's first rows
                _check_images(file, name, path)
        if not rows:
            raise DatasetError(f"data_path: expected rows in split {name} of {path!r} (the {role} split), given "
                               f"{len(files)} file(s) without any")


def _check_images(file: str, split: str, folder: str) -> None:
    """The first CHECKED_SAMPLES images of one Parquet or Arrow file decode (as _HfImages reads them)."""
    import pyarrow.parquet as pq

    if file.endswith(".parquet"):
        first = next(pq.ParquetFile(file).iter_batches(batch_size=CHECKED_SAMPLES, columns=[IMAGE_COLUMN]))
    else:
        first = _arrow_table(file).slice(0, CHECKED_SAMPLES)
    for i, value in enumerate(first.column(IMAGE_COLUMN).to_pylist()):
        try:
            with _open_image(value, folder) as img:
                img.load()
        except Exception as err:  # any failure here means "this row holds no image": say which
            raise DatasetError(f"data_path: expected an image in row {i} of {file} (split {split}), given one that "
                               f"cannot be read ({reason(err)})") from err


def _arrow_table(file: str):
    """An Arrow file as a table (memory-mapped): datasets' .arrow files are IPC streams; plain IPC files also load."""
    import pyarrow as pa

    with pa.memory_map(file) as source:
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            return pa.ipc.open_file(source).read_all()


def _label_column(file: str, split: str) -> list:
    """The label column of one Parquet or Arrow file (None for a row without one), after checking it has both
    columns."""
    import pyarrow.parquet as pq

    try:
        if file.endswith(".parquet"):
            names, table = pq.read_schema(file).names, None
        else:
            table = _arrow_table(file)
            names = table.column_names
        missing = [c for c in (IMAGE_COLUMN, LABEL_COLUMN) if c not in names]
        if not missing:
            return (table or pq.read_table(file, columns=[LABEL_COLUMN])).column(LABEL_COLUMN).to_pylist()
    except Exception as err:  # any failure here means "not a Parquet / Arrow table": say which file and why
        raise DatasetError(f"data_path: expected {file} (split {split}) to be a Parquet or Arrow table, could not "
                           f"read it: {reason(err)}") from err
    raise DatasetError(f"data_path: expected columns {IMAGE_COLUMN!r} (images) and {LABEL_COLUMN!r} (class "
                       f"indices) in {file} (split {split}), given {', '.join(names)}")


class _HfImages(torch.utils.data.Dataset):
    """One split as (transformed image (C, H, W), label) items."""

    def __init__(self, path: str, split: str, transform):
        try:
            table = _datasets().load_dataset(path, split=split)
        except Exception as err:  # the check read the files: this is load_dataset's own failure, say which
            raise DatasetError(f"data_path: datasets.load_dataset could not read split {split} of {path!r}: "
                               f"{reason(err)}") from err
        self.rows = table.select_columns([IMAGE_COLUMN, LABEL_COLUMN])
        self.path, self.split, self.transform = path, split, transform

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        try:
            row = self.rows[i]
            with _open_image(row[IMAGE_COLUMN], self.path) as img:
                return self.transform(img.convert("RGB")), int(row[LABEL_COLUMN])
        except Exception as err:  # any failure here means "this row cannot be decoded": say which
            raise DatasetError(f"data_path: row {i} of split {self.split} of {self.path!r} could not be read as "
                               f"an image and a label: {reason(err)}") from err


def _open_image(value, folder: str):
    """A PIL image from what an image column holds: a decoded image, {bytes, path}, bytes, or a path."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if not value:
        raise ValueError("an empty image (0 bytes, no path)")
    if isinstance(value, (bytes, bytearray)):
        return Image.open(io.BytesIO(value))
    return Image.open(os.path.join(folder, value))  # a path, relative to the folder unless absolute


def hf_sources(cfg: dict, train_transform, eval_transform):
    """-> (train, val) PilSources over the folder's training and validation splits."""
    path, workers = cfg["data_path"], loader_processes(cfg)
    names = {role: name for role, (name, _) in split_files(path).items()}
    return (PilSource(_HfImages(path, names["train"], train_transform), workers),
            PilSource(_HfImages(path, names["val"], eval_transform), workers))
