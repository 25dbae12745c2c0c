"""trainers.recipe: defaults, validation messages, the accumulation rule."""
import pytest

from qkvsearch.trainers.recipe import MODEL_KEYS, TRAINING_DEFAULTS, batch_plan, resolve_config

MODEL = {"model": "xcit_nano_12_p16_224", "embedding": "fsne", "hidden_width": 64, "code_size": 8,
         "code_sharing": "shared", "activation": "relu", "embed_class_attn": False, "drop_path_rate": 0.1}


def test_defaults_are_filled_and_input_is_not_mutated():
    given = dict(MODEL)
    cfg = resolve_config(given)
    assert given == MODEL
    for key, value in TRAINING_DEFAULTS.items():
        assert cfg[key] == value, key
    assert (cfg["num_classes"], cfg["img_size"], cfg["in_chans"]) == (10, 32, 3)  # digits
    assert resolve_config(cfg) == cfg  # idempotent: workers resolve the driver's resolved config again


def test_model_keys_match_the_contract():
    assert MODEL_KEYS == {"model", "embedding", "hidden_width", "code_size", "code_sharing", "activation",
                          "num_classes", "img_size", "in_chans", "embed_class_attn", "drop_path_rate"}


def test_dataset_fixes_num_classes():
    assert resolve_config({"dataset": "cifar100", "data_path": "/x"})["num_classes"] == 100
    with pytest.raises(ValueError, match=r"num_classes: expected 10 for dataset 'cifar10', given 100"):
        resolve_config({"dataset": "cifar10", "num_classes": 100})


def test_unknown_key_gets_a_did_you_mean_hint():
    with pytest.raises(ValueError, match=r"given unknown key 'learning_rate'; did you mean 'lr'\?"):
        resolve_config({"learning_rate": 0.1})
    with pytest.raises(ValueError, match=r"did you mean 'batch_size'"):
        resolve_config({"batchsize": 32})
    with pytest.raises(ValueError, match=r"did you mean 'embedding'"):
        resolve_config({"embeding": "sne"})


def test_reserved_keys_pass_through():
    cfg = resolve_config({"qs_trial_name": "t1", "qs_inject_nan_at_step": 3})
    assert cfg["qs_trial_name"] == "t1" and cfg["qs_inject_nan_at_step"] == 3


@pytest.mark.parametrize("key, value, expected", [
    ("epochs", 0, "an int >= 1"),
    ("epochs", 2.0, "an int >= 1"),
    ("batch_size", True, "an int >= 1"),
    ("lr", 0.0, "a finite number in (0.0, inf)"),
    ("lr", float("inf"), "a finite number"),
    ("lr", "1e-3", "a finite number"),
    ("label_smoothing", 1.0, r"a finite number in [0.0, 1.0)"),
    ("val_fraction", 0, "a finite number in (0.0, 1.0)"),
    ("dataset", "mnist", "one of ['digits'"),
    ("amp", "fp16", "one of ['bf16', 'none', None]"),
    ("sched", "cosin", "one of ['cosine'"),
    ("randaugment", "rnd-m9", "timm auto_augment string"),
    ("deterministic", "yes", "true or false"),
    ("clip_grad", -1, "or None"),
    ("batch_per_worker", 0, "an int >= 1 or None"),
    ("opt", "adamww", "did you mean 'adamw'"),
])
def test_bad_values_name_key_expected_and_given(key, value, expected):
    with pytest.raises(ValueError) as err:
        resolve_config({key: value})
    msg = str(err.value)
    assert msg.startswith(f"{key}: expected ") and expected in msg and f"given {value!r}" in msg


def test_numbers_become_floats():
    cfg = resolve_config({"lr": 1, "weight_decay": 0, "clip_grad": 2})
    assert isinstance(cfg["lr"], float) and isinstance(cfg["clip_grad"], float)


def test_batch_plan_accumulation_rule():
    cfg = resolve_config({"batch_size": 64})
    assert batch_plan(cfg, 1) == (64, 1)
    assert batch_plan(cfg, 2) == (32, 1)
    assert batch_plan({**cfg, "batch_per_worker": 8}, 2) == (8, 4)  # 2 workers x 8 images x 4 steps
    with pytest.raises(ValueError, match=r"batch_size: expected a multiple of the number of workers \(3\)"):
        batch_plan(cfg, 3)
    with pytest.raises(ValueError, match=r"workers x batch_per_worker \(2 x 24\), given 64"):
        batch_plan({**cfg, "batch_per_worker": 24}, 2)
    with pytest.raises(ValueError, match=r"batch_per_worker: expected an even number"):
        batch_plan({**cfg, "batch_size": 6, "mixup": 0.8}, 2)


def test_imagefolder_counts_classes(tmp_path):
    for c in ("cat", "dog", "eel"):
        (tmp_path / "train" / c).mkdir(parents=True)
    cfg = resolve_config({"dataset": "imagefolder", "data_path": str(tmp_path)})
    assert cfg["num_classes"] == 3 and cfg["img_size"] == 224
    with pytest.raises(ValueError, match=r"in_chans: expected 3 for dataset 'imagefolder' \(RGB images\), given 1"):
        resolve_config({"dataset": "imagefolder", "data_path": str(tmp_path), "in_chans": 1})
