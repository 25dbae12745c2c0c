"""``mfehvi``: ehvi that learns from every epoch a trial reached, for campaigns whose scheduler stops trials
early (MO-ASHA).

ehvi learns a trial's final value only: a trial MO-ASHA stopped at its first rung teaches it nothing, though
its epochs were paid for. Here the model's observations are (configuration, fidelity) -> the training
objective, fidelity s = log(epoch) / log(planned epochs) in [0, 1], one per epoch of a trial on the ladder
1, 3, 9, ... (the rungs of MO-ASHA's default reduction factor) plus the last epoch of a trial that ended,
stopped or completed; s is one more input of the GP, with a length scale of its own (a curve-aware
surrogate, as in freeze-thaw and multi-task Bayesian optimisation, rather than BOHB's one model per rung). The
default model (MF_DEFAULT) is additive over the keys, its sum multiplied by a kernel of s (the keys' effects
carry over between epochs as far as its length scale says), and learns each epoch's values ranked among
themselves (warp "epochs": the rank of a value among the values of its epoch, so a trial's epoch-1 result
and a final one are on one scale).
Each proposal is the candidate of largest expected hypervolume improvement of its predicted final value
(s = 1) against the front of the completed trials (search.searchers.ehvi_core). The start-up ends once START
configurations have reported an epoch.

Candidates: ehvi's, grown alike over a sample of the space (from the front of the completed trials).
State: ehvi's, plus every recorded epoch by configuration and the planned epochs.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from qkvsearch.search.records.layout import PLANNED_KEY
from qkvsearch.search.searchers.ehvi import EhviSearcher
from qkvsearch.search.searchers.ehvi_core import DEFAULT, EHVICore
from qkvsearch.spaces.checks import finite
from qkvsearch.spaces.metrics import EPOCH
from qkvsearch.spaces.search_options import STARTUP_TRIALS

LADDER = 3   # observations kept per trial: epochs 1, 3, 9, ... and its last
# chosen on curve tables left out (benchmarks/bench_multifidelity.py, benchmarks/README.md "Multi-fidelity search")
MF_DEFAULT = replace(DEFAULT, model="additive", warp="epochs", start=STARTUP_TRIALS["mfehvi"])


def fidelity(epoch: float, planned: int) -> float:
    return math.log(epoch) / math.log(planned) if planned > 1 else 1.0


class MFCore(EHVICore):
    """EHVICore whose model learns every kept epoch (module docstring). ``epochs``: candidate -> {epoch: value,
    maximised sign}; ``planned``: the planned epochs (from the results)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epochs: dict[int, dict[int, float]] = {}
        self.planned = 1

    def inputs(self, features, groups) -> tuple[np.ndarray, np.ndarray]:
        """The encoding and a fidelity column, 1 (the planned epochs) for every candidate: a group of its own."""
        groups = np.asarray(groups, int)
        return (np.column_stack([np.asarray(features, float), np.ones(len(features))]),
                np.append(groups, groups.max() + 1 if len(groups) else 0))

    def record(self, index: int, epoch: int, value: float, planned: int | None) -> None:
        if planned:
            self.planned = max(self.planned, int(planned))
        if epoch >= 1 and math.isfinite(value):
            self.epochs.setdefault(index, {})[int(epoch)] = self.sign * float(value)

    @property
    def fidelity_group(self) -> int:
        return int(self.groups.max())   # the last column's (__init__)

    def observed(self) -> int:
        return len(set(self.epochs) | set(self.results))

    def kept(self, index: int) -> dict[int, float]:
        """The epochs of a candidate the model learns: on the ladder, the last of a trial that ended (a running
        one's goes on), and its final result."""
        points = dict(self.epochs.get(index, {}))
        if index in self.results:
            points[self.planned] = self.results[index]
        last = max(points) if points and index not in self.running else 0
        return {e: v for e, v in points.items() if e == last or LADDER ** round(math.log(e, LADDER)) == e}

    def training_data(self):
        xs, ys, epochs, final = [], [], [], {}
        for i in sorted(set(self.epochs) | set(self.results)):
            for e, v in sorted(self.kept(i).items()):
                xs.append(np.append(self.features[i, :-1], fidelity(e, self.planned)))
                ys.append(v)
                epochs.append(e)
                if i in self.results and e == self.planned:
                    final[i] = len(ys) - 1
        rows = np.array([final[i] for i in sorted(self.results)], dtype=int)
        return np.array(xs).reshape(len(ys), -1), np.array(ys), rows, np.array(epochs, float)

    def prediction_inputs(self, index: np.ndarray) -> np.ndarray:
        return self.features[index]   # its last column is 1: the planned epochs

    def state(self) -> dict:
        return {**super().state(), "planned": self.planned,
                "epochs": [[int(i), [[int(e), float(v)] for e, v in sorted(c.items())]]
                           for i, c in self.epochs.items()]}

    def restore(self, state: dict) -> None:
        super().restore(state)
        self.planned = int(state.get("planned", 1))
        self.epochs = {int(i): {int(e): float(v) for e, v in c} for i, c in state.get("epochs", [])}


class MFEhviSearcher(EhviSearcher):
    """``mfehvi`` (module docstring): ehvi's searcher, its core an MFCore fed by every epoch's result."""

    name = "mfehvi"

    def __init__(self, problem, settings=None):
        super().__init__(problem, settings or MF_DEFAULT)

    def make_core(self, features, groups, costs, feasible, side) -> MFCore:
        return MFCore(features, groups, costs, feasible, self.problem.modes[self.train] == "max",
                      self.problem.seed, self.settings, self.problem.n_startup_trials, self.measured,
                      [1.0 if d == "min" else -1.0 for _, d in self.cost_objectives], side)

    def _record(self, trial_id: str, result: dict | None) -> None:
        pick = self.proposed.get(trial_id)
        value = finite((result or {}).get(self.problem.metrics[self.train]))
        epoch = finite((result or {}).get(EPOCH))
        if pick is not None and value is not None and epoch is not None:
            self.core.record(pick, int(epoch), value, finite(result.get(PLANNED_KEY)))

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self._record(trial_id, result)

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        self._record(trial_id, result)   # a stopped trial's last epoch too: what it reached is learnt
        super().on_trial_complete(trial_id, result, error)

    def keyed(self, core: dict, keys: list[str]) -> dict:
        core = super().keyed(core, keys)
        core["epochs"] = [[keys[i], e] for i, e in core["epochs"]]
        return core

    def indexed(self, core: dict, index: dict[str, int]) -> dict:
        core = super().indexed(core, index)
        core["epochs"] = [[index[k], e] for k, e in core.get("epochs", []) if k in index]
        return core
