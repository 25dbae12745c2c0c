"""What validate and launch find before anything is written or started: models of the space, datasets,
an existing campaign, the scheduler's mode; and what a spec may no longer say (fault knobs)."""
from __future__ import annotations

import os

import pytest
import yaml

from qkvsearch.search.cli import main
from qkvsearch.spaces import SpecError, load_campaign


def spec_dict(storage, **change) -> dict:
    d = {"name": "pre", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16},
         "data": {"dataset": "digits"}, "train": {"epochs": 1, "max_steps_per_epoch": 1},
         "space": {"embedding": ["linear", "sne"]}, "search": {"algorithm": "grid"}, "storage": str(storage)}
    for key, value in change.items():
        section, _, leaf = key.partition("__")
        if leaf:
            d.setdefault(section, {})[leaf] = value
        else:
            d[section] = value
    return d


@pytest.fixture
def no_ray(monkeypatch):
    import qkvsearch.search.campaign.launch as campaign

    def refuse(*_args, **_kwargs):
        raise AssertionError("Ray must not start: the spec should have been refused")

    monkeypatch.setattr(campaign, "connect", refuse)


def run(tmp_path, capsys, command, **change):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_dict(tmp_path / "results", **change)))
    code = main([command, str(path)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", ["validate", "launch", "cost"])
def test_an_unknown_timm_model_exits_2_with_close_matches_and_writes_nothing(tmp_path, capsys, no_ray, command):
    code, err = run(tmp_path, capsys, command, model__name="xcit_nano_12_p8_22")
    assert code == 2
    assert 'model.name: expected the name of a timm model' in err and "close matches: xcit_nano_12_p8_224" in err
    assert "required" not in err  # no follow-on error contradicting the first
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("change, expected", [
    ({"model__img_size": 20}, "model.img_size: expected a multiple of xcit_nano_12_p8_224's patch size"),
    ({"space": {"embedding": ["sne"], "hidden_width": [0.001]}}, "hidden_width: expected a ratio giving a width >= 1"),
    ({"space": {"embedding": ["sne"], "hidden_width": [10**9]}},
     "hidden_width.choice[0]: expected a positive int width up to"),
    ({"train__opt": "adamww"},
     'train.opt: expected a timm optimizer name such as adamw (did you mean adamw?), given "adamww"'),
    ({"train__sched": "cosin"}, 'train.sched: expected one of cosine'),
])
@pytest.mark.parametrize("command", ["validate", "launch"])
def test_what_no_trial_could_train_is_refused_before_anything_starts(tmp_path, capsys, no_ray, command, change,
                                                                     expected):
    code, err = run(tmp_path, capsys, command, **change)
    assert code == 2 and expected in err, err
    assert not (tmp_path / "results").exists()


def test_a_vit_image_size_its_patches_do_not_tile_is_refused(tmp_path, capsys, no_ray):
    code, err = run(tmp_path, capsys, "validate", model__name="vit_tiny_patch16_224", model__img_size=40)
    assert code == 2 and "model.img_size: expected a multiple of vit_tiny_patch16_224's patch size 16, given 40" in err


def test_an_imagefolder_with_empty_class_folders_is_refused(tmp_path, capsys, no_ray):
    for split in ("train", "val"):
        for c in ("cat", "dog"):
            (tmp_path / "imgs" / split / c).mkdir(parents=True)
    (tmp_path / "imgs" / "train" / "cat" / "1.png").write_bytes(b"x")
    code, err = run(tmp_path, capsys, "validate", data={"dataset": "imagefolder", "path": str(tmp_path / "imgs")})
    assert code == 2 and "expected images" in err and "given 1 without any: dog" in err


def test_launch_checks_the_dataset_before_writing(tmp_path, capsys, no_ray):
    code, err = run(tmp_path, capsys, "launch", data={"dataset": "cifar10", "path": str(tmp_path / "nope")})
    assert code == 2 and "data_path: expected a folder holding" in err
    assert not (tmp_path / "results").exists()


def test_overwrite_keeps_the_old_campaign_when_the_new_spec_fails(tmp_path, capsys, no_ray):
    old = tmp_path / "results" / "pre"
    old.mkdir(parents=True)
    (old / "qs_campaign.json").write_text('{"name": "pre", "spec": {}}')
    (old / "precious.bin").write_bytes(b"1" * 1000)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_dict(tmp_path / "results", model={"name": "xcit_nano_12_p8_224",
                                                                          "img_size": 20})))
    assert main(["launch", str(path), "--overwrite"]) == 2
    assert (old / "precious.bin").read_bytes() == b"1" * 1000
    path.write_text(yaml.safe_dump(spec_dict(tmp_path / "results")))
    assert main(["launch", str(path)]) == 2  # exists, no --overwrite
    assert "a campaign already exists" in capsys.readouterr().err and (old / "precious.bin").exists()


