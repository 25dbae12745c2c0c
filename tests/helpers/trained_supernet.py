"""One small one-shot campaign trained end to end (``qkvsearch launch`` in its own process, with its own Ray), for
the tests that read a trained supernet: exporting its subnets, campaigns that take it with ``supernet.from``.
tests/conftest.py trains it once per test session (the ``trained_oneshot`` fixture).

The space: 3 embeddings x 2 widths x 2 precisions of the q/k/v linears (9 subnets x 2 policies), on TINY_MODEL's
2 blocks; a supernet trained 2 epochs of 3 steps, then searched for one deployment target (TRAINED_TARGET, the
trials' device): 4 subnets scored, the best one chosen and exported, nothing retrained, no control sample."""
from __future__ import annotations

from pathlib import Path

from helpers import TINY_DEPTH
from helpers.live_campaign import LiveCampaign, tiny_spec, write_spec

TRAINED_NAME = "trained-oneshot"
TRAINED_TARGET = "main"   # its one deployment target: <folder>/targets/main holds the scores and the selection
TRAINED_SPACE = {"depth": TINY_DEPTH, "embedding": {"choice": ["linear", "sne", "fsne"]},
                 "hidden_width": {"choice": [0.5, 1.0]}, "code_size": 4,
                 "quant_qkv": {"choice": ["fp", "int8_dynamic"]}}
TRAINED_SUPERNET = {"train": {"epochs": 2, "max_steps_per_epoch": 3}, "retrain": "top_k", "top_k": 1, "control": 0,
                    "bn_batches": 1, "resources": {"workers_per_trial": 1}}
TRAINED_SEARCH = {"algorithm": "random", "num_trials": 4, "seed": 0}


def trained_spec(storage: Path, name: str = TRAINED_NAME) -> dict:
    """The campaign file of the trained one-shot campaign (one target, which retrains nothing)."""
    spec = tiny_spec(storage, name, workers=1, epochs=1, variants=[], steps=2)
    spec.update(space=dict(TRAINED_SPACE), supernet=dict(TRAINED_SUPERNET), search=dict(TRAINED_SEARCH),
                targets=[{"name": TRAINED_TARGET}])
    return spec


def from_spec(storage: Path, name: str, source: Path | str, **supernet) -> dict:
    """A one-shot campaign over TRAINED_SPACE that searches the supernet trained at ``source`` (a campaign
    folder: ``supernet.from``) instead of training one; ``supernet``: more keys of its supernet section."""
    spec = trained_spec(storage, name)
    del spec["targets"]
    spec["supernet"] = {**{k: v for k, v in TRAINED_SUPERNET.items() if k not in ("train", "resources")},
                        "from": str(source), **supernet}
    return spec


def train_oneshot(tmp: Path) -> Path:
    """Launch the trained one-shot campaign under ``tmp`` and wait for it to end; -> its folder."""
    spec_file = write_spec(tmp / f"{TRAINED_NAME}.yaml", trained_spec(tmp / "results"))
    exp = tmp / "results" / TRAINED_NAME
    with LiveCampaign(["launch", str(spec_file)], tmp) as run:
        code = run.finish(exp)
        assert code == 0, f"qkvsearch launch exited {code}:\n{run.stdout()[-2000:]}\n{run.stderr()[-3000:]}"
    return exp
