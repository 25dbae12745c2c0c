"""Data loading: training images/s per DataLoader process, the loader processes a GPU would need, and the input
paths side by side (--paths).

Each dataset is the training split as the project builds and reads it for a trial (spaces.keys.fill, then
trainers.data.datasets's check_dataset, load_data, train_part, and the source's batches on the CPU, as one rank of
one reads it), at 224 px through timm's training transform as trainers.data.datasets makes it: ``randaugment``, the
paper presets' recipe (random resized crop, flip, rand-m9-mstd0.5-inc1), and ``augment`` (random resized
crop, flip, colour jitter). Images: --images JPEGs (quality 90, each side 400-500 px, smooth random colours
with noise, ~90 KB: near ImageNet's ~110 KB), generated into a temporary folder and stored twice:
- imagefolder: torchvision's ImageFolder layout (train/<class>/<image>.jpg, and val/), read from the
  local folder only: the project reads an imagefolder through local paths, not from a bucket;
- wds: the same images as WebDataset tar shards in timm's layout with _info.json (the shard reader),
  read from the local folder and from an S3 bucket served by moto on 127.0.0.1 (a server process of its
  own, on a free port, reached through AWS_ENDPOINT_URL as the project's storage layer reads s3://).
Each (dataset, storage, transform) is read with loader_workers 0 (the training process decodes), 1 and 2
(--workers): a warm-up pass each (loader processes started, files in the page cache), then --repeats passes
each, interleaved, medians; a pass during which other processes on the machine used more than --max-other
cores (/proc/stat less this benchmark's processes) is run again, twice at most. images/s per process =
images/s / loader processes (0: the training process itself, which runs torch on one thread, as a loader
process does). Then, per dataset and storage, the loader processes needed to feed a GPU's training:
ceil(GPU images/s / images/s of one loader process), for the GPU figures in GPU_RATES (bench_gpu.py's, as
recorded in benchmarks/README.md; --gpu-rate adds or replaces one). Everything it starts (the S3 server,
loader processes, the temporary folder) it stops or removes, on Ctrl-C and SIGTERM too.

With --paths, the input paths instead (trainers.data.pipelines), on the same imagefolder, side by side in one run:
today's path (PIL and timm's rand-m9-mstd0.5-inc1 in --path-workers loader processes, float32 batches) against the
prepared dataset stored raw (uint8) and as JPEG (quality 90), each read by as many loader processes into the uint8
batch handed to the device: host CPU per training image (every process of the benchmark during a pass, /proc),
images/s per core, images/s; beside them the device augmentation's time per image, measured here on one CPU
thread (no GPU). Then the preparation's cost (CPU per image and per source GB, bytes stored per image) in one
process, and the prepared short side's parity: the device crop of an image prepared at each side against timm's
crop of the source image for the same box (PSNR).

    python benchmarks/bench_data.py [--images 640] [--workers 0,1,2] [--repeats 3] [--batch 64]
        [--transforms randaugment,augment] [--no-s3] [--max-other 0.25] [--dir TMP] [--gpu-rate XCiT-S12=2000]
    python benchmarks/bench_data.py --paths [--images 640] [--path-workers 1] [--repeats 3] [--batch 64]
"""
from __future__ import annotations

import argparse
import io
import json
import math
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

import numpy as np
import torch

from qkvsearch.spaces.keys import fill

MODEL = "xcit_nano_12_p16_224"  # the config needs one; the data path does not depend on it
IMG_SIZE = 224
CLASSES = 10
VAL_PER_CLASS = 2               # the validation split the checks need; it is not read
SHARDS = 8                      # training shards at least (2 per loader process at least)
SIDE = (400, 500)               # px, each side drawn in this range: about ImageNet's typical image
JPEG_QUALITY = 90
BUCKET = "bench-data"
REDO = 2                        # times a pass disturbed by other processes is run again, at most
SEED = 0
CPU = torch.device("cpu")
TRANSFORMS = {"randaugment": {"randaugment": "rand-m9-mstd0.5-inc1"},   # spaces/presets/paper-*.yaml
              "augment": {"augment": True}}
