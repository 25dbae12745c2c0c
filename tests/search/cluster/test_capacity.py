"""What a cluster can hold, now or once its autoscaler adds node types (search.cluster.capacity), without Ray."""
import pytest

from qkvsearch.search.cluster.capacity import Cluster, NodeType, ResourceError, plan_concurrency
from qkvsearch.spaces.sections import ResourcesSpec


def test_a_trial_the_autoscaler_can_make_room_for_waits_and_says_for_what():
    cluster = Cluster(0, 0, 0, None, False, [NodeType("ray.head.default", 0, 0, 0), NodeType("cpu2", 2, 0, 2)])
    assert plan_concurrency(ResourcesSpec(2, 1.0, 0.0, "auto"), cluster) == 2  # two cpu2 nodes, one trial each
    assert cluster.waiting_for.startswith("waiting for the autoscaler: one trial needs 2 workers x (1 CPU, 0 GPU)")
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


def test_an_autoscaler_that_does_not_list_its_node_types_is_asked_for_its_verdict():
    asked = []

    def verdict(answer):
        def ask(bundles):
            asked.append(bundles)
            return answer
        return ask

    spread = ResourcesSpec(2, 1.0, 0.0, "auto")
    cluster = Cluster(0, 0, 0, None, False, autoscaler="v2")
    assert plan_concurrency(spread, cluster, ask=verdict(True)) == 1  # "auto": what fits now, at least one
    assert asked == [[{"CPU": 1.0}, {"CPU": 1.0}]]
    assert cluster.waiting_for.startswith("waiting for the autoscaler: one trial needs 2 workers x (1 CPU, 0 GPU)")
    assert "says it can make room" in cluster.waiting_for
    assert plan_concurrency(ResourcesSpec(2, 1.0, 0.0, 4), Cluster(0, 0, 0, None, False, autoscaler="v2"),
                            ask=verdict(True)) == 4  # as many as asked: Tune waits for the nodes
    with pytest.raises(ResourceError) as err:
        plan_concurrency(ResourcesSpec(2, 8.0, 1.0, "auto"), Cluster(2, 0, 0, None, False, autoscaler="v2"),
                         ask=verdict(False))
    assert "no node type it may add can make room" in str(err.value) and "16 CPUs, 2 GPUs" in str(err.value)
    packed = ResourcesSpec(2, 1.0, 1.0, "auto", placement_strategy="STRICT_PACK")
    plan_concurrency(packed, Cluster(0, 0, 0, None, False, autoscaler="v2"), ask=verdict(None))
    assert asked[-1] == [{"CPU": 2.0, "GPU": 2.0}]  # one node holds them all


def test_an_autoscaler_that_says_nothing_makes_the_campaign_wait_saying_so():
    cluster = Cluster(0, 0, 0, None, False, autoscaler="v1")
    assert plan_concurrency(ResourcesSpec(1, 2.0, 1.0, "auto"), cluster) == 1
    assert "does not say what it can add" in cluster.waiting_for
    assert plan_concurrency(ResourcesSpec(1, 1.0, 0.0, "auto"), Cluster(8, 0, 0, None, False, autoscaler="v1")) == 8


def test_a_campaign_outgrows_the_nodes_present_only_when_its_trials_at_once_need_more():
    from qkvsearch.search.cluster.capacity import outgrows

    two_cpu = ResourcesSpec(2, 1.0, 0.0, "auto")
    assert not outgrows(two_cpu, Cluster(4, 0, 0, None, False), 2)
    assert outgrows(two_cpu, Cluster(4, 0, 0, None, False), 3)
    assert outgrows(ResourcesSpec(1, 1.0, 1.0, "auto"), Cluster(4, 0, 0, None, False), 1)  # a GPU it lacks
