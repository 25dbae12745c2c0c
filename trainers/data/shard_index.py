"""A WebDataset shard set's index (the ``wds`` dataset): timm's info file read and checked, before any worker
starts and again where the shards are read (trainers.data.shard_source).

Layout, as timm's wds reader (timm/data/readers/reader_wds.py) and the timm/imagenet-1k-wds sets have it: a
folder or a bucket prefix (``s3://``, ``gs://``, read through qkvsearch.storage's pyarrow filesystems) holding
``_info.json`` (or ``_info.yaml``, or timm's other name ``info.json``)::

    {"name": "imagenet-1k", "splits": {
        "train": {"name": "train", "num_samples": 1281167, "shard_lengths": [1252, ...],
                  "filenames": ["imagenet1k-train-0000.tar", ...]},        # or one brace pattern
        "validation": {...}}}

and the tar shards it names (relative to the location), each holding samples as files sharing a key:
``n01440764_10026.jpg`` (or .png / .webp) and ``n01440764_10026.cls`` (the class index as text).
Training reads split ``train``, validation the first of SPLIT_NAMES["val"] the info file names.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow.fs as pafs

from qkvsearch.spaces.errors import clip, reason
from qkvsearch.storage import exists, loads_json, open_location, read_bytes
from qkvsearch.trainers.data.sources import DatasetError, split_names

INFO_FILES = ("_info.json", "_info.yaml", "info.json")  # tried in this order (timm: _info.json, info.json)
TAR_BLOCK = 512   # a tar file is whole blocks of 512 bytes
LAYOUT = "timm's wds layout: tar shards and an info file giving each split's filenames and shard_lengths"


@dataclass(frozen=True)
class Split:
    """One split: its name in the info file, its shards (names relative to the location) and their samples."""

    name: str
    files: tuple[str, ...]
    lengths: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.lengths)


@dataclass(frozen=True)
class ShardSet:
    """A shard set's location (a folder or a URI, as given), its info file, and the two splits a run reads."""

    location: str
    info: str
    train: Split
    val: Split

    def uri(self, file: str) -> str:
        """A shard's full name, for opening and for messages."""
        return f"{self.location.rstrip('/')}/{file}"


def read_shard_set(location: str) -> ShardSet:
    """The info file at ``location``, read and checked; DatasetError naming the file and what it lacks."""
    info_uri, info = _read_info(location)
    splits = info.get("splits") if isinstance(info, dict) else None
    if not isinstance(splits, dict) or not splits:
        raise DatasetError(f"data_path: expected {info_uri} to hold {{\"splits\": {{name: {{\"filenames\": [...], "
                           f"\"shard_lengths\": [...]}}}}}} ({LAYOUT}), given {clip(str(info))}")
    names = split_names(list(splits), info_uri)
    return ShardSet(location, info_uri, *(_split(names[r], splits[names[r]], info_uri) for r in ("train", "val")))


def _read_info(location: str) -> tuple[str, object]:
    where = "bucket prefix" if "://" in location else "folder"
    for name in INFO_FILES:
        uri = f"{location.rstrip('/')}/{name}"
        try:
            data = read_bytes(uri)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise DatasetError(f"data_path: could not read {uri}: {reason(err)}") from err
        try:
            return uri, _parse(name, data)
        except Exception as err:  # any failure here means "not JSON / YAML": say which file and why
            raise DatasetError(f"data_path: expected {uri} to be {name.rsplit('.', 1)[1].upper()}, could not "
                               f"read it: {reason(err)}") from None
    given = f"a {where} without any" if exists(location) else f"{location}, which does not exist"
    raise DatasetError(f"data_path: expected {' or '.join(INFO_FILES)} in the {where} {location} ({LAYOUT}), "
                       f"given {given}")


def _parse(name: str, data: bytes):
    if name.endswith(".yaml"):
        import yaml

        return yaml.safe_load(data)
    return loads_json(data)


def _split(name: str, raw, info_uri: str) -> Split:
    where = f"split {name} of {info_uri}"
    files = raw.get("filenames") if isinstance(raw, dict) else None
    if isinstance(files, str):  # one brace pattern, as timm's split strings write them: train-{0000..0099}.tar
        from braceexpand import braceexpand

        files = list(braceexpand(files))
    lengths = raw.get("shard_lengths") if isinstance(raw, dict) else None
    if not (isinstance(files, list) and files and all(isinstance(f, str) and f.strip() for f in files)):
        raise DatasetError(f"data_path: expected {where} to name its shards (filenames: a non-empty list of "
                           f"names, or a brace pattern), given {clip(str(files))}")
    if len(set(files)) != len(files):
        raise DatasetError(f"data_path: expected {where} to name each shard once, given {len(files)} names of "
                           f"{len(set(files))} shards")
    if not (isinstance(lengths, list) and len(lengths) == len(files)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lengths) and sum(lengths)):
        raise DatasetError(f"data_path: expected {where} to give the samples of each of its {len(files)} shards "
                           f"(shard_lengths: {len(files)} ints >= 0, not all 0), given {clip(str(lengths))}")
    total = raw.get("num_samples")
    if total is not None and total != sum(lengths):
        raise DatasetError(f"data_path: expected num_samples of {where} to be the sum of its shard_lengths "
                           f"({sum(lengths)}), given {total!r}")
    return Split(name, tuple(files), tuple(lengths))


def check_shards(location: str, ranks: int, loader_workers: int) -> ShardSet:
    """What can be known of a shard set without reading its shards: the info file (read_shard_set), every shard
    it names present and made of whole tar blocks, and at least one training shard per reader (``ranks`` x
    loader processes, 0 loader_workers: the training process reads), so each reader reads at least about one
    shard's worth. DatasetError naming the file or shard, or the counts."""
    shards = read_shard_set(location)
    sizes = _listing(location)
    for split in (shards.train, shards.val):
        missing = [f for f in split.files if f not in sizes]
        if missing:
            raise DatasetError(f"data_path: expected the {len(split.files)} shards of split {split.name} named in "
                               f"{shards.info}, given {len(missing)} missing: {', '.join(missing[:5])}"
                               f"{' ...' if len(missing) > 5 else ''}")
        for f in split.files:
            if not sizes[f] or sizes[f] % TAR_BLOCK:
                raise DatasetError(f"data_path: expected shard {shards.uri(f)} to be a tar file (whole blocks of "
                                   f"{TAR_BLOCK} bytes), given {sizes[f]} bytes: cut short or not a tar")
    check_readers(shards, ranks, loader_workers)
    return shards


def check_readers(shards: ShardSet, ranks: int, loader_workers: int) -> None:
    """DatasetError unless the training split has a shard for each of ranks x loader processes. Fewer would have
    several readers read into one shard (each reading past what it skips), and timm's reader would hang DDP."""
    processes = max(1, loader_workers)
    n = len(shards.train.files)
    if n < ranks * processes:
        raise DatasetError(
            f"data_path: expected at least ranks x loader processes = {ranks} x {processes} = {ranks * processes} "
            f"shards in split {shards.train.name} of {shards.info}, given {n}; use fewer workers_per_trial or "
            f"loader_workers, or write the split in more shards")


def _listing(location: str) -> dict[str, int]:
    """Name (relative to ``location``) -> size of every file under it: one recursive listing."""
    fs, root = open_location(location)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except OSError as err:
        raise DatasetError(f"data_path: could not list {location}: {reason(err)}") from err
    return {i.path[len(root):].lstrip("/"): i.size or 0 for i in infos if i.type == pafs.FileType.File}
