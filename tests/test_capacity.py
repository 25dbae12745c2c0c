"""What a cluster can hold, now or once its autoscaler adds node types (search.capacity), without Ray."""
import pytest

from qkvsearch.search.capacity import Cluster, NodeType, plan_concurrency
from qkvsearch.search.preflight import ResourceError
from qkvsearch.spaces.schema import ResourcesSpec


def test_a_trial_the_autoscaler_can_make_room_for_waits_and_says_for_what():
    cluster = Cluster(0, 0, 0, None, False, [NodeType("ray.head.default", 0, 0, 0), NodeType("cpu2", 2, 0, 2)])
    assert plan_concurrency(ResourcesSpec(2, 1.0, 0.0, "auto"), cluster) == 2  # two cpu2 nodes, one trial each
    assert cluster.waiting_for.startswith("waiting for the autoscaler: one trial needs 2 CPUs, 0 GPUs")
    assert "cpu2 (2 CPU, 0 GPU)" in cluster.waiting_for and "ray.head.default" not in cluster.waiting_for


def test_a_trial_no_node_type_could_hold_is_refused_naming_them():
    cluster = Cluster(0, 0, 0, None, False, [NodeType("cpu2", 2, 0, 2)])
    with pytest.raises(ResourceError) as err:
        plan_concurrency(ResourcesSpec(1, 4.0, 0.0, "auto"), cluster)
    assert "1 workers x (4 CPU, 0 GPU)" in str(err.value) and "cpu2 (2 CPU, 0 GPU, up to 2)" in str(err.value)


def test_without_an_autoscaler_the_present_cluster_decides():
    assert plan_concurrency(ResourcesSpec(1, 1.0, 0.0, "auto"), Cluster(4, 0, 0, None, True)) == 4
    assert plan_concurrency(ResourcesSpec(1, 1.0, 0.0, 2), Cluster(4, 0, 0, None, True)) == 2
    with pytest.raises(ResourceError):
        plan_concurrency(ResourcesSpec(1, 1.0, 1.0, "auto"), Cluster(4, 0, 0, None, True))
