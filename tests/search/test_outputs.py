"""Output folders: every command that writes (report, simulate, grafana-dashboard) refuses the same hostile
--out the same way, through search.records.outputs.check_output_dir: an existing file, a folder under a
file or where none can be made, a campaign's own trial folders. Exit 2, the field named, nothing written."""
from __future__ import annotations

import os

import pandas as pd
import pyarrow.fs as pafs
import pytest
from helpers.campaign_files import tree_digest, write_campaign

from qkvsearch.search.cli import main
from qkvsearch.search.monitor import grafana
from qkvsearch.search.records.outputs import OutputPathError, check_output_dir

LIMIT = 2000   # characters a refusal may print


def _tree(root) -> tuple[list[str], dict]:
    """Every folder under root, and every file's digest: what "writes nothing" compares."""
    folders = sorted(os.path.relpath(d, root) for d, _, _ in os.walk(root))
    return folders, tree_digest(root, skip=None)


@pytest.fixture
def place(tmp_path, monkeypatch):
    """tmp_path as the working folder, holding a campaign (camp/, with a Tune trial folder and a Train
    runs folder as a launch leaves them), a curves table and a plain file."""
    monkeypatch.chdir(tmp_path)
    write_campaign(tmp_path / "camp", ["completed", "completed", "failed"])
    (tmp_path / "camp" / "sne-h64-t00000").mkdir()
    (tmp_path / "camp" / "sne-h64-t00000" / "params.json").write_text("{}")
    (tmp_path / "camp" / "train_runs").mkdir()
    pd.DataFrame({"trial_id": ["a", "a", "b", "b"], "epoch": [1, 2, 1, 2], "top1": [1.0, 2.0, 3.0, 4.0],
                  "params_m": [1.0, 1.0, 2.0, 2.0]}).to_csv(tmp_path / "curves.csv", index=False)
    (tmp_path / "afile").write_text("mine")
    return tmp_path


COMMANDS = {"report": ["report", "camp"], "simulate": ["simulate", "curves.csv"],
            "grafana-dashboard": ["grafana-dashboard"]}
HOSTILE = {  # --out -> what the message says
    "afile": 'given "afile", which is a file',
    "afile/sub": "which is a file",  # under it
    "camp/qs_trials": "inside the campaign's qs_trials/ folder",
    "camp/qs_trials/deeper": "inside the campaign's qs_trials/ folder",
    "camp/train_runs/x": "inside the campaign's train_runs/ folder",
    "camp/sne-h64-t00000": "inside the campaign's Tune trial folder sne-h64-t00000/",
    "camp": "the campaign folder itself",
    "/proc/qkvsearch-out/x": "no folder can be made in /proc",
}


@pytest.mark.parametrize("out", HOSTILE)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_writing_command_refuses_a_hostile_out_the_same_way(place, capsys, command, out):
    before = _tree(place)
    code = main([*COMMANDS[command], "--out", out])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.err.startswith(f"qkvsearch {command}: --out: expected a ") and HOSTILE[out] in captured.err
    assert "Traceback" not in captured.err and len(captured.err) + len(captured.out) < LIMIT
    assert _tree(place) == before


def test_report_and_simulate_refuse_a_uri_that_names_no_bucket_and_grafana_any_uri(place, capsys):
    before = _tree(place)
    for argv, said in ((["report", "camp", "--out", "s3://"], "names no bucket"),
                       (["simulate", "curves.csv", "--out", "nope://x/y"], "no path or URI this machine can open"),
                       (["grafana-dashboard", "--out", "s3://bucket/x"], "which is a URI")):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "--out: expected a " in err and said in err, err
    assert _tree(place) == before


def test_a_writable_out_is_taken_as_given_and_nothing_is_made(place):
    assert check_output_dir("new/deeper/") == "new/deeper"
    assert check_output_dir(place / "camp" / "report", campaign=place / "camp") == str(place / "camp" / "report")
    assert check_output_dir(f"file://{place}/new") == f"file://{place}/new"
    assert check_output_dir(place) == str(place)  # an existing folder
    assert sorted(p.name for p in place.iterdir()) == ["afile", "camp", "curves.csv"]


def test_a_campaign_named_by_the_command_is_guarded_through_a_uri_too(place):
    with pytest.raises(OutputPathError, match="inside the campaign's qs_trials/"):
        check_output_dir(f"file://{place}/camp/qs_trials/x", field="out_dir", campaign=f"file://{place}/camp")
    with pytest.raises(OutputPathError, match="^report_dir: expected a folder, given .*which is a file"):
        check_output_dir(place / "afile", field="report_dir")


def test_a_bucket_out_is_checked_on_the_store(s3):
    s3.create_dir("qkv-outputs")
    with s3.open_output_stream("qkv-outputs/taken") as f:
        f.write(b"x")
    assert check_output_dir("s3://qkv-outputs/new/") == "s3://qkv-outputs/new"
    with pytest.raises(OutputPathError, match='given "s3://qkv-outputs/taken", which is a file'):
        check_output_dir("s3://qkv-outputs/taken")
    listed = s3.get_file_info(pafs.FileSelector("qkv-outputs", recursive=True))
    assert [i.path for i in listed] == ["qkv-outputs/taken"]


def test_the_cli_writes_where_a_good_out_points(place, capsys):
    assert main(["grafana-dashboard", "--out", "dash/"]) == 0
    assert main(["simulate", "curves.csv", "--out", "sim", "--schedulers", "fifo"]) == 0
    capsys.readouterr()
    assert os.listdir(place / "dash") == [grafana.FILE_NAME]
    assert sorted(os.listdir(place / "sim")) == ["simulate.csv", "simulate.html"]
