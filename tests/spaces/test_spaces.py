"""The campaign spec: grammar, conditions, grid expansion, overrides, and one clear message per mistake."""
import json
import pickle
import subprocess
import sys
import textwrap

import pytest

from qkvsearch.spaces import SpecError, base_config, expand_space, load_campaign, smoke_test, suggest_config
from qkvsearch.spaces.keys import KEYS


def minimal(**sections):
    """A small valid spec (as a dict); keyword sections replace the defaults."""
    spec = {
        "name": "t",
        "model": {"name": "xcit_nano_12_p16_224", "img_size": 32, "num_classes": 10},
        "data": {"dataset": "digits"},
        "train": {"epochs": 4, "batch_size": 8},
        "space": {"embedding": {"choice": ["linear", "sne", "psne", "fsne"]}},
    }
    spec.update(sections)
    return spec


def errors_of(source, overrides=()) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_campaign(source, overrides)
    return info.value.errors


def one_error(source, overrides=()) -> str:
    errors = errors_of(source, overrides)
    assert len(errors) == 1, errors
    return errors[0]


# ------------------------------------------------------------------ the mistakes a user makes


def test_unknown_top_level_key_hints_the_section():
    msg = one_error(minimal(objectvies=[{"metric": "top1"}]))
    assert msg.startswith("objectvies: unknown key") and 'did you mean "objectives"' in msg


def test_unknown_nested_key_names_its_path_and_hint():
    msg = one_error(minimal(train={"epochs": 4, "learning_rate": 1e-3}))
    assert msg.startswith("train.learning_rate: unknown key")
    assert msg.endswith('(did you mean "lr"?)')
    msg = one_error(minimal(train={"epochs": 4, "weight_decey": 0.1}))
    assert msg == 'train.weight_decey: unknown key (did you mean "weight_decay"?)'


def test_bad_embedding_name():
    msg = one_error(minimal(space={"embedding": {"choice": ["linear", "fsen"]}}))
    assert msg.startswith("space.embedding.choice[1]: expected one of linear, sne, psne, fsne")
    assert 'given "fsen"' in msg and 'did you mean "fsne"' in msg


def test_code_size_not_a_list_of_positive_ints():
    msg = one_error(minimal(space={"embedding": "fsne", "code_size": {"choice": "big"}}))
    assert msg == 'space.code_size.choice: expected a list of positive ints, given "big"'
    msg = one_error(minimal(space={"embedding": "fsne", "code_size": [8, 0]}))
    assert msg == "space.code_size.choice[1]: expected a positive int, given 0"


def test_hidden_width_ratio_out_of_range():
    msg = one_error(minimal(space={"embedding": "sne", "hidden_width": [0.5, 6.5]}))
    assert msg == "space.hidden_width.choice[1]: expected a width ratio in (0, 4] of the token dim, given 6.5"
    msg = one_error(minimal(space={"embedding": "sne", "hidden_width": "wide"}))
    assert msg.startswith("space.hidden_width: expected a positive int (absolute), a ratio")
    assert msg.endswith('given "wide"')


def test_bad_objective_mode():
    msg = one_error(minimal(objectives=[{"metric": "top1", "mode": "maximize"}]))
    assert msg == 'objectives[0].mode: expected max or min, given "maximize"'


def test_unknown_objective_metric():
    msg = one_error(minimal(objectives=[{"metric": "acc", "mode": "max"}]))
    assert msg.startswith("objectives[0].metric: expected one of top1, top5") and 'given "acc"' in msg


def test_constraint_on_unknown_metric_or_not_a_number():
    msg = one_error(minimal(constraints={"flops": {"max": 1.0}}))
    assert msg.startswith("constraints.flops: expected a cost metric (params, params_m, embed_params, gmacs, "
                          "latency_ms, throughput, train_step_ms, peak_mem_gb, size_mb)")
    msg = one_error(minimal(constraints={"top1": {"min": 50}}))
    assert "constraints.top1" in msg and "checked before training" in msg
    msg = one_error(minimal(constraints={"params_m": {"max": "4M"}}))
    assert msg == 'constraints.params_m.max: expected a number, given "4M"'


def test_bad_algorithm():
    msg = one_error(minimal(search={"algorithm": "bayes", "num_trials": 4}))
    assert msg.startswith("search.algorithm: expected one of grid, random, tpe, nsga2")
    assert 'given "bayes"' in msg


def test_grace_epochs_beyond_epochs():
    msg = one_error(minimal(scheduler={"type": "asha", "grace_epochs": 10}))
    assert msg == "scheduler.grace_epochs: expected at most train.epochs (4), given 10"


