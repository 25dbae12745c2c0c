"""One-shot search against the default stand-alone search (ehvi under MO-ASHA): real campaigns on local Ray over
the "capacity" space (bench_oneshot.py: 126 configurations of a d <= 128 XCiT, 1-4 blocks) on digits_clutter at
32 px, the recipe of spaces/presets/oneshot-digits.yaml, objectives top-1 and GMACs, repeated over seeds.

Per seed s (the search's and the training's):
1. one-shot, retrained from scratch: the supernet (2 DDP workers, the sandwich rule, in-place distillation),
   every subnet scored with its inherited weights, the 6 best by non-dominated rank of the inherited scores (the
   preset's top_k; ``--top-k 0``: the whole inherited front) retrained from scratch, and the control
   sample (drawn from the space, retrained under two seeds) that the rank figures are measured on;
2. one-shot, trained on from inherited weights: the same supernet (``supernet.from``) and scoring, the chosen
   subnets trained on from their inherited weights for a quarter of the epochs; no control sample of its own
   (the first one's is counted in its compute too);
3. stand-alone: ehvi with MO-ASHA, stopped once its ended trials spent twice the larger one-shot campaign's
   compute; its trials, in the order they started, are counted up to a budget.

Compute, counted two ways, everything a campaign ran included (the supernet, scoring, retraining and the
control sample):
- worker-seconds: a trial's epochs' seconds (training and validation) times its workers; scoring's wall time
  times its actors (as many as the campaign's pool takes from its resources and this machine: scorers.pool_size);
- training MACs: forward MACs x 3 per image trained (forward and backward), forward MACs per image evaluated; a
  supernet update trains its teacher and students, each at its own MACs.
The target: one-shot (either retraining) reaches the stand-alone search's hypervolume at half its compute, i.e.
hypervolume(one-shot at X worker-seconds) / hypervolume(stand-alone at 2X) >= 1 (reference: chance top-1 and the
space's largest GMACs). The table gives that ratio per seed and its median and range, beside the rank figures
of the control sample (search.analysis.fidelity: tau, the GMACs proxy's tau, the noise floor).

    python benchmarks/bench_oneshot_campaign.py [--seeds 3] [--epochs 6] [--steps 10] [--supernet-epochs 12]
                                                [--supernet-lr 1e-3] [--top-k 6] [--control 4] [--storage DIR]
                                                [--analyse]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
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
BATCH = 64
SIDES = ("one-shot, from scratch", "one-shot, from inherited (1/4 of the epochs)", "stand-alone at twice the compute")


def common(args, storage: str, name: str, seed: int) -> dict:
    return {"name": name, "model": {"name": "xcit_nano_12_p8_224", "img_size": 32, "num_classes": 10},
            "data": {"dataset": "digits_clutter", "val_fraction": 0.2},
            "train": {"epochs": args.epochs, "batch_size": BATCH, "lr": args.lr, "warmup_epochs": 1, "seed": seed,
                      "max_steps_per_epoch": args.steps, "checkpoint_every": args.epochs},
            "space": SPACES["capacity"], "objectives": OBJECTIVES,
            "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 0,
                          "max_concurrent_trials": 2},
            "storage": storage}


def retrain(args) -> dict:
    """Which scored subnets are retrained: the inherited front, or its k best by non-dominated rank (the preset's)."""
    return {"retrain": "top_k", "top_k": args.top_k} if args.top_k else {"retrain": "front"}


def oneshot_spec(args, storage: str, seed: int) -> dict:
    return {**common(args, storage, f"oneshot-{seed}", seed),
            "supernet": {"train": {"epochs": args.supernet_epochs, "lr": args.supernet_lr,
                                   "max_steps_per_epoch": args.steps},
                         "resources": {"workers_per_trial": 2, "cpus_per_worker": 1},
                         "random_subnets": 2, "distill": True, **retrain(args), "control": args.control},
            "search": {"algorithm": "grid", "seed": seed}}


def inherited_spec(args, storage: str, seed: int) -> dict:
    spec = common(args, storage, f"oneshot-inherited-{seed}", seed)
    spec["train"] = {**spec["train"], "epochs": max(1, args.epochs // 4), "warmup_epochs": 0,
                     "checkpoint_every": max(1, args.epochs // 4)}
    return {**spec, "supernet": {"from": f"{storage}/oneshot-{seed}", **retrain(args), "control": 0,
                                 "retrain_from": "inherited"},
            "search": {"algorithm": "grid", "seed": seed}}


def standalone_spec(args, storage: str, seed: int, trials: int) -> dict:
    return {**common(args, storage, f"standalone-{seed}", seed),
            "search": {"algorithm": "ehvi", "num_trials": trials, "seed": seed}, "scheduler": {"type": "moasha"}}


def worker_seconds(record: dict, workers: int) -> float:
    return workers * sum(e.get("epoch_s", 0.0) for e in record["epochs"])


def trial_macs(record: dict, val_images: int) -> float:
    """Training MACs of a trial: 3 x its forward MACs per image trained, 1 x per image evaluated."""
    g = record["cost"]["gmacs"] * 1e9
    return sum(g * (3 * e.get("step_images", 0) + val_images) for e in _epoch_images(record))


def _epoch_images(record: dict) -> list[dict]:
    out, step = [], 0.0
    for e in record["epochs"]:
        out.append({"step_images": (e.get("step", step) - step) * BATCH})
        step = e.get("step", step)
    return out


def supernet_macs(plan: dict, updates: int, seed: int) -> float:
    from qkvsearch.trainers.model.cost import model_cost
    from qkvsearch.trainers.supernet.plan import SupernetPlan

    p = SupernetPlan.from_dict(plan)
    teacher = model_cost(p.teacher)["gmacs"]
    per_update = [teacher + sum(model_cost(c)["gmacs"] for c in p.students(u, seed)) for u in range(updates)]
    return 3 * BATCH * 1e9 * float(np.sum(per_update))


def front_hv(points: list[tuple[float, float]], reference) -> float:
    from qkvsearch.search.analysis.pareto import hypervolume

    return hypervolume(np.array(points, dtype=float).reshape(-1, 2), ["max", "min"], reference) if points else 0.0


def _launch(spec: dict, analyse: bool) -> str:
    from qkvsearch.search.campaign.launch import launch
    from qkvsearch.spaces import load_campaign

    exp = f"{spec['storage']}/{spec['name']}"
    if not analyse:
        launch(load_campaign(spec))
    return exp


def oneshot_compute(exp: str, spec: dict, seed: int, supernet_from: str | None = None) -> dict:
    """A one-shot campaign's compute by phase, its retrained front and (with its own supernet) its fidelity."""
    from qkvsearch.search.analysis.report import build_report
    from qkvsearch.search.campaign.oneshot.plan import PLAN_FILE, SUPERNET_DIR
    from qkvsearch.search.campaign.oneshot.scorers import pool_size
    from qkvsearch.search.cluster.capacity import Cluster
    from qkvsearch.search.monitor.status import load_records
    from qkvsearch.search.records import inherited
    from qkvsearch.search.records.layout import read_campaign
    from qkvsearch.spaces import load_campaign

    sup_dir = f"{supernet_from or exp}/{SUPERNET_DIR}"
    sup = load_records(sup_dir)[0]
    plan = json.loads(Path(f"{sup_dir}/{PLAN_FILE}").read_text())
    evaluations = inherited.read_evaluations(exp)
    selection = inherited.read_selection(exp)
    chosen = {inherited.keys_text(k) for k in selection["chosen"]}
    by_identity = {inherited.subnet_identity(e["config"], ignore=("seed",)): inherited.keys_text(e["keys"])
                   for e in evaluations}
    records = [r for r in load_records(exp) if r.get("status") != "duplicate"]
    retrained = [r for r in records if by_identity.get(inherited.subnet_identity(r["config"], ignore=("seed",)))
                 in chosen]
    control = [r for r in records if r not in retrained]
    actors = pool_size(load_campaign(spec).resources, Cluster(float(os.cpu_count() or 1), 0.0, 2.0, None, True), 2)
    # scoring starts as the supernet ends, or (a supernet taken from another campaign) as this campaign starts
    start = read_campaign(exp)["created_at"] if supernet_from else sup["ended_at"]
    scoring_wall = max(e["evaluated_at"] for e in evaluations) - start
    val = int(sup["epochs"][-1].get("val_images", 1800))
    out = {"ws": {"supernet": worker_seconds(sup, 2), "scoring": scoring_wall * actors,
                  "retrain": sum(worker_seconds(r, 1) for r in retrained),
                  "control": sum(worker_seconds(r, 1) for r in control)},
           "macs": {"supernet": supernet_macs(plan, int(sup["epochs"][-1]["step"]), seed),
                    "scoring": sum(e["cost"]["gmacs"] * 1e9 * (val + 2 * BATCH) for e in evaluations),
                    "retrain": sum(trial_macs(r, val) for r in retrained),
                    "control": sum(trial_macs(r, val) for r in control)},
           "front": [(r["epochs"][-1]["top1"], r["cost"]["gmacs"]) for r in retrained
                     if r.get("status") == "completed"],
           "walls": {"supernet": sup["ended_at"] - sup["started_at"], "scoring": scoring_wall,
                     "retrain": max(r["ended_at"] for r in records) - min(r["started_at"] for r in records)},
           "subnets": len(evaluations), "trainings": len(retrained), "control_trainings": len(control)}
    if supernet_from is None:
        build_report(exp, static=False)
        out["fidelity"] = json.loads(Path(f"{exp}/report/fidelity.json").read_text())
    return out


def run_standalone(args, storage: str, seed: int, budget_ws: float, full_training_ws: float) -> dict:
    """The stand-alone campaign, stopped (as Ctrl-C stops it) once its ended trials have spent ``budget_ws``;
    -> its trials in the order they started (status, worker-seconds, MACs, final top-1, GMACs)."""
    from qkvsearch.search.monitor.status import load_records

    # MO-ASHA stops most trials after a rung or two: room for trials at a third of a full training's cost
    spec = standalone_spec(args, storage, seed, int(min(126, max(8, math.ceil(budget_ws / (full_training_ws / 3))))))
    exp = launch_until_spent(spec, budget_ws, args.analyse)
    records = [r for r in load_records(exp) if r.get("status") != "duplicate"]  # ordered by start
    val = int(next((r["epochs"][-1].get("val_images") for r in records if r["epochs"]), 1800) or 1800)
    return {"trials": [{"ws": worker_seconds(r, 1), "macs": trial_macs(r, val),
                        "point": (r["epochs"][-1]["top1"], r["cost"]["gmacs"]) if r.get("status") == "completed"
                        else None} for r in records]}


def launch_until_spent(spec: dict, budget_ws: float, analyse: bool) -> str:
    """Launch ``spec`` (unless ``analyse``) and stop it, as Ctrl-C stops it, once its ended trials have spent
    ``budget_ws``; -> its folder."""
    from qkvsearch.search.campaign.interrupts import CampaignInterrupted

    exp = f"{spec['storage']}/{spec['name']}"
    if not analyse:
        done = threading.Event()
        watcher = threading.Thread(target=_stop_when_spent, args=(exp, budget_ws, done), daemon=True)
        watcher.start()
        try:
            _launch(spec, False)
        except CampaignInterrupted:
            pass
        finally:
            done.set()
    return exp


def standalone_at(alone: dict, budget_ws: float) -> dict:
    """The stand-alone campaign's trials its first ``budget_ws`` worker-seconds paid for."""
    spent, macs, front = 0.0, 0.0, []
    for t in alone["trials"]:
        if spent + t["ws"] > budget_ws:
            break
        spent, macs = spent + t["ws"], macs + t["macs"]
        if t["point"] is not None:
            front.append(t["point"])
    return {"ws": spent, "macs": macs, "front": front}


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


def one_seed(args, storage: str, seed: int, reference) -> dict:
    a = oneshot_spec(args, storage, seed)
    one = oneshot_compute(_launch(a, args.analyse), a, seed)
    b = inherited_spec(args, storage, seed)
    two = oneshot_compute(_launch(b, args.analyse), b, seed, supernet_from=f"{storage}/oneshot-{seed}")
    two["ws"] |= {"supernet": one["ws"]["supernet"], "control": one["ws"]["control"]}     # its supernet and
    two["macs"] |= {"supernet": one["macs"]["supernet"], "control": one["macs"]["control"]}  # control: the first's
    totals = [sum(one["ws"].values()), sum(two["ws"].values())]
    full = statistics.mean(worker_seconds(r, 1) for r in _records(f"{storage}/oneshot-{seed}"))
    alone = run_standalone(args, storage, seed, 2 * max(totals), full)
    out = {"seed": seed, "fidelity": one["fidelity"], "sides": []}
    for side, total in zip((one, two), totals):
        twice, once = standalone_at(alone, 2 * total), standalone_at(alone, total)
        hv, hv_alone = front_hv(side["front"], reference), front_hv(twice["front"], reference)
        hv_equal = front_hv(once["front"], reference)   # the stand-alone search at the same compute
        out["sides"].append({"ws": total, "macs": sum(side["macs"].values()), "hv": hv, "alone_ws": twice["ws"],
                             "alone_macs": twice["macs"], "hv_alone": hv_alone,
                             "ratio": hv / hv_alone if hv_alone else math.nan, "phases": side["ws"],
                             "hv_equal": hv_equal, "ratio_equal": hv / hv_equal if hv_equal else math.nan,
                             "walls": side["walls"], "trainings": side["trainings"]})
    out["control_trainings"] = one["control_trainings"]
    return out


def _records(exp: str) -> list[dict]:
    from qkvsearch.search.monitor.status import load_records

    return [r for r in load_records(exp) if r.get("status") == "completed"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=6, help="epochs of a stand-alone training")
    p.add_argument("--steps", type=int, default=10, help="updates per epoch")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--supernet-epochs", type=int, default=12)
    p.add_argument("--supernet-lr", type=float, default=1e-3, help="at 2e-3 the supernet stays at chance")
    p.add_argument("--top-k", type=int, default=6, help="subnets retrained: the k best of the inherited scores "
                   "by non-dominated rank (0: the whole inherited front)")
    p.add_argument("--control", type=int, default=4, help="control subnets, retrained under two seeds")
    p.add_argument("--storage", default=None, help="where the campaigns are written (default: a temporary folder)")
    p.add_argument("--analyse", action="store_true", help="run nothing: the table of the campaigns in --storage")
    args = p.parse_args()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if args.analyse and not args.storage:
        p.error("--analyse: expected --storage, the folder the campaigns were written to")
    from qkvsearch.search.campaign.oneshot.plan import candidates
    from qkvsearch.spaces import load_campaign

    with tempfile.TemporaryDirectory() as tmp:
        storage = args.storage or tmp
        largest = max(t["cost"]["gmacs"] for t in candidates(load_campaign(oneshot_spec(args, storage, 0))))
        reference = [CHANCE_TOP1, largest]
        seeds = [one_seed(args, storage, s, reference) for s in range(args.seeds)]
    print_table(seeds, reference)


def print_table(seeds: list[dict], reference) -> None:
    print(f"\nreference: top-1 {CHANCE_TOP1}, {reference[1]:.4f} GMACs; {len(seeds)} seeds\n")
    print("| seed | side | worker-seconds | training MACs (T) | hypervolume | stand-alone at 2x: worker-seconds, "
          "hypervolume | ratio (goal >= 1) | stand-alone at 1x: hypervolume, ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for s in seeds:
        for name, side in zip(SIDES, s["sides"]):
            print(f"| {s['seed']} | {name} | {side['ws']:,.0f} | {side['macs'] / 1e12:.1f} | {side['hv']:.4f} | "
                  f"{side['alone_ws']:,.0f}, {side['hv_alone']:.4f} | {side['ratio']:.3f} | "
                  f"{side['hv_equal']:.4f}, {side['ratio_equal']:.3f} |")
    print("\n| side | ratio to stand-alone at 2x, median [min, max] over seeds | at 1x |\n|---|---|---|")
    for i, name in enumerate(SIDES[:2]):
        spread = []
        for key in ("ratio", "ratio_equal"):
            r = [s["sides"][i][key] for s in seeds]
            spread.append(f"{statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}]")
        print(f"| {name} | {spread[0]} | {spread[1]} |")
    print("\n| seed | Kendall tau, control (inherited vs stand-alone) | GMACs proxy tau | noise floor tau | "
          "inherited vs proxy | phases (worker-seconds: supernet, scoring, retraining, control) |")
    print("|---|---|---|---|---|---|")
    for s in seeds:
        f, ph = s["fidelity"], s["sides"][0]["phases"]
        print(f"| {s['seed']} | {_f(f['control_kendall_tau'])} {_ci(f['control_kendall_tau_ci95'])} | "
              f"{_f(f['proxy_gmacs_tau'])} {_ci(f['proxy_gmacs_tau_ci95'])} | {_f(f['noise_floor_tau'])} "
              f"{_ci(f['noise_floor_tau_ci95'])} | {f['verdict_vs_proxy']} | {ph['supernet']:,.0f}, "
              f"{ph['scoring']:,.0f}, {ph['retrain']:,.0f}, {ph['control']:,.0f} |")


if __name__ == "__main__":
    main()
