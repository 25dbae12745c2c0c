"""trainers.data.formats: STL-10 binary files, Stanford Cars' devkit, the digits split for OOD tests and the
OOD sets, each read from files the test writes in the authors' formats."""
import numpy as np
import pytest
import torch

from qkvsearch.spaces.keys import fill
from qkvsearch.trainers.data import formats as data_sources
from qkvsearch.trainers.data.datasets import DatasetError, check_dataset, load_data

CPU = torch.device("cpu")


def trial_cfg(cfg: dict) -> dict:
    return fill({"model": "xcit_nano_12_p16_224", "epochs": 1, **cfg})


def _write_stl10(folder, n_train=4, n_test=3, seed=0):
    """STL-10's binary layout: (N, 3, 96, 96) with each channel column-major, labels 1..10 as bytes."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    images = {}
    for split, n in (("train", n_train), ("test", n_test)):
        hwc = rng.integers(0, 256, (n, 3, 96, 96), dtype=np.uint8)  # (N, C, H, W) as they should be read
        hwc.transpose(0, 1, 3, 2).tofile(folder / f"{split}_X.bin")  # stored column-major
        labels = rng.integers(1, 11, n).astype(np.uint8)
        labels.tofile(folder / f"{split}_y.bin")
        images[split] = (hwc, labels)
    return images


def test_stl10_binary_files_are_read(tmp_path):
    written = _write_stl10(tmp_path / "stl10_binary")
    cfg = trial_cfg({"dataset": "stl10", "data_path": str(tmp_path), "img_size": 16})
    check_dataset(cfg)
    assert cfg["num_classes"] == 10
    (xt, yt), (xv, yv) = data_sources.stl10(cfg)
    assert torch.equal(xt, torch.from_numpy(written["train"][0])) and xt.shape == (4, 3, 96, 96)
    assert torch.equal(yv, torch.from_numpy(written["test"][1].astype(np.int64) - 1))
    train, val = load_data(cfg)
    x, y = next(train.batches(torch.arange(4), 2, CPU, drop_last=True))
    assert x.shape == (2, 3, 16, 16) and len(val) == 3


def test_stl10_errors_name_the_file(tmp_path):
    folder = tmp_path / "stl10_binary"
    _write_stl10(folder)
    (folder / "test_y.bin").write_bytes(b"\x01")
    cfg = trial_cfg({"dataset": "stl10", "data_path": str(tmp_path)})
    with pytest.raises(DatasetError, match=r"test_X.bin.*N x 27648 bytes"):
        check_dataset(cfg)
    (folder / "train_X.bin").unlink()
    with pytest.raises(DatasetError, match="missing: train_X.bin"):
        check_dataset(cfg)


def _write_cars(root, per_split=3):
    """torchvision's Stanford Cars layout: devkit .mat structs `annotations` (fname, class 1..196) + jpgs."""
    from PIL import Image
    from scipy.io import savemat

    rng = np.random.default_rng(0)
    (root / "devkit").mkdir(parents=True)
    labels = {}
    for split, (annos, images) in data_sources.CARS_FILES.items():
        (root / images).mkdir()
        dtype = [("bbox_x1", "O"), ("bbox_y1", "O"), ("bbox_x2", "O"), ("bbox_y2", "O"), ("class", "O"), ("fname", "O")]
        table = np.zeros(per_split, dtype=dtype)
        labels[split] = []
        for i in range(per_split):
            name, cls = f"{i:05d}.jpg", int(rng.integers(1, 197))
            Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(root / images / name)
            table[i] = (1, 1, 30, 20, cls, name)
            labels[split].append(cls - 1)
        savemat(root / annos, {"annotations": table.reshape(1, -1)})
    return labels


def test_stanford_cars_devkit_is_read(tmp_path):
    labels = _write_cars(tmp_path)
    cfg = trial_cfg({"dataset": "cars", "data_path": str(tmp_path), "img_size": 32})
    check_dataset(cfg)
    assert cfg["num_classes"] == 196
    train, val = load_data(cfg)
    assert (len(train), len(val)) == (3, 3)
    x, y = next(val.batches(torch.arange(3), 3, CPU, drop_last=False))
    assert x.shape == (3, 3, 32, 32) and y.tolist() == labels["val"]


def test_stanford_cars_errors_name_what_is_missing(tmp_path):
    _write_cars(tmp_path)
    (tmp_path / "cars_test_annos_withlabels.mat").write_bytes(b"not a mat file")
    cfg = trial_cfg({"dataset": "cars", "data_path": str(tmp_path)})
    with pytest.raises(DatasetError, match="struct array 'annotations'"):
        check_dataset(cfg)
    (tmp_path / "cars_test_annos_withlabels.mat").unlink()
    with pytest.raises(DatasetError, match="missing: cars_test_annos_withlabels.mat"):
        check_dataset(cfg)


def test_digits_without_the_held_out_class_and_its_ood_twin():
    cfg = trial_cfg({"dataset": "digits_0to8"})
    assert cfg["num_classes"] == 9
    (xt, yt), (xv, yv) = data_sources.digits_0to8(cfg)
    assert int(yt.max()) == 8 and int(yv.max()) == 8
    (_, all_t), (_, all_v) = data_sources.digits(trial_cfg({"dataset": "digits"}))
    assert len(yt) + len(yv) + int((all_t == 9).sum() + (all_v == 9).sum()) == 1797
    held_out = data_sources.ood_source("digits_heldout", None, cfg)
    assert len(held_out) == int((all_t == 9).sum() + (all_v == 9).sum())
    noise = data_sources.ood_source("noise", None, cfg)
    x, y = next(noise.batches(torch.arange(4), 4, CPU, drop_last=False))
    assert x.shape == (4, 3, 32, 32) and y.tolist() == [-1] * 4


def test_ood_image_folder_at_any_depth_and_stl10_test_split(tmp_path):
    from PIL import Image

    (tmp_path / "lsun" / "a").mkdir(parents=True)
    for i, sub in enumerate(("lsun", "lsun/a")):
        Image.fromarray(np.zeros((12, 10, 3), np.uint8)).save(tmp_path / sub / f"{i}.jpg")
    cfg = trial_cfg({"dataset": "digits", "img_size": 16})
    src = data_sources.ood_source("imagefolder", str(tmp_path / "lsun"), cfg)
    x, y = next(src.batches(torch.arange(2), 2, CPU, drop_last=False))
    assert x.shape == (2, 3, 16, 16) and y.tolist() == [-1, -1]
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="without any"):
        data_sources.ood_source("imagefolder", str(tmp_path / "empty"), cfg)
    _write_stl10(tmp_path / "stl")
    assert len(data_sources.ood_source("stl10", str(tmp_path / "stl"), cfg)) == 3
