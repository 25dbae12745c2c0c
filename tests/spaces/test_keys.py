"""spaces.keys: one declaration per trial key, and every table derived from it; fill; the batch rule."""
import re
import subprocess
import sys

import pyarrow as pa
import pytest
from helpers import REPO

from qkvsearch.search.analysis import report, results
from qkvsearch.search.campaign import costs
from qkvsearch.spaces import keys
from qkvsearch.spaces.batches import batch_plan
from qkvsearch.spaces.keys import KEYS, RESOLVED_KEYS, ConfigError, fill, section_keys
from qkvsearch.spaces.schema import DataSpec, ModelSpec, TrainSpec

MODEL = {"model": "xcit_nano_12_p16_224", "embedding": "fsne", "hidden_width": 64, "code_size": 8,
         "code_sharing": "shared", "activation": "relu", "embed_class_attn": False, "drop_path_rate": 0.1,
         "epochs": 2}
SCHEMA = REPO / "search" / "RESULTS_SCHEMA.md"
ARROW = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string()}


def test_every_derived_table_agrees_with_the_declarations():
    for key in RESOLVED_KEYS.values():
        assert key.group in keys.GROUPS and key.doc, key.name
        # campaign-file sections and the spec dataclasses
        if key.section is not None:
            name = key.section_key or key.name
            assert section_keys(key.section)[name] is key
            spec_cls = {"model": ModelSpec, "data": DataSpec, "train": TrainSpec}[key.section]
            assert getattr(spec_cls(), name) == key.default, key.name
        # searchable keys and their conditions
        assert (key.name in keys.SEARCHABLE) == key.searchable, key.name
        assert keys.APPLIES_WHEN.get(key.name, (None, ()))[1] == key.applies_to
        # the cost model's keys are exactly the model and embedding groups
        assert (key.name in costs.COST_KEYS) == (key.group in keys.MODEL_GROUPS and key is not keys.WIDTH)
        # Parquet column types, report tables
        assert results.CONFIG_TYPES[key.name] == ARROW[key.arrow], key.name
        assert (key.name in report.TABLE_CONFIG) == key.report
    assert set(results.CONFIG_TYPES) == set(RESOLVED_KEYS)
    assert set(fill(MODEL)) == set(KEYS)  # a filled config holds every key, nothing else
    for section, spec_cls in (("model", ModelSpec), ("data", DataSpec), ("train", TrainSpec)):
        assert [f for f in spec_cls.__dataclass_fields__] == list(section_keys(section))


