"""``search.front_repeats``: once the search has ended, each configuration on the front of the completed trials
trains again under the next seeds until it has run ``front_repeats`` times, so every front point carries a mean and
a spread (search.analysis.report: the front's seed columns; search.analysis.effects: the intervals over seeds). The
baseline's own front trains so too: every effect sets a design value against the baseline, which a front of other
designs may dominate, and an effect needs the baseline's spread as much as the value's.

    the completed trials --plan--> the front on the campaign's objectives, and the baseline's front (over the trials
        whose categorical design keys all hold their defaults: search.analysis.effects.CHOICE_KEYS, linear q/k/v,
        softmax attention, ...); per configuration on either (its training identity without the seed) the runs it
        lacks, under the seeds after the largest it has tried, as space keys (the searched keys its config holds,
        and the seed); written once (search.records.front_repeats), so a resumed campaign trains the same runs
    --> the runs as an ordinary campaign of trials (search.campaign.run: the trial path, records, trackers,
        retention), as the one-shot control sample trains under two seeds: its space the runs as variants, grid,
        FIFO (every run trains its planned epochs, none is stopped against the others), its Tune experiment in
        <exp>/front_repeats/, its records beside the search's (<exp>/qs_trials/)
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace

import numpy as np

from qkvsearch.search.analysis.effects import CHOICE_KEYS
from qkvsearch.search.analysis.front import objective_columns
from qkvsearch.search.analysis.pareto import nondominated_mask
from qkvsearch.search.analysis.results import collect
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.run import CampaignRun
from qkvsearch.search.records.front_repeats import read_plan, write_plan
from qkvsearch.search.records.layout import FRONT_REPEATS_DIR
from qkvsearch.search.searchers.problem import build_trial
from qkvsearch.spaces import base_config, load_campaign
from qkvsearch.spaces.keys import KEYS, identity
from qkvsearch.storage import exists

log = logging.getLogger(__name__)


def _baseline(configs: list[dict]) -> np.ndarray:
    """(n,) whether each config is the baseline's design: every categorical design key at its default (or null)."""
    return np.array([all(c.get(k) is None or c.get(k) == KEYS[k].default for k in CHOICE_KEYS) for c in configs],
                    dtype=bool)


def plan_runs(campaign: OpenedCampaign) -> tuple[list[str], list[str], list[dict]]:
    """(the trial ids on the front, those on the baseline's front, the space keys of every run their configurations
    lack) from the records."""
    spec, exp = campaign.spec, campaign.exp
    trials, _ = collect(exp)
    df = trials.to_pandas()
    done = np.array(df["status"] == "completed", dtype=bool)
    if not done.any():
        return [], [], []
    _, cols, dirs = objective_columns(trials, [{"metric": o.metric, "mode": o.mode} for o in spec.objectives])
    values = df[cols].astype("float64").to_numpy()
    done &= ~np.isnan(values).any(axis=1)
    configs = [json.loads(c) for c in df["config_json"]]
    front, baseline = np.zeros(len(df), dtype=bool), np.zeros(len(df), dtype=bool)
    front[done] = nondominated_mask(values[done], dirs)
    ours = done & _baseline(configs)
    baseline[ours] = nondominated_mask(values[ours], dirs)
    keys = [identity(c, ignore=("seed",)) for c in configs]
    base = base_config(spec)
    runs, planned = [], set()
    for i in np.flatnonzero(front | baseline):
        if keys[i] in planned:   # two seeds of one configuration on the front: planned once
            continue
        planned.add(keys[i])
        same = [j for j, k in enumerate(keys) if k == keys[i]]
        have = sum(1 for j in same if done[j])
        tried = max(int(configs[j].get("seed") or 0) for j in same)
        space_keys = {k: configs[i][k] for k in spec.space.keys if configs[i].get(k) is not None}
        rebuilt = build_trial(base, space_keys)
        if rebuilt.get("invalid") or identity(rebuilt["config"], ignore=("seed",)) != keys[i]:
            log.warning(f"front_repeats: {df['trial_name'].iat[i]} cannot be made again from the space's keys; "
                        "not repeated")
            continue
        runs += [{**space_keys, "seed": tried + k} for k in range(1, spec.search.front_repeats - have + 1)]
    return df.loc[front, "trial_id"].tolist(), df.loc[baseline, "trial_id"].tolist(), runs


def repeats_spec(spec, runs: list[dict]):
    """The campaign the runs train in: the spec's recipe over the runs, searched as a grid, FIFO, no stages."""
    d = spec.to_dict()
    d.pop("stages", None)
    d.update(space={"variants": runs}, search={"algorithm": "grid", "seed": spec.search.seed},
             scheduler={"type": "fifo"})
    return load_campaign(d)


def run(campaign: OpenedCampaign, folder, cluster, version: str, *, concurrency=None, verbose=False,
        view=None) -> None:
    """Plan the runs (unless planned) and train those not trained yet; nothing without ``search.front_repeats``."""
    spec, exp = campaign.spec, campaign.exp
    if spec.search.front_repeats <= 1:
        return
    plan = read_plan(exp)
    if plan is None:
        plan = write_plan(exp, spec.search.front_repeats, *plan_runs(campaign))
    if not plan["runs"]:
        log.info("front_repeats: every configuration on the front has run "
                 f"{spec.search.front_repeats} times already")
        return
    log.info(f"front_repeats: {len(plan['runs'])} more run(s) of the {len(plan['front'])} trial(s) on the front and "
             f"the {len(plan.get('baseline', []))} on the baseline's, until each configuration has run "
             f"{spec.search.front_repeats} times")
    tune_dir = f"{exp}/{FRONT_REPEATS_DIR}"
    folder.mark(None)   # the campaign goes on: its end is this phase's (CampaignRun marks it)
    repeats = replace(campaign, spec=repeats_spec(spec, plan["runs"]))
    CampaignRun(repeats, folder, cluster, version, tune_dir=tune_dir).fit(
        concurrency, restoring=exists(f"{tune_dir}/tuner.pkl"), verbose=verbose, view=view)