# Training images/s on one GPU (bf16, 224 px), name -> (images/s or None, where the figure comes from).
# XCiT-N12: benchmarks/README.md, "On one H100" (bench_gpu.py --parts 4): the largest subnet's stand-alone
# update, compiled, 56.5 ms at batch 256. That subnet is XCiT-N12 with SNE embeddings of width 128 (0.666
# GMACs, 1.21x XCiT-N12's 0.551), so XCiT-N12 itself likely trains faster: its processes are a lower bound.
GPU_RATES = {
    "XCiT-N12": (256 / 0.0565, "H100, XCiT-N12 with SNE h 128 compiled, 56.5 ms per update of 256 "
                               "(benchmarks/README.md, 'On one H100')"),
    "XCiT-S12": (None, "not measured (no GPU)"),
}


# ---------------------------------------------------------------------------------------------
# The images, as an imagefolder and as shards


def jpeg(rng: np.random.Generator) -> bytes:
    """A JPEG of random size in SIDE: a few random colours blown up (smooth areas and edges, as a photo has)
    plus pixel noise (texture), ~90 KB at quality 90."""
    from PIL import Image

    w, h = (int(v) for v in rng.integers(SIDE[0], SIDE[1] + 1, size=2))
    coarse = rng.integers(0, 256, (int(rng.integers(6, 24)), int(rng.integers(6, 24)), 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), dtype=np.float32)  # (h, w, 3)
    img += rng.normal(0.0, 14.0, img.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


def write_imagefolder(root: str, images: dict[str, list[bytes]]) -> None:
    """root/<split>/c<label>/<split>_<i>.jpg; image i of a split has label i % CLASSES (ImageFolder's labels
    are the sorted class folders, so they agree)."""
    for split, jpegs in images.items():
        for i, data in enumerate(jpegs):
            folder = os.path.join(root, split, f"c{i % CLASSES:02d}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{split}_{i:06d}.jpg"), "wb") as f:
                f.write(data)


def tar_bytes(split: str, jpegs: list[bytes], first: int) -> bytes:
    """A tar of samples <key>.jpg and <key>.cls (the label as text), keys without dots, as timm's wds sets."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, data in enumerate(jpegs, start=first):
            for ext, payload in (("jpg", data), ("cls", str(i % CLASSES).encode())):
                entry = tarfile.TarInfo(f"{split}_{i:06d}.{ext}")
                entry.size = len(payload)
                tar.addfile(entry, io.BytesIO(payload))
    return out.getvalue()


def shard_files(images: dict[str, list[bytes]], shards: int) -> dict[str, bytes]:
    """name -> bytes of a shard set in timm's layout: the training split in ``shards`` shards of equal size
    (within one), validation in one, and _info.json naming them."""
    files, info = {}, {"name": "bench-data", "splits": {}}
    for split, jpegs in images.items():
        n = shards if split == "train" else 1
        bounds = [len(jpegs) * k // n for k in range(n + 1)]
        names = [f"{split}-{k:04d}.tar" for k in range(n)]
        for k, name in enumerate(names):
            files[name] = tar_bytes(split, jpegs[bounds[k]:bounds[k + 1]], bounds[k])
        info["splits"][split] = {"name": split, "num_samples": len(jpegs), "filenames": names,
                                 "shard_lengths": [bounds[k + 1] - bounds[k] for k in range(n)]}
    files["_info.json"] = json.dumps(info, indent=1).encode()
    return files


def write_shards(location: str, files: dict[str, bytes]) -> None:
    from qkvsearch.storage import write_bytes

    for name, data in files.items():
        write_bytes(f"{location.rstrip('/')}/{name}", data)


# ---------------------------------------------------------------------------------------------
# An S3 bucket on 127.0.0.1 (moto's server, a process of its own)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    """What the server process runs before it starts: end it when this process ends, SIGKILL included (Linux's
    PR_SET_PDEATHSIG); None where that cannot be had. Looked up here: the child may only call it."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


