"""The CUDA training path: bf16 autocast, torch.compile, device-resident data, the deferred NaN check,
persistent pinned-memory loaders, and a 1-GPU Ray Train trial (NCCL process group). Skipped without CUDA."""
import math

import pytest
import torch

from qkvsearch.spaces.keys import fill
from qkvsearch.trainers.training import engine
from qkvsearch.trainers.training.engine import Dist, DivergenceError, Run

pytestmark = pytest.mark.gpu

SMALL = {"model": "xcit_nano_12_p16_224", "embedding": "fsne", "code_size": 8, "img_size": 32,
         "dataset": "digits", "batch_size": 32, "lr": 2e-3, "warmup_epochs": 0, "epochs": 2,
         "max_steps_per_epoch": 2 * engine.CHECK_EVERY["cuda"] + 3}  # checks mid-epoch and at its end


def cuda():
    return Dist(0, 1, torch.device("cuda"))


def test_bf16_compiled_training_learns_with_data_on_the_device():
    run = Run(fill(dict(SMALL, compile=True)), cuda())
    assert isinstance(run.model, torch._dynamo.eval_frame.OptimizedModule)
    assert not engine.compile_enabled(fill(SMALL), run.dist.device, 2 * SMALL["max_steps_per_epoch"])  # auto
    with run.autocast():
        x, _ = next(run.val_src.batches(torch.arange(4), 4, run.dist.device, drop_last=False))
        assert run.model(x).dtype == torch.bfloat16
    run.train()
    first, last = run.history
    assert run.train_src.images.is_cuda and run.val_src.images.is_cuda  # copied once, indexed there
    assert all(math.isfinite(v) for v in last.values())
    assert last["train_loss"] < first["train_loss"] and last["top1"] > 30.0
    assert not any(k.startswith("_orig_mod.") for k in run.state_dict()["model"])  # checkpoints as eager


def test_divergence_is_found_at_its_update_between_host_checks():
    with pytest.raises(DivergenceError, match=r"non-finite loss nan at epoch 1 step 7"):
        engine.fit(fill(dict(SMALL, compile=False)), cuda(), faults=[{"nan_at_update": 7}])


def test_compiled_and_eager_runs_agree_closely():
    """The same seed, data and steps, compiled or eager: bf16 sums differ in order only."""
    cfg = dict(SMALL, epochs=1, max_steps_per_epoch=10)
    eager, compiled = (Run(fill(dict(cfg, compile=c)), cuda()) for c in (False, True))
    eager.train(), compiled.train()
    a, b = eager.history[-1]["train_loss"], compiled.history[-1]["train_loss"]
    assert abs(a - b) < 0.05 * abs(a)


def test_imagefolder_trains_through_persistent_pinned_loaders(tmp_path):
    from helpers.images import write_imagefolder

    write_imagefolder(tmp_path, ["ant", "bee", "cow"], 12)
    cfg = fill(dict(SMALL, dataset="imagefolder", data_path=str(tmp_path), img_size=32, batch_size=8,
                    max_steps_per_epoch=None, augment=True, loader_workers=2, compile=False))
    run = Run(cfg, cuda())
    run.train()
    assert len(run.history) == 2 and all(math.isfinite(v) for v in run.history[-1].values())
    ((_, loader),) = run.train_src._loaders.values()
    assert loader.pin_memory and loader.persistent_workers


@pytest.mark.slow
def test_ray_train_trial_on_one_gpu(tmp_path):
    import ray

    from qkvsearch.trainers.ray_train.loop import RunSettings, run_trainer

    if ray.is_initialized():
        pytest.skip("needs its own Ray with the GPU")
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        result = run_trainer(fill(SMALL), RunSettings(num_workers=1, cpus_per_worker=2, gpus_per_worker=1,
                             name="gpu", storage_path=str(tmp_path)))
    finally:
        ray.shutdown()
    history = result.return_value
    assert [m["epoch"] for m in history] == [1.0, 2.0]
    assert all(math.isfinite(v) for v in history[-1].values()) and result.checkpoint is not None
    assert history[-1]["top1"] > 30.0


@pytest.mark.slow
def test_one_shot_scoring_runs_on_the_gpu_its_actor_holds(tmp_path):
    """A scorer actor of a one-shot campaign holding a GPU scores on it, in bf16, as a trial evaluates."""
    import ray

    from qkvsearch.search.campaign.oneshot.plan import candidates, supernet_plan
    from qkvsearch.search.campaign.oneshot.scorers import ScorerPool
    from qkvsearch.search.cluster.local_ray import start_local_ray, stop_local_ray
    from qkvsearch.spaces import base_config, load_campaign
    from qkvsearch.trainers.supernet.plan import SupernetPlan
    from qkvsearch.trainers.training.engine import STATE_FORMAT, save_state

    if ray.is_initialized():
        pytest.skip("needs its own Ray with the GPU")
    spec = load_campaign({"name": "gpu-scoring", "model": {"name": "xcit_nano_12_p16_224", "img_size": 32},
                          "data": {"dataset": "digits"}, "train": {"epochs": 1, "batch_size": 32},
                          "space": {"depth": 2, "embedding": {"choice": ["linear", "sne"]}},
                          "supernet": {"train": {"epochs": 1}, "bn_batches": 1},
                          "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
                          "search": {"algorithm": "grid"}, "storage": str(tmp_path),
                          "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 1}})
    plan = supernet_plan(spec)
    teacher = fill({**base_config(spec), **SupernetPlan.from_dict(plan).teacher})
    save_state({"format": STATE_FORMAT, "model": SupernetPlan.from_dict(plan).supernet().state_dict(), "epoch": 1,
                "history": [], "config": teacher}, str(tmp_path / "supernet"))
    start_local_ray(trial_slots=1, num_cpus=2, num_gpus=1)
    try:
        with ScorerPool(spec, plan, str(tmp_path / "supernet"), teacher, 1) as pool:
            (actor,) = pool.get()
            scores = ray.get(actor.score.remote([t["config"] for t in candidates(spec)]))
            assert [w["device"] for w in pool.where] == ["cuda:0"]
    finally:
        stop_local_ray()
    assert len(scores) == 2 and all(0.0 <= s["metrics"]["top1"] <= 100.0 for s in scores)
