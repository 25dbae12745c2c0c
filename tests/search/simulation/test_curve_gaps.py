"""A tabular source is curves of epochs 1..n without a gap: `qkvsearch simulate` refuses a curve that skips
or repeats an epoch (exit 2, naming the curve and the epochs it has) and writes nothing."""
from __future__ import annotations

import os

import pandas as pd
import pytest

from qkvsearch.search.cli import main


def _table(path, curves: dict, key: str):
    """curves: curve key value -> its epochs, one row each (top1 rises, params_m is the curve's)."""
    rows = [{key: k, "epoch": e, "top1": 10.0 * e, "params_m": 1.0 + i}
            for i, (k, epochs) in enumerate(curves.items()) for e in epochs]
    if path.suffix == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.mark.parametrize("name, key, curves, said", [
    ("gap.csv", "trial_id", {"a": [1, 2, 3], "b": [1, 3]}, "curve trial_id=b: expected epochs 1..n, each once"
                                                         " (a curve is its rows of epochs 1..n without a gap), "
                                                         "given epochs 1, 3"),
    ("repeat.parquet", "config_width", {64: [1, 2, 2, 3], 96: [1, 2, 3]}, "curve config_width=64: expected "
                                                                          "epochs 1..n, each once"),
    ("late.csv", "trial_id", {"a": [2, 3], "b": [1, 2], "c": [1, 4]}, "curve trial_id=a"),
])
def test_a_curve_with_a_gap_or_a_repeated_epoch_exits_2_naming_it(tmp_path, capsys, name, key, curves, said):
    source = _table(tmp_path / name, curves, key)
    before = sorted(os.listdir(tmp_path))
    code = main(["simulate", str(source)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert said in err and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == before  # no <stem>-simulate folder


def test_the_epochs_a_refused_curve_has_are_listed_as_runs(tmp_path, capsys):
    source = _table(tmp_path / "runs.csv", {"x": [1, 2, 3, 5, 5, 6], "y": [1], "z": [2]}, "trial_id")
    assert main(["simulate", str(source)]) == 2
    err = capsys.readouterr().err
    assert "curve trial_id=x" in err and "given epochs 1-3, 5, 5-6 (and 1 more curve(s) like it)" in err, err


def test_curves_of_different_lengths_without_gaps_are_replayed(tmp_path, capsys):
    source = _table(tmp_path / "ok.csv", {"a": [1, 2, 3], "b": [1], "c": [3, 1, 2]}, "trial_id")
    assert main(["simulate", str(source), "--schedulers", "fifo"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "3 curves, 3 planned epochs" in out
