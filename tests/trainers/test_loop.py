"""trainers.training.engine / trainers.ray_train.loop: accumulation, resume equivalence, divergence, the CLI
and Ray Train.

Models are real timm models at 16x16 on sklearn's digits; Ray tests use the session's local Ray.
"""
import json
import os
import pickle

import pytest
import torch
from helpers import REPO

from qkvsearch.spaces.keys import fill
from qkvsearch.trainers.ray_train.loop import RunSettings, find_divergence, main, run_trainer
from qkvsearch.trainers.training import engine
from qkvsearch.trainers.training.engine import DivergenceError, Run, load_state

# XCiT-nano cut to 2 of its 12 blocks with the fully-shared embedding; 16x16 digits, 1 token: fast on one core.
TINY = {"model": "xcit_nano_12_p16_224", "depth": 2, "embedding": "fsne", "hidden_width": 32, "img_size": 16,
        "dataset": "digits", "val_fraction": 0.05, "batch_size": 16, "lr": 2e-3, "warmup_epochs": 0.5,
        "epochs": 1}
METRIC_KEYS = {"epoch", "train_loss", "val_loss", "top1", "top5", "lr", "images_per_s", "epoch_s", "train_s"}


def finite_metrics(metrics: dict) -> bool:
    return all(isinstance(v, float) and v == v and abs(v) != float("inf") for v in metrics.values())


