"""A one-shot campaign's driver, at launch and at every resume: each phase is done unless its records say it
is done already.

    1 supernet   the nested campaign <exp>/supernet trains it (one trial, a Ray Train DDP run); skipped with
                 ``supernet.from`` (that campaign's trained supernet) or once it has ended
    2 scoring    search.campaign.oneshot.evaluation, until search.num_trials subnets are scored
    3 export     each selected subnet as a stand-alone checkpoint (search.records.inherited.subnet_file)
    4 retrain    the selected subnets as the campaign's own trials (search.campaign.oneshot.retrain), the
                 chosen ones from their exported weights with ``retrain_from: inherited``
"""
from __future__ import annotations

import logging

from qkvsearch.search.campaign.oneshot.evaluation import ScorerPool, evaluate, export_subnets
from qkvsearch.search.campaign.oneshot.plan import (
    SUPERNET_DIR,
    candidates,
    space_hash,
    supernet_plan,
    supernet_spec,
)
from qkvsearch.search.campaign.oneshot.retrain import init_weights, retrain_spec, selected_records, selection
from qkvsearch.search.campaign.run import CampaignRun
from qkvsearch.search.records.inherited import FIDELITY_STANDALONE, FIDELITY_SUPERNET
from qkvsearch.search.records.layout import CAMPAIGN_FILE, CampaignFolder, read_campaign
from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.spaces.errors import BadInput
from qkvsearch.storage import exists, read_json, write_json

log = logging.getLogger(__name__)
PLAN_FILE = "plan.json"   # <exp>/supernet/plan.json: what the supernet was trained over (``supernet.from``)


def run(spec, exp: str, folder, cluster, version: str, *, concurrency=None, verbose=False, view=None) -> None:
    """Every phase of the one-shot campaign at ``exp`` (module docstring)."""
    trials = candidates(spec)
    source = spec.supernet.source
    if source is None:
        plan = supernet_plan(spec, trials)
        supernet_dir = f"{exp}/{SUPERNET_DIR}"
        _train_supernet(spec, exp, supernet_dir, trials, plan, cluster, version, verbose)
    else:
        supernet_dir = f"{source}/{SUPERNET_DIR}"
        plan = _trained_plan(supernet_dir, trials)
    checkpoint, teacher_cfg, supernet_id = _trained(supernet_dir)
    log.info(f"scoring subnets with the weights they inherit from {supernet_id}")
    actors = max(1, int(cluster.cpus // max(spec.resources.cpus_per_worker, 1e-9)))
    with ScorerPool(spec, plan, checkpoint, teacher_cfg, min(actors, 4 * max(1, concurrency or 1))) as scorers:
        records = evaluate(spec, exp, scorers, supernet_id, space_hash(spec))
        chosen = selection(spec, exp, records)
        chosen_records, control_records = selected_records(records, chosen)
        files = export_subnets(exp, scorers, supernet_id, chosen_records + control_records)
    log.info(f"retraining {len(chosen['chosen'])} chosen subnet(s) and {len(chosen['control'])} control "
             "subnet(s), these under two seeds")
    retrain = retrain_spec(spec, chosen)
    restoring = exists(f"{exp}/tuner.pkl")
    CampaignRun(retrain, exp, folder, cluster, version, init_weights=init_weights(chosen, chosen_records, files),
                describe={"fidelity": FIDELITY_STANDALONE, "supernet": supernet_id}).fit(
        concurrency, restoring=restoring, verbose=verbose, view=view)


def _train_supernet(spec, exp: str, supernet_dir: str, trials, plan: dict, cluster, version: str, verbose) -> None:
    if exists(f"{supernet_dir}/{CAMPAIGN_FILE}"):
        sub_folder = CampaignFolder.open(supernet_dir)
        if sub_folder.campaign.ended:
            return
        sub = sub_folder.campaign.spec
    else:
        sub = supernet_spec(spec, exp, trials, plan)
        write_json(f"{supernet_dir}/{PLAN_FILE}", plan)
        sub_folder = CampaignFolder.create(supernet_dir, sub, version)
    log.info(f"training the supernet over {len(trials)} configuration(s): {supernet_dir}")
    CampaignRun(sub, supernet_dir, sub_folder, cluster, version, supernet=plan, describe={"fidelity": FIDELITY_SUPERNET}).fit(
        1, restoring=exists(f"{supernet_dir}/tuner.pkl"), verbose=verbose)


def _trained(supernet_dir: str) -> tuple[str, dict, str]:
    """(its last checkpoint, the teacher's config it was trained with, its identity) of a trained supernet."""
    records, _ = read_trial_records(supernet_dir)
    done = [r for r in records if r.get("status") == "completed" and r.get("checkpoint_path")]
    if not done:
        raise BadInput(f"{supernet_dir}: expected a trained supernet (a completed trial with its checkpoint), "
                       f"given {', '.join(str(r.get('status')) for r in records) or 'no trial'}")
    rec = done[0]
    return rec["checkpoint_path"], rec["config"], f"{supernet_dir}:{rec['trial_id']}@epoch{len(rec['epochs'])}"


def _trained_plan(supernet_dir: str, trials) -> dict:
    """``supernet.from``: that supernet's plan, checked to hold this campaign's widest configurations."""
    from qkvsearch.trainers.supernet.weights import Supernet, widest

    read_campaign(supernet_dir)  # CampaignFileError naming the file when it is no supernet campaign
    plan = read_json(f"{supernet_dir}/{PLAN_FILE}")
    supernet = Supernet(plan["configs"], init=False)
    for cfg in widest([t["config"] for t in trials]):
        why = supernet.serves(cfg)
        if why:
            raise BadInput(f"supernet.from: expected a supernet whose space holds this campaign's, given "
                           f"{supernet_dir}, which cannot run {cfg.get('embedding')} ({why})")
    return plan
