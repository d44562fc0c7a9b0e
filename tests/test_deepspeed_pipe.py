"""DeepSpeed's pipeline exchange as the vTrain runs had it (costs.deepspeed_pipe, the
megatron-deepspeed stack of the calibration) and Megatron's padded vocabulary
(calibrate.vtrain.padded_vocab)."""

import pytest

from merak_sim.calibrate.fit import PreparedRun
from merak_sim.calibrate.measured import MeasuredRun
from merak_sim.calibrate.stacks import check_stack
from merak_sim.calibrate.vtrain import VTrainRow, padded_vocab, row_setup
from merak_sim.costs.comm import group_ranks, measured_collectives
from merak_sim.costs.deepspeed_pipe import (
    FULL_COPY_BYTES,
    DeepSpeedPipelineModel,
    exchange_seconds,
    with_exchange,
    without_exchange,
)
from merak_sim.costs.nccl import VTRAIN_A100

# pp=4 with tp=2 dp=8: 16 GPUs per stage, so every stage boundary crosses nodes.
_ROW = VTrainRow(gpus=64, global_batch=64, micro_batch=2, hidden=3072, heads=32, layers=8,
                 seq_len=2048, tp=2, dp=8, pp=4, time_ms=1000.0)


class _Row:
    """A prepared row with the names the checks below read."""

    def __init__(self, row: VTrainRow, stack: str = "megatron-deepspeed") -> None:
        self.model, self.cluster, self.config = row_setup(row)
        self.prepared = PreparedRun.of(MeasuredRun("row", self.model, self.cluster,
                                                   self.config, row.time_ms / 1e3, stack))

    def predict(self) -> float:
        return self.prepared.predict(None)


def _base(row):
    p = _Row(row)
    cm = p.prepared.cost_model(None)
    assert isinstance(cm, DeepSpeedPipelineModel)
    return p, cm, cm.base.cost_table(p.model, p.cluster, p.config)


def test_padded_vocab_is_megatrons_rounding_of_gpt2():
    assert [padded_vocab(t) for t in (1, 2, 4, 8, 16)] == [50304, 50432, 50688, 51200, 51200]
    for t in (1, 2, 3, 4, 8, 16):
        v = padded_vocab(t)
        assert v % (128 * t) == 0 and 50257 <= v < 50257 + 128 * t
    assert _Row(_ROW).model.vocab == 50432


def test_exchange_terms_by_hand():
    p, cm, base = _base(_ROW)
    comm = measured_collectives(VTRAIN_A100)
    eff = cm.base.efficiency_for(p.cluster)
    ex = exchange_seconds(base, p.cluster, p.config, comm, eff)
    a = base.stages[0].p2p_bytes
    assert a == pytest.approx(2 * 2048 * 3072 * 2)  # b * s * h fp16, no sequence parallel
    tp0, tp1 = (group_ranks("tp", p.config, g) for g in (0, 1))
    assert tp0 == (0, 1) and tp1 == (16, 17)
    send = comm("p2p", a / 2, (tp0[0], tp1[0]), p.cluster)
    # Off-node: latency plus the half tensor at the GPU's share of 91 GB/s per node.
    assert send == pytest.approx(p.cluster.inter.latency_s + (a / 2) / (91e9 / 8))
    full = comm("all-gather", a, tp0, p.cluster) + eff.mem_time(
        FULL_COPY_BYTES * a, p.cluster.gpu.mem_bandwidth_Bps, 2)
    assert ex[0].forward_s == 0 and ex[-1].backward_s == 0
    assert ex[0].backward_s == pytest.approx(2 * send + 2 * full)
    assert ex[1].forward_s == pytest.approx(2 * send + full)
    assert ex[1].backward_s == pytest.approx(ex[0].backward_s)
    assert ex[-1].forward_s == pytest.approx(ex[1].forward_s)


def test_without_partitioning_the_whole_tensor_moves_and_nothing_is_gathered():
    row = VTrainRow(gpus=64, global_batch=64, micro_batch=2, hidden=3072, heads=32,
                    layers=8, seq_len=2048, tp=1, dp=16, pp=4, time_ms=1000.0)
    p, cm, base = _base(row)
    comm = measured_collectives(VTRAIN_A100)
    ex = cm.exchange(base, p.cluster, p.config)
    a = base.stages[0].p2p_bytes
    assert ex[1].forward_s == pytest.approx(2 * comm("p2p", a, (0, 16), p.cluster))
    assert ex[1].backward_s == pytest.approx(ex[1].forward_s)


def test_the_exchange_moves_into_compute_and_back_out():
    p, cm, base = _base(_ROW)
    ex = cm.exchange(base, p.cluster, p.config)
    t = with_exchange(base, ex)
    assert t == cm.cost_table(p.model, p.cluster, p.config)
    for s0, s1, e in zip(base.stages, t.stages, ex, strict=True):
        assert s1.send_activation_s == 0
        assert s1.forward_s == pytest.approx(s0.forward_s + e.forward_s)
        assert s1.backward_s == pytest.approx(s0.backward_s + e.backward_s)
        assert s1.backward_input_s == pytest.approx(s0.backward_input_s + e.backward_s)
        assert s1.recompute_s == s0.recompute_s and s1.p2p_bytes == s0.p2p_bytes
    back = without_exchange(t, ex)
    for s0, s2 in zip(base.stages, back.stages, strict=True):
        assert s2.forward_s == pytest.approx(s0.forward_s)
        assert s2.backward_s == pytest.approx(s0.backward_s)
    # The exchange is a function of the table's bytes: the folded table gives it again.
    assert cm.exchange(t, p.cluster, p.config) == ex


def test_synchronous_exchange_costs_more_than_megatrons_asynchronous_sends():
    ds = _Row(_ROW).predict()
    sg = _Row(_ROW, "megatron").predict()
    assert ds > sg
    # One stage: no exchange, the engines agree.
    solo = VTrainRow(gpus=8, global_batch=16, micro_batch=2, hidden=1024, heads=16,
                     layers=4, seq_len=1024, tp=2, dp=4, pp=1, time_ms=100.0)
    assert _Row(solo).predict() == pytest.approx(_Row(solo, "megatron").predict())
    with pytest.raises(ValueError, match="megatron-deepspeed"):
        check_stack("bogus")
