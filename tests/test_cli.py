"""The `qkvsearch` command: bad input exits 2 with its own message and writes nothing; the
commands that start nothing (validate, cost, status) work on the shipped presets."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from qkvsearch.search.cli import main

PRESETS = Path(__file__).resolve().parent.parent / "spaces" / "presets"


def _quickstart(storage: Path) -> dict:
    spec = yaml.safe_load((PRESETS / "quickstart.yaml").read_text())
    spec["storage"] = str(storage)
    return spec


# (what to change, a fragment the message must hold)
MISTAKES = [
    (lambda s: s.update(colour="blue"), "colour: unknown key"),
    (lambda s: s["model"].update(img_sise=32), "model.img_sise: unknown key"),
    (lambda s: s["space"].update(embedding={"choice": ["linear", "snee"]}), "space.embedding"),
    (lambda s: s["space"].update(code_size={"choice": ["big"]}), "space.code_size"),
    (lambda s: s["space"].update(hidden_width={"choice": [9.0]}), "space.hidden_width"),
    (lambda s: s["objectives"].append({"metric": "top1", "mode": "up"}), "mode"),
    (lambda s: s["objectives"].append({"metric": "accuracy", "mode": "max"}), "accuracy"),
    (lambda s: s.update(constraints={"params_m": {"max": "four"}}), "constraints.params_m"),
    (lambda s: s["search"].update(algorithm="bayes"), "search.algorithm"),
    (lambda s: s["scheduler"].update(grace_epochs=50), "scheduler.grace_epochs"),
    (lambda s: s["resources"].update(workers_per_trial=0), "resources.workers_per_trial"),
    (lambda s: s["train"].update(epochs=-1), "train.epochs"),
]


@pytest.mark.parametrize("mutate,fragment", MISTAKES, ids=[m[1] for m in MISTAKES])
def test_each_spec_mistake_exits_2_with_its_message_and_writes_nothing(tmp_path, capsys, mutate, fragment):
    storage = tmp_path / "results"
    spec = _quickstart(storage)
    mutate(spec)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["launch", str(path)]) == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert not storage.exists(), "a refused spec must write nothing"


def test_yaml_syntax_error_and_missing_file_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {name: [unclosed\n")
    assert main(["validate", str(bad)]) == 2
    assert "line" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_missing_dataset_path_exits_2_before_ray_starts(tmp_path, capsys):
    code = main(["launch", str(PRESETS / "paper-s.yaml"), "--set", f"data.path={tmp_path / 'imagenet'}",
                 "--set", f"storage={tmp_path / 'results'}"])
    assert code == 2
    assert str(tmp_path / "imagenet") in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_validate_and_cost_on_the_paper_preset(capsys):
    assert main(["validate", str(PRESETS / "paper-s.yaml")]) == 0
    assert "valid" in capsys.readouterr().out
    assert main(["cost", str(PRESETS / "paper-s.yaml")]) == 0
    out = capsys.readouterr().out
    assert "7 configuration(s)" in out
    # The linear baseline row: XCiT-N12 at 224 px, 1000 classes, 3.05M parameters and 0.55 GMACs.
    (linear,) = [line for line in out.splitlines() if " linear " in line]
    assert "3.053" in linear and "0.55" in linear


def test_status_of_a_folder_without_a_campaign_exits_2(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 2
    assert "qs_campaign.json" in capsys.readouterr().err
