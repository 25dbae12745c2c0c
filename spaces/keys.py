"""The known keys of a campaign: one table per section, each key with its check and default.

A check normalises a value (ints given for float keys become floats) or raises ``Bad``; its
``expected`` text ("a positive int") is what error messages print. ``None`` as a default means
"the trainer's default" (trainers.recipe.resolve_config fills it in).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EMBEDDINGS = ("linear", "sne", "psne", "fsne")
DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "synthetic")
DATASETS_WITH_PATH = ("cifar10", "cifar100", "imagefolder")
DATASET_CLASSES = {"digits": 10, "cifar10": 10, "cifar100": 100, "synthetic": 10}   # imagefolder: its folders
DEFAULT_IMG_SIZE = {"digits": 32, "cifar10": 32, "cifar100": 32, "synthetic": 32, "imagefolder": 224}
LR_SCHEDULES = ("cosine", "tanh", "step", "multistep", "poly", "wsd", "rsqrt", "constant", "none")
AUTO_AUGMENT_PREFIXES = ("rand", "augmix", "trivial", "original", "v0", "3a")
MAX_WIDTH_RATIO = 4.0


class Bad(Exception):
    """A value failed its check; ``expected`` overrides the check's own text when set."""

    def __init__(self, expected: str | None = None):
        super().__init__(expected)
        self.expected = expected


@dataclass(frozen=True)
class Check:
    expected: str                      # "a positive int"
    plural: str                        # "positive ints" (for "expected a list of positive ints")
    fn: Callable[[Any], Any]           # value -> normalised value, raises Bad
    numeric: str | None = None         # "int" or "float": int/float ranges may be searched over this key
    options: tuple = ()                # closed set of strings, for did-you-mean hints

    def __call__(self, value):
        return self.fn(value)

    def or_none(self) -> Check:
        def fn(v):
            return None if v is None else self.fn(v)

        return Check(f"{self.expected} or null", f"{self.plural} or nulls", fn, self.numeric, self.options)


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    return (is_int(v) or isinstance(v, float)) and math.isfinite(v)


def integer(low: int) -> Check:
    word = {0: "non-negative", 1: "positive"}.get(low)
    expected = f"a {word} int" if word else f"an int >= {low}"
    plural = f"{word} ints" if word else f"ints >= {low}"

    def fn(v):
        if not is_int(v) or v < low:
            raise Bad
        return v

    return Check(expected, plural, fn, "int")


def number(low: float, high: float | None = None, low_open=False, high_open=True) -> Check:
    """A float in an interval; low_open/high_open say whether the bounds are excluded."""
    if high is None:
        text = f"> {low:g}" if low_open else f">= {low:g}"
    else:
        text = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def fn(v):
        if not is_number(v):
            raise Bad
        if v < low or (low_open and v == low):
            raise Bad
        if high is not None and (v > high or (high_open and v == high)):
            raise Bad
        return float(v)

    return Check(f"a number {text}", f"numbers {text}", fn, "float")


def one_of(*options: str) -> Check:
    text = ", ".join(options)

    def fn(v):
        if v not in options:
            raise Bad
        return v

    return Check(f"one of {text}", f"values among {text}", fn, None, options)


def _text(v):
    if not isinstance(v, str) or not v.strip():
        raise Bad
    return v


def _flag(v):
    if not isinstance(v, bool):
        raise Bad
    return v


def _auto_augment(v):
    if not isinstance(v, str) or not v.startswith(AUTO_AUGMENT_PREFIXES):
        raise Bad
    return v


TEXT = Check("a non-empty string", "non-empty strings", _text)
AUTO_AUGMENT = Check("a timm auto_augment string such as rand-m9-mstd0.5-inc1",
                     "timm auto_augment strings", _auto_augment)
FLAG = Check("true or false", "booleans", _flag)
POS_INT = integer(1)
NONNEG_INT = integer(0)
POS_NUM = number(0, low_open=True)
NONNEG_NUM = number(0)
FRACTION = number(0, 1)  # [0, 1)

WIDTH_TEXT = f'a positive int (absolute), a ratio in (0, {MAX_WIDTH_RATIO:g}] of the token dim, or "match"'


def _hidden_width(v):
    if v == "match" or v is None:
        return v
    if is_int(v):
        if v < 1:
            raise Bad("a positive int width")
        return v
    if isinstance(v, float):
        if not (0 < v <= MAX_WIDTH_RATIO) or not math.isfinite(v):
            raise Bad(f"a width ratio in (0, {MAX_WIDTH_RATIO:g}] of the token dim")
        return v
    raise Bad


HIDDEN_WIDTH = Check(WIDTH_TEXT + " or null", "widths (positive ints, ratios in (0, 4], or \"match\")",
                     _hidden_width, "int+float")

