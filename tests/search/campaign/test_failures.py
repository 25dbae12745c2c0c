"""Lost processes on local Ray: a killed Ray Train worker costs its trial a restart of the worker group from
its last checkpoint, never the trial or an epoch of its history."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers.live_campaign import folder_state, tiny_spec, wait_for, wait_while_advancing

from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.spaces import load_campaign

pytestmark = pytest.mark.slow


def _records(exp) -> list[dict]:
    try:
        return read_trial_records(exp)[0]
    except Exception:  # noqa: BLE001  (not written yet)
        return []


def _train_workers(address: str) -> list[int]:
    """Pids of the Train workers alive on the Ray at ``address`` (named: other tests' Rays may run beside it)."""
    from ray.util.state import list_actors

    alive = list_actors(address, filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
    return [a.pid for a in alive]


def test_a_killed_train_worker_restarts_its_group_from_the_checkpoint(ray_local, tmp_path):
    from qkvsearch.search.campaign.launch import launch

    raw = tiny_spec(tmp_path, "worker-lost", workers=2, epochs=4, variants=[{"embedding": "linear"}], steps=10)
    raw["resources"]["max_failures"] = 2
    spec = load_campaign(raw)
    exp = Path(tmp_path / "worker-lost")
    done = threading.Event()
    errors: list[BaseException] = []

    def run():
        try:
            launch(spec)
        except BaseException as exc:  # noqa: BLE001  (reported by the assertions below)
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    first = wait_while_advancing(lambda: next((r for r in _records(exp) if len(r["epochs"]) >= 2), None),
                                 lambda: folder_state(exp), "a trial's second epoch")
    here = ray_local.get_runtime_context().gcs_address
    pids = wait_for(lambda: _train_workers(here), 60, "the trial's Train workers")
    killed_at = time.time()
    os.kill(pids[-1], signal.SIGKILL)
    assert done.wait(600) and not errors, errors

    (hit,) = _records(exp)
    assert hit["trial_id"] == first["trial_id"] and hit["status"] == "completed"
    assert [int(e["epoch"]) for e in hit["epochs"]] == [1, 2, 3, 4]  # every epoch once: none lost or redone
    assert hit["started_at"] < killed_at < hit["ended_at"]


def test_a_damaged_or_missing_checkpoint_fails_naming_its_file(ray_local, tmp_path):
    from qkvsearch.trainers.training.engine import CheckpointError
    from qkvsearch.trainers.training.loop import RunSettings, run_trainer

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
