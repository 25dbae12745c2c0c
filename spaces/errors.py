"""Spec errors: every problem found in one campaign file is collected and reported together.

A message names the field path, what was expected and what was given, e.g.
``space.code_size.choice: expected a list of positive ints, given "big"``.
"""
from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence


class BadInput(ValueError):
    """Input the user can fix (a spec, a path, a data folder, resources): the command line exits 2.

    Every error that says "your input is wrong" derives from it; anything else is a failure (exit 1).
    """


class SpecError(BadInput):
    """A campaign spec is invalid. ``errors`` holds one message per problem; str() lists them one per line."""

    def __init__(self, errors: Iterable[str], source: str | None = None):
        self.errors = list(errors)
        self.source = source
        head = f"invalid campaign spec {clip(source)}" if source else "invalid campaign spec"
        noun = "error" if len(self.errors) == 1 else "errors"
        lines = [f"{head} ({len(self.errors)} {noun}):"] + [f"  {e}" for e in self.errors[:MAX_SHOWN]]
        if len(self.errors) > MAX_SHOWN:
            lines.append(f"  ... and {len(self.errors) - MAX_SHOWN} more")
        super().__init__("\n".join(lines))


SHOW_LIMIT = 200      # characters of a given value a message echoes
MESSAGE_LIMIT = 1000  # characters of one message (path included)
MAX_SHOWN = 50        # messages a SpecError lists; the rest are counted


def clip(text: str, limit: int = SHOW_LIMIT) -> str:
    """text cut to at most limit characters, ending in "…" when cut."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def reason(exc: BaseException) -> str:
    """An exception as the reason a message gives, never empty: "<type>: <first non-blank line of its
    text>". One without text names the exception it was raised from (or while handling), else gives its
    repr: ``RuntimeError()`` says more than "RuntimeError: "."""
    line = next((part.strip() for part in str(exc).splitlines() if part.strip()), "")
    if line:
        return clip(f"{type(exc).__name__}: {line}")
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return f"{type(exc).__name__}, from {reason(cause)}" if cause is not None else repr(exc)


def show(value, limit: int = SHOW_LIMIT) -> str:
    """A given value as the user wrote it (JSON-like: strings in double quotes), at most limit characters.

    Rendering stops as soon as the limit is passed, so a value built from YAML aliases that would
    expand to gigabytes (or one that contains itself) costs no more than a short one.
    """
    pieces, size = [], 0
    for piece in _render(value, limit):
        pieces.append(piece)
        size += len(piece)
        if size > limit:
            break
    return clip("".join(pieces), limit)


def _render(value, limit: int) -> Iterator[str]:
    # Every container yields its opening bracket before its items, so nesting depth is bounded
    # by how many characters the caller takes.
    if isinstance(value, str):
        yield json.dumps(value[:limit + 1])
    elif value is None or isinstance(value, (bool, float)):
        yield json.dumps(value)
    elif isinstance(value, int):
        try:
            yield str(value)
        except ValueError:  # beyond Python's int-to-text digit limit
            yield f"an int of {value.bit_length()} bits"
    elif isinstance(value, Mapping):
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            yield ", " if i else ""
            yield _render_key(key, limit) + ": "
            yield from _render(item, limit)
        yield "}"
    elif isinstance(value, (list, tuple, set, frozenset)):
        yield "["
        for i, item in enumerate(value):
            yield ", " if i else ""
            yield from _render(item, limit)
        yield "]"
    elif isinstance(value, (bytes, bytearray)):
        yield clip(repr(bytes(value[:limit + 1])), limit + 1)
    else:
        yield json.dumps(clip(str(value), limit + 1))


def _render_key(key, limit: int) -> str:
    """A mapping key as JSON writes one: always a quoted string."""
    if isinstance(key, str):
        return json.dumps(key[:limit + 1])
    if key is None or isinstance(key, (bool, float)):
        return json.dumps(json.dumps(key))
    return json.dumps(clip(str(key), limit + 1))


# Names people carry over from other tools -> ours.
ALIASES = {
    "learning_rate": "lr", "wd": "weight_decay", "bs": "batch_size", "optimizer": "opt",
    "lr_schedule": "sched", "drop_path": "drop_path_rate", "warmup": "warmup_epochs",
    "num_samples": "num_trials", "n_trials": "num_trials", "sampler": "algorithm",
    "grace_period": "grace_epochs", "num_workers": "workers_per_trial", "dataset_path": "path",
    "data_path": "path", "model_name": "name", "metrics": "objectives",
    "acc": "top1", "accuracy": "top1", "acc1": "top1", "flops": "gmacs", "macs": "gmacs",
    "gflops": "gmacs", "loss": "val_loss", "num_params": "params_m",
}


def hint(word: str, known: Iterable[str], list_known: bool = True) -> str:
    """' (did you mean "x"?)' for the closest known word, else a list of the known words (or "")."""
    known = sorted(known)
    if ALIASES.get(word) in known:
        return f' (did you mean "{ALIASES[word]}"?)'
    close = difflib.get_close_matches(clip(word), known, n=1, cutoff=0.6)
    if close:
        return f' (did you mean "{close[0]}"?)'
    return f" (known: {', '.join(known)})" if list_known else ""


class Collector:
    """Accumulates messages while a spec is parsed, so the user sees every problem at once."""

    def __init__(self):
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.errors.append(clip(f"{clip(path)}: {message}" if path else message, MESSAGE_LIMIT))

    def warn(self, path: str, message: str) -> None:
        """A problem that does not stop the spec from loading (e.g. every trial would be the same)."""
        self.warnings.append(clip(f"{clip(path)}: {message}" if path else message, MESSAGE_LIMIT))

    def expected(self, path: str, expected: str, given) -> None:
        self.add(path, f"expected {expected}, given {show(given)}")

    def unknown_keys(self, path: str, mapping: dict, known: Iterable[str]) -> None:
        known = list(known)
        for key in mapping:
            if key not in known:
                where = f"{path}.{key}" if path else str(key)
                self.add(where, "unknown key" + hint(key, known))

    def section(self, path: str, raw, known: Iterable[str], what: str) -> dict | None:
        """An optional mapping section: None when absent (or null), or not a mapping (then an error naming
        ``what`` it should be); else the mapping, its unknown keys reported."""
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            self.expected(path, what, raw)
            return None
        self.unknown_keys(path, raw, known)
        return dict(raw)

    def raise_if_any(self, source: str | None = None) -> None:
        if self.errors:
            raise SpecError(self.errors, source)


def section_failed(problems: Sequence[str], section: str) -> bool:
    """Whether one of ``problems`` (a Collector's errors, or what spaces.loader.read_stored_spec returns)
    concerns ``section``."""
    return any(e == section or e.startswith((f"{section}.", f"{section}:", f"{section}[")) for e in problems)


class ConfigError(BadInput):
    """A trial config holds an unknown key or a value its key does not allow (spaces.keys.fill)."""


def config_error(key: str, expected: str, given) -> ConfigError:
    """The error naming ``key``, what it expects and what it was given."""
    return ConfigError(f"{key}: expected {expected}, given {show(given)}")