@pytest.fixture
def one_thread():
    """Ray workers run with one intra-op thread: in-process references must too (same sum order)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _weights(state_dir):
    return load_state(str(state_dir))["model"]


def _assert_same_weights(a, b, rel_l2=0.0):
    """Bitwise equal, or (rel_l2 > 0, weights from two processes) equal up to float rounding:
    ||a - b|| / ||a|| <= rel_l2 over all tensors. A wrong resume (lr, data order, optimizer state)
    moves the weights by ~lr per element, orders of magnitude more."""
    assert a.keys() == b.keys()
    if all(torch.equal(a[k], b[k]) for k in a):
        return
    diff = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a) ** 0.5
    norm = sum(float(a[k].double().pow(2).sum()) for k in a) ** 0.5
    worst = max(a, key=lambda k: float((a[k].double() - b[k].double()).abs().max()))
    assert diff <= rel_l2 * norm, f"relative L2 difference {diff / norm:.3g}; worst tensor {worst}"


# ---------------------------------------------------------------------------------------------
# Engine, no Ray


@pytest.mark.slow
def test_accumulated_gradient_equals_one_big_batch(one_thread):
    """4 micro-batches of 8 give the gradient of one batch of 32 (DeiT: no BatchNorm, no dropout)."""
    base = {**TINY, "model": "deit_tiny_patch16_224", "embedding": "sne", "hidden_width": 32,
            "batch_size": 32, "max_steps_per_epoch": 1, "epochs": 1}
    grads = []
    for bpw in (None, 8):
        run = Run(fill({**base, "batch_per_worker": bpw}))
        assert run.accum == (1 if bpw is None else 4)
        engine.seed_epoch(0, 0, 0)
        engine.train_one_epoch(run)  # one update; .grad keeps the gradient of that update
        grads.append([p.grad.clone() for p in run.raw.parameters()])
    for g_big, g_acc in zip(*grads):
        torch.testing.assert_close(g_acc, g_big, rtol=1e-4, atol=1e-6)
    assert sum(float(g.abs().sum()) for g in grads[0]) > 0


def _cli(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _write_yaml(path, cfg):
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_kill_and_resume_equals_straight_run(tmp_path, capsys, one_thread, monkeypatch):
    """4 epochs straight == 2 epochs, crash, resume from state.pt for 2 more: same weights and metrics.
    Drop-path (torch RNG) and Mixup/CutMix (numpy RNG) are on, so RNG handling matters."""
    cfg = {**TINY, "epochs": 4, "max_steps_per_epoch": 2, "drop_path_rate": 0.1, "mixup": 0.8,
           "cutmix": 1.0, "label_smoothing": 0.1, "checkpoint_every": 2}
    yml = _write_yaml(tmp_path / "trial.yaml", cfg)
    code, straight = _cli(["--config", yml, "--checkpoint-dir", tmp_path / "a"], capsys)
    assert code == 0 and [m["epoch"] for m in straight] == [1, 2, 3, 4]

    monkeypatch.setenv("QKVSEARCH_FAULTS", '[{"fail_after_epoch": 2}]')
    with pytest.raises(engine.SimulatedFailure):
        main(["--config", str(yml), "--checkpoint-dir", str(tmp_path / "b")])
    monkeypatch.delenv("QKVSEARCH_FAULTS")
    assert load_state(str(tmp_path / "b"))["epoch"] == 2
    capsys.readouterr()
    code, resumed = _cli(["--config", yml, "--checkpoint-dir", tmp_path / "b"], capsys)
    # the checkpoint's epoch is reported again first (it may never have reached the search), then 3, 4
    assert code == 0 and [m["epoch"] for m in resumed] == [2, 3, 4] and resumed[0]["top1"] == straight[1]["top1"]

    _assert_same_weights(_weights(tmp_path / "a"), _weights(tmp_path / "b"))
    for s, r in zip(straight[2:], resumed[1:]):
        for k in ("train_loss", "val_loss", "top1", "lr", "step"):
            assert s[k] == r[k], k
    assert not [f for f in os.listdir(tmp_path / "b") if f != "state.pt"]  # no temp files left


def test_checkpoint_is_plain_and_loads_weights_only(tmp_path, one_thread):
    run = Run(fill({**TINY, "epochs": 1, "max_steps_per_epoch": 1}))
    run.train(report=lambda m, state_fn: engine.save_state(state_fn(), str(tmp_path)))
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert state["epoch"] == 1 and state["updates"] == 1 and state["config"] == run.cfg
    assert set(state) >= {"model", "optimizer", "scheduler", "history"}
    assert finite_metrics(state["history"][0])


def test_nan_loss_raises_divergence_error_naming_epoch_and_step(one_thread):
    cfg = fill({**TINY, "epochs": 2, "max_steps_per_epoch": 2})
    with pytest.raises(DivergenceError, match=r"non-finite loss nan at epoch 2 step 1") as err:
        engine.fit(cfg, engine.Dist(), faults=[{"nan_at_update": 3}])
    again = pickle.loads(pickle.dumps(err.value))  # crosses process boundaries intact
    assert (again.epoch, again.step) == (2, 1) and str(again) == str(err.value)


def test_cli_bad_keys_exit_2(tmp_path, capsys):
    for args, msg in [
        (["--set", "learning_rate=0.1"], 'learning_rate: expected a trial key (did you mean "lr"?)'),
        (["--set", f"model={TINY['model']}", "--set", "epochs=zero"], 'epochs: expected a positive int, given "zero"'),
        (["--set", "epochs"], "--set: expected key=value, given 'epochs'"),
        (["--config", _write_yaml(tmp_path / "l.yaml", [1, 2])], "expected a YAML mapping"),
        (["--set", "model=xcit_nano_12_p16_224", "--set", "epochs=1", "--set", "dataset=cifar10",
          "--set", f"data_path={tmp_path}/none"], "data_batch_1..5 and test_batch"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main([str(a) for a in args])
        assert exit_info.value.code == 2
        assert msg in capsys.readouterr().err


def test_cli_reads_floats_like_1e_3(tmp_path):
    from qkvsearch.trainers.ray_train.loop import load_cli_config

    cfg = load_cli_config(str(_write_yaml(tmp_path / "t.yaml", {"model": TINY["model"]})),
                          ["lr=1e-3", "epochs=2", "amp=none"])
    assert cfg["lr"] == 1e-3 and cfg["epochs"] == 2 and cfg["amp"] == "none"
    (tmp_path / "raw.yaml").write_text(f"model: {TINY['model']}\nepochs: 1\nlr: 5e-4\nclip_grad: 1\n")
    assert load_cli_config(str(tmp_path / "raw.yaml"), [])["lr"] == 5e-4


def test_missing_dataset_fails_before_any_worker(tmp_path):
    def run(workers):
        return RunSettings(num_workers=workers, name="never", storage_path=str(tmp_path / "runs"))

    with pytest.raises(ValueError, match=r"data_path: expected a folder holding data_batch_1..5 and test_batch"):
        run_trainer(fill({**TINY, "dataset": "cifar10", "data_path": str(tmp_path / "absent")}), run(2))
    assert not (tmp_path / "runs").exists()  # Ray never given the trainer
    with pytest.raises(ValueError, match=r"batch_size: expected a multiple of the workers per trial \(3\)"):
        run_trainer(fill(TINY), run(3))
    with pytest.raises(ValueError, match=r"config: expected a filled trial config"):
        run_trainer(TINY, run(1))
    with pytest.raises(ValueError, match=r"num_workers: expected an int >= 0 \(0: in this process\), given -1"):
        run(-1)
    with pytest.raises(TypeError):
        RunSettings(1, "never", str(tmp_path))   # keywords only


def test_example_trial_yaml_is_valid():
    from qkvsearch.trainers.ray_train.loop import load_cli_config

    cfg = load_cli_config(str(REPO / "examples" / "trial.yaml"), [])
    assert cfg["dataset"] == "digits" and cfg["epochs"] <= 5


# ---------------------------------------------------------------------------------------------
# Ray Train


def _report_recorder(path):
    """A Train callback (runs in the controller) appending every report of every rank to a file."""
    import ray.train

    class Recorder(ray.train.UserCallback):  # local class: pickled by value into the controller
        def after_report(self, run_context, metrics, checkpoint):
            with open(path, "a") as f:
                f.write(json.dumps({"ranks": metrics, "checkpoint": checkpoint is not None}) + "\n")

    return Recorder()


def _recorded(path):
    return [json.loads(line) for line in open(path)]


@pytest.mark.slow
def test_two_worker_ddp_learns_digits_and_replicas_agree(ray_local, tmp_path):
    cfg = fill({**TINY, "model": "xcit_nano_12_p8_224", "epochs": 3, "batch_size": 32, "batch_per_worker": 8,
                "max_steps_per_epoch": 12, "val_fraction": 0.2})  # 2 workers x 8 images x 2 micro-steps (no_sync)
    log = tmp_path / "reports.jsonl"
    result = run_trainer(cfg, RunSettings(num_workers=2, name="ddp2", storage_path=str(tmp_path),
                         callbacks=[_report_recorder(str(log))]))
    reports = _recorded(log)
    assert [len(r["ranks"]) for r in reports] == [2, 2, 2] and all(r["checkpoint"] for r in reports)
    for r in reports:  # both ranks hold identical parameters after every epoch
        rank0, rank1 = r["ranks"]
        assert rank0["qs_param_checksum"] == rank1["qs_param_checksum"] and rank0["qs_param_spread"] == 0.0, r
    epochs = result.return_value  # rank 0's metrics of every epoch
    assert [m["epoch"] for m in epochs] == [1, 2, 3] == [r["ranks"][0]["epoch"] for r in reports]
    assert all(METRIC_KEYS <= set(m) and finite_metrics(m) for m in epochs)
    assert all(m["qs_world_size"] == 2 and m["qs_accum_steps"] == 2 and m["val_images"] == 360 for m in epochs)
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"] and epochs[-1]["val_loss"] < epochs[0]["val_loss"]
    assert result.metrics == epochs[-1] and result.metrics["top1"] > 40.0  # 10 classes: chance is 10%
    assert result.metrics_dataframe["epoch"].tolist() == [2, 3]  # only the kept checkpoints (num_to_keep=2)
    assert os.path.basename(result.checkpoint.path) == "checkpoint_epoch_0003"
    state = load_state(result.checkpoint.path)
    assert state["epoch"] == 3 and state["history"] == epochs



@pytest.mark.slow
def test_ray_divergence_then_resume_matches_straight_run(ray_local, tmp_path, one_thread, monkeypatch):
    """A NaN in epoch 2 ends the run with DivergenceError (checkpoint of epoch 1 kept); the same Train
    run started again resumes via ray.train.get_checkpoint() and ends bitwise equal to a straight run;
    started once more, the finished run reports every epoch again and trains nothing."""
    import ray.train

    cfg = fill({**TINY, "epochs": 2, "max_steps_per_epoch": 3, "drop_path_rate": 0.1})
    monkeypatch.setenv("QKVSEARCH_FAULTS", '[{"nan_at_update": 4}]')  # read by run_trainer, carried to workers
    with pytest.raises(ray.train.TrainingFailedError) as err:
        run_trainer(cfg, RunSettings(num_workers=1, name="nan", storage_path=str(tmp_path)))
    monkeypatch.delenv("QKVSEARCH_FAULTS")
    div = find_divergence(err.value)
    assert isinstance(div, DivergenceError) and (div.epoch, div.step) == (2, 1)
    assert "non-finite loss nan at epoch 2 step 1" in str(err.value)

    log = tmp_path / "reports.jsonl"
    resumed = run_trainer(cfg, RunSettings(num_workers=1, name="nan", storage_path=str(tmp_path),
                          callbacks=[_report_recorder(str(log))]))
    # epoch 1 came from the checkpoint: reported again (it may not have reached the search), then epoch 2
    assert [r["ranks"][0]["epoch"] for r in _recorded(log)] == [1, 2]
    assert [m["epoch"] for m in resumed.return_value] == [1, 2]

    straight = Run(cfg)
    straight.train()
    _assert_same_weights(_weights(resumed.checkpoint.path), straight.raw.state_dict(), rel_l2=1e-6)
    for r, m in zip(resumed.return_value, straight.history):
        assert r["top1"] == m["top1"] and r["train_loss"] == pytest.approx(m["train_loss"], rel=1e-6)

    log.unlink()
    again = run_trainer(cfg, RunSettings(num_workers=1, name="nan", storage_path=str(tmp_path),
                        callbacks=[_report_recorder(str(log))]))  # finished: re-reports, trains nothing
    assert [r["ranks"][0] for r in _recorded(log)] == resumed.return_value
    assert again.metrics == resumed.metrics and again.return_value == resumed.return_value


@pytest.mark.slow
def test_local_mode_keeps_checkpoints_and_resumes_like_a_train_run(ray_local, tmp_path, one_thread, monkeypatch):
    """num_workers=0 (Train's local mode, in this process): a NaN raises DivergenceError itself; the run
    resumes from the last checkpoint it kept in <storage>/<name>/checkpoint_epoch_NNNN and ends equal to a
    straight run; each epoch reaches on_report with its checkpoint's folder."""
    cfg = fill({**TINY, "epochs": 3, "max_steps_per_epoch": 3, "drop_path_rate": 0.1})
    reports = []

    def on_report(metrics, path):
        reports.append((metrics["epoch"], path and os.path.basename(path)))

    monkeypatch.setenv("QKVSEARCH_FAULTS", '[{"nan_at_update": 7}]')  # the first update of epoch 3
    with pytest.raises(DivergenceError) as err:
        run_trainer(cfg, RunSettings(num_workers=0, name="local", storage_path=str(tmp_path), on_report=on_report))
    monkeypatch.delenv("QKVSEARCH_FAULTS")
    assert find_divergence(err.value) is err.value and (err.value.epoch, err.value.step) == (3, 1)
    assert reports == [(1.0, "checkpoint_epoch_0001"), (2.0, "checkpoint_epoch_0002")]

    reports.clear()
    resumed = run_trainer(cfg, RunSettings(num_workers=0, name="local", storage_path=str(tmp_path),
                                           on_report=on_report))
    # epochs 1 and 2 came from the checkpoint: both are reported again (the search may have missed
    # either), with no new checkpoint
    assert reports == [(1.0, None), (2.0, None), (3.0, "checkpoint_epoch_0003")]
    assert [m["epoch"] for m in resumed.return_value] == [1, 2, 3]
    assert sorted(os.listdir(tmp_path / "local")) == ["checkpoint_epoch_0002", "checkpoint_epoch_0003"]
    assert all(m["qs_world_size"] == 1 for m in resumed.return_value)

    straight = Run(cfg)
    straight.train()
    _assert_same_weights(_weights(tmp_path / "local" / "checkpoint_epoch_0003"), straight.raw.state_dict())
    assert [m["top1"] for m in resumed.return_value] == [m["top1"] for m in straight.history]


def _timing(metrics):
    """The metrics that legitimately differ between two runs of the same config."""
    return {k: metrics[k] for k in ("images_per_s", "epoch_s", "train_s", "eval_s", "qs_first_step_at", "qs_setup_s")}