class S3Server:
    """moto's S3 server on 127.0.0.1 in a process of its own (in this process it would share the GIL with the
    decoding it serves); while entered, AWS_ENDPOINT_URL and test credentials in this process's environment
    (loader processes inherit them) and a bucket BUCKET."""

    ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}

    def __init__(self):
        self.proc, self.saved = None, {}

    def __enter__(self):
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from moto.server import main; main(sys.argv[1:])",
             "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent() if sys.platform == "linux" else None)
        try:
            self._wait_ready()
            env = {**self.ENV, "AWS_ENDPOINT_URL": self.endpoint}
            self.saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            import pyarrow.fs as pafs

            pafs.S3FileSystem(endpoint_override=self.endpoint, allow_bucket_creation=True).create_dir(BUCKET)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto's S3 server ended at start (exit status {self.proc.returncode})")
            try:
                with urllib.request.urlopen(self.endpoint, timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"moto's S3 server did not answer on {self.endpoint} within {timeout:.0f} s")

    def cpu_seconds(self) -> float:
        """CPU seconds the server process has used."""
        return process_cpu(self.proc.pid)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.saved = {}
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# ---------------------------------------------------------------------------------------------
# Reading


def train_source(dataset: str, data_path: str, transform: str, workers: int):
    """The training split as the project builds it for a trial of this config (checked first, as before a
    worker starts)."""
    from qkvsearch.trainers.data import datasets as qdata

    cfg = fill({"model": MODEL, "img_size": IMG_SIZE, "dataset": dataset, "data_path": data_path,
                "num_classes": CLASSES, "epochs": 1, "seed": SEED, "loader_workers": workers,
                **TRANSFORMS[transform]})
    qdata.check_dataset(cfg, world_size=1)
    train, _val = qdata.load_data(cfg)
    return train


def one_pass(source, epoch: int, batch: int) -> tuple[int, float]:
    """(images, seconds) of one epoch's pass over the whole split, one rank of one, batches (B, 3, 224, 224)."""
    from qkvsearch.trainers.data import datasets as qdata

    torch.manual_seed(SEED + epoch)  # the augmentation seed, as the engine sets it per epoch
    part = qdata.train_part(source, 1, 0, SEED, epoch)
    n, t = 0, time.perf_counter()
    for _x, y in source.batches(part, batch, CPU, drop_last=False):
        n += len(y)
    return n, time.perf_counter() - t