# model: section key -> (flat trial key, check, default)
MODEL_KEYS: dict[str, tuple[str, Check, Any]] = {
    "name": ("model", TEXT, None),                 # required unless the space searches "model"
    "img_size": ("img_size", integer(8).or_none(), None),        # None -> the dataset's (DEFAULT_IMG_SIZE)
    "num_classes": ("num_classes", integer(2).or_none(), None),  # None -> the dataset's (DATASET_CLASSES)
    "in_chans": ("in_chans", POS_INT, 3),
    "embed_class_attn": ("embed_class_attn", FLAG, False),
    "drop_path_rate": ("drop_path_rate", FRACTION, 0.0),
    "activation": ("activation", one_of("relu", "gelu"), "relu"),
}

# data: section key -> (flat trial key, check, default)
DATA_KEYS: dict[str, tuple[str, Check, Any]] = {
    "dataset": ("dataset", one_of(*DATASETS), "digits"),
    "path": ("data_path", TEXT.or_none(), None),
    "val_fraction": ("val_fraction", number(0, 1, low_open=True).or_none(), None),  # digits: held-out share
}

# train: key -> (check, default); None = the trainer's default. epochs is required (the scheduler's budget).
TRAIN_KEYS: dict[str, tuple[Check, Any]] = {
    "epochs": (POS_INT, None),
    "batch_size": (POS_INT, None),                 # global, over all workers of a trial
    "batch_per_worker": (POS_INT, None),           # None -> batch_size // workers (no accumulation)
    "lr": (POS_NUM, None),
    "weight_decay": (NONNEG_NUM, None),
    "warmup_epochs": (NONNEG_NUM, None),           # may be fractional
    "min_lr": (NONNEG_NUM, None),
    "warmup_lr": (NONNEG_NUM, None),
    "opt": (TEXT, None),                           # timm optimizer name, e.g. adamw (checked by the trainer)
    "sched": (one_of(*LR_SCHEDULES), None),
    "label_smoothing": (FRACTION, None),
    "mixup": (NONNEG_NUM, None),                   # mixup alpha, 0 = off
    "cutmix": (NONNEG_NUM, None),                  # cutmix alpha, 0 = off
    "randaugment": (AUTO_AUGMENT, None),
    "augment": (FLAG, None),                       # timm training transform (random resized crop + flip)
    "clip_grad": (POS_NUM, None),                  # max grad norm
    "seed": (NONNEG_INT, None),
    "checkpoint_every": (POS_INT, None),           # epochs between checkpoints (the last is always saved)
    "max_steps_per_epoch": (POS_INT, None),        # None = full epoch (small values for smoke runs)
    "deterministic": (FLAG, None),
    "amp": (one_of("bf16", "none"), None),         # None -> bf16 on CUDA, none on CPU
    "loader_workers": (NONNEG_INT, None),          # DataLoader processes per worker
}
REQUIRED_TRAIN_KEYS = ("epochs",)

# Keys that only the space sets (the model section has no embedding keys).
EMBED_KEYS: dict[str, Check] = {
    "embedding": one_of(*EMBEDDINGS),
    "hidden_width": HIDDEN_WIDTH,
    "code_size": POS_INT,
    "code_sharing": one_of("shared", "per_block"),
}

# Embedding keys that mean something only for some embeddings; the loader conditions them (see dimensions).
APPLIES_WHEN: dict[str, tuple[str, ...]] = {
    "hidden_width": ("sne", "psne", "fsne"),
    "code_size": ("fsne",),
    "code_sharing": ("fsne",),
}


def searchable_keys() -> dict[str, Check]:
    """Flat trial keys a space may set: embedding keys, some model keys, and every train key but epochs."""
    keys = dict(EMBED_KEYS)
    for section_key in ("name", "activation", "drop_path_rate", "embed_class_attn"):
        flat, check, _ = MODEL_KEYS[section_key]
        keys[flat] = check
    for key, (check, _) in TRAIN_KEYS.items():
        if key != "epochs":
            keys[key] = check
    return keys


SEARCHABLE: dict[str, Check] = searchable_keys()
# Fault-injection knobs of the trainer, for checking how a campaign records failures (not for real runs).
SEARCHABLE.update({"qs_inject_nan_at_step": POS_INT, "qs_fail_after_epoch": POS_INT})

# metric -> natural optimisation mode
METRICS: dict[str, str] = {
    "top1": "max", "top5": "max", "val_loss": "min", "train_loss": "min",
    "images_per_s": "max", "epoch_s": "min", "train_s": "min",
    "gmacs": "min", "params_m": "min", "params": "min", "embed_params": "min",
}
COST_METRICS = ("params", "params_m", "embed_params", "gmacs")        # known before training
SCHEDULER_METRICS = ("top1", "top5", "val_loss", "train_loss")        # change from epoch to epoch
