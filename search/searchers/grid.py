"""``grid``: every configuration of an enumerable space, in order, ``repeats`` times with successive seeds."""
from __future__ import annotations

import itertools

from qkvsearch.search.searchers.base import FINISHED, Problem, Searcher


class GridSearcher(Searcher):
    """Suggests each configuration of the space in order (Problem.configurations), each ``repeats`` times with
    seeds seed, seed + 1, ..., then FINISHED. Configurations are generated as they are suggested: a grid of
    10^8 points costs no memory. Its state is the number suggested so far."""

    name = "grid"
    repeats_itself = True

    def __init__(self, problem: Problem):
        super().__init__(problem)
        self.next = 0            # configurations suggested so far (repeats counted)
        self._pending = None     # iterator over those not yet suggested

    def _repeated(self):
        """Each configuration, then its repeats with the next seeds: distinct trainings."""
        for cfg in self.problem.configurations():
            seed = cfg.get("seed", self.problem.train_seed)
            yield cfg
            for k in range(1, self.problem.repeats):
                yield {**cfg, "seed": seed + k}

    def suggest(self, trial_id: str):
        if self._pending is None:
            self._pending = itertools.islice(self._repeated(), self.next, None)
        config = next(self._pending, None)
        if config is None:
            return FINISHED
        self.next += 1
        return config

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        self.proposed.pop(trial_id, None)

    def state(self) -> dict:
        return {"next": self.next}

    def restore(self, state: dict) -> None:
        self.next, self._pending = int(state["next"]), None
