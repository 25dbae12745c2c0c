"""A one-shot campaign's driver, at launch and at every resume: each phase is done unless its records say it
is done already.

    1 supernet   the nested campaign <exp>/supernet trains it (one trial, a Ray Train DDP run) over the plan
                 written beside it (plan.json); skipped with ``supernet.from`` (that campaign's trained
                 supernet, checked to serve this space on the same data) or once it has ended
    2 scoring    search.campaign.oneshot.evaluation, until search.num_trials subnets are proposed, each under
                 the campaign's proposal rules (constraints and measured costs included)
    3 selection  the chosen subnets (the inherited front, or the top_k) and the control sample, drawn from the
                 space's feasible configurations (search.campaign.oneshot.retrain); the control subnets not
                 scored yet are scored then
    4 export     each selected subnet as a stand-alone checkpoint (search.records.inherited.subnet_file)
    5 retrain    the selected subnets as the campaign's own trials (search.campaign.oneshot.retrain), FIFO, the
                 chosen ones from their exported weights with ``retrain_from: inherited``
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import replace

from qkvsearch.search.campaign.interrupts import CampaignInterrupted
from qkvsearch.search.campaign.oneshot.evaluation import Scoring, export_subnets
from qkvsearch.search.campaign.oneshot.plan import (
    PLAN_FILE,
    SUPERNET_DIR,
    check_source,
    space_hash,
    supernet_plan,
    supernet_spec,
)
from qkvsearch.search.campaign.oneshot.retrain import init_weights, retraining, selected_records
from qkvsearch.search.campaign.oneshot.scorers import ScorerPool, pool_size
from qkvsearch.search.campaign.oneshot.targets import check_placeable, retrain_targets, score_targets
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.run import CampaignRun
from qkvsearch.search.records.inherited import FIDELITY_STANDALONE, FIDELITY_SUPERNET
from qkvsearch.search.records.layout import CAMPAIGN_FILE, CampaignFolder, read_campaign
from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.spaces.errors import BadInput
from qkvsearch.storage import exists, read_json, write_json

log = logging.getLogger(__name__)


def run(campaign: OpenedCampaign, folder, cluster, version: str, *, concurrency=None, verbose=False,
        view=None) -> None:
    """Every phase of the one-shot campaign (module docstring)."""
    spec, exp = campaign.spec, campaign.exp
    source = spec.supernet.source
    if spec.targets:
        check_placeable(spec.targets)   # before the supernet trains
    with _watched(exp, view):
        if source is None:
            supernet_dir = f"{exp}/{SUPERNET_DIR}"
            plan = _train_supernet(campaign, supernet_dir, cluster, version, verbose)
        else:
            supernet_dir = f"{source}/{SUPERNET_DIR}"
            plan = trained_plan(source, spec)
        checkpoint, teacher_cfg, supernet_id = _trained(supernet_dir)
        log.info(f"scoring subnets with the weights they inherit from {supernet_id}")
        size = pool_size(spec.resources, cluster, concurrency)
        with ScorerPool(spec, plan, checkpoint, teacher_cfg, size) as scorers:
            if spec.targets:    # each target scored, chosen and exported in its own folder
                opened = score_targets(campaign, scorers, supernet_id, version)
            else:
                chosen, records = Scoring(campaign, scorers, supernet_id, space_hash(spec)).choose()
                chosen_records, control_records = selected_records(records, chosen)
                files = export_subnets(exp, scorers, supernet_id, chosen_records + control_records)
    if spec.targets:
        retrain_targets(opened, supernet_id, cluster, version, concurrency=concurrency, verbose=verbose)
        return
    retrain_with = retraining(spec, chosen, records)
    if retrain_with is None:   # a selection of none: no campaign to run
        return
    log.info(f"retraining {len(chosen['chosen'])} chosen subnet(s) and {len(chosen['control'])} control "
             "subnet(s), these under two seeds")
    retrain = replace(campaign, spec=retrain_with)
    restoring = exists(f"{exp}/tuner.pkl")
    CampaignRun(retrain, folder, cluster, version, init_weights=init_weights(chosen, chosen_records, files),
                describe={"fidelity": FIDELITY_STANDALONE, "supernet": supernet_id}).fit(
        concurrency, restoring=restoring, verbose=verbose, view=view)


@contextmanager
def _watched(exp: str, view):
    """The view (the live line) shown the campaign's progress, its phase included (search.monitor.oneshot_phases),
    while the phases before the retraining run: the retraining's own monitor shows it from there on."""
    if view is None:
        yield
        return
    from qkvsearch.search.monitor.watch import CampaignMonitor

    with CampaignMonitor(exp, [view]):
        yield


def _train_supernet(campaign: OpenedCampaign, supernet_dir: str, cluster, version: str, verbose) -> dict:
    """Train the supernet unless trained; -> the plan it is trained over (the one written when it started: a
    campaign resumed by a later version keeps its own)."""
    if exists(f"{supernet_dir}/{CAMPAIGN_FILE}"):
        sub_folder = CampaignFolder.open(supernet_dir)
        plan = read_json(f"{supernet_dir}/{PLAN_FILE}")
        if sub_folder.campaign.ended:
            return plan
        sub = sub_folder.campaign.spec
    else:
        plan = supernet_plan(campaign.spec)
        sub = supernet_spec(campaign, plan)
        write_json(f"{supernet_dir}/{PLAN_FILE}", plan)
        sub_folder = CampaignFolder.create(supernet_dir, sub, version)
    log.info(f"training the supernet over the space: {supernet_dir}")
    try:
        CampaignRun(OpenedCampaign(sub, supernet_dir), sub_folder, cluster, version, supernet=plan,
                    describe={"fidelity": FIDELITY_SUPERNET}).fit(1, restoring=exists(f"{supernet_dir}/tuner.pkl"),
                                                                   verbose=verbose)
    except CampaignInterrupted as stop:  # what resumes is this campaign, not the nested one
        raise CampaignInterrupted(campaign.exp, stop.signal_name, stop.trials) from None
    return plan


def _trained(supernet_dir: str) -> tuple[str, dict, str]:
    """(its last checkpoint, the teacher's config it was trained with, its identity) of a trained supernet."""
    records, _ = read_trial_records(supernet_dir)
    done = [r for r in records if r.get("status") == "completed" and r.get("checkpoint_path")]
    if not done:
        raise BadInput(f"{supernet_dir}: expected a trained supernet (a completed trial with its checkpoint), "
                       f"given {', '.join(str(r.get('status')) for r in records) or 'no trial'}")
    rec = done[0]
    return rec["checkpoint_path"], rec["config"], f"{supernet_dir}:{rec['trial_id']}@epoch{len(rec['epochs'])}"


def trained_plan(source: str, spec) -> dict:
    """``supernet.from`` (``source``: the campaign folder as the spec gives it): the plan of the supernet it trained,
    checked to serve this campaign (plan.check_source). What is missing or damaged there: preflight.source_plan."""
    supernet_dir = f"{source.rstrip('/')}/{SUPERNET_DIR}"
    read_campaign(supernet_dir)  # CampaignFileError naming the file when it is no supernet campaign
    plan = read_json(f"{supernet_dir}/{PLAN_FILE}")
    check_source(source, plan, supernet_plan(spec))
    return plan