def close(source) -> None:
    """Stop the source's loader processes (persistent: its DataLoaders keep them between passes)."""
    for *_, loader in getattr(source, "_loaders", {}).values():
        it = getattr(loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
    getattr(source, "_loaders", {}).clear()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used: Linux's /proc, else nan."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, ValueError, IndexError):
        return float("nan")


def cpu_clock(server) -> tuple[float, float, float]:
    """(the machine's busy CPU seconds, steal included; this benchmark's: itself and its loader processes;
    the S3 server's), from /proc: what else ran during a pass is the difference."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        machine = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        machine = float("nan")
    mine = sum(os.times()[:2]) + sum(process_cpu(c.pid) for c in multiprocessing.active_children())
    return machine, mine, server.cpu_seconds() if server else 0.0


def timed_pass(source, epoch: int, batch: int, server) -> tuple[float, float, float]:
    """(images/s, the S3 server's CPU, other processes' CPU) of one pass; CPU in cores (CPU s / pass s)."""
    before = cpu_clock(server)
    n, seconds = one_pass(source, epoch, batch)
    machine, mine, srv = (b - a for a, b in zip(before, cpu_clock(server)))
    return n / seconds, srv / seconds, max(machine - mine - srv, 0.0) / seconds


def measure(dataset, storage, data_path, transform, workers, batch, repeats, max_other, server=None) -> list[dict]:
    """One row per loader_workers value: the sources built side by side (idle loader processes use no CPU),
    each warmed up, then their timed passes interleaved (the order reversed every other repeat), so a change
    in the machine's other load falls on every setting alike; a pass during which other processes used more
    than ``max_other`` cores is run again (REDO times at most; the last one counts whatever it shows)."""
    sources = {}
    try:
        for w in workers:
            sources[w] = train_source(dataset, data_path, transform, w)
        warm = {}
        for w, source in sources.items():
            t0 = time.perf_counter()
            one_pass(source, 0, batch)  # warm-up: loader processes start, files enter the page cache
            warm[w] = time.perf_counter() - t0
        got = {w: [] for w in workers}  # w -> [(images/s, server cores, other cores)] per repeat
        redone = dict.fromkeys(workers, 0)
        for r in range(repeats):
            for w in (workers if r % 2 == 0 else workers[::-1]):
                for attempt in range(1 + REDO):
                    result = timed_pass(sources[w], 1 + r, batch, server)
                    if result[2] <= max_other or attempt == REDO:
                        break
                    redone[w] += 1  # other processes took a share of the cores: this pass again
                got[w].append(result)
    finally:
        for source in sources.values():
            close(source)
    rows = []
    for w in workers:
        rates, srv, other = (list(v) for v in zip(*got[w]))
        rate = statistics.median(rates)
        rows.append({"dataset": dataset, "storage": storage, "transform": transform, "workers": w, "rate": rate,
                     "per_process": rate / max(w, 1), "rates": rates, "warm_s": warm[w],
                     "server": statistics.median(srv) if server else None, "other": statistics.median(other),
                     "redone": redone[w]})
        print(f"  {dataset:11s} {storage:5s} {transform:11s} loader processes {w}: {rate:7.1f} images/s, "
              f"{rows[-1]['per_process']:6.1f} per process  {[round(x, 1) for x in rates]}  (warm-up pass "
              f"{warm[w]:.1f} s; other processes {rows[-1]['other']:.2f} cores; passes redone {redone[w]}"
              + (f"; S3 server {rows[-1]['server']:.2f} cores" if server else "") + ")", flush=True)
    return rows


# ---------------------------------------------------------------------------------------------
# Tables


def one_process_rate(rows, dataset, storage, transform) -> tuple[float, int] | None:
    """images/s of one loader process: at loader_workers 1 (a core of its own) if measured, else the best per
    process measured; -> (rate, the loader_workers it came from)."""
    mine = [r for r in rows if (r["dataset"], r["storage"], r["transform"]) == (dataset, storage, transform)]
    one = [r for r in mine if r["workers"] == 1]
    best = one[0] if one else max(mine, key=lambda r: r["per_process"], default=None)
    return (best["per_process"], best["workers"]) if best else None


def print_tables(rows: list[dict], gpu: dict, cores: int) -> None:
    print("\n| dataset | storage | transform | loader processes | images/s, median (passes' range) | images/s per "
          "process | other processes' CPU (cores; passes redone) | S3 server's CPU (cores) |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        server = f"{r['server']:.2f}" if r["server"] is not None else "-"
        print(f"| {r['dataset']} | {r['storage']} | {r['transform']} | {r['workers'] or '0 (in the training process)'}"
              f" | {r['rate']:,.0f} ({min(r['rates']):,.0f}-{max(r['rates']):,.0f}) | {r['per_process']:,.0f} | "
              f"{r['other']:.2f}; {r['redone']} | {server} |")
    if any(r["storage"] == "local" and r["dataset"] == "imagefolder" for r in rows):
        print("| imagefolder | S3 | - | - | not read: the project reads an imagefolder from local paths only "
              "| - | - | - |")
    print(f"\nLoader processes needed to feed one GPU: ceil(GPU training images/s / images/s of one loader "
          f"process), {cores} CPU cores here")
    names = list(gpu)
    print("| dataset | storage | transform | images/s of one loader process | "
          + " | ".join(f"{n} ({_gpu_label(*gpu[n])})" for n in names) + " |")
    print("|---" * (4 + len(names)) + "|")
    seen = []
    for r in rows:
        key = (r["dataset"], r["storage"], r["transform"])
        if key in seen:
            continue
        seen.append(key)
        rate, workers = one_process_rate(rows, *key)
        cells = [str(math.ceil(g / rate)) if g else "not measured (no GPU)" for g, _ in (gpu[n] for n in names)]
        print(f"| {' | '.join(key)} | {rate:,.0f}{'' if workers == 1 else f' (at {workers})'} | "
              + " | ".join(cells) + " |")
    for n in names:
        print(f"{n}: {gpu[n][1]}")


def _gpu_label(rate, source) -> str:
    return f"{rate:,.0f} images/s" if rate else "no GPU figure"


# ---------------------------------------------------------------------------------------------
# The input paths side by side: host CPU per training image, today's path against the prepared one


def cpu_now() -> float:
    """CPU seconds this process and its loader processes have used."""
    return sum(os.times()[:2]) + sum(process_cpu(c.pid) for c in multiprocessing.active_children())


def prepare_cost(data_path: str, root: str, fmt: str) -> dict:
    """Prepare the imagefolder in this process (one core: trainers.data.prepared.serial) -> its cost and size."""
    from qkvsearch.trainers.data import prepared as prep

    cfg = fill({"model": MODEL, "img_size": IMG_SIZE, "dataset": "imagefolder", "data_path": data_path,
                "num_classes": CLASSES, "epochs": 1, "data_pipeline": "device", **TRANSFORMS["randaugment"]})
    p = prep.plan(cfg, root, fmt)
    source_bytes = sum(os.path.getsize(os.path.join(data_path, rel)) for role in ("train", "val")
                       for u in p.listing.units[role] for rel, _ in u["files"])
    t, c = time.perf_counter(), cpu_now()
    manifest = prep.ensure(p)
    wall, cpu = time.perf_counter() - t, cpu_now() - c
    images = sum(e["images"] for entries in manifest["splits"].values() for e in entries)
    stored = sum(e["bytes"] + e["index_bytes"] for entries in manifest["splits"].values() for e in entries)
    return {"format": fmt, "location": p.location, "images": images, "cpu_ms": 1e3 * cpu / images,
            "wall_s": wall, "cpu_s_per_gb": cpu / (source_bytes / 1e9), "stored_kb": stored / images / 1e3,
            "source_kb": source_bytes / images / 1e3, "short": p.short}


def loader_pass(batches, images: int) -> tuple[float, float]:
    """(host CPU ms per image, images/s) of one pass over ``batches`` (an iterator of what loaders hand over)."""
    t, c = time.perf_counter(), cpu_now()
    n = 0
    for batch in batches:
        n += len(batch[-1])
    wall, cpu = time.perf_counter() - t, cpu_now() - c
    return 1e3 * cpu / n, n / wall


def path_rows(tmp: str, images: int, batch: int, workers: int, repeats: int) -> tuple[list[dict], list[dict]]:
    """Host CPU per training image and images/s for today's path and the prepared paths (raw, JPEG), each read
    with ``workers`` loader processes up to the batch handed to the device (float32 today, uint8 prepared);
    beside them, the device augmentation's time per image on this CPU (no GPU here). -> (rows, preparation)."""
    from qkvsearch.trainers.data import datasets as qdata
    from qkvsearch.trainers.data import prepared as prep
    from qkvsearch.trainers.data import prepared_reading as reading
    from qkvsearch.trainers.data.device_augment import Recipe
    from qkvsearch.trainers.data.device_source import PreparedSource

    folder = os.path.join(tmp, "imagefolder")
    made = [prepare_cost(folder, os.path.join(tmp, "prepared"), fmt) for fmt in prep.FORMATS]
    rows = []
    today = train_source("imagefolder", folder, "randaugment", workers)
    sources = {"today (PIL + timm, float32)": today}
    cfg = fill({"model": MODEL, "img_size": IMG_SIZE, "dataset": "imagefolder", "data_path": folder,
                "num_classes": CLASSES, "epochs": 1, **TRANSFORMS["randaugment"]})
    for m in made:
        folder_m, manifest = reading.open_checked(m["location"])
        sources[f"prepared {m['format']} (uint8)"] = PreparedSource(
            Recipe.training(cfg), workers, split=reading.read_split(folder_m, manifest, "train"))
    try:
        got = {name: [] for name in sources}
        for r in range(1 + repeats):   # the first pass warms up (loader processes, page cache)
            for name, source in sources.items():
                torch.manual_seed(SEED + r)
                order = qdata.train_part(source, 1, 0, SEED, r)
                if source is today:
                    it = source.batches(order, batch, CPU, drop_last=False)
                else:
                    sampler, loader = source._loader(CPU)
                    idx = order.tolist()
                    sampler.keys = [idx[i:i + batch] for i in range(0, len(idx), batch)]
                    it = iter(loader)
                result = loader_pass(it, len(source))
                if r:
                    got[name].append(result)
        aug_ms = device_augment_ms(sources[f"prepared {prep.FORMAT} (uint8)"], batch)
        for name, res in got.items():
            cpu = statistics.median(c for c, _ in res)
            rows.append({"path": name, "cpu_ms": cpu, "per_core": 1e3 / cpu,
                         "rate": statistics.median(r for _, r in res),
                         "aug_ms": None if name.startswith("today") else aug_ms})
    finally:
        for source in sources.values():
            close(source)
    return rows, made


def device_augment_ms(source, batch: int, passes: int = 3) -> float:
    """ms per image of the device augmentation (crop, flip, RandAugment, normalisation) on this CPU, one thread."""
    from qkvsearch.trainers.data.device_augment import DeviceAugment

    aug = DeviceAugment(source.recipe)
    images, sizes, _ = source.read(list(range(min(batch, len(source)))))
    x = images.permute(0, 3, 1, 2)
    g = torch.Generator().manual_seed(SEED)
    aug(x, sizes, g)
    times = []
    for _ in range(passes):
        t = time.perf_counter()
        aug(x, sizes, g)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times) / len(sizes)


