"""open_campaign: the campaign file's spec read once, by the spec loader's rules, for every reader."""
import json
import subprocess
import sys

import pytest
from helpers import REPO
from helpers.campaign_files import SPEC, write_campaign

from qkvsearch.search.records.layout import CampaignFileError, open_campaign
from qkvsearch.spaces import load_campaign
from qkvsearch.spaces.schema import DEFAULT_OBJECTIVES

RAW = {"name": "grid3", "model": {"name": "xcit_nano_12_p16_224"}, "data": {"dataset": "synthetic"},
       "train": {"epochs": 4}, "space": {"embedding": {"grid": ["linear", "sne"]}},
       "search": {"algorithm": "grid", "repeats": 3},
       "scheduler": {"type": "moasha", "grace_epochs": 1, "reduction_factor": 2},
       "resources": {"max_concurrent_trials": 2}}


def test_a_spec_stored_at_launch_reads_as_the_loader_reads_it(tmp_path):
    spec = load_campaign(RAW, check_names=False)
    write_campaign(tmp_path, ["completed"], spec=spec.to_dict(), name="grid3")
    campaign = open_campaign(tmp_path)
    assert campaign.spec == spec and campaign.problems == ()
    assert campaign.trials_planned == 6 and campaign.epochs_planned == 4  # 2 grid points x 3 repeats
    assert campaign.objectives == [(o.metric, o.mode) for o in DEFAULT_OBJECTIVES]  # the spec states none
    assert campaign.max_concurrent_trials == 2 and campaign.spec.scheduler.reduction_factor == 2
    assert campaign.name == "grid3" and not campaign.ended and campaign.code_version == "0.1.0+abc123"


def test_reading_a_campaign_loads_neither_timm_nor_torch(tmp_path):
    write_campaign(tmp_path, ["completed"], spec=load_campaign(RAW, check_names=False).to_dict())
    code = ("import sys; from qkvsearch.search.records.layout import open_campaign; "
            f"c = open_campaign({str(tmp_path)!r}); assert c.trials_planned == 6; "
            "print(sorted(m for m in ('timm', 'torch', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_partial_or_older_spec_reads_as_far_as_it_goes(tmp_path):
    write_campaign(tmp_path, ["completed"], spec={k: v for k, v in SPEC.items() if k not in ("objectives", "train")})
    campaign = open_campaign(tmp_path)
    assert campaign.objectives == [("top1", "max")]
    assert campaign.trials_planned is None  # its search section names keys this version does not know
    assert campaign.epochs_planned is None
    assert any(p.startswith("search.num_samples: unknown key") for p in campaign.problems)


def test_validating_names_the_file_and_every_problem(tmp_path):
    bad = load_campaign(RAW, check_names=False).to_dict()
    bad["model"]["name"] = "no_such_model_anywhere"
    write_campaign(tmp_path, [], spec=bad)
    assert open_campaign(tmp_path).spec.model.name == "no_such_model_anywhere"  # names taken as given
    with pytest.raises(CampaignFileError) as err:
        open_campaign(tmp_path, validate=True)
    assert f"{tmp_path}/qs_campaign.json" in str(err.value) and "model.name: expected" in str(err.value)
    (tmp_path / "qs_campaign.json").write_text(json.dumps({"name": "x"}))
    with pytest.raises(CampaignFileError, match="spec: expected a mapping"):
        open_campaign(tmp_path)
