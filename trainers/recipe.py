"""Training recipe: the training keys of a flat trial config, their defaults and validation.

A trial config is one flat dict of plain values. Model keys belong to trainers.models /
trainers.cost (only the ones the data depends on are checked here); training keys belong here.
Keys starting with "qs_" are reserved: the ones below are test knobs, others pass through untouched.
"""
from __future__ import annotations

import difflib
import math
import os

MODEL_KEYS = frozenset({
    "model", "embedding", "hidden_width", "code_size", "code_sharing", "activation",
    "num_classes", "img_size", "in_chans", "embed_class_attn", "drop_path_rate",
})

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "synthetic")
DATASET_CLASSES = {"digits": 10, "cifar10": 10, "cifar100": 100, "synthetic": 10}  # imagefolder: folders
SCHEDULERS = ("cosine", "tanh", "step", "multistep", "poly", "wsd", "rsqrt", "constant", "none")
AUTO_AUGMENT_PREFIXES = ("rand", "augmix", "trivial", "original", "v0", "3a")

TRAINING_DEFAULTS = {
    "dataset": "digits",
    "data_path": None,
    "epochs": 5,
    "batch_size": 64,            # GLOBAL images per optimizer update
    "batch_per_worker": None,    # images per forward pass on one worker; None -> batch_size // world_size
    "lr": 1e-3,                  # peak lr after warm-up
    "weight_decay": 0.05,
    "warmup_epochs": 1.0,        # may be fractional: the schedule steps per optimizer update
    "min_lr": 1e-5,
    "warmup_lr": 1e-6,
    "opt": "adamw",              # timm optimizer name
    "sched": "cosine",           # timm scheduler name
    "label_smoothing": 0.0,
    "mixup": 0.0,                # Mixup alpha (0 = off)
    "cutmix": 0.0,               # CutMix alpha (0 = off)
    "randaugment": None,         # timm auto_augment string, e.g. "rand-m9-mstd0.5-inc1"
    "augment": False,            # timm training transform (random resized crop + flip) on PIL images
    "clip_grad": None,           # max global grad norm (None = off)
    "seed": 0,
    "checkpoint_every": 1,       # epochs between checkpoints (the last epoch is always saved)
    "max_steps_per_epoch": None, # cap on optimizer updates per epoch (smoke tests)
    "deterministic": False,
    "amp": None,                 # "bf16" | "none" | None (bf16 on CUDA, none on CPU)
    "val_fraction": 0.2,         # digits only: share of the images held out for validation
    "loader_workers": 0,         # DataLoader processes per worker (PIL-decoded datasets only)
}

RESERVED_DEFAULTS = {
    "qs_inject_nan_at_step": None,  # tests: the loss of this global update (1-based) becomes NaN
    "qs_fail_after_epoch": None,    # tests: raise after this many completed epochs (a simulated crash)
}

DEFAULT_IMG_SIZE = {"digits": 32, "cifar10": 32, "cifar100": 32, "synthetic": 32, "imagefolder": 224}


# Names other trainers use for our keys: hints for unknown keys that difflib would not find.
ALIASES = {"learning_rate": "lr", "wd": "weight_decay", "optimizer": "opt", "scheduler": "sched",
           "num_epochs": "epochs", "warmup": "warmup_epochs", "smoothing": "label_smoothing",
           "auto_augment": "randaugment", "drop_path": "drop_path_rate", "clip_grad_norm": "clip_grad",
           "batch": "batch_size", "global_batch_size": "batch_size", "data_dir": "data_path"}


def _fail(key, expected, given):
    raise ValueError(f"{key}: expected {expected}, given {given!r}")


def _int(cfg, key, lo=None, none_ok=False):
    v = cfg[key]
    if v is None and none_ok:
        return
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
        rng = f" >= {lo}" if lo is not None else ""
        _fail(key, f"an int{rng}" + (" or None" if none_ok else ""), v)


def _float(cfg, key, lo=0.0, hi=math.inf, lo_open=False, hi_open=True, none_ok=False):
    """Accept int or float in the interval; store as float."""
    v = cfg[key]
    if v is None and none_ok:
        return
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        interval = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        _fail(key, f"a finite number in {interval}" + (" or None" if none_ok else ""), v)
    cfg[key] = float(v)


def _choice(cfg, key, choices):
    if cfg[key] not in choices:
        _fail(key, f"one of {list(choices)}", cfg[key])


def _bool(cfg, key):
    if not isinstance(cfg[key], bool):
        _fail(key, "true or false", cfg[key])