def print_path_tables(rows: list[dict], made: list[dict], workers: int) -> None:
    base = next(r["cpu_ms"] for r in rows if r["path"].startswith("today"))
    print(f"\nInput paths, imagefolder on the local disk, {IMG_SIZE} px, rand-m9-mstd0.5-inc1; "
          f"loader_workers {workers}; "
          "host CPU: every process of the benchmark during a pass, up to the batch handed to the device")
    print("| path | host CPU per image (ms) | vs today | images/s per core | images/s | device augmentation "
          "per image (ms, on this CPU: no GPU) |\n|---|---|---|---|---|---|")
    for r in rows:
        aug = f"{r['aug_ms']:.2f}" if r["aug_ms"] is not None else "- (in the host CPU)"
        print(f"| {r['path']} | {r['cpu_ms']:.3f} | {base / r['cpu_ms']:.1f}x less | {r['per_core']:,.0f} | "
              f"{r['rate']:,.0f} | {aug} |")
    print("\nPreparation (one process, trainers.data.prepared.serial; a campaign spreads it over Ray tasks)")
    print("| format | short side (px) | stored KB per image (source KB) | CPU per image (ms) | CPU s per source GB "
          "|\n|---|---|---|---|---|")
    for m in made:
        print(f"| {m['format']} | {m['short']} | {m['stored_kb']:.1f} ({m['source_kb']:.1f}) | {m['cpu_ms']:.2f} | "
              f"{m['cpu_s_per_gb']:.0f} |")


