"""One supernet for K = 3 deployment targets against K stand-alone searches (ehvi under MO-ASHA), real campaigns on
local Ray over the "capacity" space (bench_oneshot.py: 126 configurations of a d <= 128 XCiT, 1-4 blocks) with the
q/k/v linears in fp or int8, on digits_clutter at 32 px, the recipe of bench_oneshot_campaign.py.

The targets, all on this CPU (their bounds derived from the space's own measured spread, see ``bounds``):
- ``latency-loose``: fp32, latency_ms at most the space's 75th percentile; objectives top-1 and latency;
- ``latency-tight``: fp32, latency_ms at most its 35th percentile; the same objectives;
- ``size-int8``: int8 dynamic q/k/v, size_mb at most its median; objectives top-1 under the policy and size.

1. one-shot: one campaign with a ``targets`` list: the supernet (2 DDP workers, the sandwich rule, in-place
   distillation) trained once, then per target its scoring (``--score`` subnets, latencies measured until
   ``--predict-after`` shapes, then predicted and the chosen measured for real), its ``--top-k`` best retrained
   from scratch and a control sample of ``--control`` subnets retrained under two seeds;
2. stand-alone, per target: ehvi with MO-ASHA over that target's space under its constraints and objectives,
   stopped once its ended trials spent its share of twice the one-shot campaign's compute (so the one-shot side
   spends at most half of the K stand-alone searches together).

Each retrained or stand-alone training is the same recipe (``--epochs`` x ``--steps`` updates of 64 images):
each target's search has the same retraining budget per model. Compute, everything each side ran included:
worker-seconds (a trial's epochs' seconds times its workers; scoring's wall time, its measurements included,
times its actors) and training MACs (3 x forward MACs per image trained, 1 x per image evaluated; a supernet
update trains its teacher and students, each at its own MACs). Per target: the hypervolume of the front of
trained models that meet its constraints (reference: chance top-1 and its own bound), one-shot's over the
stand-alone search's. Target: every ratio >= 0.98 at one-shot's total <= half of the stand-alone total.

    python benchmarks/bench_targets.py [--epochs 6] [--steps 10] [--supernet-epochs 8] [--score 30]
                                       [--top-k 2] [--control 1] [--predict-after 12] [--storage DIR] [--analyse]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_oneshot import SPACES  # noqa: E402
from bench_oneshot_campaign import (  # noqa: E402
    BATCH,
    CHANCE_TOP1,
    _launch,
    front_hv,
    launch_until_spent,
    supernet_macs,
    trial_macs,
    worker_seconds,
)

SPACE = {**SPACES["capacity"], "quant_qkv": {"choice": ["fp", "int8_dynamic"]}}
MEASURE = {"batch": 16, "latency_batch": 1, "max_s": 0.3}


def common(args, storage: str, name: str) -> dict:
    return {"name": name, "model": {"name": "xcit_nano_12_p8_224", "img_size": 32, "num_classes": 10},
            "data": {"dataset": "digits_clutter", "val_fraction": 0.2},
            "train": {"epochs": args.epochs, "batch_size": BATCH, "lr": args.lr, "warmup_epochs": 1, "seed": 0,
                      "max_steps_per_epoch": args.steps, "checkpoint_every": args.epochs},
            "space": SPACE, "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
            "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 0,
                          "max_concurrent_trials": 2},
            "measure": {**MEASURE, "predict_after": args.predict_after}, "storage": storage}


def bounds(args, storage: str) -> dict:
    """The targets' bounds from the space's own spread: latency of 16 subnets drawn from the space (fp32), measured
    as the campaigns measure, and the counted size of every int8 subnet (its int8 q/k/v stored at 1 byte)."""
    from qkvsearch.search.campaign.oneshot.plan import candidates
    from qkvsearch.spaces import load_campaign
    from qkvsearch.spaces.keys import fill
    from qkvsearch.trainers.deploy.measure import cached_measure

    every = candidates(load_campaign(common(args, storage, "bounds")))
    fp = [t for t in every if t["keys"].get("quant_qkv") == "fp"]
    rng = np.random.default_rng(0)
    drawn = [fp[i] for i in rng.choice(len(fp), size=min(16, len(fp)), replace=False)]
    lat = [cached_measure(fill(t["config"]), f"{storage}/bounds-cache", metrics=("latency_ms",),
                          batch=MEASURE["batch"], latency_batch=1, max_s=MEASURE["max_s"])[0]["latency_ms"]
           for t in drawn]
    size = [cached_measure(fill(t["config"]), f"{storage}/bounds-cache", metrics=("size_mb",))[0]["size_mb"]
            for t in every if t["keys"].get("quant_qkv") == "int8_dynamic"]
    return {"latency_loose": float(np.percentile(lat, 75)), "latency_tight": float(np.percentile(lat, 35)),
            "size": float(np.median(size))}


def targets(b: dict) -> list[dict]:
    latency = [{"metric": "top1", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}]
    return [{"name": "latency-loose", "precisions": ["fp"], "constraints": {"latency_ms": {"max": b["latency_loose"]}},
             "objectives": latency, "retrain": True},
            {"name": "latency-tight", "precisions": ["fp"], "constraints": {"latency_ms": {"max": b["latency_tight"]}},
             "objectives": latency, "retrain": True},
            {"name": "size-int8", "precisions": ["int8_dynamic"], "constraints": {"size_mb": {"max": b["size"]}},
             "objectives": [{"metric": "top1_q", "mode": "max"}, {"metric": "size_mb", "mode": "min"}],
             "retrain": True}]


def oneshot_spec(args, storage: str, b: dict) -> dict:
    return {**common(args, storage, "targets"),
            "supernet": {"train": {"epochs": args.supernet_epochs, "lr": args.supernet_lr,
                                   "max_steps_per_epoch": args.steps},
                         "resources": {"workers_per_trial": 2, "cpus_per_worker": 1},
                         "random_subnets": 2, "distill": True, "retrain": "top_k", "top_k": args.top_k,
                         "control": args.control},
            "search": {"algorithm": "ehvi", "num_trials": args.score, "seed": 0}, "targets": targets(b)}


def standalone_spec(args, storage: str, target: dict, trials: int) -> dict:
    spec = common(args, storage, f"standalone-{target['name']}")
    space = {**SPACE, "quant_qkv": target["precisions"][0]}
    return {**spec, "space": space, "objectives": target["objectives"], "constraints": target["constraints"],
            "search": {"algorithm": "ehvi", "num_trials": trials, "seed": 0}, "scheduler": {"type": "moasha"}}


def _records(exp: str) -> list[dict]:
    from qkvsearch.search.monitor.status import load_records
    from qkvsearch.search.records.layout import CampaignFileError

    try:
        return [r for r in load_records(exp) if r.get("status") != "duplicate"]
    except (FileNotFoundError, OSError, CampaignFileError):   # not run (yet)
        return []


def _value(record: dict, metric: str):
    last = record["epochs"][-1] if record.get("epochs") else {}
    value = record.get("metrics", {}).get(metric, last.get(metric, record.get(metric)))
    return record["cost"].get(metric) if value is None else value


def _front(records: list[dict], target: dict) -> list[tuple[float, float]]:
    """(accuracy, cost) of the completed trainings that meet the target's constraints."""
    from qkvsearch.spaces.schema import Constraint, violations

    acc, cost = (o["metric"] for o in target["objectives"])
    constraints = [Constraint(m, v.get("max"), v.get("min")) for m, v in target["constraints"].items()]
    out = []
    for r in records:
        a, c = _value(r, acc), r["cost"].get(cost)
        if (r.get("status") == "completed" and a is not None and c is not None
                and not violations(constraints, r["cost"])):
            out.append((float(a), float(c)))
    return out


