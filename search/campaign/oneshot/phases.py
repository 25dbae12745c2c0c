"""A one-shot campaign's driver, at launch and at every resume: each phase is done unless its records say it
is done already. The campaign's targets (search.campaign.oneshot.targets: each deployment target, or the campaign
itself when it has none) share the supernet; each has the phases after it in its own folder.

    1 supernet   the nested campaign <exp>/supernet trains it (one trial, a Ray Train DDP run) over the plan
                 written beside it (plan.json); skipped with ``supernet.from`` (that campaign's trained
                 supernet, checked to serve this space on the same data) or once it has ended
    then, for each target, one after the other (search.campaign.oneshot.evaluation.score_target):
    2 scoring    until search.num_trials subnets are proposed, each under the target's proposal rules
                 (constraints and measured costs included)
    3 selection  the chosen subnets (the inherited front, or the top_k) and the control sample, drawn from the
                 space's feasible configurations (search.campaign.oneshot.retrain); the control subnets not
                 scored yet are scored then
    4 export     each selected subnet as a stand-alone checkpoint (search.records.inherited.subnet_file)
    and, for each target that retrains (the campaign itself always does):
    5 retrain    the selected subnets as the target folder's trials (search.campaign.oneshot.retrain), FIFO, the
                 chosen ones from their exported weights with ``retrain_from: inherited``

The live view shows the campaign's progress throughout: its phases up to the retraining, then each retraining.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager

from qkvsearch.search.campaign.interrupts import CampaignInterrupted
from qkvsearch.search.campaign.oneshot.evaluation import learn_scores, score_target
from qkvsearch.search.campaign.oneshot.plan import (
    PLAN_FILE,
    SUPERNET_DIR,
    check_source,
    supernet_plan,
    supernet_spec,
)
from qkvsearch.search.campaign.oneshot.retrain import retrain
from qkvsearch.search.campaign.oneshot.scorers import ScorerPool, pool_size
from qkvsearch.search.campaign.oneshot.targets import campaign_targets, check_placeable
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.run import CampaignRun
from qkvsearch.search.records import inherited
from qkvsearch.search.records.inherited import FIDELITY_SUPERNET
from qkvsearch.search.records.layout import CAMPAIGN_FILE, CampaignFolder, read_campaign
from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.spaces.errors import BadInput
from qkvsearch.storage import exists, read_json, write_json

log = logging.getLogger(__name__)


def run(campaign: OpenedCampaign, folder, cluster, version: str, *, concurrency=None, verbose=False,
        view=None) -> None:
    """Every phase of the one-shot campaign (module docstring); folder: the campaign's own campaign file."""
    spec, exp = campaign.spec, campaign.exp
    check_placeable(spec.targets)   # before the supernet trains
    try:
        with _watched(exp, view):
            if spec.supernet.source is None:
                supernet_dir = f"{exp}/{SUPERNET_DIR}"
                plan = _train_supernet(campaign, supernet_dir, cluster, version, verbose)
            else:
                supernet_dir = f"{spec.supernet.source}/{SUPERNET_DIR}"
                plan = trained_plan(spec.supernet.source, spec)
            checkpoint, teacher_cfg, supernet_id = _trained(supernet_dir)
            targets = campaign_targets(campaign, folder, version)
            known: dict = {}   # scores any target recorded, which the others take
            for target in targets:
                learn_scores(known, inherited.read_evaluations(target.campaign.exp), target.campaign.exp)
            with ScorerPool(spec, plan, checkpoint, teacher_cfg, pool_size(spec.resources, cluster, concurrency)) \
                    as scorers:
                for target in targets:
                    score_target(target, scorers, supernet_id, known)
        for target in targets:
            if target.retrains:
                retrain(target, supernet_id, cluster, version, concurrency=concurrency, verbose=verbose, view=view)
    except CampaignInterrupted as stop:   # what resumes is this campaign, not the nested one stopped
        if stop.exp == exp:
            raise
        raise CampaignInterrupted(exp, stop.signal_name, stop.trials) from None


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
    CampaignRun(OpenedCampaign(sub, supernet_dir), sub_folder, cluster, version, supernet=plan,
                describe={"fidelity": FIDELITY_SUPERNET}).fit(1, restoring=exists(f"{supernet_dir}/tuner.pkl"),
                                                               verbose=verbose)
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
