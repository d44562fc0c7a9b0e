"""TraceCostModel: exact lookups, interpolation, analytic fallback (and saying so)."""

from pathlib import Path

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs import AnalyticCostModel, CostModel
from merak_sim.costs.trace_model import TraceCostModel, interpolate
from merak_sim.hardware import get_cluster
from merak_sim.model import ModelSpec
from merak_sim.trace import CollectiveRecord, LayerRecord, Provenance, Trace, read_trace

SHIPPED = Path(__file__).resolve().parents[1] / "traces" / "cpu-gpt-tiny.json"
SPEC = ModelSpec(name="toy", family="gpt", layers=8, hidden=256, heads=8, seq_len=128,
                 vocab=4096, dtype="fp32", dropout=0.0)
CPU = get_cluster("local-cpu")


def rec(kind, mbs, s, f, act=1000.0):
    return LayerRecord(kind, mbs, s, f, 2 * f, f, act, 10.0, backward_input_s=1.5 * f,
                       backward_weight_s=0.5 * f)


def toy_trace(records, colls=()):
    prov = Provenance("cpu", "fp32", "2.13.0", "x", "test", "2026-11-30")
    return Trace(prov, SPEC, tuple(records), tuple(colls))


def cfg(**kw):
    base = dict(pp=2, micro_batch_size=2, global_batch_size=8, dtype="fp32")
    base.update(kw)
    return ParallelConfig(**base)


def test_interpolate():
    assert interpolate([1, 2, 4], [10, 20, 40], 3) == 30
    assert interpolate([1, 2], [10, 30], 4) == 70  # linear extrapolation
    assert interpolate([2], [10], 6) == 30  # proportional from one point
    assert interpolate([1, 2, 4], [10, 20, 40], 2) == 20


def test_exact_records_drive_stage_times():
    t = toy_trace([rec("block", 2, 128, 1e-3), rec("embedding", 2, 128, 1e-4),
                   rec("head", 2, 128, 5e-3)])
    cm = TraceCostModel(t)
    assert isinstance(cm, CostModel)
    table = cm.cost_table(SPEC, CPU, cfg())
    s0, s1 = table.stages
    assert s0.forward_s == pytest.approx(4 * 1e-3 + 1e-4)
    assert s1.forward_s == pytest.approx(4 * 1e-3 + 5e-3)
    assert s1.backward_s == pytest.approx(4 * 2e-3 + 2 * 5e-3)
    assert s1.backward_input_s == pytest.approx(0.75 * s1.backward_s)
    assert s0.activation_bytes == pytest.approx(4 * 1000 + 1000)
    assert table.meta["source"] == "trace"
    assert not any("analytic used" in n for n in table.notes)


def test_interpolation_across_mbs_and_seq_is_noted():
    t = toy_trace([rec("block", 1, 64, 1e-3), rec("block", 4, 64, 4e-3),
                   rec("block", 1, 256, 4e-3), rec("block", 4, 256, 16e-3)])
    cm = TraceCostModel(t)
    vals, how = cm.estimate(SPEC, "block", 1, 2, 128)
    # mbs 2 -> 2e-3 at s=64 and 8e-3 at s=256; s=128 -> 2e-3 + 6e-3 * 64/192.
    assert vals["forward_s"] == pytest.approx(2e-3 + 6e-3 * 64 / 192)
    assert "interpolated" in how
    table = cm.cost_table(SPEC, CPU, cfg())
    assert any("trace layer 'block'" in n and "interpolated" in n for n in table.notes)
    # Embedding and head are absent: analytic fallback, said in the notes.
    assert any("trace lacks layer 'embedding'" in n for n in table.notes)
    assert table.meta["layer_sources"]["head"] == "analytic"


def test_fallback_for_other_tp_and_shape():
    t = toy_trace([rec("block", 2, 128, 1e-3)])
    cm = TraceCostModel(t)
    big = SPEC.with_(hidden=512)
    table = cm.cost_table(big, CPU, cfg())
    ana = AnalyticCostModel().cost_table(big, CPU, cfg())
    assert table.stages[0].forward_s == pytest.approx(ana.stages[0].forward_s)
    assert any("trace lacks layer 'block'" in n for n in table.notes)
    t2 = cm.cost_table(SPEC, CPU, cfg(tp=2))
    assert any("tp=2" in n for n in t2.notes)