def test_single_objective_asha_uses_the_mode_the_spec_resolved(tmp_path):
    from qkvsearch.search.campaign.opened import OpenedCampaign
    from qkvsearch.search.campaign.run import _scheduler

    spec = load_campaign(spec_dict(tmp_path, objectives=[{"metric": "val_loss"}, {"metric": "gmacs"}],
                                   scheduler={"type": "asha"}))
    assert (spec.scheduler.metric, spec.scheduler.mode) == ("val_loss", "min")
    asha = _scheduler(OpenedCampaign(spec, str(tmp_path)))
    assert (asha.metric, asha._metric_op) == ("val_loss", -1.0)  # minimised: keeps the lowest losses


@pytest.mark.parametrize("knob", ["qs_inject_nan_at_step", "qs_fail_after_epoch"])
def test_fault_injection_is_not_a_key_a_spec_can_write(tmp_path, knob):
    with pytest.raises(SpecError, match=rf"space.variants\[0\].{knob}: unknown search key"):
        load_campaign(spec_dict(tmp_path, space={"variants": [{"embedding": "sne", knob: 2}]}))


def test_constraints_no_configuration_meets_give_a_warning(tmp_path, capsys, no_ray):
    code = main(["validate", str(_write(tmp_path, spec_dict(tmp_path / "r", constraints={"params_m": {"max": 0.1}})))])
    assert code == 0
    assert "warning: constraints: no configuration of the space meets them" in capsys.readouterr().err


def _write(tmp_path, d) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(d))
    return os.fspath(path)


def test_validate_and_cost_count_distinct_configurations(capsys):
    space = ["--set", "space={embedding: {choice: [linear, sne, psne, fsne]}, code_size: {choice: [8, 16]},"
                      " hidden_width: {choice: [0.5, 64, match]}}",
             "--set", "search={algorithm: random, num_trials: 6}"]
    # at d = 128, 0.5 and 64 are one model: 1 + 3 + 3 + 3 x 2 = 13 points, 1 + 2 + 2 + 2 x 2 = 9 models
    assert main(["validate", "quickstart", *space]) == 0
    assert "configurations: 13 in the space, 9 distinct" in capsys.readouterr().out
    assert main(["cost", "quickstart", *space]) == 0
    assert "9 distinct model(s)" in capsys.readouterr().out


def test_storage_on_one_machines_disk_is_refused_for_a_cluster_of_several_machines(tmp_path):
    from qkvsearch.search.campaign.preflight import ResourceError, check_shared_storage, filesystem_type

    mounts = tmp_path / "mounts"
    mounts.write_text(f"overlay / overlay rw 0 0\nsrv:/export {tmp_path}/shared nfs4 rw 0 0\n")
    (tmp_path / "shared" / "runs").mkdir(parents=True)
    assert filesystem_type(str(tmp_path / "shared" / "runs" / "not-yet"), mounts=str(mounts)) == "nfs4"
    assert filesystem_type(str(tmp_path / "local"), mounts=str(mounts)) == "overlay"

    local = str(tmp_path / "results")
    check_shared_storage(local, {"10.0.0.1"})                       # one machine: its disk is everyone's
    check_shared_storage("s3://bucket/campaigns", {"10.0.0.1", "10.0.0.2"})
    if filesystem_type(local) not in {"nfs", "nfs4", "lustre"}:
        with pytest.raises(ResourceError) as err:
            check_shared_storage(local, {"10.0.0.1", "10.0.0.2"})
        text = str(err.value)
        assert text.startswith("storage:") and "2 machines" in text and "s3://" in text and local in text
        with pytest.raises(ResourceError) as err:  # one machine now, more once the autoscaler adds nodes
            check_shared_storage(local, {"10.0.0.1"}, can_grow=True)
        assert "autoscaler may add nodes" in str(err.value)
    check_shared_storage("s3://bucket/campaigns", {"10.0.0.1"}, can_grow=True)