def oneshot_side(exp: str, spec: dict) -> dict:
    """The one-shot campaign's compute by phase, and each target's front of retrained chosen subnets (costs: their
    measured ones, from the target's evaluations)."""
    from qkvsearch.search.campaign.oneshot.plan import PLAN_FILE, SUPERNET_DIR
    from qkvsearch.search.campaign.oneshot.scorers import pool_size
    from qkvsearch.search.cluster.capacity import Cluster
    from qkvsearch.search.records import inherited
    from qkvsearch.spaces import load_campaign

    sup = _records(f"{exp}/{SUPERNET_DIR}")[0]
    plan = json.loads(Path(f"{exp}/{SUPERNET_DIR}/{PLAN_FILE}").read_text())
    val = int(sup["epochs"][-1].get("val_images", 1800))
    actors = pool_size(load_campaign(spec).resources, Cluster(float(os.cpu_count() or 1), 0.0, 2.0, None, True), 2)
    ws = {"supernet": worker_seconds(sup, 2), "scoring": 0.0, "retrain": 0.0, "control": 0.0}
    macs = {"supernet": supernet_macs(plan, int(sup["epochs"][-1]["step"]), 0), "scoring": 0.0, "retrain": 0.0,
            "control": 0.0}
    fronts, evaluated, scored = {}, [], 0
    for target in spec["targets"]:
        folder = inherited.target_dir(exp, target["name"])
        evaluations = inherited.read_evaluations(folder)
        evaluated += [e["evaluated_at"] for e in evaluations]
        scored += sum(1 for e in evaluations if not e.get("scored_in"))
        macs["scoring"] += sum(e["cost"]["gmacs"] * 1e9 * (val + 2 * BATCH) for e in evaluations
                               if not e.get("scored_in"))
        chosen = {inherited.keys_text(k) for k in inherited.read_selection(folder)["chosen"]}
        by_identity = {inherited.subnet_identity(e["config"], ignore=("seed",)): e for e in evaluations}
        trials = _records(folder)
        retrained, control = [], []
        for r in trials:
            e = by_identity.get(inherited.subnet_identity(r["config"], ignore=("seed",)))
            (retrained if e is not None and inherited.keys_text(e["keys"]) in chosen else control).append((r, e))
        for part, rs in (("retrain", retrained), ("control", control)):
            ws[part] += sum(worker_seconds(r, 1) for r, _ in rs)
            macs[part] += sum(trial_macs(r, val) for r, _ in rs)
        fronts[target["name"]] = _front([{**r, "cost": {**r["cost"], **e["cost"]}} for r, e in retrained], target)
    ws["scoring"] = (max(evaluated) - sup["ended_at"]) * actors
    return {"ws": ws, "macs": macs, "fronts": fronts, "scored": scored}


