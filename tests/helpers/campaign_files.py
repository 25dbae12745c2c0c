"""Campaign folders written the way the campaign layer writes them, without training: a spec and trial
records of every status, with realistic epochs (metrics rise with the epoch)."""
import hashlib
import json
import os

import numpy as np

from qkvsearch.search.records.epochs_csv import epochs_csv
from qkvsearch.search.records.layout import EPOCHS_SUFFIX

STATUSES = ("pending", "running", "completed", "stopped_early", "diverged", "failed", "infeasible")
# (embedding, requested hidden_width, resolved width, code_size, params_m, gmacs) for XCiT-N12 at 224
VARIANTS = [
    ("linear", None, 0, None, 3.05, 0.55),
    ("sne", None, 64, None, 3.07, 0.56),
    ("psne", 96, 96, None, 3.06, 0.57),
    ("fsne", None, 128, 8, 2.87, 0.52),
    ("fsne", "match", 160, 16, 3.05, 0.55),
    ("fsne", 0.5, 64, 8, 2.45, 0.47),
]
SPEC = {
    "model": {"model": "xcit_nano_12_p16_224", "num_classes": 10, "img_size": 32},
    "data": {"dataset": "cifar10", "data_path": None},
    "train": {"epochs": 6, "batch_size": 128, "lr": 5e-4},
    "space": {"embedding": {"choice": ["linear", "sne", "psne", "fsne"]}},
    "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"},
                   {"metric": "params_m", "mode": "min"}],
    "constraints": {"params_m": {"max": 3.2}},
    "search": {"algorithm": "random", "num_samples": 14},
    "scheduler": {"name": "fifo"},
    "resources": {"workers_per_trial": 1},
    "storage": "results",
}


def atomic_json(path, obj):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def synthetic_record(i, status, *, rng, epochs_planned=6, campaign="synth", t0=1_700_000_000.0, size="S",
                     overrides=None):
    """One trial record as the campaign layer writes it; metrics rise with the epoch."""
    emb, width_req, width, code, params_m, gmacs = VARIANTS[i % len(VARIANTS)]
    scale = {"S": 1.0, "M": 2.2, "L": 8.5}[size]
    params_m, gmacs = params_m * scale + 0.01 * (i % 7), gmacs * scale + 0.003 * (i % 5)
    config = {"model": "xcit_nano_12_p16_224", "embedding": emb, "hidden_width": width_req, "width": width,
              "activation": "relu", "num_classes": 10, "img_size": 32, "dataset": "cifar10",
              "epochs": epochs_planned, "batch_size": 128, "lr": float(rng.choice([3e-4, 5e-4, 1e-3])),
              "seed": i, "deterministic": False, "tags": ["x", i]}
    if emb == "fsne":
        config.update(code_size=code, code_sharing="shared" if i % 2 else "per_block")
    config.update(overrides or {})
    n_ep = {"pending": 0, "infeasible": 0, "running": epochs_planned // 2, "completed": epochs_planned,
            "stopped_early": 2, "diverged": 3, "failed": 1}[status]
    ceiling = 55 + rng.uniform(0, 20)
    epochs = []
    for e in range(1, n_ep + 1):
        top1 = ceiling * (1 - np.exp(-e / 2)) + rng.normal(0, 0.3)
        epochs.append({"epoch": e, "train_loss": 2.3 / e, "val_loss": 2.4 / e + 0.05, "top1": float(top1),
                       "top5": float(min(100, top1 + 20)), "lr": 5e-4 / e, "images_per_s": 900.0 + e,
                       "epoch_s": 10.0 + 0.1 * e, "train_s": 9.0 + 0.1 * e})
    started = None if status in ("pending", "infeasible") else t0 + 30 * i
    ended = None if status in ("pending", "running") else t0 + 30 * i + 10 * n_ep + 5
    error = {"diverged": "non-finite train_loss at epoch 3", "failed": "RuntimeError: CUDA out of memory",
             "infeasible": "constraint params_m <= 3.2 violated: 3.3"}.get(status)
    return {
        "trial_id": f"t{i:05d}", "trial_name": f"{emb}-h{width}-{i:04x}", "campaign": campaign,
        "code_version": "0.1.0+abc123", "status": status, "config": config,
        "cost": {"params": int(params_m * 1e6), "params_m": params_m, "embed_params": 1000 * width,
                 "gmacs": gmacs},
        "epochs": epochs, "epochs_planned": epochs_planned, "error": error,
        "checkpoint_path": f"/ckpt/t{i:05d}/checkpoint_{n_ep:06d}" if n_ep else None,
        "started_at": started, "ended_at": ended, "train_s_total": float(sum(e["train_s"] for e in epochs)),
    }


