"""One-shot search against the default stand-alone search (ehvi under MO-ASHA) given the same compute: two real
campaigns on local Ray over bench_oneshot.py's "capacity" space (126 configurations of a d <= 128 XCiT, 1-4
blocks, on digits_clutter at 32 px), the same training recipe, objectives top-1 and GMACs.

1. The one-shot campaign: the supernet (2 DDP workers, the sandwich rule, in-place distillation), every subnet
   scored with its inherited weights, the inherited front retrained from scratch, and a control sample retrained
   under two seeds. The control sample is the diagnostic (how well inherited accuracy ranks, beside the seed
   noise): its compute is reported apart and not counted.
2. The stand-alone campaign: ehvi with MO-ASHA, the tool's default for a space of ranges and several
   objectives, given as many trials as the one-shot campaign's compute could pay for; its trials, in the order
   they started, are counted until their compute reaches the one-shot campaign's.

Compute is counted two ways:
- worker-seconds: each worker holds one CPU thread; a trial's are its epochs' seconds (training and validation)
  times its workers; scoring's are its wall time times its Ray actors (actor start-up included);
- training MACs: forward MACs x 3 (forward and backward) per image trained, forward MACs per image evaluated;
  the supernet's update trains its teacher and students (trainers.supernet.training), each at its own MACs.
The figures: the hypervolume of the one-shot campaign's retrained front over the stand-alone campaign's at equal
worker-seconds (goal >= 1.0; reference: chance top-1 and the space's largest GMACs), Kendall's tau of inherited
against stand-alone top-1 with its interval and noise floor (search.analysis.fidelity), subnets scored per
minute, and each phase's wall time.

    python benchmarks/bench_oneshot_campaign.py [--epochs 16] [--steps 60] [--supernet-epochs 32]
                                                [--supernet-lr 1e-3] [--control 8] [--storage DIR] [--analyse]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_oneshot import SPACES, _ci, _f  # noqa: E402

CHANCE_TOP1 = 10.0     # digits_clutter has 10 classes: the hypervolume counts what beats guessing
OBJECTIVES = [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}]


def common(args, storage: str, name: str) -> dict:
    return {"name": name, "model": {"name": "xcit_nano_12_p8_224", "img_size": 32, "num_classes": 10},
            "data": {"dataset": "digits_clutter", "val_fraction": 0.2},
            "train": {"epochs": args.epochs, "batch_size": 64, "lr": 1e-3, "warmup_epochs": 1, "seed": 0,
                      "max_steps_per_epoch": args.steps},
            "space": SPACES["capacity"], "objectives": OBJECTIVES,
            "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 0,
                          "max_concurrent_trials": 2},
            "storage": storage}


def oneshot_spec(args, storage: str) -> dict:
    return {**common(args, storage, "bench-oneshot"),
            "supernet": {"train": {"epochs": args.supernet_epochs, "lr": args.supernet_lr},
                         "resources": {"workers_per_trial": 2, "cpus_per_worker": 1},
                         "random_subnets": 2, "distill": True, "retrain": "front", "control": args.control},
            "search": {"algorithm": "grid", "seed": 0}}


def standalone_spec(args, storage: str, trials: int) -> dict:
    return {**common(args, storage, "bench-standalone"), "search": {"algorithm": "ehvi", "num_trials": trials, "seed": 0},
            "scheduler": {"type": "moasha"}}


def worker_seconds(record: dict, workers: int) -> float:
    return workers * sum(e.get("epoch_s", 0.0) for e in record["epochs"])


def final_top1(record: dict) -> float:
    return record["epochs"][-1]["top1"]


def trial_macs(record: dict, steps: int, batch: int, val_images: int) -> float:
    """Training MACs of a stand-alone trial: 3 x its forward MACs per image trained, 1 x per image evaluated."""
    g = record["cost"]["gmacs"] * 1e9
    return len(record["epochs"]) * g * (3 * steps * batch + val_images)


def supernet_macs(plan: dict, updates: int, seed: int, batch: int) -> float:
    from qkvsearch.trainers.supernet.training import SupernetPlan

    p = SupernetPlan.from_dict(plan)
    per_update = [p.gmacs[p.teacher] + sum(p.gmacs[i] for i in p.students(u, seed)) for u in range(updates)]
    return 3 * batch * 1e9 * float(np.sum(per_update))


def front_hv(points: list[tuple[float, float]], reference) -> float:
    from qkvsearch.search.analysis.pareto import hypervolume

    return hypervolume(np.array(points, dtype=float).reshape(-1, 2), ["max", "min"], reference) if points else 0.0


def run_oneshot(args, storage: str) -> dict:
    from qkvsearch.search.analysis.report import build_report
    from qkvsearch.search.campaign.launch import launch
    from qkvsearch.search.campaign.oneshot.phases import PLAN_FILE
    from qkvsearch.search.campaign.oneshot.plan import SUPERNET_DIR
    from qkvsearch.search.monitor.status import load_records
    from qkvsearch.search.records import inherited
    from qkvsearch.spaces import load_campaign

    exp = f"{storage}/{oneshot_spec(args, storage)['name']}"
    if not args.analyse:
        launch(load_campaign(oneshot_spec(args, storage)))
    sup = load_records(f"{exp}/{SUPERNET_DIR}")[0]
    with open(f"{exp}/{SUPERNET_DIR}/{PLAN_FILE}") as f:
        plan = json.load(f)
    evaluations = inherited.read_evaluations(exp)
    selection = inherited.read_selection(exp)
    chosen = {inherited.keys_text(k) for k in selection["chosen"]}
    by_identity = {inherited.subnet_identity(e["config"], ignore=("seed",)): inherited.keys_text(e["keys"])
                   for e in evaluations}
    records = [r for r in load_records(exp) if r.get("status") != "duplicate"]
    role = {r["trial_id"]: "chosen" if by_identity.get(inherited.subnet_identity(r["config"], ignore=("seed",)))
            in chosen else "control" for r in records}
    retrained = [r for r in records if role[r["trial_id"]] == "chosen"]
    control = [r for r in records if role[r["trial_id"]] == "control"]
    scoring_wall = max(e["evaluated_at"] for e in evaluations) - sup["ended_at"]
    actors = 2
    sup_updates = len(sup["epochs"]) * args.steps
    val = int(sup["epochs"][-1].get("val_images", 1800))
    out = {
        "exp": exp, "wall": max(r["ended_at"] for r in records) - sup["started_at"], "subnets": len(evaluations),
        "scoring_wall": scoring_wall,
        "supernet_wall": sup["ended_at"] - sup["started_at"],
        "retrain_wall": max(r["ended_at"] for r in records) - min(r["started_at"] for r in records),
        "ws": {"supernet": worker_seconds(sup, 2), "scoring": scoring_wall * actors,
               "retrain": sum(worker_seconds(r, 1) for r in retrained)},
        "control_ws": sum(worker_seconds(r, 1) for r in control),
        "macs": {"supernet": supernet_macs(plan, sup_updates, 0, 64),
                 "scoring": sum(e["cost"]["gmacs"] * 1e9 * (val + 2 * 64) for e in evaluations),
                 "retrain": sum(trial_macs(r, args.steps, 64, val) for r in retrained)},
        "front": [(final_top1(r), r["cost"]["gmacs"]) for r in retrained if r.get("status") == "completed"],
        "inherited_front": [(e["metrics"]["top1"], e["cost"]["gmacs"]) for e in evaluations
                            if inherited.keys_text(e["keys"]) in chosen],
        "full_training_ws": float(np.mean([worker_seconds(r, 1) for r in records])),
        "retrained": len(retrained), "control": len(control),
    }
    build_report(exp, static=False)
    with open(f"{exp}/report/fidelity.json") as f:
        out["fidelity"] = json.load(f)
    return out


def run_standalone(args, storage: str, budget_ws: float, full_training_ws: float) -> dict:
    from qkvsearch.search.campaign.interrupts import CampaignInterrupted
    from qkvsearch.search.campaign.launch import launch
    from qkvsearch.search.monitor.status import load_records
    from qkvsearch.spaces import load_campaign

    # MO-ASHA stops most trials after 1 or 3 of 16 epochs: room for trials at a quarter of a full training's
    # cost; the campaign is stopped (as Ctrl-C stops it) once its ended trials have spent the budget, and only
    # the trials the budget pays for, in the order they started, are counted
    spec = standalone_spec(args, storage, int(min(126, max(8, math.ceil(budget_ws / (0.25 * full_training_ws))))))
    exp = f"{storage}/{spec['name']}"
    if not args.analyse:
        done = threading.Event()
        watcher = threading.Thread(target=_stop_when_spent, args=(exp, budget_ws, done), daemon=True)
        watcher.start()
        try:
            launch(load_campaign(spec))
        except CampaignInterrupted:
            pass
        finally:
            done.set()
    records = [r for r in load_records(exp) if r.get("status") != "duplicate"]  # ordered by start
    spent, counted = 0.0, []
    for r in records:
        if spent + worker_seconds(r, 1) > budget_ws:
            break
        spent += worker_seconds(r, 1)
        counted.append(r)
    wall = max(r["ended_at"] or r["started_at"] for r in records) - records[0]["started_at"]
    val = int(next((r["epochs"][-1].get("val_images") for r in records if r["epochs"]), 1800) or 1800)
    return {"exp": exp, "wall": wall, "trials": len(records), "counted": len(counted), "ws": spent,
            "all_ws": sum(worker_seconds(r, 1) for r in records),
            "macs": sum(trial_macs(r, args.steps, 64, val) for r in counted),
            "front": [(final_top1(r), r["cost"]["gmacs"]) for r in counted if r.get("status") == "completed"],
            "all_front": [(final_top1(r), r["cost"]["gmacs"]) for r in records if r.get("status") == "completed"]}


def _stop_when_spent(exp: str, budget_ws: float, done: threading.Event) -> None:
    """SIGTERM to this process (the campaign's own stop: trials marked interrupted, Ray shut down) once the ended
    trials of ``exp`` have spent ``budget_ws``."""
    from qkvsearch.search.records.layout import FINAL_STATUSES
    from qkvsearch.search.records.readers import read_trial_records

    while not done.wait(5.0):
        try:
            records, _ = read_trial_records(exp)
        except Exception:  # noqa: BLE001 - not written yet
            continue
        if sum(worker_seconds(r, 1) for r in records if r.get("status") in FINAL_STATUSES) >= budget_ws:
            os.kill(os.getpid(), signal.SIGTERM)
            return


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=16, help="epochs of a stand-alone training")
    p.add_argument("--steps", type=int, default=60, help="updates per epoch")
    p.add_argument("--supernet-epochs", type=int, default=32)
    p.add_argument("--supernet-lr", type=float, default=1e-3,
                   help="the stand-alone recipe's (at 2e-3 the supernet stayed at chance for 6 epochs of 32)")
    p.add_argument("--control", type=int, default=8, help="control subnets, retrained under two seeds")
    p.add_argument("--storage", default=None, help="where both campaigns are written (default: a temporary folder)")
    p.add_argument("--analyse", action="store_true", help="run nothing: the table of the campaigns in --storage")
    args = p.parse_args()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")

    if args.analyse and not args.storage:
        p.error("--analyse: expected --storage, the folder both campaigns were written to")
    with tempfile.TemporaryDirectory() as tmp:
        storage = args.storage or tmp
        one = run_oneshot(args, storage)
        budget = sum(one["ws"].values())
        alone = run_standalone(args, storage, budget, one["full_training_ws"])
        from qkvsearch.search.campaign.oneshot.plan import candidates
        from qkvsearch.spaces import load_campaign

        largest = max(t["cost"]["gmacs"] for t in candidates(load_campaign(oneshot_spec(args, storage))))
        reference = [CHANCE_TOP1, largest]
        hv_one, hv_alone = front_hv(one["front"], reference), front_hv(alone["front"], reference)
        f = one["fidelity"]
        print("\n| measure | one-shot | stand-alone (ehvi, MO-ASHA) |")
        print("|---|---|---|")
        print(f"| worker-seconds counted | {budget:,.0f} (supernet {one['ws']['supernet']:,.0f}, scoring "
              f"{one['ws']['scoring']:,.0f}, retraining {one['ws']['retrain']:,.0f}) | {alone['ws']:,.0f} "
              f"({alone['counted']} of its {alone['trials']} trials; all {alone['all_ws']:,.0f}) |")
        macs_one = sum(one["macs"].values())
        print(f"| training MACs counted | {macs_one / 1e12:,.1f} T (supernet {one['macs']['supernet'] / 1e12:,.1f}, "
              f"scoring {one['macs']['scoring'] / 1e12:,.2f}, retraining {one['macs']['retrain'] / 1e12:,.1f}) | "
              f"{alone['macs'] / 1e12:,.1f} T |")
        print(f"| front (top-1 %, GMACs) | {_front(one['front'])} | {_front(alone['front'])} |")
        print(f"| hypervolume (reference: top-1 {CHANCE_TOP1}, {largest:.4f} GMACs) | {hv_one:.4f} | {hv_alone:.4f} |")
        print(f"| hypervolume, one-shot over stand-alone (goal >= 1.0) | {hv_one / hv_alone if hv_alone else float('nan'):.3f} | |")
        print(f"| stand-alone's whole campaign: hypervolume | | {front_hv(alone['all_front'], reference):.4f} |")
        print(f"| inherited front (top-1 %, GMACs) | {_front(one['inherited_front'])} | |")
        print(f"| Kendall tau, inherited vs stand-alone ({f['retrained']} subnets, {f['ranked_over']}) | "
              f"{_f(f['kendall_tau'])} {_ci(f['kendall_tau_ci95'])} | |")
        print(f"| noise floor: tau, seed 0 vs seed 1 ({f['noise_floor_pairs']} control subnets) | "
              f"{_f(f['noise_floor_tau'])} {_ci(f['noise_floor_tau_ci95'])} | |")
        print(f"| top-{f['top_k']} overlap | {_f(f['top_k_overlap'])} | |")
        print(f"| subnets scored per minute ({one['subnets']} subnets) | {60 * one['subnets'] / one['scoring_wall']:.0f} | |")
        print(f"| wall: supernet, scoring, retraining (chosen and control) | {one['supernet_wall']:.0f} s, "
              f"{one['scoring_wall']:.0f} s, {one['retrain_wall']:.0f} s | |")
        print(f"| wall: whole campaign | {one['wall']:.0f} s | {alone['wall']:.0f} s |")
        print(f"| control sample (diagnostic, not counted) | {one['control']} trainings, "
              f"{one['control_ws']:,.0f} worker-seconds | |")


def _front(points) -> str:
    from qkvsearch.search.analysis.pareto import nondominated_mask

    if not points:
        return "none"
    pts = np.array(points, dtype=float)
    keep = pts[nondominated_mask(pts, ["max", "min"])]
    return ", ".join(f"{t:.1f}/{g:.4f}" for t, g in sorted(map(tuple, keep), key=lambda x: x[1]))


if __name__ == "__main__":
    main()
