"""Replay a campaign's searcher and scheduler on recorded learning curves: no training, no Ray actors.

    from qkvsearch.search.simulation import Setting, compare, load_source
    curves = load_source("results/quickstart")          # a campaign folder, or a .parquet / .csv table
    runs = compare(curves, [Setting.parse("fifo"), Setting.parse("moasha:brackets=2")], concurrency=4)
    for run in runs:
        print(run.label, run.hv_at_epochs(0.5 * curves.grid_epochs) / curves.grid_hv)

The schedulers are the very classes a campaign builds (``search.campaign.run._scheduler``):
``MOASHAScheduler``, Ray's ``ASHAScheduler`` and ``FIFOScheduler``, driven through Tune's callbacks
(``on_trial_add``, ``on_trial_result``, ``on_trial_complete``) with stand-in trials that carry only a
``trial_id``. Nothing here re-implements a scheduling rule.

Four parts: ``curves`` (the sources: a campaign folder or a tabular benchmark), ``searchers`` (the
campaign's searchers over a table), ``replay`` (the simulated clock and the schedulers), ``output`` (the table,
simulate.html and simulate.csv).
"""
from qkvsearch.search.simulation.curves import (
    Curves,
    curves_from_frame,
    load_source,
    load_table,
    parse_objectives,
)
from qkvsearch.search.simulation.output import default_out_dir, format_table, write_outputs
from qkvsearch.search.simulation.replay import (
    Run,
    Setting,
    SimTrial,
    compare,
    default_settings,
    parse_settings,
    simulate,
)
from qkvsearch.search.simulation.searchers import ShuffledCurves

__all__ = ["Curves", "Run", "Setting", "ShuffledCurves", "SimTrial", "compare", "curves_from_frame",
           "default_out_dir", "default_settings", "format_table", "load_source", "load_table",
           "parse_objectives", "parse_settings", "simulate", "write_outputs"]
