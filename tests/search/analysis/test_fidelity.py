"""How well inherited accuracy ranks: the rank figures are over subnets retrained from scratch only, since a
subnet trained on from its inherited weights carries its inherited accuracy into its own."""
from __future__ import annotations

import numpy as np
import pandas as pd

from qkvsearch.search.analysis.fidelity import measure, section_lines


def _subnets(chosen_from: str) -> pd.DataFrame:
    # 3 chosen subnets whose standalone top-1 follows their inherited one exactly; 4 control subnets whose
    # standalone top-1 runs against it
    inherited = [90, 80, 70, 60, 50, 40, 30]
    standalone = [90, 80, 70, 10, 20, 30, 40]
    selected = ["chosen"] * 3 + ["control"] * 4
    return pd.DataFrame({"top1_inherited": inherited, "top1_standalone": standalone,
                         "top1_standalone_reseeded": [np.nan] * 3 + [11, 21, 31, 41], "selected": selected,
                         "retrained_from": [chosen_from] * 3 + ["scratch"] * 4,
                         "gmacs": [1.0] * 7})


def test_subnets_trained_on_from_inherited_weights_are_left_out_of_the_rank_figures():
    objectives = (("top1", "max"), ("gmacs", "min"))
    scratch = measure(_subnets("scratch"), objectives, None)
    tuned = measure(_subnets("inherited"), objectives, None)
    assert scratch["retrained"] == 7 and scratch["ranked_over"] == "every retrained subnet"
    assert tuned["retrained"] == 4 and tuned["ranked_over"].startswith("the control subnets")
    assert tuned["kendall_tau"] == -1.0 and scratch["kendall_tau"] > -1.0  # the control subnets alone
    assert "over the control subnets" in section_lines(tuned)[1]


def test_a_selection_and_evaluations_written_before_retrain_from_and_policies_read_as_from_scratch(tmp_path):
    """A one-shot campaign recorded before: its selection says nothing of where training started (scratch),
    its evaluations carry no top1_q or size_mb (null columns)."""
    import json

    import pyarrow as pa

    from qkvsearch.search.analysis.fidelity import subnet_table
    from qkvsearch.search.records import inherited

    exp = str(tmp_path / "earlier")
    configs = [{"embedding": e, "depth": 2, "seed": 0} for e in ("linear", "sne", "psne", "fsne")]
    inherited.write_batch(exp, 0, [{"subnet_id": f"subnet_{i:06d}", "keys": {"embedding": c["embedding"]},
                                    "config": c, "cost": {"gmacs": 0.1 * (i + 1)},
                                    "metrics": {"top1": 50.0 + i, "top5": 90.0, "val_loss": 1.0},
                                    "supernet": "s", "space": "h"} for i, c in enumerate(configs)])
    inherited.write_selection(exp, {"chosen": [{"embedding": "fsne"}], "control": [{"embedding": "linear"}],
                                    "seed": 0})  # as written before retrain_from existed
    trials = pa.table({"status": ["completed"] * 3,
                       "config_json": [json.dumps(c) for c in (configs[3], configs[0], {**configs[0], "seed": 1})],
                       "final_top1": [70.0, 60.0, 61.0]})
    df = subnet_table(exp, trials)
    assert [x if isinstance(x, str) else None for x in df["retrained_from"]] == ["scratch", None, None, "scratch"]
    assert df["top1_q_inherited"].isna().all() and df["size_mb"].isna().all()
    assert list(df["top1_standalone"].dropna()) == [60.0, 70.0]
