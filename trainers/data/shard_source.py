"""WebDataset shards read into batches: ``ShardSource``, the source of a ``wds`` dataset's splits (the index:
trainers.data.shard_index; the deal: trainers.data.shard_deal).

A rank's share of a split is a sources.Part (``ShardSource.part``: which rank of how many, which epoch), and
``batches(part, ...)`` reads every sample of it once (trainers.data.shard_deal says which). One DataLoader per
(batch size, device type), kept across epochs; its loader processes persist and read each pass's plan (the
part, and the seed augmentation draws from) from a small shared array the training process fills before the
pass starts. A loader process opens each of its pieces through qkvsearch.storage's pyarrow filesystem (a local
file, or an object streamed from a bucket), splits the tar into samples with webdataset's tar iterators, mixes
them in a buffer of SHUFFLE_SAMPLES (training), decodes each as timm's wds reader does (decode_sample: an
image jpg / png / webp and its .cls label; timm's decoder is private to its reader) and the config's timm
transform, and sends (x (B, C, H, W), y (B,)) batches. The training process joins the short batch each loader
process ends with to the others', so the rank gets every full batch its part holds.

A shard that cannot be read, or holds fewer samples than the info file says, and a sample that cannot be
decoded or whose label is out of range, raise ShardError naming the shard (and the sample): the trial
fails, not the campaign.
"""
from __future__ import annotations

import functools
import io
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from qkvsearch.spaces.errors import reason
from qkvsearch.storage import open_location
from qkvsearch.trainers.data.shard_deal import Piece, reader_pieces
from qkvsearch.trainers.data.shard_index import ShardSet, Split, check_readers, read_shard_set
from qkvsearch.trainers.data.sources import (
    CHECKED_SAMPLES,
    DECODE_PROBE_SAMPLES,
    DatasetError,
    Part,
    Source,
    decode_rate,
    loader_processes,
    seed_sample,
)

SHUFFLE_SAMPLES = 512          # encoded samples a loader process mixes (ImageNet JPEGs: ~55 MB)
IMAGE_KEYS = "jpg;png;webp"    # a sample's image: its first file of these extensions (timm's wds default)
READ_BUFFER = 8 << 20          # bytes read ahead from a bucket object (tar reads 10 kB records)
# The plan a pass reads, slots of the shared array: the Part, whether it trains, the augmentation seed
_WORLD, _RANK, _SEED, _EPOCH, _TRAINING, _AUG_SEED = range(6)


class ShardError(DatasetError):
    """A shard, or a sample in it, cannot be read; the message names the shard."""


@functools.cache
def _tar_tools():
    """webdataset's tar iterators, or DatasetError saying what to install."""
    try:
        from webdataset.tariterators import group_by_keys, tar_file_iterator
    except ImportError as err:
        raise DatasetError(f"dataset: wds needs the webdataset package (pip install 'qkvsearch[data]'): "
                           f"{reason(err)}") from None
    return tar_file_iterator, group_by_keys


def decode_sample(sample: dict) -> tuple:
    """(RGB PIL image, class index) of an encoded sample, as timm's wds reader decodes one without a json target:
    its first image of IMAGE_KEYS, its class from .cls (a decimal byte string)."""
    from PIL import Image

    image = next((sample[k] for k in IMAGE_KEYS.split(";") if k in sample), None)
    given = ", ".join(sorted(k for k in sample if not k.startswith("__"))) or "none"
    if image is None:
        raise KeyError(f"no {IMAGE_KEYS.replace(';', ' / ')} file (its files: {given})")
    if "cls" not in sample:
        raise KeyError(f"no .cls file (its files: {given})")
    if not image:
        raise ValueError("an empty image file (0 bytes)")
    with io.BytesIO(image) as b:
        img = Image.open(b)
        img.load()
    return img.convert("RGB"), int(sample["cls"])


