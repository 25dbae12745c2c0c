"""Campaigns on the device input path over an imagefolder (data.pipeline: device, on CPU workers): the first
campaign prepares the dataset once, with Ray tasks, before its trials start, and both its trials read it; a second
campaign on the same storage reads it without preparing again; a shard damaged since is found when a campaign
starts and prepared again, alone. `validate` says what would be prepared, where, and whether it is there."""
from __future__ import annotations

import os

import pytest
from helpers.images import write_imagefolder
from helpers.live_campaign import tiny_spec

from qkvsearch.search.campaign.launch import launch
from qkvsearch.search.campaign.prepare import describe, plans, prepare_for
from qkvsearch.search.monitor.status import load_records
from qkvsearch.spaces import load_campaign
from qkvsearch.trainers.data import prepared

pytestmark = pytest.mark.slow


def _spec(tmp, name: str, variants: list[dict]):
    raw = tiny_spec(tmp / "results", name, workers=1, epochs=1, variants=variants, steps=2)
    raw["model"]["num_classes"] = 3
    raw["data"] = {"dataset": "imagefolder", "path": str(tmp / "images"), "pipeline": "device"}
    raw["train"].update(batch_size=8, randaugment="rand-m9-mstd0.5-inc1", random_erasing=0.25)
    return load_campaign(raw)


def test_a_dataset_prepared_once_serves_two_trials_and_a_second_campaign_and_a_damaged_shard_is_redone(
        ray_local, tmp_path):
    write_imagefolder(tmp_path / "images", ["a", "b", "c"], 6, size=(30, 22))
    first = _spec(tmp_path, "first", [{"embedding": "linear"}, {"embedding": "sne"}])
    (p,) = plans(first)
    assert "to be prepared when the campaign starts" in describe(first)[1] and p.location in describe(first)[1]
    exp = launch(first)
    records = load_records(exp)
    assert len(records) == 2 and {r["status"] for r in records} == {"completed"}, [r.get("error") for r in records]
    assert {r["config"]["data_pipeline"] for r in records} == {"device"}
    (made,) = prepared.history(p.location)   # once, before the trials: neither trial prepared it again
    assert made["why"] == "new" and made["shards"] == ["train-00000", "val-00000"] and made["images"] == 36

    second = _spec(tmp_path, "second", [{"embedding": "linear"}])
    assert plans(second)[0].location == p.location and "ready" in describe(second)[1]
    (rec,) = load_records(launch(second))
    assert rec["status"] == "completed", rec.get("error")
    assert len(prepared.history(p.location)) == 1   # read, not prepared again

    shard = os.path.join(p.location, "val-00000.bin")
    original = open(shard, "rb").read()
    data = bytearray(original)
    data[7] ^= 0xFF
    with open(shard, "wb") as f:
        f.write(bytes(data))
    given = prepare_for(second)   # what a campaign does when it starts, on its Ray
    assert given == {"root": str(tmp_path / "results" / prepared.PREPARED_DIR), str(p.short): p.location}
    redone = prepared.history(p.location)[-1]
    assert redone["shards"] == ["val-00000"] and "val-00000.bin's SHA-256 differs" in redone["why"]
    assert prepared.check(p.location, prepared.read_manifest(p.location)) == {}
    assert open(shard, "rb").read() == original   # made again from the same images, the same bytes
