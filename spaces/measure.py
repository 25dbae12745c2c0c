"""The campaign file's ``measure`` section: how the measured cost metrics (spaces.metrics.MEASURED) are measured.

    measure:
      batch: 64                 # images a forward for throughput (inference)
      latency_batch: 1          # images a forward for latency_ms
      metrics: [peak_mem_gb]    # measured metrics to record although no objective or constraint names them
      cache: s3://bucket/qkv-measurements   # shared by campaigns; default: <campaign folder>/qs_measurements
      max_s: 10                 # seconds one metric's warm-up and timing may take (past it: 5 timed calls)

A campaign measures only when an objective, a constraint or ``metrics`` names a measured metric
(``measured_metrics``); one that names none measures nothing. Each distinct model is measured once per
device, precision, batch, compile mode and software versions (trainers.deploy.measure), before its first trial.
"""
from __future__ import annotations

from qkvsearch.spaces.checks import POS_INT, POS_NUM, is_number
from qkvsearch.spaces.errors import Collector, hint, show
from qkvsearch.spaces.fields import Field, nonempty, read_table, section_spec, table
from qkvsearch.spaces.metrics import MEASURED_METRICS
from qkvsearch.spaces.schema import FrozenMap

# The section's fields (spaces.fields), and its spec made of them; the fields added later are written back only
# when set, so that earlier campaign files read back unchanged.
MEASURE_FIELDS = table(
    Field("batch", POS_INT, 64, "images a forward when throughput is measured"),
    Field("latency_batch", POS_INT, 1, "images a forward when latency_ms is measured"),
    Field("metrics", f"a list of measured metrics ({', '.join(MEASURED_METRICS)})", (),
          "measured metrics to record although no objective or constraint names them", example=["peak_mem_gb"]),
    Field("cache", nonempty("a folder or URI (a string)"), None,
          "where measurements are kept; campaigns that share it reuse them",
          default_doc="<campaign folder>/qs_measurements"),
    Field("max_s", POS_NUM, 10.0,
          "seconds one metric's warm-up and timing may take (5 timed calls at least; it stops earlier once the "
          "median is within 1 %)"),
    Field("resources", "a mapping {Ray resource: amount}", FrozenMap(),
          "the Ray resources of the node measurements run on (a deployment target's: spaces.targets)",
          default_doc="{} (a node of the trials' kind)", example={"edge_node": 1}, added_later=True),
    Field("predict_after", POS_INT, None,
          "one-shot scoring: model shapes measured before a model fitted on them predicts the rest (the chosen "
          "subnets are always measured)", default_doc="null (every shape measured)", added_later=True),
)
MEASURE_KEYS = tuple(MEASURE_FIELDS)
MeasureSpec = section_spec("MeasureSpec", MEASURE_FIELDS, __name__,
                           "The measure section (MEASURE_FIELDS): how measured cost is measured.")


def parse_measure(raw, c: Collector) -> MeasureSpec:
    """The measure section -> MeasureSpec (defaults filled in); problems go to ``c`` naming the key."""
    raw = c.section("measure", raw, MEASURE_KEYS, f"a mapping ({', '.join(MEASURE_KEYS)})")
    if raw is None:
        return MeasureSpec()
    return MeasureSpec(**read_table(raw, MEASURE_FIELDS, c, "measure", metrics=_metrics, resources=ray_resources))


def _metrics(raw, c: Collector, where: str) -> tuple[str, ...]:
    """measure.metrics: measured metrics, each named where it is not one."""
    metrics = raw or []
    if not isinstance(metrics, list):
        c.expected(where, MEASURE_FIELDS["metrics"].expected, metrics)
        return ()
    for i, metric in enumerate(metrics):
        if metric not in MEASURED_METRICS:
            c.add(f"{where}[{i}]", f"expected one of {', '.join(MEASURED_METRICS)}, given {show(metric)}"
                  + (hint(metric, MEASURED_METRICS, list_known=False) if isinstance(metric, str) else ""))
    return tuple(dict.fromkeys(m for m in metrics if m in MEASURED_METRICS))


def measured_metrics(spec) -> tuple[str, ...]:
    """The measured metrics a campaign needs: named by an objective, a constraint or measure.metrics, in
    spaces.metrics.MEASURED order; () when none (nothing is measured)."""
    named = {o.metric for o in spec.objectives} | {c.metric for c in spec.constraints} | set(spec.measure.metrics)
    return tuple(m for m in MEASURED_METRICS if m in named)


def ray_resources(raw, c: Collector, where: str) -> FrozenMap:
    """A mapping {Ray resource name: amount > 0, finite} (CPU and GPU among them), each entry checked and named."""
    if raw is None:
        return FrozenMap()
    if not isinstance(raw, dict):
        c.expected(where, "a mapping {Ray resource: amount}", raw)
        return FrozenMap()
    out = {}
    for name, amount in raw.items():
        if not isinstance(name, str) or not name or not is_number(amount) or amount <= 0:
            c.expected(f"{where}.{name}", "a positive amount of a named Ray resource", amount)
        else:
            out[name] = float(amount)
    return FrozenMap(out)
