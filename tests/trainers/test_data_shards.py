"""Datasets stored by split, at the reader level (no Ray): wds shard sets (trainers.data.shard_index, shard_deal,
shard_source) on a local folder and in an S3 bucket, hfds Parquet folders (trainers.data.hf_folder), and the errors
each gives, before any worker starts and mid-epoch."""
import itertools

import pytest
import torch
import yaml
from helpers import PRESETS
from helpers.shards import sample_ids, write_parquet_folder, write_wds

from qkvsearch.spaces.keys import fill
from qkvsearch.trainers.data.datasets import DatasetError, check_dataset, eval_part, load_data, train_part
from qkvsearch.trainers.data.shard_deal import reader_pieces
from qkvsearch.trainers.data.sources import Part

CPU = torch.device("cpu")
TRAIN, VAL = [6, 5, 7, 6, 4, 8], [5, 4]   # samples per shard: 36 training samples in 6 shards, 9 validation


def wds_cfg(path, **kw) -> dict:
    return fill({"model": "xcit_nano_12_p16_224", "epochs": 1, "dataset": "wds", "data_path": str(path),
                 "num_classes": 3, "img_size": 16, **kw})


def read_epoch(source, world: int, epoch: int, batch: int, drop_last: bool, seed: int = 0):
    """rank -> the sample ids of its batches, in order, and its batch count; labels checked against the ids."""
    out = {}
    for rank in range(world):
        ids, steps = [], 0
        for x, y in source.batches(train_part(source, world, rank, seed, epoch), batch, CPU, drop_last):
            got = sample_ids(x)
            assert y.tolist() == [i % 3 for i in got]
            assert len(got) == batch or not drop_last
            ids, steps = ids + got, steps + 1
        out[rank] = (ids, steps)
    return out