def test_collectives_from_trace():
    colls = [CollectiveRecord("all-reduce", 2, "intra", 1e6, 1e-3),
             CollectiveRecord("all-reduce", 2, "intra", 3e6, 2e-3)]
    cm = TraceCostModel(toy_trace([rec("block", 2, 128, 1e-3)], colls))
    assert cm.comm_time("all-reduce", 2e6, (0, 1), CPU) == pytest.approx(1.5e-3)
    # No record for all-gather: analytic.
    assert cm.comm_time("all-gather", 2e6, (0, 1), CPU) == pytest.approx(
        AnalyticCostModel().comm_time("all-gather", 2e6, (0, 1), CPU))


def test_shipped_trace_drives_local_cpu_costs():
    t = read_trace(SHIPPED)
    cm = TraceCostModel(SHIPPED)
    spec = t.model
    table = cm.cost_table(spec, CPU, cfg(pp=2, micro_batch_size=2))
    blk = next(r for r in t.layers if r.kind == "block" and r.micro_batch_size == 2
               and r.seq_len == spec.seq_len)
    assert table.stages[0].layers == 2
    mid = table.stages[0].forward_s - next(
        r for r in t.layers if r.kind == "embedding" and r.micro_batch_size == 2
        and r.seq_len == spec.seq_len).forward_s
    assert mid == pytest.approx(2 * blk.forward_s)
    # mbs 3 is not measured: interpolated between 2 and 4.
    t3 = cm.cost_table(spec, CPU, cfg(pp=2, micro_batch_size=3, global_batch_size=12))
    assert any("interpolated" in n for n in t3.notes)


def test_trace_collectives_price_the_table():
    cfg2 = cfg(dp=2, pp=2, micro_batch_size=2, global_batch_size=8)
    ana = AnalyticCostModel().cost_table(SPEC, CPU, cfg2)
    g = ana.stages[0].grad_bytes
    p = ana.stages[0].p2p_bytes
    colls = [CollectiveRecord("all-reduce", 2, "intra", 0.0, 1e-4),
             CollectiveRecord("all-reduce", 2, "intra", 2 * g, 0.5),
             CollectiveRecord("p2p", 2, "intra", 0.0, 1e-5),
             CollectiveRecord("p2p", 2, "intra", 2 * p, 0.2)]
    cm = TraceCostModel(toy_trace([rec("block", 2, 128, 1e-3)], colls))
    t = cm.cost_table(SPEC, CPU, cfg2)
    tied = SPEC.vocab * SPEC.hidden * 4  # fp32 word-embedding gradient, summed 0 <-> 2

    def ar(nbytes):
        return 1e-4 + (0.5 - 1e-4) * nbytes / (2 * g)

    assert t.stages[0].grad_allreduce_s == pytest.approx(ar(g) + ar(tied))
    assert t.stages[0].send_activation_s == pytest.approx(1e-5 + (0.2 - 1e-5) / 2)
    # The fallback model itself is untouched.
    assert cm.fallback.cost_table(SPEC, CPU, cfg2).stages[0].grad_allreduce_s == \
        pytest.approx(ana.stages[0].grad_allreduce_s)


@pytest.mark.parametrize("name", ["cpu-gpt-tiny.json", "cpu-exec-gpt.json",
                                  "cpu-exec-hf-gpt2.json"])
def test_memory_model_predicts_shipped_trace_activation_bytes(name):
    from merak_sim.memory import (
        CPU_EAGER,
        CPU_EAGER_HF_GPT2,
        first_stage_extra_bytes,
        last_stage_extra_bytes,
        layer_activation_bytes,
    )

    prof = CPU_EAGER_HF_GPT2 if "hf-gpt2" in name else CPU_EAGER
    t = read_trace(SHIPPED.parent / name)
    fn = {"block": layer_activation_bytes, "embedding": first_stage_extra_bytes,
          "head": last_stage_extra_bytes}
    for r in t.layers:
        m = t.model.with_(seq_len=r.seq_len)
        pred = fn[r.kind](m, r.micro_batch_size, profile=prof)
        assert pred == pytest.approx(r.activation_bytes, rel=0.03), (r.key, pred)
