"""A space's configurations drawn without a searcher: by a seeded generator, or picked option by option.

``spaces.trials.suggest_keys`` draws a configuration through an Optuna-style trial (define-by-run: the variant,
then each active dimension). The trials here answer its calls themselves:

    RandomTrial(rng)   each value drawn uniformly (log-uniformly where the dimension says log), as Optuna's
                       random sampler draws: what a supernet's random students are (trainers.supernet.space)
    PickTrial(picks)   each parameter's option by index (``options``): an enumerable dimension's values, a
                       range's two ends; what a search over the space's extremes moves through

A space travels to Ray workers as plain data (``space_data``, read back by ``space_of``), exactly: every
dimension with its kind, values, bounds and conditions, and the variants.
"""
from __future__ import annotations

import math

import numpy as np

from qkvsearch.spaces.schema import Dimension, FrozenMap, Space

VARIANT = "variant"   # the parameter that draws a variant (suggest_config's)


def space_data(space: Space) -> dict:
    """``space`` as plain data (JSON)."""
    return {"dimensions": [{"key": d.key, "kind": d.kind, "values": list(d.values), "low": d.low, "high": d.high,
                            "log": d.log, "when": {k: list(v) for k, v in d.when.items()}}
                           for d in space.dimensions],
            "variants": [dict(v) for v in space.variants]}


def space_of(data: dict) -> Space:
    """The Space ``space_data`` wrote."""
    dims = tuple(Dimension(d["key"], d["kind"], tuple(d["values"]), d["low"], d["high"], bool(d["log"]),
                           FrozenMap({k: tuple(v) for k, v in d["when"].items()})) for d in data["dimensions"])
    return Space(dims, tuple(FrozenMap(v) for v in data["variants"]))


def options(space: Space) -> dict[str, list]:
    """parameter -> the options a PickTrial picks among: the variants' indices, an enumerable dimension's
    values, a range's low and high end."""
    out: dict[str, list] = {VARIANT: list(range(len(space.variants)))} if space.variants else {}
    for d in space.dimensions:
        out[d.key] = list(d.values) if d.enumerable else [d.low, d.high]
    return out


class RandomTrial:
    """An Optuna-style trial whose every suggestion is a uniform draw from ``rng`` (numpy Generator)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def suggest_categorical(self, name: str, choices: list):
        return choices[int(self.rng.integers(len(choices)))]

    def suggest_int(self, name: str, low: int, high: int, log: bool = False) -> int:
        if log:
            # as Optuna's random sampler: log-uniform over [low - 0.5, high + 0.5], rounded (a log range has low >= 1)
            value = math.exp(self.rng.uniform(math.log(low - 0.5), math.log(high + 0.5)))
            return int(min(max(round(value), low), high))
        return int(self.rng.integers(low, high + 1))

    def suggest_float(self, name: str, low: float, high: float, log: bool = False) -> float:
        if log:   # clipped: exp(log(x)) may fall a rounding outside [low, high]
            return float(min(max(math.exp(self.rng.uniform(math.log(low), math.log(high))), low), high))
        return float(self.rng.uniform(low, high))


class PickTrial:
    """An Optuna-style trial that answers each parameter with its option ``picks[name]`` (an index into
    ``options``; a parameter not picked takes its first option)."""

    def __init__(self, picks: dict[str, int]):
        self.picks = picks

    def _pick(self, name: str, choices: list):
        return choices[self.picks.get(name, 0) % len(choices)]

    def suggest_categorical(self, name: str, choices: list):
        return self._pick(name, choices)

    def suggest_int(self, name: str, low: int, high: int, log: bool = False) -> int:
        return int(self._pick(name, [low, high]))

    def suggest_float(self, name: str, low: float, high: float, log: bool = False) -> float:
        return float(self._pick(name, [low, high]))
