"""Spec errors: every problem found in one campaign file is collected and reported together.

A message names the field path, what was expected and what was given, e.g.
``space.code_size.choice: expected a list of positive ints, given "big"``.
"""
from __future__ import annotations

import difflib
import json
from collections.abc import Iterable


class BadInput(ValueError):
    """Input the user can fix (a spec, a path, a data folder, resources): the command line exits 2.

    Every error that says "your input is wrong" derives from it; anything else is a failure (exit 1).
    """


class SpecError(BadInput):
    """A campaign spec is invalid. ``errors`` holds one message per problem; str() lists them one per line."""

    def __init__(self, errors: Iterable[str], source: str | None = None):
        self.errors = list(errors)
        self.source = source
        head = f"invalid campaign spec {source}" if source else "invalid campaign spec"
        noun = "error" if len(self.errors) == 1 else "errors"
        lines = [f"{head} ({len(self.errors)} {noun}):"] + [f"  {e}" for e in self.errors]
        super().__init__("\n".join(lines))


def show(value) -> str:
    """A given value as the user wrote it: strings in double quotes, the rest as JSON where possible."""
    if isinstance(value, str):
        return json.dumps(value)
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return repr(value)


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
    close = difflib.get_close_matches(str(word), known, n=1, cutoff=0.6)
    if close:
        return f' (did you mean "{close[0]}"?)'
    return f" (known: {', '.join(known)})" if list_known else ""


class Collector:
    """Accumulates messages while a spec is parsed, so the user sees every problem at once."""

    def __init__(self):
        self.errors: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}" if path else message)

    def expected(self, path: str, expected: str, given) -> None:
        self.add(path, f"expected {expected}, given {show(given)}")

    def unknown_keys(self, path: str, mapping: dict, known: Iterable[str]) -> None:
        known = list(known)
        for key in mapping:
            if key not in known:
                where = f"{path}.{key}" if path else str(key)
                self.add(where, "unknown key" + hint(key, known))

    def raise_if_any(self, source: str | None = None) -> None:
        if self.errors:
            raise SpecError(self.errors, source)