def crop_parity(n: int = 64, sides=(160, 192, 224, 256, 320)) -> list[tuple]:
    """PSNR (dB) of the device crop of a prepared image (short side S) against timm's crop of the source image for
    the same box (PIL bilinear), median and 10th percentile over ``n`` generated photos and timm-drawn boxes; and,
    for scale, PIL bilinear against bicubic on the source (timm's interpolation 'random' picks either)."""
    import random

    from PIL import Image
    from timm.data.transforms import RandomResizedCropAndInterpolation as RRC

    from qkvsearch.trainers.data.device_augment import CROP_RATIO, CROP_SCALE, DeviceAugment, Recipe
    from qkvsearch.trainers.data.prepared import resized

    rng = np.random.default_rng(SEED)
    random.seed(SEED)   # timm's crop draws from Python's generator
    aug = DeviceAugment(Recipe(IMG_SIZE, True))
    photos = [np.asarray(Image.open(io.BytesIO(jpeg(rng))).convert("RGB")) for _ in range(n)]
    boxes = [RRC.get_params(Image.fromarray(a), CROP_SCALE, CROP_RATIO) for a in photos]

    def psnr(a, b):
        return 10 * math.log10(255 ** 2 / max(np.mean((a.astype(np.float64) - b) ** 2), 1e-12))

    out = []
    for side in (*sides, None):
        vals = []
        for a, (i, j, h, w) in zip(photos, boxes):
            want = np.asarray(Image.fromarray(a).crop((j, i, j + w, i + h))
                              .resize((IMG_SIZE, IMG_SIZE), Image.BILINEAR))
            src = a if side is None else resized(a, side)
            sy, sx = src.shape[0] / a.shape[0], src.shape[1] / a.shape[1]
            box = torch.tensor([[j * sx, i * sy, (j + w) * sx, (i + h) * sy]], dtype=torch.float32)
            got = aug.crop(torch.from_numpy(np.ascontiguousarray(src)).permute(2, 0, 1)[None], box)[0]
            vals.append(psnr(got.permute(1, 2, 0).numpy(), want))
        out.append(("source" if side is None else side, statistics.median(vals), float(np.percentile(vals, 10))))
    vals = []
    for a, (i, j, h, w) in zip(photos, boxes):
        c = Image.fromarray(a).crop((j, i, j + w, i + h))
        vals.append(psnr(np.asarray(c.resize((IMG_SIZE, IMG_SIZE), Image.BILINEAR)),
                         np.asarray(c.resize((IMG_SIZE, IMG_SIZE), Image.BICUBIC))))
    out.append(("timm bilinear vs bicubic", statistics.median(vals), float(np.percentile(vals, 10))))
    return out


