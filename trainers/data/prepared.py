"""A prepared dataset: a dataset's images decoded once, resized to a short side the training crop can use, and
stored as shards that every trial of every campaign on that storage reads (the device input path,
trainers.data.device_source).

    <root>/<key>/manifest.json       written last: the dataset is complete when it is there
                 units.json          the source units each shard was made of (to make a damaged one again)
                 <role>-NNNNN.bin    the images of one unit, one after the other (FORMAT: raw uint8 HWC or JPEG)
                 <role>-NNNNN.idx    their index: JSON [[offset, length, height, width, label], ...]
                 verified.json       (size, mtime) of each file when its checksum was last checked here
                 history.jsonl       one line per preparation: which shards, why, how long

``key``: a hash of the source's listing (trainers.data.image_items: names, sizes, modification times, labels),
the short side, the stored format and the code's PREPARE_VERSION: a later or resumed campaign over the same
files finds it. Every file goes through qkvsearch.storage (a local path or a bucket; atomic writes). Before a
trial reads it, each shard is checked: its files' sizes against the manifest, and their SHA-256 where they
changed since they were last verified (on a bucket: when a node copies them to its own disk); a damaged shard
is prepared again from its unit, never read half.

Bad source images are found here: unreadable ones (zero-byte, truncated, corrupt) are left out and named in the
manifest, and the ``bad_images`` policy decides when the dataset is opened (refuse: DatasetError naming them;
skip: read without them); CMYK, grayscale, 16-bit and other non-RGB images are converted to 8-bit RGB, counted
and named.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from qkvsearch.spaces.errors import reason
from qkvsearch.storage import exists, open_location, read_bytes, read_json, write_bytes, write_json
from qkvsearch.trainers.data import image_items
from qkvsearch.trainers.data.device_augment import EVAL_CROP_PCT
from qkvsearch.trainers.data.sources import DatasetError

log = logging.getLogger(__name__)

PREPARE_VERSION = 1
FORMATS = ("raw", "jpeg")
# The stored format, chosen by measurement (benchmarks/README.md, "The device input path"): raw uint8 takes 12.5x
# less host CPU per training image than PIL and timm's transforms, JPEG at the same side 6.2x (its decoding), at
# 2.3x the source JPEGs' bytes on disk against 0.23x.
FORMAT = "raw"
JPEG_QUALITY = 90
MAX_ASPECT = 2.0       # a longer side than MAX_ASPECT x the short side keeps its centre (bounds a batch's canvas)
PREPARED_DIR = "qs_prepared"   # under a campaign's storage, beside its campaigns
MANIFEST, UNITS, VERIFIED, HISTORY = "manifest.json", "units.json", "verified.json", "history.jsonl"
NAMED = 20             # bad images named in a message, at most


def short_side(img_size: int) -> int:
    """The prepared short side: timm's evaluation resize (img_size / crop_pct, 256 for 224), so that evaluation
    reads a prepared image exactly as timm's transform would; the training crop's choice: benchmarks/README.md."""
    return math.floor(img_size / EVAL_CROP_PCT)


def default_root() -> str:
    """Where a run outside a campaign keeps prepared datasets ($QKVSEARCH_PREPARED, else in the user's cache; a
    campaign: <storage>/qs_prepared)."""
    return os.environ.get("QKVSEARCH_PREPARED") or os.path.join(os.path.expanduser("~"), ".cache", "qkvsearch",
                                                                PREPARED_DIR)


@dataclass(frozen=True)
class Plan:
    """What a prepared dataset of a config's source is: its location, the source's listing, the short side and the
    stored format."""

    location: str
    data_path: str
    dataset: str
    listing: image_items.Listing
    short: int
    format: str = FORMAT

    @property
    def key(self) -> str:
        return self.location.rstrip("/").rsplit("/", 1)[-1]

    def shard_names(self, role: str) -> list[str]:
        return [f"{role}-{i:05d}" for i in range(len(self.listing.units[role]))]

    def estimated_bytes(self) -> float:
        """Bytes the stored images take, estimated: raw at the short side x 4/3 (a 4:3 image); JPEG from the
        measured bytes per pixel of benchmarks/README.md."""
        pixels = self.short * self.short * 4 / 3
        per_image = pixels * 3 if self.format == "raw" else pixels * JPEG_BYTES_PER_PIXEL
        return per_image * sum(self.listing.images(r) for r in ("train", "val"))


JPEG_BYTES_PER_PIXEL = 0.25  # re-encoded at quality 90: bench_data.py's generated photos (an estimate for validate)


def plan(cfg: dict, root: str, fmt: str = FORMAT) -> Plan:
    """The prepared dataset of ``cfg``'s source under ``root`` (a path or URI): lists the source."""
    listing = image_items.listing(cfg)
    short = short_side(cfg["img_size"])
    key = hashlib.sha256(json.dumps([listing.fingerprint, cfg["dataset"], short, fmt, JPEG_QUALITY, MAX_ASPECT,
                                     PREPARE_VERSION]).encode()).hexdigest()[:20]
    return Plan(f"{root.rstrip('/')}/{key}", cfg["data_path"], cfg["dataset"], listing, short, fmt)