def test_workers_per_trial_zero():
    msg = one_error(minimal(resources={"workers_per_trial": 0}))
    assert msg == "resources.workers_per_trial: expected a positive int, given 0"


def test_empty_choice():
    msg = one_error(minimal(space={"embedding": {"choice": []}}))
    assert msg == "space.embedding.choice: expected a non-empty list of values among linear, sne, psne, fsne, given []"


def test_condition_on_unknown_key():
    space = {"embedding": ["sne", "fsne"], "code_size": {"choice": [8], "when": {"embeding": "fsne"}}}
    msg = errors_of(minimal(space=space))[0]
    assert msg.startswith("space.code_size.when.embeding: unknown key") and 'did you mean "embedding"' in msg


def test_condition_value_never_taken():
    space = {"embedding": ["sne", "fsne"], "code_sharing": {"choice": ["shared"]},
             "code_size": {"choice": [8], "when": {"code_sharing": "per_block"}}}
    msg = one_error(minimal(space=space))
    assert msg.startswith('space.code_size.when.code_sharing: code_sharing never takes "per_block"')


def test_int_range_low_above_high():
    msg = one_error(minimal(space={"seed": {"int": [5, 2]}}, search={"algorithm": "random", "num_trials": 2}))
    assert msg == "space.seed.int: expected low < high, given [5, 2]"


def test_range_on_a_categorical_key():
    msg = one_error(minimal(space={"embedding": {"int": [1, 2]}}, search={"algorithm": "tpe", "num_trials": 2}))
    assert msg.startswith("space.embedding.int: embedding takes one of") and "choice" in msg


