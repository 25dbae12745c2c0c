"""trainers.data.datasets: real files in the CIFAR / ImageFolder formats, digits, sharding, dataset errors."""
import pickle

import numpy as np
import pytest
import torch
from helpers.images import write_imagefolder

from qkvsearch.spaces.keys import ConfigError, fill
from qkvsearch.trainers.data import datasets as data
from qkvsearch.trainers.data.datasets import (
    DatasetError,
    check_dataset,
    eval_part,
    eval_shard,
    load_data,
    train_part,
    train_shard,
)


def trial_cfg(cfg: dict) -> dict:
    """A filled trial config around the data keys under test."""
    return fill({"model": "xcit_nano_12_p16_224", "epochs": 1, **cfg})

CPU = torch.device("cpu")


def _write_cifar(folder, files, label_key, n, num_classes, seed=0):
    """Pickles in the authors' format: b"data" (n, 3072) uint8 row = R plane, G plane, B plane."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for f in files:
        d = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
             label_key: [int(v) for v in rng.integers(0, num_classes, n)], b"batch_label": b"x"}
        with open(folder / f, "wb") as fh:
            pickle.dump(d, fh)
        written[f] = d
    return written


CIFAR10_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def test_cifar10_format_is_read(tmp_path):
    written = _write_cifar(tmp_path / "cifar-10-batches-py", CIFAR10_FILES, b"labels", 6, 10)
    cfg = trial_cfg({"dataset": "cifar10", "data_path": str(tmp_path)})  # parent folder works too
    check_dataset(cfg)
    train, val = load_data(cfg)
    assert isinstance(train, data.TensorSource) and (len(train), len(val)) == (30, 6)
    assert train.images.shape == (30, 3, 32, 32) and train.images.dtype == torch.uint8
    row = written["data_batch_2"][b"data"][1]  # image 1 of batch 2 = index 7
    assert torch.equal(train.images[7, 1], torch.from_numpy(row[1024:2048].reshape(32, 32)))  # G plane
    assert train.labels[7] == written["data_batch_2"][b"labels"][1]
    x, y = next(val.batches(torch.arange(6), 4, CPU, drop_last=False))
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 and y.tolist() == written["test_batch"][b"labels"][:4]


def test_cifar100_format_with_fine_labels_and_resize(tmp_path):
    written = _write_cifar(tmp_path, ["train", "test"], b"fine_labels", 8, 100)
    cfg = trial_cfg({"dataset": "cifar100", "data_path": str(tmp_path), "img_size": 48})
    check_dataset(cfg)
    train, val = load_data(cfg)
    assert train.labels.tolist() == written["train"][b"fine_labels"]
    x, _ = next(train.batches(torch.arange(8), 8, CPU, drop_last=True))
    assert x.shape == (8, 3, 48, 48)
    aug_train, aug_val = load_data({**cfg, "augment": True, "randaugment": "rand-m9-mstd0.5-inc1"})
    assert isinstance(aug_train, data.PilSource) and isinstance(aug_val, data.TensorSource)
    x, y = next(aug_train.batches(torch.arange(8), 4, CPU, drop_last=True))  # uint8 -> PIL -> timm transform
    assert x.shape == (4, 3, 48, 48) and y.tolist() == written["train"][b"fine_labels"][:4]


def test_cifar_errors_name_path_and_expectation(tmp_path):
    cfg = trial_cfg({"dataset": "cifar10", "data_path": str(tmp_path / "nope")})
    with pytest.raises(DatasetError, match=r"data_path: expected a folder holding data_batch_1..5 and test_batch"
                                           r".*nope.*does not exist"):
        check_dataset(cfg)
    with pytest.raises(ConfigError, match=r"data_path: required for dataset cifar10"):
        trial_cfg({"dataset": "cifar10"})
    _write_cifar(tmp_path, CIFAR10_FILES[:3], b"labels", 2, 10)
    with pytest.raises(DatasetError, match=r"to hold data_batch_1..5 and test_batch"
                                           r".*missing: data_batch_4, data_batch_5, test_batch"):
        check_dataset(trial_cfg({"dataset": "cifar10", "data_path": str(tmp_path)}))
    _write_cifar(tmp_path, CIFAR10_FILES, b"labels", 2, 10)
    (tmp_path / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DatasetError, match=r"test_batch.*CIFAR python pickle with keys b'data'"):
        check_dataset(trial_cfg({"dataset": "cifar10", "data_path": str(tmp_path)}))


def test_cifar_pickle_refuses_foreign_objects(tmp_path):
    _write_cifar(tmp_path, CIFAR10_FILES, b"labels", 2, 10)
    with open(tmp_path / "test_batch", "wb") as fh:
        pickle.dump({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": DatasetError("x")}, fh)
    with pytest.raises(DatasetError, match=r"unexpected object qkvsearch.trainers.data.sources.DatasetError"):
        check_dataset(trial_cfg({"dataset": "cifar10", "data_path": str(tmp_path)}))


def test_imagefolder_is_read(tmp_path):
    write_imagefolder(tmp_path, ["ant", "bee", "cow"], 3)
    cfg = trial_cfg({"dataset": "imagefolder", "data_path": str(tmp_path), "img_size": 16})
    assert cfg["num_classes"] == 3
    check_dataset(cfg)
    train, val = load_data(cfg)
    assert isinstance(train, data.PilSource) and (len(train), len(val)) == (9, 9)
    xs, ys = zip(*val.batches(eval_part(val, 1, 0), 4, CPU, drop_last=False))
    assert [len(y) for y in ys] == [4, 4, 1] and xs[0].shape == (4, 3, 16, 16)
    assert torch.cat(ys).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # class index = sorted folder order
    aug = trial_cfg({**cfg, "randaugment": "rand-m9-mstd0.5", "augment": True})
    x, _ = next(load_data(aug)[0].batches(torch.arange(9), 8, CPU, drop_last=True))
    assert x.shape == (8, 3, 16, 16)


def test_augmented_epochs_replay_whatever_the_loader_processes(tmp_path):
    """An augmented epoch depends on the epoch's seed alone: the same batches with 0 or 2 persistent
    loader processes, again on a second pass over the same loader, and different for the next epoch."""
    write_imagefolder(tmp_path, ["ant", "bee"], 4)
    base = {"dataset": "imagefolder", "data_path": str(tmp_path), "img_size": 16, "augment": True,
            "randaugment": "rand-m9-mstd0.5"}

    def epoch(source, seed):
        torch.manual_seed(seed)
        return torch.cat([x for x, _ in source.batches(torch.arange(8), 4, CPU, drop_last=True)])

    inline = load_data(trial_cfg(base))[0]
    workers = load_data(trial_cfg({**base, "loader_workers": 2}))[0]
    first = epoch(inline, 1)
    assert torch.equal(first, epoch(workers, 1))
    assert torch.equal(first, epoch(workers, 1))  # the same loader processes, a second pass
    assert not torch.equal(first, epoch(workers, 2))
    assert len(workers._loaders) == 1  # one DataLoader kept across epochs


def test_imagefolder_errors(tmp_path):
    (tmp_path / "train" / "a").mkdir(parents=True)
    cfg = trial_cfg({"dataset": "imagefolder", "data_path": str(tmp_path)})
    with pytest.raises(DatasetError, match=r"train/ and val/ with one folder per class; missing val/"):
        check_dataset(cfg)
    (tmp_path / "val" / "a").mkdir(parents=True)
    with pytest.raises(DatasetError, match=r"one folder per class \(at least 2\), found \['a'\]"):
        check_dataset(cfg)
    (tmp_path / "train" / "b").mkdir()
    (tmp_path / "val" / "c").mkdir()
    with pytest.raises(DatasetError, match=r"same class folders.*train=\['a', 'b'\] val=\['a', 'c'\]"):
        check_dataset(cfg)
    (tmp_path / "val" / "c").rmdir()
    (tmp_path / "val" / "b").mkdir()
    with pytest.raises(DatasetError, match=r"expected images .* in every class folder of .*train', given 2 without "
                                           r"any: a, b"):
        check_dataset(cfg)
    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / split / c / "deeper").mkdir()
            (tmp_path / split / c / "deeper" / "0.JPG").write_bytes(b"")  # any depth, any case, as ImageFolder
    with pytest.raises(DatasetError, match=r"num_classes: expected 2 \(class folders in"):
        check_dataset({**cfg, "num_classes": 5})


def test_digits_split_and_batches():
    cfg = trial_cfg({"dataset": "digits", "img_size": 16})
    train, val = load_data(cfg)
    assert (len(train), len(val)) == (1437, 360)  # 1,797 images, val_fraction 0.2, stratified
    assert sorted(set(val.labels.tolist())) == list(range(10))
    x, y = next(train.batches(torch.arange(32), 32, CPU, drop_last=True))
    assert x.shape == (32, 3, 16, 16) and torch.equal(x[:, 0], x[:, 1]) is False  # normalised per channel
    assert torch.isfinite(x).all() and -3 < float(x.min()) and float(x.max()) < 3
    again, _ = load_data(cfg)
    assert torch.equal(again.images, train.images)  # the split is fixed


def test_digits_clutter_is_made_offline_the_same_every_time_from_the_digits_split():
    from qkvsearch.trainers.data.formats import CLUTTER_COPIES, CLUTTER_VAL_COPIES, digits, digits_clutter

    cfg = trial_cfg({"dataset": "digits_clutter"})
    (xt, yt), (xv, yv) = digits_clutter(cfg)
    (_, dt), (_, dv) = digits(cfg)
    assert xt.shape == (CLUTTER_COPIES * len(dt), 1, 32, 32) and xv.shape == (CLUTTER_VAL_COPIES * len(dv), 1, 32, 32)
    assert torch.equal(yv, dv.repeat(CLUTTER_VAL_COPIES)) and torch.equal(yt, dt.repeat(CLUTTER_COPIES))
    (again, _), _ = digits_clutter(cfg)
    assert torch.equal(again, xt)   # deterministic
    copies = xt.reshape(CLUTTER_COPIES, len(dt), 32, 32)
    assert not torch.equal(copies[0], copies[1])   # a digit drawn again lands elsewhere among other pieces
    ink = (xt > 0).flatten(1).sum(1).float()
    assert ink.min() > 20 and ink.mean() > 100   # the digit (up to 256 px scaled) and its clutter
    train, val = load_data(cfg)
    assert (len(train), len(val)) == (len(yt), len(yv))


def test_synthetic_has_fixed_size():
    train, val = load_data(trial_cfg({"dataset": "synthetic", "img_size": 24}))
    assert (len(train), len(val)) == data.SYNTHETIC_SIZES
    x, y = next(train.batches(torch.arange(4), 4, CPU, drop_last=True))
    assert x.shape == (4, 3, 24, 24) and int(y.max()) < 10


def test_sharding_is_disjoint_and_complete():
    n, world = 103, 3
    shards = [train_shard(n, world, r, seed=5, epoch=2) for r in range(world)]
    joined = torch.cat(shards)
    assert all(len(s) == n // world for s in shards) and len(set(joined.tolist())) == len(joined)
    assert torch.equal(shards[0], train_shard(n, world, 0, seed=5, epoch=2))  # from (seed, epoch)
    assert not torch.equal(shards[0], train_shard(n, world, 0, seed=5, epoch=3))
    val = torch.cat([eval_shard(n, world, r) for r in range(world)])
    assert sorted(val.tolist()) == list(range(n))  # every val image once: no padding, no duplicates


def test_a_source_read_by_index_is_dealt_the_sharding_indices():
    """The training loop asks each source for a rank's share (train_part, eval_part); a source read by index
    answers with train_shard's and eval_shard's indices, which its batches read."""
    train, val = load_data(trial_cfg({"dataset": "synthetic", "img_size": 16}))
    aug, _ = load_data(trial_cfg({"dataset": "synthetic", "img_size": 16, "augment": True}))
    assert isinstance(train, data.TensorSource) and isinstance(aug, data.PilSource)
    for source in (train, aug):
        share = train_part(source, 3, 1, 5, 2)
        assert torch.equal(share, train_shard(len(source), 3, 1, seed=5, epoch=2))
        assert torch.equal(eval_part(source, 3, 2), eval_shard(len(source), 3, 2))
    x, y = next(val.batches(eval_part(val, 4, 3), 8, CPU, drop_last=False))
    ref_x, ref_y = next(val.batches(torch.arange(3, 35, 4), 8, CPU, drop_last=False))
    assert torch.equal(y, ref_y) and torch.equal(x, ref_x)


def test_mixup_and_label_smoothing_losses():
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    base = trial_cfg({})
    assert data.build_mixup(base) is None and isinstance(data.train_criterion(base), torch.nn.CrossEntropyLoss)
    ls = trial_cfg({"label_smoothing": 0.1})
    assert isinstance(data.train_criterion(ls), LabelSmoothingCrossEntropy)
    mix = trial_cfg({"mixup": 0.8, "cutmix": 1.0, "label_smoothing": 0.1})
    x, y = data.build_mixup(mix)(torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3]))
    assert y.shape == (4, 10) and torch.allclose(y.sum(1), torch.ones(4))
    assert isinstance(data.train_criterion(mix), SoftTargetCrossEntropy)


def test_randaugment_posterize_at_full_magnitude_does_not_crash():
    """rand-...-inc1 with magnitude noise reaches PosterizeIncreasing level 10 = keep 0 bits, which the
    installed Pillow rejects: a worker would crash at a random step without the clamp."""
    from PIL import Image
    from timm.data.auto_augment import AugmentOp

    data.train_transform(trial_cfg({"randaugment": "rand-m9-mstd0.5-inc1"}))
    img = Image.fromarray(np.full((8, 8, 3), 200, np.uint8))
    out = AugmentOp("PosterizeIncreasing", prob=1.0, magnitude=10)(img)
    assert np.asarray(out).max() == 128  # 1 bit kept: 200 -> 128


def test_every_dataset_a_campaign_file_may_name_has_a_reader():
    from qkvsearch.spaces.datasets import DATASET_INFO
    from qkvsearch.trainers.data.datasets import READERS, reader_of

    assert set(READERS) == {name for name, info in DATASET_INFO.items() if not info.reader}   # the rest name theirs
    for name in DATASET_INFO:  # what reads data_path checks it first; what is made in memory does not
        reader = reader_of(name)
        assert (reader.check is not None) == DATASET_INFO[name].needs_path and bool(reader.expected) == (
            reader.check is not None), name
