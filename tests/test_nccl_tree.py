"""All-reduce across nodes: NCCL's double binary tree beside the rings, the fastest
priced (merak_sim.costs.comm module docstring)."""

import math

import pytest

from merak_sim.costs.comm import CostModelError, collective_algorithm, collective_time
from merak_sim.costs.comm import inter_bandwidth_per_gpu
from merak_sim.costs.nccl import VTRAIN_A100
from merak_sim.hardware import get_cluster

BIG = get_cluster("dgx-h100", nodes=512)


def _one_per_node(k, cluster=BIG):
    return tuple(range(0, cluster.gpus_per_node * k, cluster.gpus_per_node))


def _ring_inter(nbytes, k, cluster=BIG, table=None):
    bw, lat = inter_bandwidth_per_gpu(cluster, table), cluster.inter.latency_s
    return 2 * (k - 1) * lat + 2 * (k - 1) / k * nbytes / bw


def test_tree_time_is_log_steps_and_twice_the_bytes():
    k, nbytes = 512, 1e6
    bw, lat = inter_bandwidth_per_gpu(BIG), BIG.inter.latency_s
    ranks = _one_per_node(k)
    assert collective_algorithm("all-reduce", nbytes, ranks, BIG) == "hierarchical tree"
    expect = 2 * math.ceil(math.log2(k)) * lat + 2 * nbytes / bw
    assert collective_time("all-reduce", nbytes, ranks, BIG) == pytest.approx(expect)
    # The ring's 2 (k - 1) latency steps alone cost more than the whole tree here.
    assert _ring_inter(nbytes, k) > 5 * expect


def test_ring_keeps_large_messages_on_few_nodes():
    ranks = _one_per_node(2)
    for nbytes in (1e5, 1e9):
        # Two nodes: the tree's latency steps equal the ring's, its bytes are twice.
        assert collective_algorithm("all-reduce", nbytes, ranks, BIG) == "hierarchical ring"
        assert collective_time("all-reduce", nbytes, ranks, BIG) == pytest.approx(
            _ring_inter(nbytes, 2))
    assert collective_algorithm("all-reduce", 1e9, _one_per_node(16), BIG) == \
        "hierarchical ring"


def test_the_switch_point_moves_to_larger_messages_with_more_nodes():
    def switch(k):
        sizes = [2 ** e for e in range(10, 40)]
        return next(s for s in sizes
                    if collective_algorithm("all-reduce", s, _one_per_node(k), BIG)
                    != "hierarchical tree")
    assert switch(4) < switch(16) < switch(64)


def test_tree_never_raises_a_price_and_serves_all_reduce_only():
    for k in (2, 4, 32, 512):
        for nbytes in (1e4, 1e6, 1e8):
            t = collective_time("all-reduce", nbytes, _one_per_node(k), BIG)
            assert t <= _ring_inter(nbytes, k) * (1 + 1e-12)
            for kind in ("reduce-scatter", "all-gather"):
                assert collective_algorithm(kind, nbytes, _one_per_node(k), BIG) != \
                    "hierarchical tree"


def test_measured_inter_node_bandwidth_prices_the_tree_too():
    cluster = get_cluster("vtrain-a100", nodes=64)
    ranks = _one_per_node(64, cluster)
    bw = inter_bandwidth_per_gpu(cluster, VTRAIN_A100)
    assert bw < inter_bandwidth_per_gpu(cluster)  # 91 GB/s per node, below line rate
    nbytes = 1e6
    assert collective_algorithm("all-reduce", nbytes, ranks, cluster, VTRAIN_A100) == \
        "hierarchical tree"
    expect = 2 * math.ceil(math.log2(64)) * cluster.inter.latency_s + 2 * nbytes / bw
    assert collective_time("all-reduce", nbytes, ranks, cluster, VTRAIN_A100) == \
        pytest.approx(expect)


def test_names_inside_one_node_and_refuses_p2p():
    assert collective_algorithm("all-reduce", 1e6, tuple(range(8)), BIG) == "intra-node"
    with pytest.raises(CostModelError, match="p2p is a single transfer"):
        collective_algorithm("p2p", 1e6, (0, 8), BIG)
    with pytest.raises(CostModelError, match="unknown collective"):
        collective_algorithm("broadcast", 1e6, (0, 8), BIG)
