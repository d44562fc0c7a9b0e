"""Blackwell presets and NVLink domains larger than a node (issue 36, item 1)."""

import math

import pytest

from merak_sim.costs.comm import (
    NVLS_EFFICIENCY,
    collective_algorithm,
    collective_time,
    group_shape,
    nvls_allreduce_time,
)
from merak_sim.hardware import GPU_PRESETS, Cluster, HardwareError, get_cluster
from merak_sim.layout import domain_of

GB = 1e9
T = 1e12


def test_blackwell_dense_peaks_are_half_the_sparse_datasheet_figures():
    b200, gb300 = GPU_PRESETS["B200-180GB"], GPU_PRESETS["GB300-288GB"]
    # HGX B200: FP8 72 PFLOP/s with sparsity over 8 GPUs -> 4.5 dense per GPU.
    assert b200.peak("fp8") == 72e15 / 8 / 2
    assert b200.peak("bf16") == 36e15 / 8 / 2
    assert b200.peak("nvfp4") == 2 * b200.peak("fp8")
    # GB300 NVL72: FP4 1,080 PFLOP/s dense per 72 GPUs.
    assert gb300.peak("nvfp4") == pytest.approx(1080e15 / 72)
    assert gb300.memory_bytes == 288 * GB and gb300.mem_bandwidth_Bps == 576e12 / 72


def test_nvl72_domain_spans_trays():
    c = get_cluster("gb200-nvl72", nodes=36)
    assert (c.gpus_per_node, c.domain_size, c.world_size) == (4, 72, 144)
    assert not c.same_node(3, 4) and c.same_domain(3, 4)
    assert c.link_between(0, 71) is c.intra and c.link_between(71, 72) is c.inter
    assert c.domain_of(143) == 1 == domain_of(143, 72)
    # One NIC per GPU: a tray's 4 adapters shared by its 4 GPUs.
    assert c.inter_bandwidth_per_gpu_Bps == pytest.approx(0.9 * 400 / 8 * GB)


def test_hgx_domain_is_the_node():
    c = get_cluster("dgx-b200", nodes=2)
    assert c.domain_size == 8 and not c.same_domain(7, 8)
    assert c.inter_bandwidth_per_gpu_Bps == pytest.approx(0.9 * 50 * GB)


def test_domain_must_be_whole_nodes():
    base = get_cluster("gb200-nvl72")
    with pytest.raises(HardwareError, match="multiple of gpus_per_node 4"):
        Cluster(base.name, base.gpu, 2, 4, base.intra, base.inter, nvlink_domain=6)


def test_json_round_trip_keeps_domain():
    c = get_cluster("gb300-nvl72", nodes=18)
    back = Cluster.from_json(c.to_dict())
    assert back.domain_size == 72 and back.nvls and back.gpu.peak("nvfp4") == 15e15


def test_tp_group_across_trays_is_priced_on_nvlink():
    c = get_cluster("gb200-nvl72", nodes=36)
    ranks = tuple(range(8))  # trays 0 and 1
    assert group_shape(ranks, c) == (1, 8)
    n = 64 * 2**20
    ring = 7 * 5e-6 + 7 / 8 * n / (720 * GB)
    assert collective_time("all-gather", n, ranks, c) == pytest.approx(ring)
    # The same 8 ranks on HGX B200 nodes of 8 are one node too: same NVLink price.
    assert collective_time("all-gather", n, ranks, get_cluster("dgx-b200")) == \
        pytest.approx(ring)


def test_nvls_allreduce_inside_domain():
    c = get_cluster("gb200-nvl72")
    n = 256 * 2**20
    ranks = tuple(range(0, 72, 9))  # 8 ranks on 8 different trays
    nvls = 2 * 5e-6 + n / (NVLS_EFFICIENCY * 900 * GB)
    ring = 2 * 7 * 5e-6 + 2 * 7 / 8 * n / (720 * GB)
    assert nvls < ring
    assert nvls_allreduce_time(n, c) == pytest.approx(nvls)
    assert collective_time("all-reduce", n, ranks, c) == pytest.approx(nvls)
    assert collective_algorithm("all-reduce", n, ranks, c) == "nvls"
    # No NVLS on the H100 preset (kept as fitted): infinite, never chosen.
    assert math.isinf(nvls_allreduce_time(n, get_cluster("dgx-h100")))


def test_allreduce_across_nvl72_racks_uses_nvls_then_tree():
    c = get_cluster("gb200-nvl72", nodes=18 * 16)  # 16 racks
    ranks = tuple(range(0, c.world_size, 9))  # 8 per rack, 16 racks
    assert group_shape(ranks, c) == (16, 8)
    n = 32 * 2**20
    bw_g = c.inter_bandwidth_per_gpu_Bps
    tree = 2 * 4 * 5e-6 + 2 * (n / 8) / bw_g
    expect = nvls_allreduce_time(n, c) + tree
    assert collective_algorithm("all-reduce", n, ranks, c) == "hierarchical nvls-tree"
    assert collective_time("all-reduce", n, ranks, c) == pytest.approx(expect)