def test_the_deal_covers_every_sample_once_with_equal_ranks_for_any_shard_lengths():
    for lengths, world, readers in itertools.product(([6, 5, 7, 6, 4, 8], [1, 9, 2, 30], [10] * 8), (1, 2, 3, 4),
                                                     (1, 2, 3)):
        total = sum(lengths)
        for epoch in (0, 1):
            seen, per_rank = [], []
            for rank in range(world):
                part = Part(world, rank, 7, epoch)
                mine = [(p.shard, s) for r in range(readers) for p in reader_pieces(lengths, part, readers, r)
                        for s in range(p.start, p.stop)]
                per_rank.append(len(mine))
                seen += mine
            assert len(seen) == len(set(seen)) == total - total % world   # once each; < world left out
            assert per_rank == [total // world] * world                   # the same steps on every rank
        val = [(p.shard, s) for rank in range(world) for r in range(readers)
               for p in reader_pieces(lengths, Part(world, rank), readers, r) for s in range(p.start, p.stop)]
        assert sorted(val) == [(i, s) for i, n in enumerate(lengths) for s in range(n)]  # validation: all, once
    assert reader_pieces(TRAIN, Part(2, 0, 7, 0), 2, 1) == reader_pieces(TRAIN, Part(2, 0, 7, 0), 2, 1)
    assert reader_pieces(TRAIN, Part(2, 0, 7, 0), 1, 0) != reader_pieces(TRAIN, Part(2, 0, 7, 1), 1, 0)


def test_a_wds_folder_is_read_once_per_epoch_across_ranks_and_loader_workers(tmp_path):
    write_wds(str(tmp_path), {"train": TRAIN, "validation": VAL})
    cfg = wds_cfg(tmp_path, loader_workers=2)
    check_dataset(cfg, world_size=2)
    train, val = load_data(cfg)
    assert (len(train), len(val)) == (36, 9)
    epochs = {e: read_epoch(train, 2, e, batch=4, drop_last=False) for e in (0, 1)}
    for got in epochs.values():
        assert sorted(got[0][0] + got[1][0]) == list(range(36))   # every sample once between ranks and workers
        assert len(got[0][0]) == len(got[1][0]) == 18
    assert epochs[0][0][0] != epochs[1][0][0]                       # another epoch, another order
    steps = read_epoch(train, 2, 1, batch=4, drop_last=True)
    assert steps[0][1] == steps[1][1] == 18 // 4                    # full batches only, as many on each rank
    again, _ = load_data(cfg)                                       # a resumed run: the same epoch, the same deal
    assert read_epoch(again, 2, 1, batch=4, drop_last=False) == epochs[1]
    next(train.batches(train_part(train, 2, 0, 0, 2), 4, CPU, True))  # a pass left part-way (the engine's last
    assert read_epoch(train, 2, 1, batch=4, drop_last=False) == epochs[1]  # update comes before the data's end)
    ids = [i for rank in range(2) for x, _ in val.batches(eval_part(val, 2, rank), 4, CPU, False)
           for i in sample_ids(x)]
    assert sorted(ids) == list(range(36, 45))                       # validation: every sample once
    assert train_part(train, 2, 1, 0, 3) == Part(2, 1, 0, 3) and eval_part(val, 2, 1) == Part(2, 1)
    whole = [i for x, _ in val.batches(val.part(1, 0), 4, CPU, False) for i in sample_ids(x)]
    assert whole == list(range(36, 45))           # one process reading the whole split: in its stored order


def test_a_wds_bucket_prefix_is_read_through_storage(s3):
    s3.create_dir("shards")
    write_wds("s3://shards/tiny", {"train": [4, 4, 4, 4], "validation": [3]})
    cfg = wds_cfg("s3://shards/tiny", loader_workers=2)
    check_dataset(cfg, world_size=2)      # the info file read here, before the loader processes start
    train, val = load_data(cfg)
    got = read_epoch(train, 2, 0, batch=4, drop_last=False)
    assert sorted(got[0][0] + got[1][0]) == list(range(16)) and len(got[0][0]) == 8
    x, y = next(val.batches(eval_part(val, 1, 0), 8, CPU, False))
    assert sample_ids(x) == [16, 17, 18] and x.shape == (3, 3, 16, 16)
    with pytest.raises(DatasetError, match=r"s3://shards/other.*does not exist"):
        check_dataset(wds_cfg("s3://shards/other"))


def test_an_info_file_in_yaml_with_a_brace_pattern_is_read(tmp_path):
    info = write_wds(str(tmp_path), {"train": [3, 3], "validation": [2]})
    info["splits"]["train"]["filenames"] = "train-{0000..0001}.tar"
    (tmp_path / "_info.json").unlink()
    (tmp_path / "_info.yaml").write_text(yaml.safe_dump(info))
    check_dataset(wds_cfg(tmp_path))
    train, _ = load_data(wds_cfg(tmp_path))
    assert train.split.files == ("train-0000.tar", "train-0001.tar") and len(train) == 6


def test_wds_errors_name_the_split_the_counts_and_the_shard(tmp_path):
    write_wds(str(tmp_path / "a"), {"train": [4, 4, 4], "valid": [2]})
    with pytest.raises(DatasetError, match=r"split named validation or val or test in .*a/_info.json, given "
                                           r"splits train, valid"):
        check_dataset(wds_cfg(tmp_path / "a"))
    write_wds(str(tmp_path / "b"), {"train": [4, 4, 4], "validation": [2]})
    with pytest.raises(DatasetError, match=r"ranks x loader processes = 2 x 2 = 4 shards in split train of "
                                           r".*b/_info.json, given 3"):
        check_dataset(wds_cfg(tmp_path / "b", loader_workers=2), world_size=2)
    train, _ = load_data(wds_cfg(tmp_path / "b", loader_workers=2))
    with pytest.raises(DatasetError, match="2 x 2 = 4 shards"):   # where the ranks are only known at reading
        next(train.batches(train_part(train, 2, 0, 0, 0), 4, CPU, True))
    shard = tmp_path / "b" / "train-0001.tar"
    whole = shard.read_bytes()
    shard.write_bytes(whole[:1000])
    with pytest.raises(DatasetError, match=r"shard .*b/train-0001.tar to be a tar file .* given 1000 bytes"):
        check_dataset(wds_cfg(tmp_path / "b"))
    shard.write_bytes(whole[:1536] + b"\x7f" * (len(whole) - 1536))     # whole blocks, garbage after a sample
    check_dataset(wds_cfg(tmp_path / "b"))                              # the listing cannot tell
    train, _ = load_data(wds_cfg(tmp_path / "b", loader_workers=1))
    with pytest.raises(DatasetError, match=r"shard .*b/train-0001.tar (unreadable|holds)"):
        read_epoch(train, 1, 0, batch=4, drop_last=True)
    (tmp_path / "b" / "_info.json").write_text("{not json")
    with pytest.raises(DatasetError, match=r"_info.json to be JSON"):
        check_dataset(wds_cfg(tmp_path / "b"))
    with pytest.raises(DatasetError, match=r"_info.json or _info.yaml or info.json in the folder .*nowhere, "
                                           r"which does not exist"):
        check_dataset(wds_cfg(tmp_path / "nowhere"))
    with pytest.raises(DatasetError, match="num_classes: required for dataset wds"):
        check_dataset(wds_cfg(tmp_path / "a", num_classes=None))


def _validate(tmp_path, data_path: str, workers: int, loader_workers: int) -> int:
    """`qkvsearch validate` of the quickstart campaign reading the wds set at data_path."""
    from qkvsearch.search.cli import main

    spec = yaml.safe_load((PRESETS / "quickstart.yaml").read_text())
    spec.update(storage=str(tmp_path / "results"), data={"dataset": "wds", "path": data_path})
    spec["model"].update(num_classes=3)
    spec["space"]["variants"] = spec["space"]["variants"][:1]
    spec["train"]["loader_workers"] = loader_workers
    spec["resources"]["workers_per_trial"] = workers
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return main(["validate", str(path)])


def test_a_bad_wds_set_stops_validate_before_ray_with_exit_2(tmp_path, capsys):
    write_wds(str(tmp_path / "shards"), {"train": [4, 4, 4], "validation": [2]})
    assert _validate(tmp_path, str(tmp_path / "shards"), workers=1, loader_workers=2) == 0
    assert _validate(tmp_path, str(tmp_path / "shards"), workers=2, loader_workers=1) == 0
    capsys.readouterr()
    assert _validate(tmp_path, str(tmp_path / "shards"), workers=2, loader_workers=2) == 2  # the trial's ranks
    err = capsys.readouterr().err
    assert "ranks x loader processes = 2 x 2 = 4 shards in split train" in err and "given 3" in err, err


def test_validate_reads_a_wds_bucket_prefix_rather_than_warning(s3, tmp_path, capsys):
    s3.create_dir("shards")
    write_wds("s3://shards/tiny", {"train": [4, 4], "validation": [3]})
    assert _validate(tmp_path, "s3://shards/tiny", workers=2, loader_workers=0) == 0
    capsys.readouterr()
    assert _validate(tmp_path, "s3://shards/tiny", workers=2, loader_workers=1) == 0
    assert _validate(tmp_path, "s3://shards/tiny", workers=2, loader_workers=2) == 2
    assert "2 x 2 = 4 shards in split train of s3://shards/tiny/_info.json, given 2" in capsys.readouterr().err
    assert _validate(tmp_path, "s3://shards/elsewhere", workers=1, loader_workers=0) == 2  # not a warning
    err = capsys.readouterr().err
    assert "data_path: expected _info.json or _info.yaml or info.json in the bucket prefix s3://shards/elsewhere" \
        in err and "which does not exist" in err, err


def test_an_hfds_folder_is_read_by_index(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    write_parquet_folder(tmp_path / "hf", {"train": 10, "validation": 4})
    cfg = fill({"model": "xcit_nano_12_p16_224", "epochs": 1, "dataset": "hfds", "data_path": str(tmp_path / "hf"),
                "num_classes": 3, "img_size": 16})
    check_dataset(cfg)
    train, val = load_data(cfg)
    assert (len(train), len(val)) == (10, 4)
    ids = [i for rank in range(2) for x, y in train.batches(train_part(train, 2, rank, 0, 0), 5, CPU, False)
           for i in sample_ids(x)]
    assert sorted(ids) == list(range(10))
    x, y = next(val.batches(eval_part(val, 1, 0), 4, CPU, False))
    assert sample_ids(x) == [10, 11, 12, 13] and y.tolist() == [1, 2, 0, 1]
    with pytest.raises(DatasetError, match=r"labels in 0..1 \(num_classes\) in .*train-00000-of-00001.parquet"):
        check_dataset({**cfg, "num_classes": 2})
    write_parquet_folder(tmp_path / "no_val", {"train": 4})
    with pytest.raises(DatasetError, match=r"split named validation or val or test in .*no_val.*given splits train"):
        check_dataset({**cfg, "data_path": str(tmp_path / "no_val")})
