"""A searcher of the test's own, added as a user adds one: this class and its row in spaces.search_options
(tests/test_extending.py). It draws each proposal at random from its own generator and keeps what it was told."""
from __future__ import annotations

import numpy as np

from qkvsearch.search.searchers.base import Searcher
from qkvsearch.spaces.draws import RandomTrial


class ToySearcher(Searcher):
    name = "toy"

    def __init__(self, problem):
        super().__init__(problem)
        self.draws, self.told = 0, []

    def suggest(self, trial_id: str):
        self.draws += 1
        keys = self.problem.draw(RandomTrial(np.random.default_rng([self.problem.seed, self.draws])))
        self.proposed[trial_id] = self.draws
        return keys

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        self.told.append([trial_id, None if error or not result else result.get(self.problem.metrics[0])])

    def state(self) -> dict:
        return {"draws": self.draws, "told": self.told}

    def restore(self, state: dict) -> None:
        self.draws, self.told = int(state["draws"]), list(state["told"])
