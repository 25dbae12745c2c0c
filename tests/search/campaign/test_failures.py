"""A trial's checkpoint that is damaged or missing fails its training naming the file (a killed Train worker, which
costs its trial a restart of the worker group from that checkpoint: test_shard_campaign.py)."""
from __future__ import annotations

import pytest
from helpers.live_campaign import tiny_spec

from qkvsearch.spaces import load_campaign

pytestmark = pytest.mark.slow


def test_a_damaged_or_missing_checkpoint_fails_naming_its_file(ray_local, tmp_path):
    from qkvsearch.trainers.ray_train.loop import RunSettings, run_trainer
    from qkvsearch.trainers.training.engine import CheckpointError

    cfg = load_campaign(tiny_spec(tmp_path, "ckpt", workers=1, epochs=1, variants=[{"embedding": "linear"}],
                                  steps=2))
    from qkvsearch.spaces import base_config
    from qkvsearch.trainers.model.cost import resolve_trial

    config, _ = resolve_trial({**base_config(cfg), "embedding": "linear"})
    run_trainer(config, RunSettings(num_workers=0, name="r", storage_path=str(tmp_path / "runs")))
    (state,) = (tmp_path / "runs" / "r").glob("checkpoint_epoch_*/state.pt")
    state.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError) as err:
        run_trainer({**config, "epochs": 2}, RunSettings(num_workers=0, name="r", storage_path=str(tmp_path / "runs")))
    assert str(err.value).startswith(f"checkpoint {state}: damaged")
