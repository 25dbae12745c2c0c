"""spaces.stages: the campaign file's stages section, its errors (named by field), its round trip, and that a
campaign without it reads as before."""
import pytest

from qkvsearch.spaces import SpecError, load_campaign, smoke_test
from qkvsearch.spaces.schema import Objective

STAGES = {
    "finetune": [{"dataset": "digits_0to8", "epochs": 2, "lr": 1e-4, "img_size": 16},
                 {"dataset": "cifar10", "path": "/data/cifar10", "epochs": 3}],
    "ood": {"in_distribution": "digits_0to8", "score": "energy",
            "datasets": [{"format": "noise"}, {"name": "nine", "format": "digits_heldout"},
                         {"name": "svhn", "format": "imagefolder", "path": "/data/svhn"}]},
    "objectives": ["fpr95", {"metric": "top1@cifar10"}, "gmacs"],
    "constraints": {"auroc": {"min": 60}},
}


def _spec(stages):
    d = load_campaign("quickstart").to_dict()
    return load_campaign({**d, "stages": stages})


def test_stages_read_and_round_trip():
    spec = _spec(STAGES)
    ft, ood = spec.stages.finetune, spec.stages.ood
    assert [f.name for f in ft] == ["finetune@digits_0to8", "finetune@cifar10"]
    assert dict(ft[0].recipe) == {"epochs": 2, "lr": 1e-4, "img_size": 16} and ft[1].path == "/data/cifar10"
    assert [(s.name, s.format) for s in ood.datasets] == [("noise", "noise"), ("nine", "digits_heldout"),
                                                          ("svhn", "imagefolder")]
    assert spec.stages.objectives == (Objective("fpr95", "min"), Objective("top1@cifar10", "max"),
                                      Objective("gmacs", "min"))
    assert spec.stages.constraints[0].min == 60.0
    assert load_campaign(spec.to_dict()) == spec
    assert spec.objectives == load_campaign("quickstart").objectives  # the searcher's stay pretraining's


def test_a_stages_own_resources_round_trip_and_leave_its_result_key_alone():
    from qkvsearch.spaces.stages import result_settings

    own = {"workers_per_trial": 4, "gpus_per_worker": 1}
    stages = {**STAGES, "select": "as_completed",
              "finetune": [{**STAGES["finetune"][0], "resources": own}, STAGES["finetune"][1]],
              "ood": {**STAGES["ood"], "resources": {"cpus_per_worker": 2}}}
    spec = _spec(stages)
    ft = spec.stages.finetune[0]
    assert dict(ft.resources) == own and dict(spec.stages.ood.resources) == {"cpus_per_worker": 2}
    assert spec.stages.select == "as_completed" and load_campaign(spec.to_dict()) == spec
    assert result_settings(ft) == result_settings(_spec(STAGES).stages.finetune[0])  # same result key
    assert smoke_test(spec).stages.finetune[0].resources == ft.resources


def test_no_stages_section_reads_as_before():
    spec = load_campaign("quickstart")
    assert not spec.stages and "stages" not in spec.to_dict()
    assert load_campaign({**spec.to_dict(), "stages": None}) == spec


def test_default_stage_objectives():
    spec = _spec({"finetune": STAGES["finetune"], "ood": STAGES["ood"]})
    assert spec.stages.objectives == (Objective("transfer_avg", "max"), Objective("fpr95", "min"))


@pytest.mark.parametrize(("stages", "message"), [
    ({"finetune": [{"dataset": "mnist", "epochs": 1}]}, 'stages.finetune[0].dataset: expected one of digits'),
    ({"finetune": [{"dataset": "digits"}]}, "stages.finetune[0].epochs: required"),
    ({"finetune": [{"dataset": [1], "epochs": 1}]}, "stages.finetune[0].dataset: expected one of digits"),
    ({"finetune": [{"dataset": {"a": 1}, "epochs": 1}]}, "stages.finetune[0].dataset: expected one of digits"),
    ({"finetune": [{"dataset": "stl10", "epochs": 1}]}, "stages.finetune[0].path: required for stl10"),
    ({"finetune": [{"dataset": "digits", "epochs": 1, "lr": -1}]},
     'stages.finetune[0].lr: expected a number > 0, given -1'),
    ({"finetune": [{"dataset": "digits", "epochs": 1, "lrr": 1}]}, "stages.finetune[0].lrr: unknown key"),
    ({"finetune": [{"dataset": "digits", "epochs": 1}] * 2},
     "stages.finetune[1].dataset: expected one finetune stage per dataset"),
    ({"ood": {"in_distribution": "cifar10", "datasets": [{"format": "noise"}]}},
     "stages.ood.in_distribution: expected the dataset of a finetune stage (no finetune stage), given \"cifar10\""),
    ({**STAGES, "ood": {**STAGES["ood"], "score": "odin"}},
     'stages.ood.score: expected msp | energy | max_logit, given "odin"'),
    ({**STAGES, "ood": {**STAGES["ood"], "datasets": [{"format": "imagefolder"}]}},
     "stages.ood.datasets[0].path: required for imagefolder"),
    ({**STAGES, "ood": {**STAGES["ood"], "datasets": []}}, "stages.ood.datasets: expected a non-empty list"),
    ({**STAGES, "objectives": ["top1@stl10"]}, 'stages.objectives[0].metric: expected one of transfer_avg'),
    ({**STAGES, "constraints": {"gmacs": {"max": 1}}}, "stages.constraints.gmacs: expected a stage metric"),
    ({**STAGES, "select": "top_k"}, "stages.top_k: expected a positive int (select top_k), given null"),
    ({**STAGES, "top_k": 2}, "stages.top_k: expected null unless select is top_k, given 2"),
    ({"select": "front"}, "stages: expected a finetune or an ood stage"),
    ({**STAGES, "select": "each"}, 'stages.select: expected front | top_k | as_completed, given "each"'),
    ({"finetune": [{"dataset": "digits", "epochs": 1, "resources": {"gpus_per_worker": -1}}]},
     "stages.finetune[0].resources.gpus_per_worker: expected a number >= 0, given -1"),
    ({"finetune": [{"dataset": "digits", "epochs": 1, "resources": {"gpu": 1}}]},
     "stages.finetune[0].resources.gpu: unknown key"),
    ({**STAGES, "ood": {**STAGES["ood"], "resources": {"workers_per_trial": 2}}},
     "stages.ood.resources.workers_per_trial: unknown key"),
    ({**STAGES, "ood": {**STAGES["ood"], "resources": 4}}, "stages.ood.resources: expected a mapping (cpus_per_worker"),
    ([1], "stages: expected a mapping"),
])
def test_bad_stages_name_the_field(stages, message):
    with pytest.raises(SpecError) as err:
        _spec(stages)
    assert message in str(err.value)


def test_smoke_test_shrinks_every_fine_tuning():
    smoke = smoke_test(_spec(STAGES))
    for f in smoke.stages.finetune:
        assert (f.recipe["epochs"], f.recipe["max_steps_per_epoch"], f.recipe["warmup_epochs"]) == (1, 2, 0.0)
    assert smoke.stages.ood == _spec(STAGES).stages.ood


def test_a_stage_metric_among_the_searchers_objectives_says_where_it_goes():
    d = load_campaign("quickstart").to_dict()
    with pytest.raises(SpecError, match=r"objectives\[0\].metric: .*a stage metric: list it under stages.objectives"):
        load_campaign({**d, "objectives": ["fpr95"]})