def write_campaign(exp_dir, statuses, *, spec=SPEC, seed=0, epochs_planned=6, size="S", name="synth", overrides=None,
                   layout="current"):
    """Write qs_campaign.json and per status qs_trials/<id>.json with, in the current layout, the epochs
    in qs_trials/<id>.epochs.csv (``layout="older"``: inside the record; a list of layouts: one per
    record, in turn); returns the records, each with its "epochs"."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(exp_dir, "qs_trials"), exist_ok=True)
    atomic_json(os.path.join(exp_dir, "qs_campaign.json"),
                 {"name": name, "spec": spec, "code_version": "0.1.0+abc123", "created_at": 1_700_000_000.0})
    records = [synthetic_record(i, s, rng=rng, epochs_planned=epochs_planned, size=size, campaign=name,
                                overrides=overrides)
               for i, s in enumerate(statuses)]
    layouts = [layout] if isinstance(layout, str) else layout
    for i, rec in enumerate(records):
        write_record(exp_dir, rec, layouts[i % len(layouts)])
    return records


def write_record(exp_dir, rec, layout="current"):
    """One trial's files as the recorder leaves them (no epochs file before the first epoch)."""
    folder = os.path.join(exp_dir, "qs_trials")
    if layout == "older":
        atomic_json(os.path.join(folder, f"{rec['trial_id']}.json"), rec)
        return
    stored = {k: v for k, v in rec.items() if k != "epochs"} | {"epochs_file": f"{rec['trial_id']}{EPOCHS_SUFFIX}"}
    if rec["epochs"]:
        with open(os.path.join(folder, stored["epochs_file"]), "wb") as f:
            f.write(epochs_csv(rec["epochs"]))
    atomic_json(os.path.join(folder, f"{rec['trial_id']}.json"), stored)


ALL_STATUSES = list(STATUSES) + ["completed"] * 7  # 14 trials, every status present


def tree_digest(root, skip="results"):
    out = {}
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != skip]
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def earlier_campaign(exp, spec, results: dict) -> dict:
    """A finished campaign's folder as the records layer writes it, for warm starts: ``results`` maps a name to
    (the space keys of a configuration of ``spec``, its top1); each is one completed trial ``old_<name>`` of
    one epoch. Returns name -> the trial built (search.searchers.problem.build_trial)."""
    from types import SimpleNamespace

    from qkvsearch.search.records.recorder import Recorder
    from qkvsearch.search.searchers.problem import build_trial
    from qkvsearch.spaces import base_config
    from qkvsearch.storage import write_json

    write_json(f"{exp}/qs_campaign.json", {"name": "earlier", "spec": spec.to_dict()})
    built = {name: build_trial(base_config(spec), keys) for name, (keys, _) in results.items()}
    recorder = Recorder(str(exp), "earlier", lambda t: {"name": t.trial_id, "config": built[t.key]["config"],
                                                         "cost": built[t.key]["cost"], "epochs_planned": 1})
    for name, (_, top1) in results.items():
        t = SimpleNamespace(trial_id=f"old_{name}", key=name)
        recorder.on_trial_start(0, [], t)
        recorder.on_trial_result(0, [], t, {"epoch": 1.0, "top1": top1, **built[name]["cost"]})
        recorder.on_trial_complete(0, [], t)
    return built
