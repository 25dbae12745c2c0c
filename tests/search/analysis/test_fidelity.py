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
