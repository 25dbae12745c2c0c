"""Deployment targets end to end on local Ray: two targets over the session's trained supernet
(``supernet.from``): "edge" measured on a node with a logical resource declared to the local Ray
(QKVSEARCH_RAY_RESOURCES), "server" on the trials' device under a parameter bound. The campaign is killed (SIGKILL)
while the second target scores, and resumed: each target chooses under its own constraints, exports its chosen
subnets, and nothing is scored or measured twice. A target whose resources no node has is refused naming it;
bad targets exit 2 before any training, naming the target."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from subprocess import run as sh

import pyarrow.parquet as pq
import pytest
import torch
from helpers.live_campaign import LiveCampaign, wait_while_advancing, write_spec
from helpers.trained_supernet import from_spec

from qkvsearch.search.analysis.report import build_report
from qkvsearch.search.campaign.measured import CACHE_DIR
from qkvsearch.search.campaign.oneshot.targets import check_placeable
from qkvsearch.search.cluster.capacity import ResourceError
from qkvsearch.search.monitor.oneshot_phases import read_phases
from qkvsearch.search.records import inherited
from qkvsearch.search.records.lease import STALE_ENV, read_lease
from qkvsearch.spaces.keys import quant_policy

pytestmark = pytest.mark.slow

STALE_S = 4
RESOURCE = "cpu_node"
PARAMS_MAX = 0.95   # M: SNE at full hidden width (1.0 M parameters) breaks it, the other subnets (0.84-0.90 M) not
TARGETS = [
    {"name": "edge", "resources": {RESOURCE: 1}, "precisions": ["fp"],
     "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}]},
    {"name": "server", "constraints": {"params_m": {"max": PARAMS_MAX}},
     "objectives": [{"metric": "top1_q", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}]},
]


def _spec(tmp: Path, source: Path, targets=TARGETS) -> dict:
    spec = from_spec(tmp / "results", "targets", source)
    spec.update(search={"algorithm": "random", "num_trials": 5, "seed": 1}, targets=targets,
                resources={**spec["resources"], "cpus_per_worker": 2},   # one scoring actor: fewer processes start
                measure={"batch": 4, "max_s": 0.02, "predict_after": 3})
    return spec


def _batches(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / inherited.INHERITED_DIR).glob("batch-*.json"))}


def _cache(exp: Path) -> dict[str, bytes]:
    return {str(p.relative_to(exp)): p.read_bytes() for p in sorted((exp / CACHE_DIR).rglob("*.json"))}


def test_two_targets_measure_where_they_run_choose_apart_and_resume_without_repeating(trained_oneshot, tmp_path):
    spec_file = write_spec(tmp_path / "targets.yaml", _spec(tmp_path, trained_oneshot))
    exp = tmp_path / "results" / "targets"
    edge, server = exp / "targets" / "edge", exp / "targets" / "server"
    env = {STALE_ENV: str(STALE_S)}

    declared = {**env, "QKVSEARCH_RAY_RESOURCES": json.dumps({RESOURCE: 1})}
    with LiveCampaign(["launch", str(spec_file)], tmp_path, declared) as run:   # killed while "server" scores
        wait_while_advancing(lambda: run._check_alive() or _batches(server), lambda: run.advancing(exp),
                             "a scored batch of the second target")
        run.kill()
    wait_while_advancing(lambda: read_lease(exp).stale, lambda: None, "the killed driver's hold to go stale",
                         stall_s=4 * STALE_S)
    before = {"edge": _batches(edge), "server": _batches(server), "cache": _cache(exp)}

    with LiveCampaign(["resume", str(exp)], tmp_path, declared) as run:
        assert run.finish(exp) == 0, run.stderr()[-3000:]

    assert all(_batches(edge)[n] == b for n, b in before["edge"].items()) and _batches(edge)   # recorded: kept
    assert all(_batches(server)[n] == b for n, b in before["server"].items())
    cache = _cache(exp)
    assert all(cache[n] == b for n, b in before["cache"].items())           # nothing measured twice
    by_target = {"edge": inherited.read_evaluations(str(edge)), "server": inherited.read_evaluations(str(server))}
    for name, records in by_target.items():
        keys = [inherited.subnet_identity(r["config"]) for r in records]
        assert len(keys) == len(set(keys)) and records, name             # none scored twice
    # measured where each target runs: edge's tasks held the declared resource, server's did not
    measured = {name: [r["measured_on"] for r in records if r.get("measured_on", {}).get("held") is not None]
                for name, records in by_target.items()}
    assert measured["edge"] and all(m["held"].get(RESOURCE) == 1.0 for m in measured["edge"])
    assert measured["server"] and all(RESOURCE not in m["held"] for m in measured["server"])
    assert {p.parent.name for p in (exp / CACHE_DIR).rglob("*.json")} == {"edge", "server"}   # cached apart
    # a subnet "edge" scored is not scored again for "server": its score is taken, naming where
    edge_scores = {inherited.subnet_identity(r["config"]): r["metrics"] for r in by_target["edge"]}
    taken = [r for r in by_target["server"] if r.get("scored_in")]
    assert all(r["scored_in"] == str(edge) and r["metrics"] == edge_scores[inherited.subnet_identity(r["config"])]
               for r in taken)
    assert all(not quant_policy(r["config"]) for r in by_target["edge"])  # edge runs fp only
    # each target chose under its own constraints, on measured (not predicted) costs, and exported its choice
    for name, folder in (("edge", edge), ("server", server)):
        selection = inherited.read_selection(str(folder))
        chosen = [r for r in by_target[name] if inherited.keys_text(r["keys"]) in
                  {inherited.keys_text(k) for k in selection["chosen"]}]
        assert chosen and all(not r.get("predicted") for r in chosen)
        for r in chosen:
            weights = torch.load(inherited.subnet_file(str(folder), r["subnet_id"]), weights_only=False)
            assert weights["config"] == r["config"]
    server_spec = json.loads((server / "qs_campaign.json").read_text())["spec"]
    assert server_spec["constraints"] == {"params_m": {"max": PARAMS_MAX}}
    assert all(r["cost"]["params_m"] <= PARAMS_MAX for r in by_target["server"])   # none breaks it was scored
    assert any(r["cost"]["params_m"] > PARAMS_MAX for r in by_target["edge"])       # edge has no such bound
    predictor = json.loads((edge / inherited.PREDICTOR_FILE).read_text())
    assert predictor["shapes_measured"] >= 3 and predictor["held_out"]["latency_ms"]["mape"] >= 0

    phases = read_phases(str(exp))   # what status, watch and the live line say: the targets' sums
    assert phases.phase == "done" and phases.texts()["scoring"] == \
        f"scoring done: {sum(map(len, by_target.values()))} subnets scored"
    build_report(str(exp), static=False)
    table = pq.read_table(exp / "report" / "targets.parquet").to_pandas()
    assert list(table["target"]) == ["edge", "server"] and list(table["chosen"]) == [
        len(inherited.read_selection(str(f))["chosen"]) for f in (edge, server)]
    assert (edge / "report" / "pareto.html").exists() and (server / "report" / "pareto.html").exists()
    assert "Deployment targets" in (exp / "report" / "report.md").read_text()


def test_a_target_no_node_can_place_is_refused_naming_it(ray_local):
    from qkvsearch.spaces import load_campaign

    spec = load_campaign({**_spec(Path("/tmp"), Path("/tmp/x")), "supernet": {"train": {"epochs": 1}}})
    with pytest.raises(ResourceError) as refused:   # the local Ray declares no cpu_node
        check_placeable(spec.targets)
    said = str(refused.value)
    assert said.startswith("targets[0].resources:") and "'edge'" in said and RESOURCE in said
    assert "QKVSEARCH_RAY_RESOURCES" in said


@pytest.mark.parametrize("target, named", [
    ({"name": "bad", "objectives": [{"metric": "epoch_s", "mode": "min"}]}, "targets[1].objectives[0].metric"),
    ({"name": "bad", "constraints": {"gmacs": {"max": 1e-6}}}, "targets[1].constraints.gmacs"),
])
def test_a_bad_target_exits_2_naming_it_before_anything_trains(tmp_path, target, named):
    # the counted bound is checked against the space's smallest subnet, before Ray starts: no supernet needed
    spec = _spec(tmp_path, tmp_path / "nowhere", targets=[TARGETS[0], target])
    spec["supernet"] = {"train": {"epochs": 1}, "retrain": "front", "control": 0}
    done = sh([sys.executable, "-m", "qkvsearch.search.cli", "launch", str(write_spec(tmp_path / "t.yaml", spec))],
              capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert named in done.stderr
    assert not (tmp_path / "results" / "targets" / "supernet").exists()   # nothing trained
