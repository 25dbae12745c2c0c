"""Run in a process of its own by tests/test_extending.py, with the project as it is once the toys' rows are added
(the test lays it out: its spaces/ holds each row, nothing else told of the toys). Each toy goes where its kind of
extension goes: the section field through the parser, the reference, the file and the measurement's settings; the
searcher through a campaign's proposals and a replay; the scheduler, with its option, as a campaign builds it and
through a replay; the dataset format through the loader's checks and a training epoch. Prints one JSON line."""
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from qkvsearch.search.campaign.assemble import build_search
from qkvsearch.search.campaign.measured import measure_settings
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.run import _scheduler
from qkvsearch.search.searchers.outcomes import scored_result
from qkvsearch.search.simulation.curves import curves_from_frame
from qkvsearch.search.simulation.replay import Setting, simulate
from qkvsearch.spaces import SpecError, base_config, load_campaign
from qkvsearch.spaces.keys import fill
from qkvsearch.spaces.reference import render
from qkvsearch.trainers.data.datasets import check_dataset
from qkvsearch.trainers.data.sources import DatasetError
from qkvsearch.trainers.training.engine import Dist, fit

BASE = {"name": "toys", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
        "data": {"dataset": "digits"}, "train": {"epochs": 4, "batch_size": 16},
        "space": {"depth": 2, "embedding": {"choice": ["linear", "sne", "fsne"]}},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}], "storage": "/tmp"}


def errors(raw: dict) -> list[str]:
    try:
        load_campaign(raw, check_names=False)
    except SpecError as err:
        return err.errors
    return []


def table(n: int = 12, epochs: int = 6):
    """Recorded curves (search.simulation's tabular format): top1 rises every epoch, but for every third config,
    whose top1 falls after epoch 2."""
    rows = []
    for c in range(n):
        for e in range(1, epochs + 1):
            top1 = 50 + c + (min(e, 2) - 10 * max(0, e - 2) if c % 3 == 0 else e)
            rows.append({"config_id": c, "config_lr": 0.001 * (c + 1), "epoch": e, "top1": top1, "params_m": 1 + c})
    import pandas as pd

    return curves_from_frame(pd.DataFrame(rows), "toys", [("top1", "max"), ("params_m", "min")])


found = {}
exp = tempfile.mkdtemp()

# a field of a campaign-file section: one Field row in MEASURE_FIELDS
spec = load_campaign({**BASE, "measure": {"warmup_runs": 7}})
found["field"] = {"parsed": spec.measure.warmup_runs, "default": load_campaign(BASE).measure.warmup_runs,
                  "round_trip": load_campaign(spec.to_dict()) == spec,
                  "written": spec.to_dict()["measure"].get("warmup_runs"),
                  "reference": "| `warmup_runs` |" in render("fields measure"),
                  "settings": measure_settings(OpenedCampaign(spec, exp)).spec.warmup_runs,
                  "refused": errors({**BASE, "measure": {"warmup_runs": 0}})}

# a searcher: its class and its row in SEARCHERS
spec = load_campaign({**BASE, "search": {"algorithm": "toy", "num_trials": 3}})
proposals = build_search(spec)
for i in range(3):
    trial = proposals.suggest(f"t{i}")
    proposals.on_trial_complete(f"t{i}", scored_result({"top1": 50.0 + i, **trial["cost"]}))
replayed = simulate(table(), Setting("fifo"), searcher="toy", num_trials=5, seed=0)
found["searcher"] = {"class": type(proposals.inner).__name__, "told": proposals.inner.told,
                     "replayed": int(replayed.trials), "written": spec.to_dict()["search"]["algorithm"],
                     "refused": errors({**BASE, "search": {"algorithm": "toyy", "num_trials": 3}})}

# a trial scheduler with an option of its own: its builder, its row in SCHEDULERS and its option's in SCHEDULER_FIELDS
spec = load_campaign({**BASE, "scheduler": {"type": "patient", "patience": 3}})
built = _scheduler(OpenedCampaign(spec, exp))
replayed = simulate(table(), Setting("patient"), searcher="shuffle", seed=0)
found["scheduler"] = {"class": type(built).__name__, "patience": built.patience, "metric": built.watched,
                      "round_trip": load_campaign(spec.to_dict()) == spec,
                      "reference": "| `patience` |" in render("fields scheduler"),
                      "replay": {k: int(getattr(replayed, k)) for k in ("trials", "complete", "stopped", "epochs")}}

# a dataset format: its reader and its row in DATASET_INFO
folder = Path(tempfile.mkdtemp())
from sklearn.datasets import load_digits  # noqa: E402

digits = load_digits()
images = (digits.images * 255 / 16).astype(np.uint8)[:, None]   # (N, 1, 8, 8)
np.savez(folder / "images.npz", x_train=images[:1400], y_train=digits.target[:1400], x_val=images[1400:],
         y_val=digits.target[1400:])
spec = load_campaign({**BASE, "data": {"dataset": "npz", "path": str(folder)}})
cfg = fill({**base_config(spec), "depth": 2, "epochs": 1, "max_steps_per_epoch": 2, "warmup_epochs": 0})
check_dataset(cfg)
history = fit(cfg, Dist())
try:
    check_dataset({**cfg, "data_path": exp})
    missing = ""
except DatasetError as err:
    missing = str(err)
found["dataset"] = {"img_size": cfg["img_size"], "num_classes": cfg["num_classes"], "epochs": len(history),
                    "train_loss": history[-1]["train_loss"], "val_images": history[-1].get("val_images"),
                    "missing": missing, "no_path": errors({**BASE, "data": {"dataset": "npz"}})}
print(json.dumps(found))
sys.exit(0)