def _schema_as_built() -> str:
    """search/RESULTS_SCHEMA.md as the documentation site shows it (docs/hooks.py renders its tables)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks.render_page(SCHEMA.read_text())


def test_results_schema_document_lists_every_key_with_its_type_default_and_doc():
    assert "| `config_model` |" not in SCHEMA.read_text()   # generated when the site builds, not by hand
    table = results.config_columns_markdown()
    assert {m.group(1) for m in re.finditer(r"^\| `config_(\w+)` \|.*$", table, re.M)} == set(RESOLVED_KEYS)
    assert table in _schema_as_built()


def test_results_schema_document_lists_every_stage_metric_from_its_declaration():
    from qkvsearch.search.analysis.stages import stage_metric_markdown
    from qkvsearch.spaces.metrics import OOD_METRICS, STAGE_METRIC_LIST, STAGE_METRICS
    from qkvsearch.trainers.stages.ood_metrics import ood_metrics

    assert stage_metric_markdown() in _schema_as_built() and stage_metric_markdown() not in SCHEMA.read_text()
    scores = ood_metrics([0.9, 0.8, 0.7], [0.1, 0.6])  # what the OOD stage computes: every declared metric
    assert list(scores) == list(OOD_METRICS) and set(STAGE_METRICS) == {m.name for m in STAGE_METRIC_LIST}


def test_defaults_are_filled_once_and_input_is_not_mutated():
    given = dict(MODEL)
    cfg = fill(given)
    assert given == MODEL
    for key in KEYS.values():
        if keys.not_applicable(key, cfg, keys.GROUPS):   # e.g. attention on an XCiT: null
            assert cfg[key.name] is None, key.name
        elif key.default is not None and key.name not in given:
            assert cfg[key.name] == key.default, key.name
    assert (cfg["num_classes"], cfg["img_size"], cfg["in_chans"]) == (10, 32, 3)  # digits
    assert fill(cfg) == cfg


def test_keys_of_other_embeddings_are_null_and_may_not_be_set():
    cfg = fill({"model": MODEL["model"], "epochs": 1, "embedding": "linear"})
    assert cfg["hidden_width"] is None and cfg["code_size"] is None and cfg["code_sharing"] is None
    sne = fill({"model": MODEL["model"], "epochs": 1, "embedding": "sne"})
    assert sne["hidden_width"] == "paper" and sne["code_size"] is None
    with pytest.raises(ConfigError, match=r"^code_size: expected null unless embedding is fsne \(embedding is sne\)"
                                          r", given 16$"):
        fill({"model": MODEL["model"], "epochs": 1, "embedding": "sne", "code_size": 16})


def test_required_keys_and_unknown_keys():
    with pytest.raises(ConfigError, match=r"^epochs: required"):
        fill({"model": MODEL["model"]})
    with pytest.raises(ConfigError, match=r"^model: required"):
        fill({"epochs": 1})
    with pytest.raises(ConfigError, match=r'did you mean "lr"'):
        fill({**MODEL, "learning_rate": 0.1})
    with pytest.raises(ConfigError, match=r'did you mean "embedding"'):
        fill({**MODEL, "embeding": "sne"})


def test_an_unknown_timm_model_gets_close_matches():
    with pytest.raises(ConfigError, match=r"^model: expected the name of a timm model.*close matches: "
                                          r"xcit_nano_12_p16_224.*given \"xcit_nano_12_p16_22\"$"):
        fill({**MODEL, "model": "xcit_nano_12_p16_22"})
    assert fill({**MODEL, "model": "qkv_xcit_nano_12_p16_224"})["model"] == "xcit_nano_12_p16_224"


def test_dataset_decides_num_classes_and_image_size(tmp_path):
    assert fill({**MODEL, "dataset": "cifar100", "data_path": "/x"})["num_classes"] == 100
    with pytest.raises(ConfigError, match=r"^num_classes: expected 10 for dataset cifar10, given 100$"):
        fill({**MODEL, "dataset": "cifar10", "data_path": "/x", "num_classes": 100})
    with pytest.raises(ConfigError, match=r"^data_path: required for dataset cifar10"):
        fill({**MODEL, "dataset": "cifar10"})
    for c in ("cat", "dog", "eel"):
        (tmp_path / "train" / c).mkdir(parents=True)
    cfg = fill({**MODEL, "dataset": "imagefolder", "data_path": str(tmp_path)})
    assert cfg["num_classes"] == 3 and cfg["img_size"] == 224
    with pytest.raises(ConfigError, match=r"^in_chans: expected 3 for dataset imagefolder \(RGB images\), given 1$"):
        fill({**MODEL, "dataset": "imagefolder", "data_path": str(tmp_path), "in_chans": 1})


@pytest.mark.parametrize("key, value, expected", [
    ("epochs", 0, "a positive int"),
    ("epochs", 2.0, "a positive int"),
    ("batch_size", True, "a positive int"),
    ("lr", 0.0, "a number > 0"),
    ("lr", float("inf"), "a number > 0"),
    ("lr", "1e-3", "a number > 0"),
    ("label_smoothing", 1.0, "a number in [0, 1)"),
    ("val_fraction", 0, "a number in (0, 1)"),
    ("dataset", "mnist", "one of digits, synthetic"),
    ("amp", "fp16", "one of auto, bf16, none"),
    ("sched", "cosin", "one of cosine"),
    ("randaugment", "rnd-m9", "timm auto_augment string"),
    ("deterministic", "yes", "true or false"),
    ("clip_grad", -1, "or null"),
    ("batch_per_worker", 0, "a positive int or null"),
    ("opt", "adamww", "did you mean adamw"),
    ("hidden_width", 5.0, "a width ratio in (0, 4]"),
])
def test_bad_values_name_key_expected_and_given(key, value, expected):
    with pytest.raises(ConfigError) as err:
        fill({**MODEL, key: value})
    msg = str(err.value)
    assert msg.startswith(f"{key}: expected ") and expected in msg and msg.endswith(f"given {keys.show(value)}")


def test_numbers_become_floats():
    cfg = fill({**MODEL, "lr": 1, "weight_decay": 0, "clip_grad": 2})
    assert isinstance(cfg["lr"], float) and isinstance(cfg["clip_grad"], float)


def test_batch_plan_accumulation_rule():
    cfg = fill({**MODEL, "batch_size": 64})
    assert batch_plan(cfg, 1) == (64, 1)
    assert batch_plan(cfg, 2) == (32, 1)
    assert batch_plan({**cfg, "batch_per_worker": 8}, 2) == (8, 4)  # 2 workers x 8 images x 4 steps
    with pytest.raises(ConfigError, match=r"batch_size: expected a multiple of the workers per trial \(3\)"):
        batch_plan(cfg, 3)
    with pytest.raises(ConfigError, match=r"workers x batch_per_worker \(2 x 24\), given 64"):
        batch_plan({**cfg, "batch_per_worker": 24}, 2)
    with pytest.raises(ConfigError, match=r"batch_per_worker: expected an even number"):
        batch_plan({**cfg, "batch_size": 6, "mixup": 0.8}, 2)


def test_trainers_take_filled_configs_only():
    with pytest.raises(ConfigError, match=r"^config: expected a filled trial config"):
        keys.require_filled(MODEL)
    assert keys.require_filled(fill(MODEL))


def test_a_config_read_with_its_names_as_given_imports_no_timm():
    """A trial's process fills the config its campaign checked at launch without importing timm (its Train
    workers build the model); outside names_as_given the model name is checked against timm's registry."""
    code = ("import sys\n"
            "from qkvsearch.spaces.checks import names_as_given\n"
            "from qkvsearch.spaces.keys import fill\n"
            "cfg = {'model': 'xcit_nano_12_p8_224', 'epochs': 1, 'dataset': 'digits'}\n"
            "with names_as_given():\n"
            "    fill(cfg)\n"
            "    fill({**cfg, 'model': 'no_such_model'})  # taken as given\n"
            "given = 'timm' in sys.modules\n"
            "fill(cfg)\n"
            "print(given, 'timm' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.split() == ["False", "True"]