def run_standalone(args, storage: str, target: dict, budget_ws: float, full_ws: float) -> dict:
    """A target's stand-alone search, stopped once its ended trials spent ``budget_ws``."""
    trials = int(min(126, max(8, math.ceil(budget_ws / (full_ws / 3)))))   # MO-ASHA stops most after a rung
    records = _records(launch_until_spent(standalone_spec(args, storage, target, trials), budget_ws, args.analyse))
    val = int(next((r["epochs"][-1].get("val_images") for r in records if r["epochs"]), 1800) or 1800)
    ended = [r for r in records if r.get("epochs")]
    return {"ws": sum(worker_seconds(r, 1) for r in ended), "macs": sum(trial_macs(r, val) for r in ended),
            "front": _front(records, target), "trials": len(ended)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=6, help="epochs of a stand-alone training (and a retraining)")
    p.add_argument("--steps", type=int, default=10, help="updates per epoch")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--supernet-epochs", type=int, default=8)
    p.add_argument("--supernet-lr", type=float, default=1e-3)
    p.add_argument("--score", type=int, default=30, help="subnets each target's search scores")
    p.add_argument("--top-k", type=int, default=2, help="subnets each target retrains")
    p.add_argument("--control", type=int, default=1, help="control subnets per target, retrained under two seeds")
    p.add_argument("--predict-after", type=int, default=12, help="shapes measured per target before predicting")
    p.add_argument("--storage", default=None, help="where the campaigns are written (default: a temporary folder)")
    p.add_argument("--analyse", action="store_true", help="run nothing: the table of the campaigns in --storage")
    args = p.parse_args()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("QKVSEARCH_RAY_RESOURCES", "{}")
    if args.analyse and not args.storage:
        p.error("--analyse: expected --storage, the folder the campaigns were written to")
    with tempfile.TemporaryDirectory() as tmp:
        storage = args.storage or tmp
        bounds_file = Path(storage) / "bounds.json"
        if not bounds_file.exists():
            bounds_file.parent.mkdir(parents=True, exist_ok=True)
            bounds_file.write_text(json.dumps(bounds(args, storage)))
        b = json.loads(bounds_file.read_text())
        spec = oneshot_spec(args, storage, b)
        one = oneshot_side(_launch(spec, args.analyse), spec)
        total = sum(one["ws"].values())
        full = np.mean([worker_seconds(r, 1) for t in spec["targets"]
                        for r in _records(f"{storage}/targets/targets/{t['name']}") if r.get("status") == "completed"])
        share = 2 * total / len(spec["targets"])   # each stand-alone search: its share of twice one-shot's compute
        alone = {t["name"]: run_standalone(args, storage, t, share, float(full)) for t in spec["targets"]}
    print_table(spec, b, one, alone)


def print_table(spec: dict, b: dict, one: dict, alone: dict) -> None:
    total_ws, total_macs = sum(one["ws"].values()), sum(one["macs"].values())
    alone_ws, alone_macs = sum(a["ws"] for a in alone.values()), sum(a["macs"] for a in alone.values())
    print(f"\nbounds: latency {b['latency_loose']:.3f} / {b['latency_tight']:.3f} ms, size {b['size']:.3f} MB; "
          f"{one['scored']} subnets scored in all")
    print("one-shot phases (worker-seconds): " + ", ".join(f"{k} {v:,.0f}" for k, v in one["ws"].items()))
    print("\n| side | worker-seconds | training MACs (T) |\n|---|---|---|")
    print(f"| one-shot, {len(alone)} targets | {total_ws:,.0f} | {total_macs / 1e12:.1f} |")
    print(f"| {len(alone)} stand-alone searches | {alone_ws:,.0f} | {alone_macs / 1e12:.1f} |")
    print(f"| ratio (goal <= 0.5) | {total_ws / alone_ws:.3f} | {total_macs / alone_macs:.3f} |")
    print("\n| target | reference | one-shot: retrained feasible, hypervolume | stand-alone: trials, feasible "
          "completed, hypervolume | ratio (goal >= 0.98) |\n|---|---|---|---|---|")
    for t in spec["targets"]:
        bound = next(iter(t["constraints"].values()))["max"]
        ref = [CHANCE_TOP1, bound]
        hv, hv_alone = front_hv(one["fronts"][t["name"]], ref), front_hv(alone[t["name"]]["front"], ref)
        print(f"| {t['name']} | top-1 {CHANCE_TOP1:g}, {bound:.3f} | {len(one['fronts'][t['name']])}, {hv:.4f} | "
              f"{alone[t['name']]['trials']}, {len(alone[t['name']]['front'])}, {hv_alone:.4f} | "
              f"{hv / hv_alone if hv_alone else math.nan:.3f} |")


if __name__ == "__main__":
    main()
