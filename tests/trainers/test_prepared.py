"""The device input path's data (trainers.data.prepared, device_source, pipelines), in this process: an imagefolder
prepared once (bad source images found, counted and named, the policy applied), checked before it is read (a
damaged shard prepared again, alone), read into batches that replay whatever the loader processes; the decode
path on a CPU (torchvision's decoder, PIL behind it)."""
from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from qkvsearch.spaces.keys import ConfigError, fill
from qkvsearch.trainers.data import datasets as qdata
from qkvsearch.trainers.data import prepared as prep
from qkvsearch.trainers.data import prepared_reading as reading
from qkvsearch.trainers.data.sources import DatasetError

CLASSES, PER_CLASS = ("ant", "bee"), 6


def _jpeg(rng, mode="RGB", size=(36, 28)) -> bytes:
    a = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(a).convert(mode).save(out, "JPEG", quality=90)
    return out.getvalue()


def _folder(root, bad: bool = True):
    """root/{train,val}/<class>/*.jpg; with ``bad``, the training split also holds one image of each bad kind."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in CLASSES:
            (root / split / c).mkdir(parents=True)
            for i in range(PER_CLASS):
                (root / split / c / f"{i}.jpg").write_bytes(_jpeg(rng))
    if bad:
        d = root / "train" / "ant"
        (d / "zero.jpg").write_bytes(b"")
        (d / "cut.jpg").write_bytes(_jpeg(rng)[:300])
        (d / "noise.jpg").write_bytes(rng.integers(0, 256, 500, dtype=np.uint8).tobytes())
        (d / "cmyk.jpg").write_bytes(_jpeg(rng, "CMYK"))
        Image.fromarray(rng.integers(0, 256, (20, 30), dtype=np.uint8)).save(d / "gray.png")
        Image.fromarray(rng.integers(0, 65535, (20, 30), dtype=np.uint16)).save(d / "deep.png")
    return root


def _cfg(root, **kw):
    return fill({"model": "vit_tiny_patch16_224", "img_size": 16, "dataset": "imagefolder", "data_path": str(root),
                 "epochs": 1, "randaugment": "rand-m9-mstd0.5-inc1", "data_pipeline": "device", **kw})


def test_preparation_finds_names_and_counts_bad_images_and_the_policy_decides(tmp_path):
    cfg = _cfg(_folder(tmp_path / "img"))
    p = prep.plan(cfg, str(tmp_path / "prepared"))
    manifest = prep.ensure(p)
    unreadable, converted = prep.bad_images(manifest)
    assert sorted(os.path.basename(n) for n, _ in unreadable) == ["cut.jpg", "noise.jpg", "zero.jpg"]
    whys = {os.path.basename(n): why for n, why in unreadable}
    assert whys["zero.jpg"] == "zero-byte file" and whys["cut.jpg"].startswith("truncated")
    assert {k: [os.path.basename(n) for n in v] for k, v in converted.items()} == \
        {"CMYK": ["cmyk.jpg"], "grayscale": ["gray.png"], "16-bit": ["deep.png"]}
    assert sum(e["images"] for e in manifest["splits"]["train"]) == 2 * PER_CLASS + 3   # the bad three left out
    with pytest.raises(DatasetError, match=r"data.bad_images: refuse, and 3 unreadable .*zero.jpg \(zero-byte"):
        prep.apply_policy(manifest, "refuse", cfg["data_path"])
    prep.apply_policy(manifest, "skip", cfg["data_path"])
    # the trial's view: refused under refuse (the default), read without them under skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QKVSEARCH_PREPARED", str(tmp_path / "prepared"))
        with pytest.raises(DatasetError, match="refuse"):
            qdata.load_data(cfg)
        train, val = qdata.load_data(_cfg(cfg["data_path"], bad_images="skip"))
    assert (len(train), len(val)) == (2 * PER_CLASS + 3, 2 * PER_CLASS)
    assert len(prep.history(p.location)) == 1   # the second load prepared nothing


def test_a_damaged_shard_is_found_and_prepared_again_alone(tmp_path):
    cfg = _cfg(_folder(tmp_path / "img", bad=False))
    p = prep.plan(cfg, str(tmp_path / "prepared"))
    manifest = prep.ensure(p)
    assert prep.check(p.location, manifest) == {}
    shard = os.path.join(p.location, "train-00000.bin")
    data = bytearray(open(shard, "rb").read())
    data[len(data) // 2] ^= 0xFF   # one byte: the size stays, the checksum does not
    with open(shard, "wb") as f:
        f.write(data)
    assert list(prep.check(p.location, manifest)) == ["train-00000"]
    folder, again = reading.open_checked(p.location)
    assert folder == p.location and again["splits"] == manifest["splits"] | {"train": again["splits"]["train"]}
    (first, second) = prep.history(p.location)
    assert first["why"] == "new" and second["shards"] == ["train-00000"] and "SHA-256" in second["why"]
    assert prep.check(p.location, again) == {}
    os.truncate(os.path.join(p.location, "val-00000.idx"), 10)   # cut short: found by its size
    assert "holds 10 bytes" in prep.check(p.location, again)["val-00000"]


def _batches(source, seed, epoch=0, batch=4):
    torch.manual_seed(seed)
    order = qdata.train_part(source, 1, 0, 0, epoch)
    return list(source.batches(order, batch, torch.device("cpu"), drop_last=True))


def test_prepared_batches_replay_whatever_the_loader_processes_and_follow_the_epoch(tmp_path):
    root = _folder(tmp_path / "img", bad=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QKVSEARCH_PREPARED", str(tmp_path / "prepared"))
        in_process, _ = qdata.load_data(_cfg(root, random_erasing=0.5))
        two, val = qdata.load_data(_cfg(root, random_erasing=0.5, loader_workers=2))
    import random

    random.seed(3)   # random erasing draws from Python's generator, as timm's does (the engine seeds it per epoch)
    a = _batches(in_process, 7)
    random.seed(3)
    b = _batches(two, 7)
    assert len(a) == 2 * PER_CLASS // 4 and all(x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 for x, _ in a)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    random.seed(3)
    c = _batches(in_process, 8)
    assert not torch.equal(a[0][0], c[0][0])
    (x, y), = list(val.batches(qdata.eval_part(val, 1, 0), 2 * PER_CLASS, torch.device("cpu"), False))
    assert x.shape == (2 * PER_CLASS, 3, 16, 16) and sorted(y.tolist()) == [0] * PER_CLASS + [1] * PER_CLASS
    for s in (two, val):
        for _, loader in s._loaders.values():
            loader._iterator._shutdown_workers()


def test_decode_path_on_a_cpu_decodes_each_batch_and_follows_the_policy(tmp_path):
    root = _folder(tmp_path / "img", bad=False)
    (root / "train" / "bee" / "gray.png").write_bytes(b"")   # a zero-byte file
    train, _ = qdata.load_data(_cfg(root, data_pipeline="decode", bad_images="skip"))
    batches = _batches(train, 0, batch=len(train))
    assert len(batches) == 1 and batches[0][0].shape == (len(train) - 1, 3, 16, 16)   # the zero-byte one left out
    strict, _ = qdata.load_data(_cfg(root, data_pipeline="decode"))
    with pytest.raises(DatasetError, match=r"bee/gray.png cannot be read \(zero-byte"):
        _batches(strict, 0, batch=len(strict))
    with pytest.raises(ConfigError, match="data_pipeline: expected auto, host or device for dataset digits"):
        fill({"model": "vit_tiny_patch16_224", "epochs": 1, "data_pipeline": "decode"})


def test_a_campaign_prepared_dataset_is_read_where_it_is_named(tmp_path):
    root = _folder(tmp_path / "img", bad=False)
    cfg = _cfg(root)
    p = prep.plan(cfg, str(tmp_path / "campaign-storage"))
    prep.ensure(p)
    given = {"root": str(tmp_path / "campaign-storage"), str(p.short): p.location}
    train, _ = qdata.load_data(cfg, prepared=given)
    assert train.split.folder == p.location
    assert json.loads((tmp_path / "campaign-storage" / p.key / "manifest.json").read_text())["short_side"] == 18


@pytest.mark.parametrize("dataset", ["wds", "hfds"])
def test_shards_and_parquet_folders_are_prepared_and_read_by_index(tmp_path, dataset):
    from helpers.shards import write_parquet_folder, write_wds

    path = tmp_path / dataset
    if dataset == "wds":
        write_wds(str(path), {"train": [5, 5], "validation": [4]})
    else:
        write_parquet_folder(path, {"train": 10, "validation": 4})
    cfg = fill({"model": "vit_tiny_patch16_224", "img_size": 16, "dataset": dataset, "data_path": str(path),
                "num_classes": 3, "epochs": 1, "augment": True, "data_pipeline": "device"})
    p = prep.plan(cfg, str(tmp_path / "prepared"))
    manifest = prep.ensure(p)
    assert [sum(e["images"] for e in manifest["splits"][r]) for r in ("train", "val")] == [10, 4]
    train, val = qdata.load_data(cfg, prepared=p.location)
    batches = _batches(train, 0, batch=5)
    assert [x.shape for x, _ in batches] == [(5, 3, 16, 16)] * 2
    assert len(val) == 4 and set(val.split.labels.tolist()) <= {0, 1, 2}
