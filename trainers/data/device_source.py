"""Sources of the device input paths (spaces.keys: ``data_pipeline`` device and decode): loader processes ship
uint8 images, and the training process augments and normalises them on its device, batched
(trainers.data.device_augment).

- ``PreparedSource``: a split of a prepared dataset (trainers.data.prepared); a loader process reads each image of a
  batch with one pread (JPEG: decoded by PIL at the prepared size) into a uint8 canvas (B, H, W, 3), H and W the
  batch's largest, and sends it with the images' sizes and labels;
- ``MemorySource``: a split held in memory as uint8 (digits, CIFAR, STL-10): batches are indexed on the device;
- ``DecodeSource``: image files read by index, their encoded bytes sent as they are and decoded on the device in
  one batched call (torchvision.io.decode_jpeg: nvJPEG on CUDA; on a CPU device the training process decodes,
  libjpeg-turbo); an image that call cannot decode (not a JPEG, CMYK, corrupt) is decoded by PIL, and one PIL
  cannot read follows ``bad_images``.
Read by index (sources.ReadByIndex): a rank's share and its order are those of the host path. Every random draw
of a pass comes from a generator seeded from torch's seed when the pass starts (set per seed, rank and epoch by
the engine), so a pass replays whatever the loader processes.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from qkvsearch.trainers.data.device_augment import DeviceAugment, Recipe
from qkvsearch.trainers.data.prepared import decode_stored
from qkvsearch.trainers.data.prepared_reading import PreparedSplit
from qkvsearch.trainers.data.sources import (
    DatasetError,
    ReadByIndex,
    TensorSource,
    _EpochSampler,
    decode_rate,
)

log = logging.getLogger(__name__)


def pass_generator() -> torch.Generator:
    """The generator a pass's augmentation draws from, seeded from torch's seed (the engine's per epoch)."""
    return torch.Generator().manual_seed(int(torch.initial_seed()))


def canvas(arrays: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, W, 3) uint8 arrays -> (uint8 (B, H, W, 3) with each in its top-left corner, int64 (B, 2) sizes). The rest
    of the canvas is left as it is: the crop weighs no pixel outside an image (DeviceAugment.crop)."""
    sizes = np.asarray([a.shape[:2] for a in arrays], dtype=np.int64).reshape(-1, 2)
    h, w = (int(v) for v in sizes.max(0)) if len(arrays) else (1, 1)
    out = np.empty((len(arrays), h, w, 3), dtype=np.uint8)
    for i, a in enumerate(arrays):
        out[i, :a.shape[0], :a.shape[1]] = a
    return torch.from_numpy(out), torch.from_numpy(sizes)


class _Chunks(torch.utils.data.Dataset):
    """dataset[list of indices] = one collated batch: read in a loader process (or the training one)."""

    def __init__(self, read):
        self.read = read

    def __len__(self):
        return 1 << 62

    def __getitem__(self, indices):
        return self.read(indices)


@dataclass
class _Loaded(ReadByIndex):
    """A source read through a DataLoader of whole batches (``read(indices)``), augmented on the device."""

    recipe: Recipe
    loader_workers: int
    _loaders: dict = field(default_factory=dict, repr=False)

    def read(self, indices: list[int]):
        raise NotImplementedError

    def to_device(self, batch, device, g):
        """A batch as read -> (uint8 (B, C, H, W) on device, sizes (B, 2), labels (B,) on device)."""
        images, sizes, labels = batch
        return images.to(device, non_blocking=True).permute(0, 3, 1, 2), sizes, labels.to(device, non_blocking=True)

    def batches(self, indices, batch_size, device, drop_last):
        g = pass_generator()
        augment = self._augment()
        sampler, loader = self._loader(device)
        idx = indices.tolist()
        stop = len(idx) - batch_size + 1 if drop_last else len(idx)
        sampler.keys = [idx[i:i + batch_size] for i in range(0, max(stop, 0), batch_size)]
        for batch in loader:
            images, sizes, labels = self.to_device(batch, device, g)
            if len(labels):
                yield augment(images, sizes, g), labels

    def _augment(self):
        if not hasattr(self, "_device_augment"):
            self._device_augment = DeviceAugment(self.recipe)
        return self._device_augment

    def decode_rate(self) -> float:
        """Images/s one process reads into a uint8 batch (the loader's share; loader_workers auto)."""
        return decode_rate(lambda i: self.read([i % len(self)]))

    def _loader(self, device):
        key = device.type
        if key not in self._loaders:
            sampler = _EpochSampler()
            workers = self.loader_workers
            loader = torch.utils.data.DataLoader(
                _Chunks(self.read), batch_size=None, sampler=sampler, num_workers=workers,
                persistent_workers=workers > 0, pin_memory=device.type == "cuda")
            self._loaders[key] = sampler, loader
        return self._loaders[key]


@dataclass
class PreparedSource(_Loaded):
    """One split of a prepared dataset (module docstring)."""

    split: PreparedSplit | None = None
    _fds: dict = field(default_factory=dict, repr=False)

    def __len__(self):
        return len(self.split)

    def __getstate__(self):   # loader processes open their own files
        return {**self.__dict__, "_fds": {}, "_loaders": {}}

    def read(self, indices):
        s = self.split
        arrays = []
        for i in indices:
            shard, offset, length, h, w, _ = (int(v) for v in s.table[i])
            fd = self._fds.get(shard)
            if fd is None:
                fd = self._fds[shard] = os.open(os.path.join(s.folder, s.shards[shard]), os.O_RDONLY)
            data = os.pread(fd, length, offset)
            if len(data) != length:
                raise DatasetError(f"data.pipeline: prepared shard {s.shards[shard]} in {s.folder} ends before image "
                                   f"{i}'s {length} bytes at {offset}")
            arrays.append(decode_stored(data, h, w, s.format))
        images, sizes = canvas(arrays)
        return images, sizes, torch.from_numpy(s.labels[indices].copy())


@dataclass
class MemorySource(ReadByIndex):
    """A split held in memory as uint8 (N, C, h, w), augmented on the device (TensorSource keeps it there)."""

    tensors: TensorSource
    recipe: Recipe

    def __len__(self):
        return len(self.tensors)

    def batches(self, indices, batch_size, device, drop_last):
        g = pass_generator()
        augment = DeviceAugment(self.recipe)
        images, labels = self.tensors._on(device)
        sizes = torch.tensor(images.shape[-2:]).expand(batch_size, 2)
        indices = indices.to(images.device)
        stop = len(indices) - batch_size + 1 if drop_last else len(indices)
        for i in range(0, max(stop, 0), batch_size):
            idx = indices[i:i + batch_size]
            yield augment(images[idx], sizes[:len(idx)], g), labels[idx]


@dataclass
class DecodeSource(_Loaded):
    """Image files read by index, decoded on the device (module docstring). items: [path relative to root, label]."""

    root: str = ""
    items: list = field(default_factory=list)
    policy: str = "refuse"

    def __len__(self):
        return len(self.items)

    def read(self, indices):
        out, labels = [], []
        for i in indices:
            rel, label = self.items[i]
            try:
                with open(os.path.join(self.root, rel), "rb") as f:
                    data = f.read()
            except OSError as err:   # decoded as nothing: the policy names it
                data = b""
                log.debug("%s: %s", rel, err)
            out.append(torch.tensor(np.frombuffer(data, dtype=np.uint8)))
            labels.append(label)
        return out, torch.as_tensor(indices, dtype=torch.int64), torch.as_tensor(labels, dtype=torch.int64)

    def to_device(self, batch, device, g):
        data, indices, labels = batch
        arrays, keep = decode_batch(data, device, [self.items[int(i)][0] for i in indices], self.policy)
        if len(keep) != len(data):
            if len(keep) % 2:   # timm's mixup pairs the batch: keep it even
                keep = keep[:-1]
                arrays = arrays[:-1]
            labels = labels[keep]
        images, sizes = device_canvas(arrays, device)
        return images, sizes, labels.to(device, non_blocking=True)

    def decode_rate(self) -> float:
        """Images/s one process reads the bytes of (the loader's share; decoding is the device's)."""
        return decode_rate(lambda i: self.read([i % len(self)]))


def decode_batch(data: list[torch.Tensor], device: torch.device, names: list[str], policy: str):
    """Encoded images -> ([(3, h, w) uint8 on device], the batch positions kept): one batched decode_jpeg on the
    device; what it cannot decode, PIL on the host; what neither can, refused or left out (``policy``)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    from qkvsearch.trainers.data.image_items import decode

    try:
        decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        return decoded, list(range(len(data)))
    except (RuntimeError, ValueError):
        pass   # one of them is not a JPEG the decoder takes: each on its own
    out, keep = [], []
    for i, d in enumerate(data):
        try:
            out.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=device))
            keep.append(i)
            continue
        except (RuntimeError, ValueError):
            pass
        try:
            a = decode(d.numpy().tobytes()).array
        except ValueError as err:
            if policy == "refuse":
                raise DatasetError(f"data.bad_images: refuse, and {names[i]} cannot be read ({err}); fix or remove "
                                   f"it, or set data.bad_images: skip") from None
            log.warning("data.bad_images skip: %s left out (%s)", names[i], err)
            continue
        out.append(torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1).to(device))
        keep.append(i)
    return out, keep


def device_canvas(images: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, h, w) uint8 images on the device -> (uint8 (B, 3, H, W) canvas, sizes (B, 2) on the CPU)."""
    sizes = torch.tensor([list(t.shape[-2:]) for t in images], dtype=torch.int64).reshape(-1, 2)
    h, w = (int(v) for v in sizes.max(0).values) if len(images) else (1, 1)
    out = torch.empty(len(images), 3, h, w, dtype=torch.uint8, device=device)
    for i, t in enumerate(images):   # the rest left as it is (canvas)
        out[i, :, :t.shape[-2], :t.shape[-1]] = t
    return out, sizes
