"""The campaign file's measure section and the measured metrics (spaces.measure, spaces.metrics.MEASURED)."""
from __future__ import annotations

import copy

import pytest
import yaml

from qkvsearch.search.cli import main
from qkvsearch.spaces import SpecError, load_campaign
from qkvsearch.spaces.measure import MeasureSpec, measured_metrics
from qkvsearch.spaces.metrics import COST_METRICS, MEASURED, METRICS
from qkvsearch.spaces.schema import violations

BASE = {"name": "m", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16}, "data": {"dataset": "digits"},
        "train": {"epochs": 1}, "space": {"embedding": {"choice": ["linear", "fsne"]}}}


def _spec(**sections) -> dict:
    return {**copy.deepcopy(BASE), **sections}


def test_measured_metrics_are_cost_metrics_with_a_mode():
    for metric, (mode, unit, doc) in MEASURED.items():
        assert METRICS[metric] == mode and metric in COST_METRICS and unit and doc
    assert METRICS["throughput"] == "max" and METRICS["latency_ms"] == "min"


def test_a_campaign_measures_only_what_it_names():
    assert measured_metrics(load_campaign(_spec())) == ()
    spec = load_campaign(_spec(objectives=[{"metric": "top1"}, {"metric": "throughput"}],
                               constraints={"latency_ms": {"max": 4}}, measure={"metrics": ["peak_mem_gb"]}))
    assert measured_metrics(spec) == ("latency_ms", "throughput", "peak_mem_gb")
    assert spec.objectives[1].mode == "max"
    assert load_campaign(spec.to_dict()) == spec
    assert "measure" not in load_campaign(_spec()).to_dict()   # the default is not written out


def test_the_measure_section_fills_its_defaults_and_round_trips():
    spec = load_campaign(_spec(measure={"batch": 32, "cache": "s3://bucket/measured", "max_s": 2}))
    assert spec.measure == MeasureSpec(batch=32, latency_batch=1, metrics=(), cache="s3://bucket/measured", max_s=2.0)
    assert load_campaign(spec.to_dict()) == spec


@pytest.mark.parametrize("measure, message", [
    ({"batch": 0}, "measure.batch: expected a positive int, given 0"),
    ({"latency_batch": "one"}, 'measure.latency_batch: expected a positive int, given "one"'),
    ({"max_s": -1}, "measure.max_s: expected a number > 0, given -1"),
    ({"metrics": ["latncy_ms"]}, 'measure.metrics[0]: expected one of latency_ms, throughput, train_step_ms, '
                                 'peak_mem_gb, size_mb, given "latncy_ms" (did you mean "latency_ms"?)'),
    ({"metrics": "latency_ms"}, "measure.metrics: expected a list of measured metrics"),
    ({"cache": ""}, 'measure.cache: expected a folder or URI (a string), given ""'),
    ({"warmup": 3}, "measure.warmup: unknown key"),
    ([1], "measure: expected a mapping"),
])
def test_a_bad_measure_section_names_the_key_the_expected_and_the_given(measure, message):
    with pytest.raises(SpecError) as err:
        load_campaign(_spec(measure=measure))
    assert message in str(err.value)


def test_bad_input_exits_2_naming_the_field(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_spec(measure={"batch": 0}, constraints={"latency_s": {"max": 1}})))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "measure.batch: expected a positive int, given 0" in err
    assert "constraints.latency_s: expected a cost metric" in err and "latency_ms" in err


def test_a_measured_constraint_is_not_judged_before_it_is_measured():
    spec = load_campaign(_spec(constraints={"latency_ms": {"max": 4}, "params_m": {"max": 1}}))
    assert violations(spec.constraints, {"params_m": 0.5}) == []
    assert violations(spec.constraints, {"params_m": 0.5, "latency_ms": 5.0}) == ["latency_ms 5 > max 4"]