def read_piece(fs, root: str, shards: ShardSet, split: Split, piece: Piece):
    """(place in its shard, encoded sample {"__key__", "__url__", extension: bytes}) of the piece's samples, in
    order; those before piece.start are read past. fs, root: open_location(shards.location)."""
    tar_file_iterator, group_by_keys = _tar_tools()
    file = split.files[piece.shard]
    uri, seen = shards.uri(file), 0
    try:
        with fs.open_input_stream(f"{root}/{file}", compression=None,
                                  buffer_size=None if "://" not in shards.location else READ_BUFFER) as stream:
            files = ({**f, "__url__": uri} for f in tar_file_iterator(stream))
            for seen, sample in enumerate(group_by_keys(files), start=1):
                if seen > piece.start:
                    yield seen - 1, sample
                if seen >= piece.stop:
                    return
    except Exception as err:  # any failure here means "this shard cannot be read": say which and where
        raise ShardError(f"data_path: shard {uri} unreadable after {seen} samples: {reason(err)}") from err
    raise ShardError(f"data_path: shard {uri} holds {seen} samples, {shards.info} says "
                     f"{split.lengths[piece.shard]}")


class _ReaderStream(torch.utils.data.IterableDataset):
    """One rank's part of a split, as the pass's plan (a shared array) says, as (x (B, C, H, W), y (B,)) batches
    of batch_size; each loader process reads its run of the part and ends with one short batch."""

    def __init__(self, shards: ShardSet, split: Split, transform: Callable, num_classes: int, batch_size: int,
                 plan):
        super().__init__()
        self.shards, self.split, self.transform, self.num_classes = shards, split, transform, num_classes
        self.batch_size, self.plan = batch_size, plan
        self.offsets = np.concatenate([[0], np.cumsum(split.lengths)[:-1]]).tolist()  # first sample id per shard

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        readers, reader = (info.num_workers, info.id) if info is not None else (1, 0)
        p = list(self.plan)
        training = bool(p[_TRAINING])
        part = Part(p[_WORLD], p[_RANK], p[_SEED] if training else None, p[_EPOCH] if training else None)
        samples = self._samples(reader_pieces(self.split.lengths, part, readers, reader))
        if training:
            samples = _mixed(samples, np.random.default_rng([p[_SEED], p[_EPOCH], p[_RANK], reader]))
        batch = []
        for sample_id, sample in samples:
            if training:
                seed_sample(p[_AUG_SEED], sample_id)
            batch.append(self.decode(sample))
            if len(batch) == self.batch_size:
                yield _stack(batch)
                batch = []
        if batch:
            yield _stack(batch)

    def _samples(self, pieces: list[Piece]):
        """(id in the split, encoded sample) of each piece in turn."""
        fs, root = open_location(self.shards.location)  # in this process: a filesystem client is not fork-safe
        for piece in pieces:
            for place, sample in read_piece(fs, root, self.shards, self.split, piece):
                yield self.offsets[piece.shard] + place, sample

    def decode(self, sample: dict):
        """(image tensor (C, H, W), label) of an encoded sample; ShardError naming its shard."""
        try:
            img, label = decode_sample(sample)
            x = self.transform(img)
        except Exception as err:  # any failure here means "this sample cannot be decoded": say which
            raise ShardError(f"data_path: shard {sample.get('__url__')}: sample {sample.get('__key__')} could not "
                             f"be decoded (expected an image {IMAGE_KEYS.replace(';', ' / ')} and its class in "
                             f".cls): {reason(err)}") from err
        if not 0 <= label < self.num_classes:
            raise ShardError(f"data_path: shard {sample.get('__url__')}: sample {sample.get('__key__')} has label "
                             f"{label}, expected 0..{self.num_classes - 1} (num_classes {self.num_classes})")
        return x, label


def _mixed(samples, rng: np.random.Generator, size: int = SHUFFLE_SAMPLES):
    """The samples in an order mixed within a buffer of ``size``: each leaves from a random place of it."""
    buffer = []
    for item in samples:
        if len(buffer) < size:
            buffer.append(item)
            continue
        i = int(rng.integers(size))
        buffer[i], item = item, buffer[i]
        yield item
    rng.shuffle(buffer)
    yield from buffer


def _stack(batch):
    xs, ys = zip(*batch)
    return torch.stack(xs), torch.tensor(ys, dtype=torch.int64)


