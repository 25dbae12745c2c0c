"""A dataset's encoded images as units of work (``listing``) and each unit's images as bytes (``read_unit``): what a
prepared dataset is made of (trainers.data.prepared), and the files the decode path reads by index.

A unit is a plain dict (it travels to Ray tasks and is kept in the prepared dataset's index, so that a damaged
shard can be made again without listing the source again):
- ``{"files": [[path relative to data_path, label], ...]}``: imagefolder (class folders sorted, as torchvision's
  ImageFolder labels them; files sorted at any depth), cars (the devkit's annotations); UNIT_IMAGES a unit;
- ``{"tar": shard file, "samples": n}``: wds, one unit per tar shard (samples read with the shard reader's tools);
- ``{"table": file, "row_group": i}`` (Parquet) or ``{"table": file, "start": a, "stop": b}`` (Arrow): hfds.
The listing's fingerprint stands for the source's content: each file's name, size and modification time (a
dataset's bytes are not read to learn whether it changed; rsync's quick check), with the labels.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from qkvsearch.spaces.errors import reason
from qkvsearch.trainers.data.sources import IMAGE_EXTENSIONS, DatasetError

UNIT_IMAGES = 1024     # source images per unit of files / Arrow rows (one prepared shard each)


@dataclass
class Listing:
    """A dataset's units by split role (train, val), the fingerprint of what they were listed from, its classes."""

    units: dict[str, list[dict]]
    fingerprint: str
    classes: int

    def images(self, role: str) -> int:
        return sum(unit_size(u) for u in self.units[role])


def unit_size(unit: dict) -> int:
    if "files" in unit:
        return len(unit["files"])
    if "tar" in unit:
        return unit["samples"]
    return unit.get("rows", unit.get("stop", 0) - unit.get("start", 0))


def _chunks(items: list, n: int = UNIT_IMAGES) -> list[dict]:
    return [{"files": items[i:i + n]} for i in range(0, len(items), n)]


def _stat_line(path: str, name: str) -> str:
    st = os.stat(path)
    return f"{name}\t{st.st_size}\t{st.st_mtime_ns}"


def _digest(lines) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


def listing(cfg: dict) -> Listing:
    """The units of ``cfg``'s dataset (imagefolder, cars, wds or hfds), checked already (trainers.data.datasets)."""
    return LISTERS[cfg["dataset"]](cfg["data_path"])


def file_items(cfg: dict, role: str) -> list[list]:
    """[relative path, label] of every image of a split read from files (imagefolder, cars), in listing order."""
    out = []
    for unit in listing(cfg).units[role]:
        out += unit["files"]
    return out


def _imagefolder(root: str) -> Listing:
    classes = sorted(e.name for e in os.scandir(os.path.join(root, "train"))
                     if e.is_dir() and not e.name.startswith("."))
    units, lines = {}, []
    for role in ("train", "val"):
        items = []
        for label, c in enumerate(classes):
            folder = os.path.join(root, role, c)
            for here, dirs, files in os.walk(folder):
                dirs.sort()
                for f in sorted(files):
                    if f.lower().endswith(IMAGE_EXTENSIONS):
                        rel = os.path.relpath(os.path.join(here, f), root)
                        items.append([rel, label])
                        lines.append(_stat_line(os.path.join(root, rel), rel) + f"\t{label}")
        units[role] = _chunks(items)
    return Listing(units, _digest(lines), len(classes))


def _cars(root: str) -> Listing:
    from qkvsearch.trainers.data.formats import CARS_FILES, _read_cars_annotations

    units, lines = {}, [_stat_line(os.path.join(root, a), a) for a, _ in CARS_FILES.values()]
    for role in ("train", "val"):
        items = [[os.path.relpath(p, root), label] for p, label in _read_cars_annotations(root, role)]
        lines += [_stat_line(os.path.join(root, rel), rel) for rel, _ in items]
        units[role] = _chunks(items)
    return Listing(units, _digest(lines), 196)


def _wds(location: str) -> Listing:
    from qkvsearch.trainers.data.shard_index import _listing, read_shard_set

    shards = read_shard_set(location)
    sizes = _listing(location)
    lines = [json.dumps([shards.info, sizes.get(shards.info.rsplit("/", 1)[-1])])]
    units = {}
    for role, split in (("train", shards.train), ("val", shards.val)):
        units[role] = [{"tar": f, "samples": n, "split": split.name} for f, n in zip(split.files, split.lengths)]
        lines += [f"{f}\t{sizes.get(f)}\t{n}" for f, n in zip(split.files, split.lengths)]
    return Listing(units, _digest(lines), 0)


def _hfds(root: str) -> Listing:
    import pyarrow.parquet as pq

    from qkvsearch.trainers.data.hf_folder import split_files

    units, lines = {}, []
    for role, (_name, files) in split_files(root).items():
        out = []
        for file in sorted(files):
            lines.append(_stat_line(file, os.path.relpath(file, root)))
            if file.endswith(".parquet"):
                meta = pq.ParquetFile(file).metadata
                out += [{"table": os.path.relpath(file, root), "row_group": g, "rows": meta.row_group(g).num_rows}
                        for g in range(meta.num_row_groups)]
            else:
                n = len(_arrow_table(file))
                out += [{"table": os.path.relpath(file, root), "start": a, "stop": min(a + UNIT_IMAGES, n)}
                        for a in range(0, n, UNIT_IMAGES)]
        units[role] = out
    return Listing(units, _digest(lines), 0)


