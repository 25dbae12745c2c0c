"""The `qkvsearch` command: bad input exits 2 with its own message and writes nothing; the
commands that start nothing (validate, cost, status) work on the shipped presets."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from helpers import PRESETS

from qkvsearch.search import cli
from qkvsearch.search.cli import main
from qkvsearch.spaces import BadInput


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
    assert "7 distinct model(s)" in out
    # The linear baseline row: XCiT-N12 at 224 px, 1000 classes, 3.05M parameters and 0.55 GMACs.
    (linear,) = [line for line in out.splitlines() if " linear " in line]
    assert "3.053" in linear and "0.55" in linear


def test_status_of_a_folder_without_a_campaign_exits_2(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 2
    assert "qs_campaign.json" in capsys.readouterr().err


# ------------------------------------------------------------------ exit codes and log records


def _boom(exc):
    def command(_args):
        raise exc
    return command


def test_an_internal_error_exits_1_with_its_traceback(monkeypatch, capsys):
    monkeypatch.setitem(cli._COMMANDS, "validate", _boom(RuntimeError("boom")))
    assert main(["validate", str(PRESETS / "quickstart.yaml")]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "RuntimeError: boom" in err


@pytest.mark.parametrize("exc", [ValueError("a bug, not bad input"), FileNotFoundError("internal file")])
def test_plain_value_and_file_errors_are_failures_not_bad_input(monkeypatch, capsys, exc):
    monkeypatch.setitem(cli._COMMANDS, "validate", _boom(exc))
    assert main(["validate", str(PRESETS / "quickstart.yaml")]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_bad_input_exits_2_without_a_traceback(monkeypatch, capsys):
    monkeypatch.setitem(cli._COMMANDS, "status", _boom(BadInput("DIR: expected a campaign folder, given x")))
    assert main(["status", "x"]) == 2
    err = capsys.readouterr().err
    assert err == "qkvsearch status: DIR: expected a campaign folder, given x\n"


def test_a_giant_bad_input_message_is_cut(monkeypatch, capsys):
    monkeypatch.setitem(cli._COMMANDS, "status", _boom(BadInput("x" * 10**6)))
    assert main(["status", "x"]) == 2
    assert len(capsys.readouterr().err) < 5000


def test_interrupt_exits_130(monkeypatch, capsys):
    monkeypatch.setitem(cli._COMMANDS, "resume", _boom(KeyboardInterrupt()))
    assert main(["resume", "results/x"]) == 130
    assert "interrupted; `qkvsearch resume DIR` continues a campaign" in capsys.readouterr().err


def test_help_lists_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "130 interrupted" in out and "2 bad input" in out


def test_library_log_records_are_printed_and_the_handler_is_removed(monkeypatch, capsys):
    logger = logging.getLogger("qkvsearch")
    handlers, level = list(logger.handlers), logger.level

    def chatty(_args):
        logging.getLogger("qkvsearch.search.example").info("planned 4 trials")
        logging.getLogger("qkvsearch.spaces.example").warning("the space holds one configuration")
        logging.getLogger("qkvsearch.search.example").debug("not shown")
        return 0

    monkeypatch.setitem(cli._COMMANDS, "status", chatty)
    for _ in range(3):   # repeated in-process calls print each record once
        assert main(["status", "x"]) == 0
        captured = capsys.readouterr()
        assert captured.out == "planned 4 trials\n"
        assert captured.err == "warning: the space holds one configuration\n"
    assert logger.handlers == handlers and logger.level == level


# ------------------------------------------------------------------ damaged campaign folders


DAMAGED = {
    "truncated": b'{"name": "x", "spec": {"name": "x", "mod',
    "not-json": b"\x89PNG\r\n\x1a\n\x00\x00",
    "no-spec": b'{"name": "x"}',
    "spec-not-a-mapping": b'{"name": "x", "spec": [1, 2]}',
    "a-list": b"[1, 2, 3]",
    "deep": b"[" * 100_000,
    "empty": b"",
}


@pytest.fixture
def no_ray(monkeypatch):
    """A resume that got past its checks would start Ray: fail instead."""
    import qkvsearch.search.campaign.launch as campaign

    def refuse(*_args, **_kwargs):
        raise AssertionError("Ray must not start for a damaged campaign folder")

    monkeypatch.setattr(campaign, "connect", refuse)


def _damaged_folder(tmp_path: Path, kind: str) -> Path:
    exp = tmp_path / "results" / kind
    exp.mkdir(parents=True)
    (exp / "qs_campaign.json").write_bytes(DAMAGED[kind])
    return exp


@pytest.mark.parametrize("command", ["status", "report", "resume"])
@pytest.mark.parametrize("kind", list(DAMAGED))
def test_a_damaged_campaign_file_exits_2_naming_it(tmp_path, capsys, no_ray, command, kind):
    exp = _damaged_folder(tmp_path, kind)
    before = sorted(p.name for p in exp.iterdir())
    code = main([command, str(exp)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "qs_campaign.json" in err and "Traceback" not in err, err
    assert len(err) < 2000, err[:300]
    assert sorted(p.name for p in exp.iterdir()) == before, "a refused command must write nothing"


@pytest.mark.parametrize("command", ["status", "report", "resume"])
def test_a_folder_that_is_missing_a_file_or_holds_a_directory_exits_2(tmp_path, capsys, no_ray, command):
    (tmp_path / "plain").write_text("x")
    (tmp_path / "odd" / "qs_campaign.json").mkdir(parents=True)
    for target in (tmp_path / "missing", tmp_path / "plain", tmp_path / "odd", tmp_path):
        code = main([command, str(target)])
        err = capsys.readouterr().err
        assert code == 2, (target, err)
        assert str(target) in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd", "plain"]
