"""qkvsearch's campaign layers, lowest first. A layer imports only from layers above it in this table
(and the package root's ``qkvsearch.storage``, ``qkvsearch.spaces``, ``qkvsearch.trainers``, which never
import ``qkvsearch.search``); ``tests/search/test_layers.py`` enforces it.

=============  ==================================================================  =====================
layer          what it owns                                                         loads Ray / torch
=============  ==================================================================  =====================
records        the campaign folder's files: layout, statuses, epochs CSV, readers,  neither
               the recorder
analysis       Pareto maths, results tables (Parquet), the report (effects at       neither
               equal cost, importance, the paper's table), one-shot fidelity,
               campaigns compared
monitor        progress, the terminal view, metrics, Grafana, status, watch         neither (Ray's
                                                                                    metrics lazily)
scheduling     MO-ASHA's rules (pure) and the Tune schedulers that apply them       Ray (the adapters)
searchers      the searchers (grid, Optuna's samplers, ehvi) behind one set of     Ray's Searcher (the
               hooks, the proposal wrapper Tune drives, their saved state          wrapper), torch lazily
cluster        a local Ray, cluster capacity, jobs                                  Ray
campaign       launch and resume (one run path), the trial driver, the             Ray, torch (lazily)
               Train->Tune bridge, measured cost, retention, stages, trackers,
               preflight checks, interrupts, one-shot search's phases
simulation     replaying searchers and schedulers on recorded curves               Ray's schedulers
cli            the ``qkvsearch`` command                                            what a command needs
=============  ==================================================================  =====================

Below them all: ``qkvsearch.storage`` (local paths and bucket URIs, atomic writes), ``qkvsearch.spaces``
(the campaign schema and the trial keys) and ``qkvsearch.trainers`` (models, cost, data, the DDP loop).

The module paths of the flat layout before these layers stay importable (qkvsearch._legacy).
"""
