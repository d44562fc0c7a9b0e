"""Physics of the vTrain multi-node rows: NCCL's measured bus bandwidth between nodes
(merak_sim.costs.nccl, costs.comm) and the per-row breakdown of a prediction
(research.vtrain_breakdown)."""

import pytest

from merak_sim.costs.comm import (
    collective_time,
    group_ranks,
    inter_bandwidth_per_gpu,
    measured_collectives,
)
from merak_sim.costs.nccl import (
    A100_NVSWITCH,
    HDR4_A100_NODES,
    NCCL_TABLES,
    VTRAIN_A100,
    InterNodeBusBandwidth,
)
from merak_sim.hardware import get_cluster
from research.vtrain import PreparedRow, VTrainRow, vtrain_cost_model
from research.vtrain_breakdown import RowBreakdown, comm_scale_needed, row_breakdown

GB = 1e9


def test_measured_inter_node_figure_and_its_bounds():
    # Public nccl-tests reports on 8x A100 + 4x HDR nodes: 84.8-96 GB/s, 91 at 1-8 GB.
    assert HDR4_A100_NODES.node_Bps == 91 * GB
    assert (HDR4_A100_NODES.low_Bps, HDR4_A100_NODES.high_Bps) == (84.8 * GB, 96 * GB)
    # Below the 4x HDR line rate (100 GB/s per node), as NCCL never reaches it.
    assert HDR4_A100_NODES.high_Bps < 100 * GB
    with pytest.raises(ValueError, match="measured range"):
        InterNodeBusBandwidth("x", node_Bps=120 * GB, low_Bps=80 * GB, high_Bps=100 * GB)
    assert NCCL_TABLES["vtrain-a100"] is VTRAIN_A100
    assert VTRAIN_A100.allreduce_s == A100_NVSWITCH.allreduce_s  # same NVLink tables
    assert A100_NVSWITCH.inter is None  # the DGX presets (8 adapters) keep the link


def test_per_gpu_share_is_the_measured_node_figure_over_its_gpus():
    c = get_cluster("vtrain-a100", nodes=2)
    assert c.inter_bandwidth_per_gpu_Bps == pytest.approx(100 * GB / 8)
    assert inter_bandwidth_per_gpu(c) == c.inter_bandwidth_per_gpu_Bps
    assert inter_bandwidth_per_gpu(c, A100_NVSWITCH) == c.inter_bandwidth_per_gpu_Bps
    assert inter_bandwidth_per_gpu(c, VTRAIN_A100) == pytest.approx(91 * GB / 8)
    # Never above the link's own share (a faster measurement than the wire).
    fast = InterNodeBusBandwidth("x", node_Bps=200 * GB, low_Bps=200 * GB,
                                 high_Bps=200 * GB)
    assert fast.per_gpu_Bps(12.5 * GB, 8) == 12.5 * GB


def test_off_node_transfers_use_the_measured_bandwidth():
    c = get_cluster("vtrain-a100", nodes=2)
    meas = measured_collectives(VTRAIN_A100)
    n = 512 << 20
    lat = c.inter.latency_s
    bw = 91 * GB / 8
    # p2p across nodes: one latency plus the bytes at the GPU's share.
    assert meas("p2p", n, (0, 8), c) == pytest.approx(lat + n / bw)
    # A two-rank ring all-reduce across nodes: 2 steps, each GPU sends the payload once.
    assert meas("all-reduce", n, (0, 8), c) == pytest.approx(2 * lat + n / bw)
    # Intra-node collectives are unchanged (the NVLink tables).
    ranks = tuple(range(8))
    assert meas("all-reduce", n, ranks, c) == pytest.approx(
        A100_NVSWITCH.allreduce_time(n, 8))
    # Off-node: slower than the line-rate link model by 100/91 on the network part.
    plain = collective_time("all-reduce", n, (0, 8), c)
    assert meas("all-reduce", n, (0, 8), c) / plain == pytest.approx(100 / 91, rel=1e-3)


_ROW = VTrainRow(gpus=64, global_batch=64, micro_batch=2, hidden=3072, heads=32, layers=8,
                 seq_len=2048, tp=2, dp=8, pp=4, time_ms=1000.0)