def _check_unknown(cfg):
    known = set(TRAINING_DEFAULTS) | MODEL_KEYS | set(RESERVED_DEFAULTS)
    for key in cfg:
        if not isinstance(key, str):
            _fail("config key", "a string", key)
        if key in known or key.startswith("qs_"):
            continue
        close = [ALIASES[key]] if key in ALIASES else difflib.get_close_matches(key, sorted(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"{key}: expected a training key ({', '.join(sorted(TRAINING_DEFAULTS))}) or a model key "
            f"({', '.join(sorted(MODEL_KEYS))}), given unknown key {key!r}{hint}")


def _check_training(cfg):
    _choice(cfg, "dataset", DATASETS)
    if cfg["data_path"] is not None and not isinstance(cfg["data_path"], (str, os.PathLike)):
        _fail("data_path", "a path string or None", cfg["data_path"])
    if cfg["data_path"] is not None:
        cfg["data_path"] = os.fspath(cfg["data_path"])
    for key in ("epochs", "batch_size", "checkpoint_every"):
        _int(cfg, key, lo=1)
    for key in ("batch_per_worker", "max_steps_per_epoch"):
        _int(cfg, key, lo=1, none_ok=True)
    _int(cfg, "seed", lo=0)
    _int(cfg, "loader_workers", lo=0)
    _float(cfg, "lr", lo_open=True)
    for key in ("weight_decay", "warmup_epochs", "min_lr", "warmup_lr", "mixup", "cutmix"):
        _float(cfg, key)
    _float(cfg, "label_smoothing", hi=1.0)
    _float(cfg, "val_fraction", lo_open=True, hi=1.0)
    _float(cfg, "clip_grad", lo_open=True, none_ok=True)
    _check_opt(cfg)
    _choice(cfg, "sched", SCHEDULERS)
    aa = cfg["randaugment"]
    if aa is not None and not (isinstance(aa, str) and aa.startswith(AUTO_AUGMENT_PREFIXES)):
        _fail("randaugment", "None or a timm auto_augment string such as 'rand-m9-mstd0.5-inc1'", aa)
    _bool(cfg, "augment")
    _bool(cfg, "deterministic")
    _choice(cfg, "amp", ("bf16", "none", None))


def _check_opt(cfg):
    from timm.optim import list_optimizers  # lazy: timm imports torch

    if not isinstance(cfg["opt"], str) or cfg["opt"].lower() not in list_optimizers():
        close = difflib.get_close_matches(str(cfg["opt"]).lower(), list_optimizers(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        _fail("opt", f"a timm optimizer name such as 'adamw'{hint}", cfg["opt"])


def _check_data_model_keys(cfg):
    """Fill and check the model keys the data decides: num_classes, img_size, in_chans."""
    ds = cfg["dataset"]
    cfg.setdefault("img_size", DEFAULT_IMG_SIZE[ds])
    cfg.setdefault("in_chans", 3)
    _int(cfg, "img_size", lo=8)
    _int(cfg, "in_chans", lo=1)
    if ds in ("cifar10", "cifar100", "imagefolder") and cfg["in_chans"] != 3:
        _fail("in_chans", f"3 for dataset {ds!r} (RGB images)", cfg["in_chans"])
    if (cfg["augment"] or cfg["randaugment"]) and cfg["in_chans"] != 3:
        _fail("in_chans", "3 when augment or randaugment is on (timm transforms make RGB images)", cfg["in_chans"])
    if ds in DATASET_CLASSES:
        cfg.setdefault("num_classes", DATASET_CLASSES[ds])
        if cfg["num_classes"] != DATASET_CLASSES[ds]:
            _fail("num_classes", f"{DATASET_CLASSES[ds]} for dataset {ds!r}", cfg["num_classes"])
    elif "num_classes" not in cfg:
        n = _count_class_folders(cfg["data_path"])
        if n >= 2:  # fewer: check_dataset says what is wrong with the folder
            cfg["num_classes"] = n
    if "num_classes" in cfg:
        _int(cfg, "num_classes", lo=2)


def _count_class_folders(data_path):
    """imagefolder: number of class folders under <data_path>/train, or 0 when unreadable."""
    train = os.path.join(data_path, "train") if data_path else None
    if not train or not os.path.isdir(train):
        return 0
    return sum(1 for e in os.scandir(train) if e.is_dir() and not e.name.startswith("."))


def _check_reserved(cfg):
    _int(cfg, "qs_inject_nan_at_step", lo=1, none_ok=True)
    _int(cfg, "qs_fail_after_epoch", lo=1, none_ok=True)


def resolve_config(cfg: dict) -> dict:
    """Return a new config with every training default filled in, validated.

    Raises ValueError naming the key, the expected and the given value. Unknown keys are
    rejected (with a did-you-mean hint) unless they are model keys or reserved "qs_" keys.
    For imagefolder, num_classes is counted from <data_path>/train when not given.
    """
    if not isinstance(cfg, dict):
        _fail("config", "a dict of plain values", cfg)
    _check_unknown(cfg)
    out = {**TRAINING_DEFAULTS, **RESERVED_DEFAULTS, **cfg}
    _check_training(out)
    _check_reserved(out)
    _check_data_model_keys(out)
    return out


def batch_plan(cfg: dict, world_size: int) -> tuple[int, int]:
    """(batch_per_worker, accumulation steps) such that world_size * bpw * steps == batch_size."""
    gb, bpw = cfg["batch_size"], cfg["batch_per_worker"]
    if bpw is None:
        if gb % world_size:
            _fail("batch_size", f"a multiple of the number of workers ({world_size})", gb)
        bpw = gb // world_size
    if gb % (world_size * bpw):
        _fail("batch_size", f"a multiple of workers x batch_per_worker ({world_size} x {bpw})", gb)
    if (cfg["mixup"] > 0 or cfg["cutmix"] > 0) and bpw % 2:
        _fail("batch_per_worker", "an even number when mixup or cutmix is on (timm Mixup pairs images)", bpw)
    return bpw, gb // (world_size * bpw)
