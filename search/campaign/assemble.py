"""The campaign's searcher, assembled: the spec's searcher (search.searchers.SEARCHERS) over the spec's problem,
inside the proposal wrapper Tune drives (search.searchers.proposals.Proposals) with the campaign's constraints,
its record of infeasible proposals, its measurements and its warm start. Launch and resume build it the same way
(search.campaign.run); a resume then restores its saved state into it."""
from __future__ import annotations

from dataclasses import replace
from functools import partial

from qkvsearch.search.campaign.measured import Measurer, measure_settings
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.records.proposals import write_proposal
from qkvsearch.search.searchers import make_searcher
from qkvsearch.search.searchers.base import FINISHED
from qkvsearch.search.searchers.earlier import known_trials
from qkvsearch.search.searchers.outcomes import scored_result
from qkvsearch.search.searchers.problem import build_trial, spec_problem
from qkvsearch.search.searchers.proposals import Proposals
from qkvsearch.spaces import base_config
from qkvsearch.spaces.search_options import OPTIONS, default_population, default_startup
from qkvsearch.spaces.spec import CampaignSpec


def build_search(campaign: OpenedCampaign | CampaignSpec, storage=None) -> Proposals:
    """The campaign's searcher. campaign: an OpenedCampaign, whose folder records infeasible proposals and caches
    measurements, or a CampaignSpec alone, with no folder (``infeasible_share``'s estimate): nothing recorded,
    nothing measured. storage: an Optuna storage for the study, named after the campaign
    (search.campaign.tracking.study_storage; None: in memory)."""
    opened = campaign if isinstance(campaign, OpenedCampaign) else None
    spec = opened.spec if opened else campaign
    base = base_config(spec)
    searcher = make_searcher(spec.search.algorithm, spec_problem(spec, storage))
    return Proposals(searcher, partial(build_trial, base), constraints=spec.constraints,
                     record=partial(record_proposal, opened.exp, spec.name) if opened else None,
                     measurer=campaign_measurer(opened) if opened else None,
                     earlier=partial(known_trials, spec, base) if spec.search.warm_start else None,
                     skip_duplicates=spec.search.algorithm == "grid",
                     recorded_cost=partial(_recorded_cost, opened.exp) if opened else None)


def campaign_measurer(campaign: OpenedCampaign) -> Measurer | None:
    """The campaign's Measurer when it measures something."""
    how = measure_settings(campaign)
    if not how.metrics:
        return None
    res = campaign.spec.resources
    return Measurer(how, res.workers_per_trial, res.cpus_per_worker, res.gpus_per_worker)


def _recorded_cost(exp: str, trial_id: str) -> dict | None:
    """A trial's cost from its record (None when it has none)."""
    from qkvsearch.search.records.readers import read_record

    rec = read_record(exp, trial_id)
    return rec.get("cost") if rec else None


def record_proposal(exp: str, campaign: str, proposal_id: str, trial_id: str, trial: dict, error: str) -> None:
    """Record an infeasible proposal (search.records.proposals): it never becomes a trial."""
    write_proposal(exp, campaign, proposal_id, trial_id, trial["config"], trial["cost"], error,
                   trial.get("measured_on"))


ESTIMATE_TRIALS = 40  # trials drawn per searcher by `infeasible_share`


def infeasible_share(spec, algorithm: str, trials: int = ESTIMATE_TRIALS) -> float:
    """The share of a searcher's proposals that would break the campaign's constraints, estimated by drawing
    ``trials`` trials without training: each trial is told COMPLETE with its cost objectives and 0 for every
    training objective (all feasible trials alike, so only the constraints and the costs steer the sampler),
    infeasible proposals as in a campaign; each configuration once (a repeat is as feasible as its first run)."""
    search = replace(spec.search, algorithm=algorithm, num_trials=trials, warm_start=None, repeats=1,
                     population_size=default_population(trials) if algorithm == "nsga2" else None,
                     n_startup_trials=(default_startup(trials, algorithm) if algorithm in OPTIONS["n_startup_trials"]
                                       else None))
    searcher = build_search(replace(spec, search=search))
    for i in range(trials):
        trial = searcher.suggest(f"estimate_{i:05d}")
        if trial is None or trial == FINISHED or trial == Proposals.FINISHED:
            break
        known = {o.metric: 0.0 for o in spec.objectives}
        searcher.on_trial_complete(f"estimate_{i:05d}", scored_result({**known, **trial["cost"]}))
    return searcher.infeasible / max(1, searcher.proposals)