@dataclass
class ShardSource(Source):
    """One split of a shard set, read as the Part of it a rank is dealt (``part``; no index is read)."""

    shards: ShardSet
    split: Split
    transform: Callable
    num_classes: int
    loader_workers: int
    _loaders: dict = field(default_factory=dict, repr=False)

    def __len__(self):
        return self.split.total

    def part(self, world_size: int, rank: int, seed: int | None = None, epoch: int | None = None) -> Part:
        """Rank ``rank`` of ``world_size``: the samples trainers.data.shard_deal deals it, for training in the order
        (seed, epoch) draws (seed, epoch None: validation, the stored order)."""
        return Part(world_size, rank) if epoch is None else Part(world_size, rank, seed, epoch)

    def batches(self, part: Part, batch_size, device, drop_last):
        """Yield (x float (B, 3, img_size, img_size), y int64 (B,)) on ``device``: every sample of the share
        ``part`` (self.part) once; with drop_last the short batch at the end is left out."""
        if part.training:
            check_readers(self.shards, part.world_size, self.loader_workers)
        plan, loader = self._loader(batch_size, device)
        plan[:] = [part.world_size, part.rank, part.seed or 0, part.epoch or 0, part.training,
                   int(torch.initial_seed())]  # before the pass starts: the loader processes read it then
        short, held = [], 0   # the loader processes' last batches, short of batch_size
        for x, y in loader:
            if len(y) == batch_size:
                yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                continue
            short.append((x, y))
            held += len(y)
            while held >= batch_size:
                x, y = (torch.cat(parts) for parts in zip(*short))
                short, held = [(x[batch_size:], y[batch_size:])], held - batch_size
                yield x[:batch_size].to(device), y[:batch_size].to(device)
        if held and not drop_last:
            x, y = (torch.cat(parts) for parts in zip(*short))
            yield x.to(device), y.to(device)

    def decode_rate(self) -> float:
        """Images/s one process reads from the first shard into training tensors (sources.decode_rate)."""
        fs, root = open_location(self.shards.location)
        stream = _ReaderStream(self.shards, self.split, self.transform, self.num_classes, 1, None)
        samples = read_piece(fs, root, self.shards, self.split, Piece(0, 0, self.split.lengths[0]))
        return decode_rate(lambda _: stream.decode(next(samples)[1]),
                           max_samples=min(DECODE_PROBE_SAMPLES, self.split.lengths[0] - 1))

    def most_workers(self, ranks: int) -> int:
        """The most loader processes per rank the training split's shards allow (check_readers)."""
        return len(self.shards.train.files) // max(ranks, 1)

    def _loader(self, batch_size, device):
        key = (batch_size, device.type)
        if key not in self._loaders:
            plan = multiprocessing.RawArray("Q", 6)  # unsigned 64-bit: torch.initial_seed() may use all 64 bits
            workers = self.loader_workers
            stream = _ReaderStream(self.shards, self.split, self.transform, self.num_classes, batch_size, plan)
            self._loaders[key] = plan, torch.utils.data.DataLoader(
                stream, batch_size=None, num_workers=workers, persistent_workers=workers > 0,
                pin_memory=device.type == "cuda")
        return self._loaders[key]


def check_samples(shards: ShardSet, num_classes: int) -> None:
    """The first CHECKED_SAMPLES samples of each split (of its first shard holding any) decode as a trial decodes
    them: an image and its .cls class in 0..num_classes-1. ShardError naming the shard and the sample otherwise."""
    fs, root = open_location(shards.location)
    for split in (shards.train, shards.val):
        first = next(i for i, n in enumerate(split.lengths) if n)   # the info file holds a sample (shard_index)
        stream = _ReaderStream(shards, split, lambda img: img, num_classes, 1, None)
        for _, sample in read_piece(fs, root, shards, split, Piece(first, 0, min(CHECKED_SAMPLES,
                                                                                  split.lengths[first]))):
            stream.decode(sample)


def shard_sources(cfg: dict, train_transform: Callable, eval_transform: Callable):
    """-> (train, val) ShardSources of the shard set at cfg's data_path (check_shards has checked it)."""
    shards = read_shard_set(cfg["data_path"])
    workers, classes = loader_processes(cfg), cfg["num_classes"]
    return (ShardSource(shards, shards.train, train_transform, classes, workers),
            ShardSource(shards, shards.val, eval_transform, classes, workers))
