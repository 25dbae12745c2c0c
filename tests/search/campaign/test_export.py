"""`qkvsearch export` (search.campaign.oneshot.export) on the one-shot campaign trained once per test session
(helpers.trained_supernet): the best subnet, written by the command line, computes bit for bit what the supernet
computes for it; a quantized subnet named by its space keys carries the state its quantized model loads, which
computes what quantizing the exported weights gives; what the campaign cannot export is refused, exit 2, naming
why, with nothing written."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers.campaign_files import tree_digest
from helpers.trained_supernet import TRAINED_TARGET

from qkvsearch.search.campaign.oneshot.export import export_subnet
from qkvsearch.search.cli import EXIT_BAD_INPUT, main
from qkvsearch.search.records import inherited
from qkvsearch.spaces.keys import quant_policy
from qkvsearch.spaces.metrics import COUNTED_METRICS
from qkvsearch.trainers.model.models import build_model
from qkvsearch.trainers.model.quantize import quantize_model

pytestmark = pytest.mark.slow

QKVSEARCH = [sys.executable, "-m", "qkvsearch.search.cli"]


def _images() -> torch.Tensor:
    return torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))   # (B, C, H, W): TINY_MODEL's input


def _loaded(state: dict, config: dict) -> torch.nn.Module:
    model = build_model(config)
    model.load_state_dict(state)
    return model.eval()


def test_the_best_subnet_exported_computes_what_the_supernet_computes_for_it(trained_oneshot):
    from qkvsearch.search.campaign.oneshot.phases import _trained
    from qkvsearch.trainers.supernet.plan import SupernetPlan
    from qkvsearch.trainers.supernet.scoring import SubnetScorer
    from qkvsearch.trainers.supernet.training import _Subnet
    from qkvsearch.trainers.training.engine import load_state

    exp = trained_oneshot
    folder = exp / inherited.TARGETS_DIR / TRAINED_TARGET
    done = subprocess.run([*QKVSEARCH, "export", str(exp), "--target", TRAINED_TARGET, "--rank", "1"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    (chosen,) = inherited.read_selection(folder)["chosen"]
    (record,) = [e for e in inherited.read_evaluations(folder)
                 if inherited.keys_text(e["keys"]) == inherited.keys_text(chosen)]
    pt = folder / "exports" / f"{record['subnet_id']}.pt"
    assert done.stdout.splitlines() == [f"checkpoint: {pt}", f"summary: {pt.with_suffix('.json')}"]
    state = torch.load(pt, map_location="cpu", weights_only=not quant_policy(record["config"]))
    summary = json.loads(pt.with_suffix(".json").read_text())
    config = state["config"]
    assert config == record["config"] == summary["config"] and ("quantized" in state) == bool(quant_policy(config))
    assert summary["subnet_id"] == record["subnet_id"] and summary["keys"] == chosen
    assert summary["inherited"] == record["metrics"] and summary["measured"] == {} and summary["predicted"] == []
    assert summary["counted"] == {k: record["cost"][k] for k in COUNTED_METRICS}

    checkpoint, teacher, supernet_id = _trained(str(exp / inherited.SUPERNET_DIR))
    assert state["supernet"] == summary["supernet"] == supernet_id
    plan = SupernetPlan.from_dict(json.loads((exp / inherited.SUPERNET_DIR / "plan.json").read_text()))
    scorer = SubnetScorer(plan, load_state(checkpoint), teacher, bn_batches=1, device="cpu")
    scorer._recalibrate(config)   # BatchNorm as the export recalibrated it: the same batches, the same seed
    assert all(v.device.type == "cpu" and v.dtype in (torch.float32, torch.int64) for v in state["model"].values())
    with torch.no_grad():
        want = _Subnet(scorer.supernet, config).eval()(_images())
        got = _loaded(state["model"], config)(_images())
    # bit for bit: the export recalibrated BatchNorm in a fresh process, this test with the same thread count
    # (tests/conftest.py: torch_threads_kept)
    assert want.dtype == got.dtype == torch.float32 and torch.equal(got, want)


def test_a_quantized_subnet_named_by_its_keys_carries_its_quantized_state(trained_oneshot, tmp_path):
    out = tmp_path / "sne-int8.pt"
    written = export_subnet(str(trained_oneshot), target=TRAINED_TARGET,
                            sets=["quant_qkv=int8_dynamic", "embedding=sne", "hidden_width=0.5"], out=str(out))
    assert written == {"checkpoint": str(out), "summary": str(tmp_path / "sne-int8.json")}
    state = torch.load(out, map_location="cpu", weights_only=False)   # torchao's tensors; a file this test wrote
    config = state["config"]
    summary = json.loads((tmp_path / "sne-int8.json").read_text())
    assert summary["keys"] == {"depth": 2, "embedding": "sne", "hidden_width": 0.5, "quant_qkv": "int8_dynamic"}
    assert (config["embedding"], config["hidden_width"], config["quant_qkv"]) == ("sne", 0.5, "int8_dynamic")
    assert set(summary["counted"]) == set(COUNTED_METRICS) and summary["config"] == config

    served = quantize_model(build_model(config).eval(), config, "cpu")
    served.load_state_dict(state["quantized"], strict=True)
    mine = quantize_model(_loaded(state["model"], config), config, "cpu")
    with torch.no_grad():
        got, want, full = served(_images()), mine(_images()), _loaded(state["model"], config)(_images())
    assert torch.equal(got, want) and not torch.equal(got, full)   # quantized, and as the export's own weights give


REFUSALS = {  # --set etc. -> what the message says
    "too wide": (["--set", "embedding=sne", "--set", "hidden_width=2.0", "--set", "quant_qkv=fp"],
                 "(depth=2, embedding=sne, hidden_width=2.0, quant_qkv=fp), which it cannot run: "),
    "unknown key": (["--set", "nope=1"], "--set: expected KEY=VALUE with a key of the campaign's space (depth, "),
    "unknown subnet": (["--subnet", "subnet_999999"], "--subnet: expected the id of a subnet scored in "),
    "rank": (["--rank", "99"], "--rank: expected a rank from 1 to the number of chosen subnets (1 in "),
    "target": (["--target", "nope", "--rank", "1"], "--target: expected one of the campaign's deployment targets "
                                                    f"({TRAINED_TARGET}), given \"nope\""),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_what_the_campaign_cannot_export_is_refused_with_nothing_written(trained_oneshot, capsys, case):
    args, said = REFUSALS[case]
    before = (tree_digest(trained_oneshot, skip=None), sorted(d for d, _, _ in os.walk(trained_oneshot)))
    code = main(["export", str(trained_oneshot),
                 *(args if "--target" in args else ["--target", TRAINED_TARGET, *args])])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and err.startswith("qkvsearch export: ") and said in err, err
    assert "Traceback" not in err
    assert (tree_digest(trained_oneshot, skip=None), sorted(d for d, _, _ in os.walk(trained_oneshot))) == before