# ---------------------------------------------------------------------------------------------- preparing one unit


def resized(a: np.ndarray, short: int) -> np.ndarray:
    """(H, W, 3) uint8 -> its short side ``short`` (PIL bilinear, the long side truncated, as torchvision's Resize),
    the long side's centre kept within MAX_ASPECT x short."""
    from PIL import Image

    h, w = a.shape[:2]
    nh, nw = (int(short * h / w), short) if w <= h else (short, int(short * w / h))
    out = np.asarray(Image.fromarray(a).resize((nw, nh), Image.BILINEAR))
    most = int(MAX_ASPECT * short)
    if nh > most:
        out = out[(nh - most) // 2:(nh - most) // 2 + most]
    if nw > most:
        out = out[:, (nw - most) // 2:(nw - most) // 2 + most]
    return np.ascontiguousarray(out)


def encode(a: np.ndarray, fmt: str) -> bytes:
    if fmt == "raw":
        return a.tobytes()
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(a).save(out, "JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


def decode_stored(data, h: int, w: int, fmt: str) -> np.ndarray:
    """A stored image's bytes -> (h, w, 3) uint8."""
    if fmt == "raw":
        return np.frombuffer(data, dtype=np.uint8).reshape(h, w, 3)
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img)


def prepare_unit(location: str, data_path: str, unit: dict, name: str, short: int, fmt: str) -> dict:
    """Decode, resize and store one unit as shard ``name`` (its .bin and .idx); -> its manifest entry, with the
    unreadable images ([name, why]) and the converted ones ({kind: [names]}) it found."""
    t0 = time.perf_counter()
    chunks, index, unreadable, converted, offset = [], [], [], {}, 0
    for item, data, label in image_items.read_unit(data_path, unit):
        if isinstance(data, Exception):
            unreadable.append([item, f"unreadable ({reason(data)})"])
            continue
        try:
            decoded = image_items.decode(data)
        except ValueError as err:
            unreadable.append([item, str(err)])
            continue
        if decoded.converted:
            converted.setdefault(decoded.converted, []).append(item)
        a = resized(decoded.array, short)
        blob = encode(a, fmt)
        chunks.append(blob)
        index.append([offset, len(blob), a.shape[0], a.shape[1], label])
        offset += len(blob)
    data, idx = b"".join(chunks), json.dumps(index).encode()
    write_bytes(f"{location}/{name}.bin", data)
    write_bytes(f"{location}/{name}.idx", idx)
    return {"name": name, "images": len(index), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "index_bytes": len(idx), "index_sha256": hashlib.sha256(idx).hexdigest(),
            "unreadable": unreadable, "converted": converted, "seconds": time.perf_counter() - t0}


def serial(fn: Callable, calls: list[tuple]) -> list:
    """Run prepare_unit's calls one after the other in this process (a campaign's driver: Ray tasks instead)."""
    return [fn(*args) for args in calls]


# ---------------------------------------------------------------------------------------------- the whole dataset


@contextlib.contextmanager
def locked(location: str):
    """An exclusive hold on a local prepared dataset while it is checked or written (trials of one node); none for a
    bucket (its writes are whole objects, and its readers check what they copy)."""
    if "://" in location:
        yield
        return
    import fcntl

    os.makedirs(location, exist_ok=True)
    with open(os.path.join(location, ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure(p: Plan, run: Callable = serial) -> dict:
    """The manifest of ``p``'s prepared dataset, preparing what is missing or damaged first (``run`` maps
    prepare_unit over its calls: in this process, or over a cluster). Returns the manifest."""
    with locked(p.location):
        manifest = read_manifest(p.location)
        if manifest is None:
            todo = {r: p.shard_names(r) for r in ("train", "val")}
            why = "new"
        else:
            damaged = check(p.location, manifest)
            if not damaged:
                return manifest
            todo = {r: [n for n in p.shard_names(r) if n in damaged] for r in ("train", "val")}
            why = "damaged: " + "; ".join(f"{n} ({damaged[n]})" for n in sorted(damaged)[:NAMED])
        if manifest is None:
            write_json(f"{p.location}/{UNITS}", p.listing.units)
        return _prepare(p.location, p.data_path, p.listing.units, todo, p.short, p.format, run, manifest, why,
                        {"dataset": p.dataset, "data_path": p.data_path, "fingerprint": p.listing.fingerprint,
                         "classes": p.listing.classes})


def _prepare(location, data_path, units, todo, short, fmt, run, manifest, why, source) -> dict:
    t0 = time.perf_counter()
    calls = [(location, data_path, units[role][int(name.rsplit("-", 1)[1])], name, short, fmt)
             for role, names in todo.items() for name in names]
    entries = {e["name"]: e for e in run(prepare_unit, calls)}
    if manifest is None:
        manifest = {"version": PREPARE_VERSION, "source": source, "short_side": short, "format": fmt,
                    "jpeg_quality": JPEG_QUALITY, "max_aspect": MAX_ASPECT,
                    "splits": {role: [] for role in units}}
        for role in units:
            manifest["splits"][role] = [entries[f"{role}-{i:05d}"] for i in range(len(units[role]))]
    else:
        for role in manifest["splits"]:
            manifest["splits"][role] = [entries.get(e["name"], e) for e in manifest["splits"][role]]
    seconds = time.perf_counter() - t0
    write_json(f"{location}/{MANIFEST}", manifest)
    stamp(location, manifest)
    done = list(entries.values())
    _history(location, {"at": time.time(), "why": why, "shards": sorted(entries), "seconds": seconds,
                        "images": sum(e["images"] for e in done), "bytes": sum(e["bytes"] for e in done),
                        "cpu_seconds": sum(e["seconds"] for e in done)})
    log.info("prepared %d shard(s) of %s in %.1f s (%s)", len(entries), location, seconds, why[:200])
    return manifest


def _history(location: str, line: dict) -> None:
    from qkvsearch.storage import append_bytes

    uri = f"{location}/{HISTORY}"
    data = (json.dumps(line) + "\n").encode()
    append_bytes(uri, data, lambda: (read_bytes(uri) if exists(uri) else b"") + data)


def history(location: str) -> list[dict]:
    """The preparations of a prepared dataset, oldest first."""
    uri = f"{location}/{HISTORY}"
    if not exists(uri):
        return []
    return [json.loads(line) for line in read_bytes(uri).decode().splitlines() if line.strip()]


def read_manifest(location: str) -> dict | None:
    """The manifest of a complete prepared dataset, or None (not there, or not one this code reads)."""
    try:
        m = read_json(f"{location}/{MANIFEST}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("prepared dataset %s: unreadable manifest, prepared again (%s)", location, reason(err))
        return None
    return m if isinstance(m, dict) and m.get("version") == PREPARE_VERSION else None


def shard_files(entry: dict):
    yield f"{entry['name']}.bin", entry["bytes"], entry["sha256"]
    yield f"{entry['name']}.idx", entry["index_bytes"], entry["index_sha256"]


def _sha256_file(fs, path: str) -> str:
    h = hashlib.sha256()
    with fs.open_input_stream(path) as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def check(location: str, manifest: dict) -> dict[str, str]:
    """Shard name -> what is wrong with it, for each damaged shard: a file missing or of another size than the
    manifest says; locally, a checksum that differs, for the files changed since verified.json says they were
    checked (each is checked the first time). Records what it verified."""
    import pyarrow.fs as pafs

    fs, root = open_location(location)
    local = isinstance(fs, pafs.LocalFileSystem)
    marks = _read_stamp(location) if local else {}
    damaged, verified = {}, dict(marks)
    for entries in manifest["splits"].values():
        for entry in entries:
            for file, size, digest in shard_files(entry):
                info = fs.get_file_info(f"{root}/{file}")
                if info.type == pafs.FileType.NotFound:
                    damaged[entry["name"]] = f"{file} missing"
                    break
                if info.size != size:
                    damaged[entry["name"]] = f"{file} holds {info.size} bytes, the manifest says {size}"
                    break
                if not local:
                    continue
                mark = [info.size, info.mtime_ns]
                if marks.get(file) == mark:
                    continue
                if _sha256_file(fs, f"{root}/{file}") != digest:
                    damaged[entry["name"]] = f"{file}'s SHA-256 differs from the manifest's"
                    verified.pop(file, None)
                    break
                verified[file] = mark
    if local and verified != marks:
        write_json(f"{location}/{VERIFIED}", verified)
    return damaged


def _read_stamp(location: str) -> dict:
    try:
        return read_json(f"{location}/{VERIFIED}")
    except (FileNotFoundError, ValueError):
        return {}


def stamp(location: str, manifest: dict) -> None:
    """Record the files just written as verified (their checksums were computed from the bytes written)."""
    import pyarrow.fs as pafs

    fs, root = open_location(location)
    if not isinstance(fs, pafs.LocalFileSystem):
        return
    marks = _read_stamp(location)
    for entries in manifest["splits"].values():
        for entry in entries:
            for file, _, _ in shard_files(entry):
                info = fs.get_file_info(f"{root}/{file}")
                if info.type != pafs.FileType.NotFound:
                    marks[file] = [info.size, info.mtime_ns]
    write_json(f"{location}/{VERIFIED}", marks)


def bad_images(manifest: dict) -> tuple[list, dict]:
    """(unreadable [name, why] left out, converted {kind: [names]}) over the whole prepared dataset."""
    unreadable, converted = [], {}
    for entries in manifest["splits"].values():
        for e in entries:
            unreadable += e["unreadable"]
            for kind, names in e["converted"].items():
                converted.setdefault(kind, []).extend(names)
    return unreadable, converted


def bad_images_text(manifest: dict, data_path: str) -> str:
    """What preparation found, in words ('' when nothing)."""
    unreadable, converted = bad_images(manifest)
    parts = []
    if unreadable:
        parts.append(f"{len(unreadable)} unreadable image(s) left out of {data_path}: "
                     + ", ".join(f"{n} ({why})" for n, why in unreadable[:NAMED])
                     + (" ..." if len(unreadable) > NAMED else ""))
    for kind, names in sorted(converted.items()):
        parts.append(f"{len(names)} {kind} image(s) converted to 8-bit RGB: " + ", ".join(names[:NAMED])
                     + (" ..." if len(names) > NAMED else ""))
    return "; ".join(parts)


def apply_policy(manifest: dict, policy: str, data_path: str) -> None:
    """bad_images refuse: DatasetError naming the unreadable images preparation left out; skip: a log line."""
    unreadable, _ = bad_images(manifest)
    text = bad_images_text(manifest, data_path)
    if unreadable and policy == "refuse":
        raise DatasetError(f"data.bad_images: refuse, and {text} (fix or remove them, or set data.bad_images: skip)")
    if text:
        log.warning("prepared dataset: %s", text)


# ---------------------------------------------------------------------------------------------- repairs


def repair(location: str, manifest: dict, damaged: dict, run: Callable = serial) -> dict:
    """Prepare the damaged shards again from units.json (no listing of the source); -> the new manifest."""
    units = read_json(f"{location}/{UNITS}")
    todo = {role: [e["name"] for e in entries if e["name"] in damaged] for role, entries in manifest["splits"].items()}
    why = "damaged: " + "; ".join(f"{n} ({damaged[n]})" for n in sorted(damaged)[:NAMED])
    return _prepare(location, manifest["source"]["data_path"], units, todo, manifest["short_side"],
                    manifest["format"], run, manifest, why, manifest["source"])