def test_bad_override_syntax():
    msg = one_error(minimal(), ["train.epochs"])
    assert msg == 'override "train.epochs": expected key.path=value, e.g. train.epochs=10'
    msg = one_error(minimal(), ["trian.epochs=3"])
    assert msg.startswith('override "trian.epochs=3": unknown section "trian"') and '"train"' in msg
    msg = one_error(minimal(), ["name.x=1"])
    assert msg == 'override "name.x=1": name is "t", not a mapping'


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\ntrain:\n  epochs: 3\n  lr: [1e-3\nmodel: {name: x}\n")
    msg = one_error(path)
    assert msg.startswith(f"{path}:") and "YAML syntax error (line " in msg


def test_duplicate_yaml_key_is_an_error(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("name: dup\ntrain:\n  epochs: 3\n  epochs: 4\n")
    msg = one_error(path)
    assert 'duplicate key "epochs" (first at line 3)' in msg and "(line 4)" in msg


def test_file_not_found_lists_presets(tmp_path):
    msg = one_error(tmp_path / "nope.yaml")
    assert msg.startswith(f"campaign file not found: {tmp_path / 'nope.yaml'}") and "quickstart" in msg


def test_missing_data_path_and_required_epochs():
    errors = errors_of(minimal(data={"dataset": "imagefolder"}, train={"batch_size": 8}))
    assert "data.path: required for dataset imagefolder (the dataset's root folder)" in errors
    assert any(e.startswith("train.epochs: required") for e in errors)


def test_grid_algorithm_refuses_ranges_and_grid_values_need_grid():
    msg = one_error(minimal(space={"lr": {"float": [1e-4, 1e-3], "log": True}}, search={"algorithm": "grid"}))
    assert msg == "search.algorithm: grid needs every dimension to be choice/grid, but space.lr is a range"
    msg = one_error(minimal(space={"embedding": {"grid": ["sne"]}}, search={"algorithm": "tpe", "num_trials": 3}))
    assert msg.startswith("space.embedding.grid: grid values are enumerated") and "use choice" in msg


def test_batch_must_split_evenly_over_workers():
    msg = one_error(minimal(train={"epochs": 2, "batch_size": 10}, resources={"workers_per_trial": 4}))
    assert msg == "train.batch_size: expected a multiple of the workers per trial (4), given 10"


def test_num_classes_must_match_the_dataset():
    msg = one_error(minimal(model={"name": "xcit_nano_12_p16_224", "num_classes": 1000}))
    assert msg == "model.num_classes: expected 10 for dataset digits, given 1000"


def test_storage_scheme():
    msg = one_error(minimal(storage="http://example.com/runs"))
    assert msg.startswith("storage: expected a local path or a URI with scheme s3://")
    for ok in ("s3://bucket/runs", "gs://b/r", "file:///tmp/r", "/abs/path", "rel/path"):
        assert load_campaign(minimal(storage=ok)).storage == ok


def test_every_error_is_reported_at_once():
    spec = minimal(train={"epochs": 0, "lr": -1}, resources={"workers_per_trial": 0},
                   objectives=[{"metric": "top1", "mode": "up"}], search={"algorithm": "bayes"})
    with pytest.raises(SpecError) as info:
        load_campaign(spec)
    assert len(info.value.errors) == 5, info.value.errors
    text = str(info.value)
    assert text.splitlines()[0] == "invalid campaign spec (5 errors):"
    assert all(f"  {e}" in text.splitlines() for e in info.value.errors)
    assert isinstance(info.value, ValueError)


# ------------------------------------------------------------------ conditions and expansion


def test_embedding_conditions_are_added_and_expansion_runs_each_combination_once():
    spec = load_campaign(minimal(space={
        "embedding": ["linear", "sne", "fsne"],
        "hidden_width": [0.5, "match"],
        "code_size": [8, 16],
        "code_sharing": ["shared", "per_block"],
    }))
    assert dict(spec.space.dimension("code_size").when) == {"embedding": ("fsne",)}
    assert dict(spec.space.dimension("hidden_width").when) == {"embedding": ("sne", "fsne")}
    trials = expand_space(spec)
    # linear: 1; sne: 2 widths; fsne: 2 widths x 2 codes x 2 sharings
    assert len(trials) == 1 + 2 + 8
    keys = {json.dumps({k: t.get(k) for k in ("embedding", "hidden_width", "code_size", "code_sharing")})
            for t in trials}
    assert len(keys) == len(trials)
    for t in trials:
        assert ("code_size" in t) == (t["embedding"] == "fsne")
        assert ("hidden_width" in t) == (t["embedding"] != "linear")
    assert spec.search.algorithm == "grid" and spec.search.num_trials == 11


def test_explicit_condition_that_admits_a_wrong_embedding_is_an_error():
    space = {"embedding": ["sne", "fsne"], "code_size": {"choice": [8], "when": {"embedding": ["sne", "fsne"]}}}
    msg = one_error(minimal(space=space))
    assert msg == 'space.code_size.when.embedding: code_size applies only to embedding fsne, given "sne"'


def test_code_size_without_any_embedding_is_an_error():
    msg = one_error(minimal(space={"code_size": [8, 16]}))
    assert msg.startswith("space.code_size: code_size applies only when embedding is fsne, but the space "
                          "does not set embedding")


def test_variants_times_dimensions_and_variant_checks():
    spec = load_campaign(minimal(space={
        "variants": [{"embedding": "linear"}, {"embedding": "fsne", "hidden_width": 1.0}],
        "code_size": [8, 16],
        "seed": {"grid": [0, 1]},
    }))
    trials = expand_space(spec)
    assert [(t["embedding"], t.get("code_size"), t["seed"]) for t in trials] == [
        ("linear", None, 0), ("linear", None, 1),
        ("fsne", 8, 0), ("fsne", 8, 1), ("fsne", 16, 0), ("fsne", 16, 1)]
    bad = minimal(space={"embedding": ["sne", "fsne"],
                         "variants": [{"code_size": 8}, {"embedding": "linear"}, {"embedding": "linear"}]})
    errors = errors_of(bad)
    assert "space.variants[1].embedding: is also a space dimension: set it in one place only" in errors
    assert any(e.startswith("space.variants[0].code_size: applies only when embedding is fsne") for e in errors)
    msg = one_error(minimal(space={"variants": [{"embedding": "sne"}, {"embedding": "sne"}]}))
    assert msg.startswith("space.variants[1]: duplicate variant")


def test_conditions_order_dimensions_and_cycles_are_reported():
    spec = load_campaign(minimal(space={
        "lr": {"choice": [1e-3, 1e-4], "when": {"opt": "sgd"}},
        "opt": ["sgd", "adamw"],
        "embedding": "sne",
    }))
    assert [d.key for d in spec.space.dimensions] == ["opt", "embedding", "lr"]
    assert len(expand_space(spec)) == 3
    cyc = minimal(space={"opt": {"choice": ["sgd"], "when": {"sched": "cosine"}},
                         "sched": {"choice": ["cosine"], "when": {"opt": "sgd"}}})
    assert one_error(cyc) == "space: conditions form a cycle among opt, sched"


def test_ranges_scalars_and_yaml_floats(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent("""\
        model: {name: xcit_nano_12_p16_224}
        train: {epochs: 3, lr: 5e-4}
        space:
          lr: {float: [1e-4, 1e-2], log: true}
          seed: {int: [0, 3]}
          embedding: psne
        search: {algorithm: tpe, num_trials: 5}
        """))
    spec = load_campaign(path)
    assert spec.name == "r" and spec.train.lr == 5e-4
    lr = spec.space.dimension("lr")
    assert (lr.kind, lr.low, lr.high, lr.log) == ("float", 1e-4, 1e-2, True)
    assert spec.space.dimension("embedding").values == ("psne",)
    with pytest.raises(SpecError, match=r"space.lr: a range cannot be enumerated"):
        expand_space(spec)


def test_width_one_and_one_point_zero_are_different_values():
    spec = load_campaign(minimal(space={"embedding": "sne", "hidden_width": [1, 1.0]}))
    widths = [t["hidden_width"] for t in expand_space(spec)]
    assert widths == [1, 1.0] and [type(w) for w in widths] == [int, float]


# ------------------------------------------------------------------ API


def test_base_config_maps_sections_to_flat_keys():
    spec = load_campaign(minimal(data={"dataset": "cifar10", "path": "/d/c10"}, train={"epochs": 2, "lr": 1e-3}))
    base = base_config(spec)
    assert base["model"] == "xcit_nano_12_p16_224" and base["dataset"] == "cifar10"
    assert base["data_path"] == "/d/c10" and base["lr"] == 1e-3 and base["epochs"] == 2
    assert "embedding" not in base and base["weight_decay"] == KEYS["weight_decay"].default  # defaults filled
    assert "name" not in base and "path" not in base


def test_overrides_set_nested_values_and_lists():
    assert one_error(minimal(), ["objectives.0.mode=max"]) == (
        'override "objectives.0.mode=max": objectives is not set, so it has no item 0')
    spec = load_campaign(minimal(objectives=[{"metric": "top1", "mode": "min"}]),
                         ["train.epochs=12", "space.embedding.choice=[sne, fsne]", "objectives.0.mode=max",
                          "search.seed=7", "resources.max_concurrent_trials=2"])
    assert spec.train.epochs == 12 and spec.search.seed == 7
    assert spec.space.dimension("embedding").values == ("sne", "fsne")
    assert spec.resources.max_concurrent_trials == 2 and spec.objectives[0].mode == "max"
    msg = one_error(minimal(), ["train.epochs=abc"])
    assert msg == 'train.epochs: expected a positive int, given "abc"'


def test_round_trip_pickle_and_frozen():
    spec = load_campaign(minimal(constraints={"params_m": {"max": 4}}, scheduler={"type": "asha"}))
    assert load_campaign(spec.to_dict()) == spec
    assert json.loads(json.dumps(spec.to_dict())) == spec.to_dict()
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert (spec.scheduler.metric, spec.scheduler.mode) == ("top1", "max")
    with pytest.raises(AttributeError):
        spec.train.epochs = 3
    assert spec.violations({"params_m": 4.5}) == ["params_m 4.5 > max 4"]
    assert spec.violations({"params_m": 3.9}) == []


def test_smoke_test_shrinks_a_grid_and_a_search():
    spec = load_campaign(minimal(space={"embedding": ["linear", "sne", "psne", "fsne"], "code_size": [8, 16, 32]},
                                 train={"epochs": 50, "batch_size": 512, "warmup_epochs": 5},
                                 scheduler={"type": "asha", "grace_epochs": 10}))
    small = smoke_test(spec, max_trials=3)
    assert small.name == "t-smoke" and small.search.num_trials == 3
    assert (small.train.epochs, small.train.max_steps_per_epoch, small.train.warmup_epochs) == (2, 2, 0)
    assert small.train.batch_size == 4 and small.scheduler.grace_epochs == 1
    picked = [(t["embedding"], t.get("code_size")) for t in expand_space(small)]
    assert picked == [("linear", None), ("fsne", 8), ("fsne", 32)]
    tpe = load_campaign(minimal(search={"algorithm": "nsga2", "num_trials": 40}))
    assert smoke_test(tpe).search.num_trials == 4 and smoke_test(tpe).search.population_size == 2


def test_importing_spaces_stays_light():
    code = ("import sys, qkvsearch.spaces; "
            "print(sorted(m for m in ('torch', 'ray', 'timm', 'optuna') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_suggest_config_draws_conditional_trials_through_optuna():
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_campaign(minimal(space={
        "variants": [{"embedding": "linear"}, {"embedding": "fsne"}, {"embedding": "sne"}],
        "hidden_width": [0.5, "match"], "code_size": [8, 16], "lr": {"float": [1e-4, 1e-2], "log": True},
    }, search={"algorithm": "tpe", "num_trials": 30}))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        cfg = suggest_config(spec, study.ask())
        assert 1e-4 <= cfg["lr"] <= 1e-2
        assert ("code_size" in cfg) == (cfg["embedding"] == "fsne")
        assert ("hidden_width" in cfg) == (cfg["embedding"] != "linear")
        seen.add(cfg["embedding"])
    assert seen == {"linear", "sne", "fsne"}
