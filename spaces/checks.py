"""The checks of values in a campaign file and a trial config: each normalises a value (ints given for float
keys become floats) or raises ``Bad``; its ``expected`` text ("a positive int") is what error messages print:
``<key>: expected <what>, given <value>``. spaces.keys declares which check each trial key takes.
"""
from __future__ import annotations

import contextlib
import contextvars
import difflib
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

AUTO_AUGMENT_PREFIXES = ("rand", "augmix", "trivial", "original", "v0", "3a")
MAX_WIDTH_RATIO = 4.0
# Size bounds of the model keys: past any vision transformer, and what keeps counting a model's cost (built on
# the meta device block by block) within seconds. The model's size as a whole: search.campaign.costs.check_size.
MAX_BLOCKS = 256        # depth
MAX_UNITS = 65536       # a count of channels, hidden units, code features, heads, charts or tokens
MAX_PIXELS = 8192       # img_size, patch_size
MAX_MLP_RATIO = 64.0    # mlp_ratio, token_mlp_ratio
# Every int a campaign file takes has an upper bound (``integer`` requires one): a value past what the field can
# mean is refused by validate, not met by a run that hangs or fails (10**9 control subnets drawn one by one).
MAX_COUNT = 10**9       # a count with no tighter bound of its own (trials, epochs, images, steps): past any campaign
MAX_SEED = 2**32 - 1    # numpy's RandomState, which Optuna's samplers seed, takes none above
MAX_LOADER_WORKERS = 512  # DataLoader processes of one worker: past the CPUs of any node


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
    arrow: str = "string"              # Parquet column type: int64 | float64 | bool | string
    limit: str = ""                    # "up to 1000": a bound the reference shows (messages: when it is passed)

    def __call__(self, value):
        return self.fn(value)

    def or_none(self) -> Check:
        def fn(v):
            return None if v is None else self.fn(v)

        return Check(f"{self.expected} or null", f"{self.plural} or nulls", fn, self.numeric, self.options,
                     self.arrow, self.limit)


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    return (is_int(v) or isinstance(v, float)) and math.isfinite(v)


def finite(v, default=None):
    """A reported or recorded value as a float when it is a finite real number (numpy scalars too; never
    a bool or a string), else ``default``: the one test every reader of metrics applies."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return default
    v = float(v)
    return v if math.isfinite(v) else default




def integer(low: int, high: int) -> Check:
    """An int in [low, high] (a value past high names the bound: "a positive int up to 1000")."""
    word = {0: "non-negative", 1: "positive"}.get(low)
    expected = f"a {word} int" if word else f"an int >= {low}"
    plural = f"{word} ints" if word else f"ints >= {low}"

    def fn(v):
        if not is_int(v) or v < low:
            raise Bad
        if v > high:
            raise Bad(f"{expected} up to {high}")
        return v

    return Check(expected, plural, fn, "int", arrow="int64", limit=f"up to {high}" if high < MAX_COUNT else "")


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

    return Check(f"a number {text}", f"numbers {text}", fn, "float", arrow="float64")


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
FLAG = Check("true or false", "booleans", _flag, arrow="bool")
AUTO_FLAG = Check("true, false or auto", "true, false or auto", lambda v: v if v == "auto" else _flag(v),
                  options=("auto",))  # Parquet: string ("true", "false", "auto")
POS_INT = integer(1, MAX_COUNT)
NONNEG_INT = integer(0, MAX_COUNT)
SEED = integer(0, MAX_SEED)


def _workers(v):
    if v == "auto":
        return v
    try:
        return integer(0, MAX_LOADER_WORKERS)(v)
    except Bad as bad:
        raise Bad(bad.expected and f"{bad.expected} or auto") from None


WORKERS = Check("a non-negative int or auto", "non-negative ints or auto", _workers, options=("auto",),
                limit=f"up to {MAX_LOADER_WORKERS}")  # Parquet: string ("0", "auto")
POS_NUM = number(0, low_open=True)
NONNEG_NUM = number(0)
FRACTION = number(0, 1)  # [0, 1)

WIDTH_TEXT = (f'a positive int (absolute), a ratio in (0, {MAX_WIDTH_RATIO:g}] of the token dim, "match" '
              f'or "paper"')
PAPER_WIDTH = "paper"   # the paper's Table 1 width: d/2 sne, 3d/4 psne, d fsne


def _hidden_width(v):
    if v is None:
        return PAPER_WIDTH
    if v in ("match", PAPER_WIDTH):
        return v
    if is_int(v):
        if not 1 <= v <= MAX_UNITS:
            raise Bad(f"a positive int width up to {MAX_UNITS}")
        return v
    if isinstance(v, float):
        if not (0 < v <= MAX_WIDTH_RATIO) or not math.isfinite(v):
            raise Bad(f"a width ratio in (0, {MAX_WIDTH_RATIO:g}] of the token dim")
        return v
    raise Bad


HIDDEN_WIDTH = Check(WIDTH_TEXT, 'widths (positive ints, ratios in (0, 4], "match" or "paper")',
                     _hidden_width, "int+float")   # Parquet: string (ints, ratios and words in one column)


# False while a spec is read back from a campaign file (names were checked when it was launched): model and
# optimizer names are then taken as given, so that reading a campaign never imports timm (nor torch).
CHECK_NAMES: contextvars.ContextVar[bool] = contextvars.ContextVar("CHECK_NAMES", default=True)


@contextlib.contextmanager
def names_as_given(given: bool = True):
    """Within it (when ``given``), timm model and optimizer names are taken as given: what was checked when
    its campaign was launched (a stored spec, a trial's config), read without importing timm."""
    token = CHECK_NAMES.set(not given)
    try:
        yield
    finally:
        CHECK_NAMES.reset(token)


def _timm_model(v):
    """A timm model name; ``qkv_<name>`` (our registered variants) means ``<name>``."""
    if not isinstance(v, str) or not v.strip():
        raise Bad
    name = v[len(REGISTERED_PREFIX):] if v.startswith(REGISTERED_PREFIX) else v
    if not CHECK_NAMES.get():
        return name
    import timm  # lazy: importing the spec layer stays free of torch and timm

    if timm.is_model(name):
        return name
    close = difflib.get_close_matches(name, timm.list_models(exclude_filters=[REGISTERED_PREFIX + "*"]),
                                      n=3, cutoff=0.7)
    hint = f" (close matches: {', '.join(close)})" if close else ""
    raise Bad(f"the name of a timm model, e.g. xcit_nano_12_p16_224{hint}")


def _timm_optimizer(v):
    if not isinstance(v, str) or not v.strip():
        raise Bad
    if not CHECK_NAMES.get():
        return v.lower()
    from timm.optim import list_optimizers  # lazy, as above

    known = list_optimizers()
    if v.lower() in known:
        return v.lower()
    close = difflib.get_close_matches(v.lower(), known, n=1)
    raise Bad("a timm optimizer name such as adamw" + (f" (did you mean {close[0]}?)" if close else ""))


REGISTERED_PREFIX = "qkv_"
MODEL_NAME = Check("the name of a timm model, e.g. xcit_nano_12_p16_224", "timm model names", _timm_model)
OPTIMIZER = Check("a timm optimizer name such as adamw", "timm optimizer names", _timm_optimizer)