def print_crop_parity(rows) -> None:
    print("\nThe prepared short side: the device crop of a prepared image against timm's crop of the source (same box, "
          "PIL bilinear), PSNR over generated photos")
    print("| prepared short side (px) | PSNR median (dB) | PSNR 10th percentile (dB) |\n|---|---|---|")
    for side, med, low in rows:
        print(f"| {side} | {med:.1f} | {low:.1f} |")


# ---------------------------------------------------------------------------------------------


def _raise_on_signal(owner: int):
    def handler(signum, frame):
        if os.getpid() != owner:  # a forked loader process: end as the signal would have ended it
            os._exit(128 + signum)
        raise SystemExit(128 + signum)  # the main process: unwind, so every finally stops what it started
    return handler


def parse_gpu_rates(given: list[str]) -> dict:
    rates = dict(GPU_RATES)
    for item in given:
        name, _, value = item.partition("=")
        try:
            rates[name.strip()] = (float(value), "--gpu-rate")
        except ValueError:
            raise SystemExit(f"--gpu-rate: expected NAME=IMAGES_PER_S, given {item!r}") from None
    return rates


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=640,
                   help="training images (validation: 2 per class more); a multiple of batch x loader processes "
                        "gives each loader process as many batches")
    p.add_argument("--workers", default="0,1,2", help="loader_workers values to measure, e.g. 0,1,2,4")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per setting after the warm-up pass")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--transforms", default="randaugment,augment", help=f"of {', '.join(TRANSFORMS)}")
    p.add_argument("--no-s3", action="store_true", help="local folders only (no S3 server)")
    p.add_argument("--max-other", type=float, default=0.25, metavar="CORES",
                   help=f"a pass during which other processes used more CPU is run again ({REDO} times at most)")
    p.add_argument("--dir", default=None, help="where the temporary folder goes (default: the system's)")
    p.add_argument("--gpu-rate", action="append", default=[], metavar="NAME=IMAGES_PER_S",
                   help="a GPU's training images/s (bench_gpu.py part 1), added to or replacing GPU_RATES")
    p.add_argument("--paths", action="store_true",
                   help="the input paths side by side instead (today's against the prepared ones, preparation's "
                        "cost, the prepared short side's crop parity)")
    p.add_argument("--path-workers", type=int, default=1, help="loader processes of --paths")
    args = p.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    transforms = args.transforms.split(",")
    if unknown := [t for t in transforms if t not in TRANSFORMS]:
        raise SystemExit(f"--transforms: expected some of {', '.join(TRANSFORMS)}, given {', '.join(unknown)}")
    gpu = parse_gpu_rates(args.gpu_rate)
    shards = max(SHARDS, 2 * max(workers))
    if args.images < shards:
        raise SystemExit(f"--images: expected at least {shards} (one per training shard)")
    signal.signal(signal.SIGTERM, _raise_on_signal(os.getpid()))
    torch.set_num_threads(1)  # the training process decodes on one core, as a loader process does
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    t_all = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="bench-data-", dir=args.dir)
    try:
        rng = np.random.default_rng(SEED)
        t = time.perf_counter()
        images = {"train": [jpeg(rng) for _ in range(args.images)],
                  "validation": [jpeg(rng) for _ in range(VAL_PER_CLASS * CLASSES)]}
        kb = np.mean([len(d) for d in images["train"]]) / 1e3
        write_imagefolder(os.path.join(tmp, "imagefolder"), {"train": images["train"], "val": images["validation"]})
        files = shard_files(images, shards)
        write_shards(os.path.join(tmp, "wds"), files)
        print(f"{args.images} training JPEGs, {SIDE[0]}-{SIDE[1]} px sides, quality {JPEG_QUALITY}, mean "
              f"{kb:.0f} KB; {shards} training shards of ~{args.images // shards}; made in "
              f"{time.perf_counter() - t:.0f} s; {cores} CPU cores, torch {torch.__version__}; batch {args.batch}, "
              f"{IMG_SIZE} px; medians of {args.repeats} passes after a warm-up pass", flush=True)
        if args.paths:
            rows, made = path_rows(tmp, args.images, args.batch, args.path_workers, args.repeats)
            print_path_tables(rows, made, args.path_workers)
            print_crop_parity(crop_parity())
            print(f"\ntotal {time.perf_counter() - t_all:.0f} s")
            return
        rows = []
        for transform in transforms:
            rows += measure("imagefolder", "local", os.path.join(tmp, "imagefolder"), transform, workers,
                            args.batch, args.repeats, args.max_other)
            rows += measure("wds", "local", os.path.join(tmp, "wds"), transform, workers, args.batch, args.repeats,
                            args.max_other)
        if not args.no_s3:
            with S3Server() as server:
                write_shards(f"s3://{BUCKET}/wds", files)
                for transform in transforms:
                    rows += measure("wds", "S3", f"s3://{BUCKET}/wds", transform, workers, args.batch,
                                    args.repeats, args.max_other, server)
        order = {(d, s): i for i, (d, s) in enumerate((("imagefolder", "local"), ("wds", "local"), ("wds", "S3")))}
        rows.sort(key=lambda r: (order[r["dataset"], r["storage"]], transforms.index(r["transform"]), r["workers"]))
        print_tables(rows, gpu, cores)
        print(f"\ntotal {time.perf_counter() - t_all:.0f} s")
    finally:
        for child in multiprocessing.active_children():  # loader processes close() did not reach
            child.terminate()
            child.join(5)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
