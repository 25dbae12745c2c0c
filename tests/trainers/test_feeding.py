"""loader_workers auto (trainers.training.feeding): the count chosen from measured rates, the sources it sizes,
the loader's wait share per epoch, and the identity rule of a count that cannot change what is trained."""
import contextlib
import io

import pytest
import torch
from helpers.images import write_imagefolder
from helpers.shards import write_wds

from qkvsearch.spaces.keys import ConfigError, fill, identity
from qkvsearch.trainers.data.datasets import check_dataset, load_data
from qkvsearch.trainers.training.engine import Dist, Run
from qkvsearch.trainers.training.feeding import chosen_workers, epoch_metrics, size_loaders

TINY = {"model": "xcit_nano_12_p16_224", "depth": 2, "embedding": "linear", "img_size": 16, "epochs": 1,
        "batch_size": 4, "lr": 1e-3, "warmup_epochs": 0}


def test_the_count_follows_the_rates_and_the_cpus():
    # decoding 10x faster than the device trains: decoding in turn costs 10 % more, one process hides it
    assert chosen_workers(1000.0, 100.0, cpus=4, cuda=True) == 1
    # a GPU that trains 800 images/s fed by processes that decode 100 each: 8, or all but one CPU
    assert chosen_workers(100.0, 800.0, cpus=16, cuda=True) == 8
    assert chosen_workers(100.0, 800.0, cpus=4, cuda=True) == 3
    # decoding nearly free against training: none
    assert chosen_workers(1e6, 100.0, cpus=8, cuda=True) == 0
    # on a CPU device a process takes a CPU from training: with 2 CPUs none pays, with 8 one does
    assert chosen_workers(400.0, 100.0, cpus=2, cuda=False) == 0
    assert chosen_workers(200.0, 100.0, cpus=8, cuda=False) == 1
    # one CPU: never a loader process; a cap of the data's own is kept
    assert chosen_workers(10.0, 1000.0, cpus=1, cuda=True) == 0
    assert chosen_workers(100.0, 800.0, cpus=16, cuda=True, most=2) == 2


def test_auto_is_a_value_of_its_own_and_a_wrong_one_names_the_key():
    assert fill({**TINY, "dataset": "digits", "loader_workers": "auto"})["loader_workers"] == "auto"
    with pytest.raises(ConfigError, match='loader_workers: expected a non-negative int or auto, given "many"'):
        fill({**TINY, "dataset": "digits", "loader_workers": "many"})


def test_a_count_changes_the_identity_only_where_it_changes_the_order_read(tmp_path):
    digits = [fill({**TINY, "dataset": "digits", "loader_workers": w}) for w in (0, 2, "auto")]
    assert len({identity(c) for c in digits}) == 1   # read by index: the seed alone orders it
    shards = [fill({**TINY, "dataset": "wds", "data_path": str(tmp_path), "num_classes": 3, "loader_workers": w})
              for w in (0, 2, "auto")]
    assert len({identity(c) for c in shards}) == 3   # dealt to loader processes: each count reads its own order


def test_auto_sizes_a_pil_source_and_every_epoch_reports_its_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)   # the CPUs a Train worker would be given
    write_imagefolder(tmp_path, ["ant", "bee"], 6)
    cfg = fill({**TINY, "dataset": "imagefolder", "data_path": str(tmp_path), "augment": True,
                "loader_workers": "auto"})
    check_dataset(cfg)
    run = Run(cfg, Dist())
    assert run.loader_processes in (0, 1, 2)   # at most the CPUs but one
    assert run.train_src.loader_workers == run.val_src.loader_workers == run.loader_processes
    metrics = run.run_epoch()
    assert 0.0 <= metrics["loader_wait"] <= 1.0
    assert metrics["loader_processes"] == float(run.loader_processes)


def test_a_set_count_is_kept_and_a_source_in_memory_needs_none():
    fixed = Run(fill({**TINY, "dataset": "digits", "augment": True, "loader_workers": 1}), Dist())
    assert fixed.loader_processes is None and fixed.train_src.loader_workers == 1
    in_memory = Run(fill({**TINY, "dataset": "digits", "loader_workers": "auto"}), Dist())
    assert in_memory.loader_processes == 0   # tensors in memory: nothing to decode
    assert "loader_processes" not in epoch_metrics(0.1, 1.0, None)


def test_auto_keeps_a_shard_source_within_what_its_shards_allow(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    write_wds(str(tmp_path), {"train": [4, 4], "validation": [3]})
    cfg = fill({**TINY, "dataset": "wds", "data_path": str(tmp_path), "num_classes": 3, "loader_workers": "auto"})
    check_dataset(cfg)
    train, val = load_data(cfg)
    assert train.decode_rate() > 0
    assert train.most_workers(1) == 2 and train.most_workers(2) == 1

    class Probe:   # what size_loaders reads of a run: its sources, device, batch, and a module to time
        def __init__(self):
            self.cfg, self.train_src, self.val_src, self.dist, self.bpw = cfg, train, val, Dist(), 4
            self.autocast = contextlib.nullcontext   # float32 on a CPU, as autocast_context gives it

        def timed_module(self):
            return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 3))

    assert size_loaders(Probe()) <= 2


def test_the_live_view_shows_each_running_trials_wait_and_the_summary_the_largest(tmp_path):
    from helpers.campaign_files import write_campaign, write_record

    from qkvsearch.search.monitor.progress import read_progress
    from qkvsearch.search.monitor.terminal import live_block

    records = write_campaign(tmp_path, ["running", "running", "completed"])
    for rec, wait in zip(records[:2], (0.25, 0.5)):
        rec["epochs"] = [{**e, "loader_wait": wait} for e in rec["epochs"]]
        write_record(tmp_path, rec)
    progress = read_progress(tmp_path)
    assert sorted(t.loader_wait for t in progress.running) == [0.25, 0.5]
    assert progress.summary().endswith("; loader wait up to 50%")
    from rich.console import Console

    console = Console(width=160, record=True, file=io.StringIO())
    console.print(live_block(progress))
    text = console.export_text()
    assert "loader wait" in text and "25%" in text and "50%" in text
