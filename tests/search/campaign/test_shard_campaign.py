"""A campaign training on WebDataset shards in a bucket (dataset wds): a real S3-protocol server (moto, server
mode on 127.0.0.1) holds the shards and timm's info file, written by the test; one trial trains with 2-rank DDP
(gloo, CPU) through Ray Train, each rank reading its share of the shards straight from the bucket.

Once the trial has recorded its first epoch (Train then holds that epoch's checkpoint), one of its DDP workers
is killed (SIGKILL, as a lost process), and Train starts a new worker group from the latest checkpoint: the
trial goes on and completes; every epoch is recorded once (the checkpoint's epoch, reported again by the new
group, too), each takes the N // batch_size updates the whole training split makes (both ranks take them all,
else DDP would hang or the trial fail) and validates on every validation sample once. Which samples each rank
reads is the deal of trainers.data.shard_deal, checked here for this campaign's epochs: the ranks between them read
every training sample once per epoch, as many each (the reader itself: tests/trainers/test_data_shards.py).

A shard that turns out corrupt mid-epoch (whole tar blocks, garbage inside: no listing can tell) fails the
trial's training with an error naming the shard, which the trial records as its error (a failed trial; the
campaign goes on): checked at the level of the trial's training function, trainers.ray_train.loop.run_trainer."""
from __future__ import annotations

import os
import signal
import time

import pytest
from helpers.live_campaign import LiveCampaign, ray_processes, tiny_spec, wait_while_advancing, write_spec
from helpers.shards import write_wds

from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.trainers.data.shard_deal import reader_pieces
from qkvsearch.trainers.data.sources import Part

pytestmark = pytest.mark.slow

BUCKET = "qkv-shards"
NAME = "on-shards"
TRAIN, VAL = [16, 16, 16, 16], [8]   # samples per shard: 64 training samples in 4 shards, 8 validation
BATCH, RANKS, EPOCHS, SEED = 16, 2, 8, 0   # 8 epochs: the kill after the first lands while it trains
UPDATES = sum(TRAIN) // BATCH        # per epoch: each rank's 32 samples are 4 batches of 8


def _spec(storage, data_path: str, epochs: int = EPOCHS) -> dict:
    raw = tiny_spec(storage, NAME, workers=RANKS, epochs=epochs, variants=[{"embedding": "linear"}])
    raw["model"]["num_classes"] = 3
    raw["data"] = {"dataset": "wds", "path": data_path}
    raw["train"].update(batch_size=BATCH, seed=SEED, max_steps_per_epoch=None)
    raw["resources"]["max_failures"] = 2   # new worker groups, from the latest checkpoint
    return raw


def _records(exp) -> list[dict]:
    try:
        return read_trial_records(exp)[0]
    except Exception:  # noqa: BLE001  (not written yet)
        return []


def _train_workers(run: LiveCampaign) -> list[int]:
    """Pids of the Train workers of the campaign's Ray (named by Ray after their actor class)."""
    return [int(line.split()[0]) for line in ray_processes(run.ray_tmp) if "ray::RayTrainWorker" in line]


def test_a_ddp_campaign_on_bucket_shards_resumes_a_killed_worker_group_and_reads_each_epoch_once(s3, tmp_path):
    from qkvsearch.trainers.training.engine import load_state

    s3.create_dir(BUCKET)
    write_wds(f"s3://{BUCKET}/tiny", {"train": TRAIN, "validation": VAL})
    spec = write_spec(tmp_path / "spec.yaml", _spec(tmp_path / "results", f"s3://{BUCKET}/tiny"))
    exp = tmp_path / "results" / NAME

    with LiveCampaign(["launch", str(spec)], tmp_path) as run:
        workers = wait_while_advancing(
            lambda: run._check_alive() or (any(r["epochs"] for r in _records(exp)) and _train_workers(run)),
            lambda: run.advancing(exp), "the first epoch recorded", every=0.05)
        assert len(workers) == RANKS, workers
        killed_at = time.time()
        os.kill(workers[-1], signal.SIGKILL)
        assert run.finish(exp) == 0, run.stderr()[-3000:]
    (rec,) = read_trial_records(exp)[0]
    assert rec["status"] == "completed", rec["error"]
    assert rec["started_at"] < killed_at < rec["ended_at"]   # the trial went on: not a new one
    epochs = rec["epochs"]
    assert [int(e["epoch"]) for e in epochs] == list(range(1, EPOCHS + 1))          # each epoch once
    assert [int(e["step"]) for e in epochs] == [UPDATES * (i + 1) for i in range(EPOCHS)]
    assert {int(e["val_images"]) for e in epochs} == {sum(VAL)}                     # validation: all, once
    history = load_state(rec["checkpoint_path"])["history"]
    assert [int(m["epoch"]) for m in history] == list(range(1, EPOCHS + 1))
    assert [m["top1"] for m in history] == [e["top1"] for e in epochs]
    started = [m["qs_first_step_at"] for m in history]   # the first step of the group that trained each epoch
    assert started == sorted(started) and len(set(started)) == 2, started   # the first group, then the new one

    for epoch in range(EPOCHS):  # the deal the ranks read (loader_workers 0: one reader per rank)
        shares = [[(p.shard, s) for p in reader_pieces(TRAIN, Part(RANKS, r, SEED, epoch), 1, 0)
                   for s in range(p.start, p.stop)] for r in range(RANKS)]
        assert [len(s) for s in shares] == [UPDATES * BATCH // RANKS] * RANKS
        assert sorted(shares[0] + shares[1]) == [(i, s) for i, n in enumerate(TRAIN) for s in range(n)]


def test_a_corrupt_shard_fails_the_trial_naming_the_shard(tmp_path):
    from qkvsearch.search.campaign.driver import error_text
    from qkvsearch.spaces import base_config, load_campaign
    from qkvsearch.trainers.data.shard_source import ShardError
    from qkvsearch.trainers.model.cost import resolve_trial
    from qkvsearch.trainers.ray_train.loop import RunSettings, run_trainer

    write_wds(str(tmp_path / "tiny"), {"train": TRAIN, "validation": VAL})
    shard = tmp_path / "tiny" / "train-0002.tar"
    whole = shard.read_bytes()
    shard.write_bytes(whole[:1536] + b"\x7f" * (len(whole) - 1536))   # whole tar blocks, garbage after a sample
    config, _ = resolve_trial({**base_config(load_campaign(_spec(tmp_path, str(tmp_path / "tiny"), epochs=1))),
                               "embedding": "linear"})
    with pytest.raises(ShardError) as err:   # the trial's training (local mode: its own error, as it is)
        run_trainer(config, RunSettings(num_workers=0, name="r", storage_path=str(tmp_path / "runs")))
    assert f"shard {shard}" in str(err.value)
    assert f"shard {shard}" in error_text(err.value)   # what a failed trial records as its error
