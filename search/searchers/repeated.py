"""``search.repeats`` for any searcher: each configuration it proposes is trained ``repeats`` times, under the seeds
seed, seed + 1, ... (the training seed of the proposal, the campaign's when the space does not set it), so the
report can give each a mean and a spread. grid enumerates its repeats itself (search.searchers.grid).

    inner.suggest(t)  -> keys          the proposal, trained as trial t (seed s)
    suggest(t1)       -> keys, seed s+1   its repeats, before the inner searcher is asked again, each a trial of its
    suggest(t2)       -> keys, seed s+2   own that the inner searcher never hears of: it learns every proposal from
                                          the training under the first seed, as it would without repeats

A proposal the campaign refuses (``tell_infeasible``, which follows its suggestion) takes its repeats with it. The
wrapper's state is the inner searcher's and the repeats not yet proposed, as plain data (search.searchers.state).
"""
from __future__ import annotations

from qkvsearch.search.searchers.base import Searcher


class Repeated(Searcher):
    """``inner``'s proposals, each ``inner.problem.repeats`` times (module docstring). Its name is the inner
    searcher's: the campaign's state file names the algorithm."""

    def __init__(self, inner: Searcher, repeats: int, train_seed: int):
        super().__init__(inner.problem)
        self.inner, self.repeats, self.train_seed = inner, int(repeats), int(train_seed)
        self.name = inner.name
        self.queue: list[tuple[str, dict]] = []   # (the trial that proposed it, a repeat's space keys), in order
        self.own: set[str] = set()                # trial ids running a repeat: the inner searcher never saw them

    def suggest(self, trial_id: str):
        if self.queue:
            _, keys = self.queue.pop(0)
            self.own.add(trial_id)
            return keys
        keys = self.inner.suggest(trial_id)
        if isinstance(keys, dict):
            seed = int(keys.get("seed", self.train_seed))
            self.queue = [(trial_id, {**keys, "seed": seed + k}) for k in range(1, self.repeats)]
        return keys

    def _inner(self, trial_id: str) -> bool:
        return trial_id not in self.own

    def constrain(self, trial_id: str, cost: dict) -> None:
        if self._inner(trial_id):
            self.inner.constrain(trial_id, cost)

    def rename(self, old: str, new: str) -> None:
        if old in self.own:
            self.own.discard(old)
            self.own.add(new)
        else:
            self.inner.rename(old, new)
        self.queue = [(new if origin == old else origin, keys) for origin, keys in self.queue]

    def tell_infeasible(self, trial_id: str, cost: dict) -> None:
        if trial_id in self.own:
            self.own.discard(trial_id)
            return
        self.queue = [(origin, keys) for origin, keys in self.queue if origin != trial_id]
        self.inner.tell_infeasible(trial_id, cost)

    def tell_earlier(self, earlier) -> None:
        self.inner.tell_earlier(earlier)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if self._inner(trial_id):
            self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self.own:
            self.own.discard(trial_id)
            return
        self.inner.on_trial_complete(trial_id, result=result, error=error)

    def state(self) -> dict:
        return {"inner": self.inner.state(), "queue": [[origin, keys] for origin, keys in self.queue],
                "own": sorted(self.own)}

    def restore(self, state: dict) -> None:
        self.inner.restore(state["inner"])
        self.queue = [(origin, dict(keys)) for origin, keys in state["queue"]]
        self.own = set(state["own"])
