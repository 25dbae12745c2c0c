"""What a searcher is to the campaign and to the simulator: the hooks they call, declared once, and the
problem it searches.

Every hook is declared on ``Searcher`` (as Ray Tune's ``tune/search/searcher.py`` declares its own), most
as documented no-ops: a searcher that needs none of them inherits a visible no-op, and a wrapper never
asks ``hasattr``. The proposal wrapper (search.searchers.proposals) and the simulator
(search.simulation.searchers) talk to a searcher only through them.

A searcher keeps what it proposed under the trial id it proposed it for (``proposed``: trial id -> its
own handle of the proposal, e.g. an Optuna trial number or a candidate index). ``rename`` moves a handle to
the trial that finally runs the proposal (a proposal that waited to be measured), for every searcher alike.

State: ``state()`` is plain data (JSON: numbers, strings, lists, mappings) holding everything a searcher
needs to go on after its campaign's driver stopped; ``restore(state)`` takes it back into a searcher built
anew from the same problem. Nothing a searcher saves is a pickled object, so a new attribute in a later
version never breaks a campaign saved by an earlier one (search.searchers.state).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

FINISHED = "FINISHED"   # suggest(): nothing more to propose (Ray Tune's Searcher.FINISHED)


@dataclass(frozen=True)
class EarlierTrial:
    """A result an earlier campaign recorded for a configuration this one can draw (search.searchers.earlier):
    ``config`` its space keys, ``key`` its training identity, ``status`` its final status, ``values`` its last
    epoch's metrics and its cost by metric, ``trial`` where it was recorded."""

    key: str
    trial: str
    config: dict
    status: str
    values: dict
    cost: dict


@dataclass(frozen=True)
class Problem:
    """What a searcher searches, built from a campaign's spec (search.searchers.problem.spec_problem) or from
    a table of recorded curves (search.simulation.searchers).

    objectives: ((metric, "max" | "min"), ...); constraints: spaces.schema.Constraint on costs, known before
    training; known: the metrics known before training (a proposal's cost holds them).
    draw(trial): the space keys of one configuration, drawn through an Optuna-style trial (define-by-run).
    params_of(config): the (params, distributions) that draw ``config``, or None outside the space.
    configurations(): every configuration in order (enumerable spaces).
    candidates(): (configurations, their costs, whether each can be trained at all) for searchers over a
    candidate list.
    neighbour(config, rng, changes): a configuration next to ``config`` (spaces.trials.neighbour_config), for a
    searcher to add to its candidates; None where the candidates are every configuration (a table, a space of
    at most search.searchers.problem.MAX_CANDIDATES), set where they are a sample of the space.
    costs(configs): (their costs, whether each can be trained), as candidates() gives them."""

    objectives: tuple[tuple[str, str], ...]
    constraints: tuple = ()
    known: tuple[str, ...] = ()
    seed: int = 0
    num_trials: int | None = None
    draw: Callable[[Any], dict] | None = None
    params_of: Callable[[dict], tuple[dict, dict] | None] | None = None
    configurations: Callable[[], Iterator[dict]] | None = None
    candidates: Callable[[], tuple[list[dict], list[dict], list[bool]]] | None = None
    neighbour: Callable[[dict, Any, int], dict | None] | None = None
    costs: Callable[[list[dict]], tuple[list[dict], list[bool]]] | None = None
    repeats: int = 1          # each configuration this many times, seeds train_seed, train_seed + 1, ...
    train_seed: int = 0
    population_size: int | None = None
    n_startup_trials: int | None = None
    storage: Any = field(default=None, compare=False)   # an Optuna storage the study lives in (a tracker's)
    study_name: str | None = None

    @property
    def metrics(self) -> list[str]:
        return [m for m, _ in self.objectives]

    @property
    def modes(self) -> list[str]:
        return [d for _, d in self.objectives]


class Searcher:
    """The base of every searcher (module docstring). Subclasses set ``name`` (their entry in
    search.searchers.SEARCHERS) and implement ``suggest``, ``on_trial_complete``, ``state`` and ``restore``."""

    name: ClassVar[str] = ""
    repeats_itself: ClassVar[bool] = False   # it proposes Problem.repeats runs of each configuration on its own

    def __init__(self, problem: Problem):
        self.problem = problem
        self.proposed: dict[str, Any] = {}   # trial id -> this searcher's handle of what it proposed for it

    # -- proposing -------------------------------------------------------------------------------------
    def suggest(self, trial_id: str) -> dict | str | None:
        """The space keys of the next configuration for ``trial_id``; FINISHED when nothing is left; None when
        nothing can be proposed now (ask again later)."""
        raise NotImplementedError

    def constrain(self, trial_id: str, cost: dict) -> None:
        """The cost of the proposal just made for ``trial_id`` (counted, and measured when known), before it
        becomes a trial: what a constrained searcher needs to know about its feasibility."""

    def rename(self, old: str, new: str) -> None:
        """The proposal made for trial ``old`` now runs as trial ``new``."""
        if old in self.proposed:
            self.proposed[new] = self.proposed.pop(old)

    def tell_infeasible(self, trial_id: str, cost: dict) -> None:
        """The proposal just made for ``trial_id`` breaks a constraint by ``cost`` and never becomes a trial;
        ``trial_id`` asks anew."""
        self.proposed.pop(trial_id, None)

    def tell_earlier(self, earlier: EarlierTrial) -> None:
        """An earlier campaign's result for a configuration of this space (a warm start), before the first
        proposal."""

    # -- learning --------------------------------------------------------------------------------------
    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """One epoch's result of a running trial."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """The trial ended: its last result (search.searchers.outcomes.outcome_state reads how it ended)."""
        raise NotImplementedError

    # -- state -----------------------------------------------------------------------------------------
    def state(self) -> dict:
        """Everything needed to go on, as plain data."""
        raise NotImplementedError

    def restore(self, state: dict) -> None:
        """Take back what ``state()`` gave, into a searcher built anew from the same problem."""
        raise NotImplementedError