LISTERS = {"imagefolder": _imagefolder, "cars": _cars, "wds": _wds, "hfds": _hfds}


# ---------------------------------------------------------------------------------------------- reading


def read_unit(data_path: str, unit: dict) -> Iterator[tuple[str, bytes | Exception, int]]:
    """(name, the image's encoded bytes or the error that reading them raised, label) of each image of a unit, in
    order. A unit whose container (tar, table) cannot be read raises DatasetError naming it."""
    if "files" in unit:
        for rel, label in unit["files"]:
            try:
                with open(os.path.join(data_path, rel), "rb") as f:
                    data = f.read()
            except OSError as err:
                data = err
            yield rel, data, int(label)
    elif "tar" in unit:
        yield from _tar_samples(data_path, unit)
    else:
        yield from _table_rows(data_path, unit)


def _tar_samples(location: str, unit: dict):
    from qkvsearch.storage import open_location
    from qkvsearch.trainers.data.shard_deal import Piece
    from qkvsearch.trainers.data.shard_index import ShardSet, Split
    from qkvsearch.trainers.data.shard_source import IMAGE_KEYS, read_piece

    split = Split(unit["split"], (unit["tar"],), (unit["samples"],))
    shards = ShardSet(location, f"{location.rstrip('/')}/_info.json", split, split)
    fs, root = open_location(location)
    for _, sample in read_piece(fs, root, shards, split, Piece(0, 0, unit["samples"])):
        name = f"{unit['tar']}/{sample.get('__key__')}"
        image = next((sample[k] for k in IMAGE_KEYS.split(";") if k in sample), None)
        try:
            label = int(sample["cls"])
        except (KeyError, ValueError) as err:
            raise DatasetError(f"data_path: sample {name} has no class index (.cls): {reason(err)}") from err
        yield name, image if image is not None else KeyError(f"no {IMAGE_KEYS.replace(';', ' / ')} file"), label


def _arrow_table(file: str):
    import pyarrow as pa

    source = pa.memory_map(file)
    try:
        return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_file(pa.memory_map(file)).read_all()


def _table_rows(root: str, unit: dict):
    import pyarrow.parquet as pq

    from qkvsearch.trainers.data.hf_folder import IMAGE_COLUMN, LABEL_COLUMN

    file = os.path.join(root, unit["table"])
    try:
        if "row_group" in unit:
            table = pq.ParquetFile(file).read_row_group(unit["row_group"], columns=[IMAGE_COLUMN, LABEL_COLUMN])
            first = 0
        else:
            table = _arrow_table(file).slice(unit["start"], unit["stop"] - unit["start"])
            first = unit["start"]
    except Exception as err:  # any failure here means "this table cannot be read": say which
        raise DatasetError(f"data_path: could not read {file}: {reason(err)}") from err
    for i, (value, label) in enumerate(zip(table.column(IMAGE_COLUMN).to_pylist(),
                                           table.column(LABEL_COLUMN).to_pylist())):
        name = f"{unit['table']}#{unit.get('row_group', '')}{'/' if 'row_group' in unit else ''}{first + i}"
        try:
            data = _image_bytes(value, root)
        except Exception as err:  # noqa: BLE001  (a bad row: counted by the caller)
            data = err
        yield name, data, int(label)


def _image_bytes(value, folder: str) -> bytes:
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        with open(os.path.join(folder, value), "rb") as f:
            return f.read()
    raise ValueError(f"an image column value of type {type(value).__name__}")


# ---------------------------------------------------------------------------------------------- decoding on the host


@dataclass(frozen=True)
class Decoded:
    """One source image decoded to 8-bit RGB: (H, W, 3) uint8 array, and what it was when it was not RGB."""

    array: object
    converted: str = ""     # "", "CMYK", "grayscale", "16-bit", or another PIL mode (palette, alpha)


def decode(data: bytes):
    """Encoded bytes -> Decoded; raises ValueError saying why an image cannot be read (zero-byte, not an image,
    truncated or corrupt). 16-bit images are scaled to 8 bits (PIL's convert would clip them to white)."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    if not len(data):
        raise ValueError("zero-byte file")
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except UnidentifiedImageError:
        raise ValueError("not an image PIL can identify (corrupt)") from None
    except (OSError, SyntaxError, ValueError) as err:
        text = str(err)
        raise ValueError(f"truncated ({text})" if "truncated" in text.lower() else f"corrupt ({text})") from None
    mode, kind = img.mode, ""
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        kind = "16-bit"
        a = np.asarray(img, dtype=np.float64)
        top = 65535.0 if mode.startswith("I;16") or a.max() > 255 else 255.0
        img = Image.fromarray(np.clip(a * (255.0 / top) + 0.5, 0, 255).astype(np.uint8), "L")
    elif mode == "CMYK":
        kind = "CMYK"
    elif mode in ("L", "LA", "1"):
        kind = "grayscale"
    elif mode != "RGB":
        kind = mode
    return Decoded(np.asarray(img.convert("RGB")), kind)