def test_vtrain_rows_are_priced_with_the_measured_network():
    p = PreparedRow.of(_ROW)
    t = vtrain_cost_model().cost_table(p.model, p.cluster, p.config)
    # dp=8 with tp=2 spans 2 nodes per stage: the gradient all-reduce crosses nodes.
    groups = group_ranks("dp", p.config, pp_rank=1)
    assert groups == tuple(range(16, 32, 2))
    g = t.stages[1].grad_bytes
    assert t.stages[1].grad_allreduce_s == pytest.approx(
        measured_collectives(VTRAIN_A100)("all-reduce", g, groups, p.cluster))


def test_breakdown_terms_account_for_the_prediction():
    p = PreparedRow.of(_ROW)
    b = row_breakdown(p)
    assert b.predicted_s == pytest.approx(p.predict())
    assert b.measured_s == 1.0 and b.error == pytest.approx(b.predicted_s - 1.0)
    for v in (b.compute_s, b.bubble_s, b.tp_comm_s, b.pp_comm_s, b.dp_comm_s,
              b.optimizer_s):
        assert v > 0
    # pp=4: the bubble is about (pp - 1) / m of the compute (m = 4 micro-batches).
    assert 0.3 * b.compute_s < b.bubble_s < 1.0 * b.compute_s
    assert abs(b.other_s) < 0.05 * b.predicted_s
    # One stage, one replica: no pipeline and no data-parallel communication.
    solo = PreparedRow.of(VTrainRow(gpus=2, global_batch=4, micro_batch=2, hidden=1024,
                                    heads=16, layers=4, seq_len=1024, tp=2, dp=1, pp=1,
                                    time_ms=100.0))
    s = row_breakdown(solo)
    assert s.pp_comm_s == 0 and s.dp_comm_s == 0 and s.bubble_s == pytest.approx(0, abs=1e-9)
    assert s.tp_comm_s > 0


def test_comm_scale_needed():
    def b(pred, meas, comm):
        return RowBreakdown(predicted_s=pred, measured_s=meas, compute_s=pred - comm,
                            bubble_s=0.0, tp_comm_s=comm / 2, pp_comm_s=comm / 4,
                            dp_comm_s=comm / 4, optimizer_s=0.0)

    assert comm_scale_needed([b(10, 10, 1)]) == pytest.approx(1.0)
    assert comm_scale_needed([b(9, 10, 1), b(10, 11, 1)]) == pytest.approx(2.0)
    assert comm_scale_needed([b(11, 10, 2)]) == pytest.approx(0.5)
    assert comm_scale_needed([b(9, 10, 0)]) == float("inf")


def test_breakdown_counts_the_exchange_as_pipeline_communication():
    from merak_sim.calibrate.vtrain import VTrainRow
    from research.vtrain import PreparedRow, vtrain_cost_model

    # pp=4 with tp=2 dp=8: 16 GPUs per stage, so every stage boundary crosses nodes.
    row = VTrainRow(gpus=64, global_batch=64, micro_batch=2, hidden=3072, heads=32,
                    layers=8, seq_len=2048, tp=2, dp=8, pp=4, time_ms=1000.0)
    p = PreparedRow.of(row)
    cm = vtrain_cost_model()
    base = cm.base.cost_table(p.model, p.cluster, p.config)
    b = row_breakdown(p)
    assert b.predicted_s == pytest.approx(p.predict())
    ex = cm.exchange(base, p.cluster, p.config)
    m = p.config.num_microbatches
    # At least one stage's waits per micro-batch lie on the critical path.
    assert b.pp_comm_s >= m * (ex[1].forward_s + ex[1].backward_s) * 0.5
    # Compute excludes the waits: the busiest rank's compute in the table without them.
    c = p.recompute
    compute = max(m * (s.forward_s - s.tp_exposed_fwd_s + s.backward_s - s.tp_exposed_bwd_s
                       + c[g] * (s.recompute_s - s.tp_exposed_recompute_s))
                  for g, s in enumerate(base.stages))
    assert b.compute_s == pytest.approx(compute)
    assert abs(b.other_s) < 0.05 * b.predicted_s
