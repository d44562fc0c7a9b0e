"""Tensor-parallel collectives in the simulator: cost-table fields, TP events on the
"collective" stream, sync vs sub-pipelined exposure, SimPy == evaluator with
contention off, link sharing with p2p under contention, notes not duplicated."""

from dataclasses import replace

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs import AnalyticCostModel
from merak_sim.costs.base import CostTable, StageCost
from merak_sim.hardware import get_cluster
from merak_sim.model import get_model
from merak_sim.schedule.ir import Kind
from merak_sim.sim import Topology, simulate
from merak_sim.sim.from_config import recompute_fractions, schedule_for
from merak_sim.sim.program import compile_program
from merak_sim.timeline import TP_KIND

GPT20 = get_model("gpt-20b")
C3090 = get_cluster("paper-3090")
DGX = get_cluster("dgx-a100-80g")


def _table(cfg, model=GPT20, cluster=C3090):
    return AnalyticCostModel().cost_table(model, cluster, cfg)


def _cfg(**kw):
    base = dict(dp=2, tp=4, pp=8, micro_batch_size=2, global_batch_size=32,
                schedule="1f1b", recompute="none", dtype="fp16")
    base.update(kw)
    return ParallelConfig(**base)


# -- cost table ----------------------------------------------------------------------
def test_analytic_fills_tp_fields_consistently():
    cfg = _cfg()
    t = _table(cfg)
    rows = AnalyticCostModel().layer_breakdown(GPT20, C3090, cfg)
    mid = t.stages[3]
    n = mid.layers
    per_layer = rows["layer"]["tp_comm_fwd_s"]
    # Sync: everything is exposed and equals the layer breakdown's exposed time.
    assert mid.tp_comm_fwd_s == pytest.approx(n * per_layer)
    assert mid.tp_exposed_fwd_s == pytest.approx(mid.tp_comm_fwd_s)
    assert mid.tp_exposed_bwd_s == pytest.approx(mid.tp_comm_bwd_s) and mid.tp_comm_bwd_s > 0
    assert mid.tp_comm_recompute_s == pytest.approx(mid.tp_comm_fwd_s)
    # Bytes: 2 all-reduces per layer of b*s*h fp16 values, ring sends 2(t-1)/t of each.
    ar = cfg.micro_batch_size * GPT20.seq_len * GPT20.hidden * 2
    assert mid.tp_bytes_fwd == pytest.approx(n * 2 * 2 * 3 / 4 * ar)
    # The forward time includes the exposed part: removing it leaves the compute.
    lay = AnalyticCostModel().layer_costs(GPT20, C3090, cfg)[0]
    assert mid.forward_s - mid.tp_exposed_fwd_s == pytest.approx(n * lay.forward_s)
    # First stage adds the embedding's all-reduce, last the LM head's (backward).
    first, last = t.stages[0], t.stages[-1]
    assert first.tp_comm_fwd_s > first.layers * per_layer
    assert first.tp_comm_bwd_s == pytest.approx(first.layers * rows["layer"]["tp_comm_bwd_s"])
    assert last.tp_comm_bwd_s > last.layers * rows["layer"]["tp_comm_bwd_s"]
    # tp = 1: no TP collectives at all.
    one = _table(_cfg(dp=8, tp=1, pp=8))
    assert all(s.tp_comm_fwd_s == s.tp_comm_bwd_s == s.tp_bytes_fwd == 0 for s in one.stages)


def test_sub_pipelined_hides_all_but_the_last_all_reduce():
    sync = _table(_cfg()).stages[3]
    sub = _table(_cfg(tp_overlap="sub-pipelined")).stages[3]
    assert sub.tp_exposed_fwd_s < sync.tp_exposed_fwd_s
    assert sub.tp_exposed_bwd_s < sync.tp_exposed_bwd_s
    # Same bytes; the total is the sync one split in halves (plus latency terms).
    assert sub.tp_bytes_fwd == pytest.approx(sync.tp_bytes_fwd)
    assert sub.tp_comm_fwd_s >= sync.tp_comm_fwd_s
    # Exposed >= one all-reduce per layer pass (the last of 2k), hidden <= compute.
    n = sub.layers
    assert sub.tp_exposed_fwd_s >= sub.tp_comm_fwd_s / 4 - 1e-12  # 2k = 4 collectives
    assert sub.tp_comm_fwd_s - sub.tp_exposed_fwd_s <= sub.forward_s - sub.tp_exposed_fwd_s
    assert n > 0


def test_old_constructors_default_to_no_tp():
    s = StageCost(*([0.0] * 16), layers=1)
    assert s.tp_comm_fwd_s == s.tp_exposed_bwd_s == s.tp_bytes_recompute == 0.0


# -- events and exposure -------------------------------------------------------------
@pytest.mark.parametrize("engine", ["simpy", "evaluator"])
def test_tp_events_stream_and_durations(engine):
    cfg = _cfg(recompute="full")
    table = _table(cfg)
    res = simulate(config=cfg, cost_table=table, engine=engine, contention=False)
    prog = res.trace.prog
    df = res.events()
    tp = df[df["kind"] == TP_KIND]
    assert set(tp["stream"]) == {"collective"}
    comp = df[df["stream"] == "compute"].set_index(["rank", "action"])
    n_tp_actions = sum(1 for i, a in enumerate(prog.actions) if prog.tp_s[i] > 0)
    assert len(tp) == n_tp_actions > 0
    c = recompute_fractions(cfg, prog.schedule)
    for row in tp.itertuples():
        st = table.stages[row.stage]
        kind = comp.loc[(row.rank, row.action), "kind"]
        if kind == "FORWARD":
            want = st.tp_comm_fwd_s
        else:
            assert kind == "BACKWARD"
            want = st.tp_comm_bwd_s + c[row.stage] * st.tp_comm_recompute_s
        assert row.end_s - row.start_s == pytest.approx(want, rel=1e-12)
        # The collective ends with its action (no contention).
        assert row.end_s == comp.loc[(row.rank, row.action), "end_s"]
        assert row.bytes > 0
    # Chrome trace: on the rank's TP-collective thread.
    trace = res.chrome_trace()["traceEvents"]
    ev = [e for e in trace if e.get("cat") == TP_KIND]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace
             if e["name"] == "thread_name"}
    assert len(ev) == len(tp)
    assert {names[(e["pid"], e["tid"])] for e in ev} == {"collective (tp)"}


def test_gantt_draws_tp_collectives(tmp_path):
    cfg = _cfg()
    res = simulate(config=cfg, cost_table=_table(cfg), contention=False)
    fig = res.plot_gantt(tmp_path / "g.png")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert TP_KIND in labels and (tmp_path / "g.png").stat().st_size > 0


def test_exposed_comm_counts_exposed_tp_sync_vs_subpipelined():
    out = {}
    for ov in ("none", "sub-pipelined"):
        cfg = ParallelConfig(dp=1, tp=4, pp=1, micro_batch_size=2, global_batch_size=8,
                             tp_overlap=ov, dtype="fp16")
        table = _table(cfg, cluster=get_cluster("paper-3090", nodes=1))
        res = simulate(config=cfg, cost_table=table, contention=False)
        prog = res.trace.prog
        r = res.ranks[0]
        # pp = dp = 1: the only communication is the TP collectives' exposed part.
        assert r.exposed_comm_s == pytest.approx(sum(prog.tp_exposed_s), rel=1e-12)
        assert r.compute_s + r.exposed_comm_s == pytest.approx(res.iteration_time_s)
        out[ov] = (res, prog)
    sync, sub = out["none"][1], out["sub-pipelined"][1]
    assert sum(sync.tp_exposed_s) == pytest.approx(sum(sync.tp_s))
    assert sum(sub.tp_exposed_s) < 0.6 * sum(sub.tp_s)
    assert out["sub-pipelined"][0].ranks[0].exposed_comm_s < out["none"][0].ranks[0].exposed_comm_s
    # Sub-pipelined: the collective starts before the compute it overlaps ends.
    df = out["sub-pipelined"][0].events()
    f0 = df[(df["action"] == "F0")].set_index("stream")
    hidden = sub.tp_s[0] - sub.tp_exposed_s[0]
    assert f0.loc["collective", "start_s"] == pytest.approx(
        f0.loc["compute", "end_s"] - sub.tp_exposed_s[0] - hidden)


def test_recompute_split_excludes_tp_communication():
    cfg = _cfg(dp=1, pp=2, global_batch_size=8, recompute="full")
    table = _table(cfg, cluster=get_cluster("paper-3090", nodes=2))
    res = simulate(config=cfg, cost_table=table, contention=False)
    prog = res.trace.prog
    c = recompute_fractions(cfg, prog.schedule)
    for r in res.ranks:
        st = table.stages[r.stage]
        nb = sum(1 for a in prog.actions if a.stage == r.stage and a.kind is Kind.BACKWARD)
        want = nb * c[r.stage] * (st.recompute_s - st.tp_exposed_recompute_s)
        assert r.recompute_s == pytest.approx(want, rel=1e-9)


# -- SimPy == evaluator --------------------------------------------------------------
TP_CONFIGS = [
    dict(),
    dict(tp_overlap="sub-pipelined"),
    dict(sequence_parallel=True, recompute="full"),
    dict(schedule="interleaved-1f1b", virtual_stages=2, global_batch_size=32),
    dict(schedule="zb-h1", tp_overlap="sub-pipelined"),
    dict(tp=8, dp=1, schedule="shifted-critical-path", recompute="full"),
]


@pytest.mark.parametrize("kw", TP_CONFIGS)
def test_simpy_equals_evaluator_with_tp(kw):
    cfg = _cfg(**kw)
    table = _table(cfg)
    ev = simulate(config=cfg, cost_table=table, engine="evaluator")
    for mode in ("representative", "full"):
        sp = simulate(config=cfg, cost_table=table, mode=mode, contention=False)
        assert sp.iteration_time_s == pytest.approx(ev.iteration_time_s, rel=1e-9)
    sp = simulate(config=cfg, cost_table=table, contention=False)
    for a, b in zip(sp.ranks, ev.ranks, strict=True):
        assert a.exposed_comm_s == pytest.approx(b.exposed_comm_s, rel=1e-9, abs=1e-12)
        assert a.compute_s == pytest.approx(b.compute_s, rel=1e-9)


def test_idle_links_leave_time_exactly_unchanged():
    # pp = dp = 1: the TP collectives are alone on their links.
    cfg = ParallelConfig(dp=1, tp=8, pp=1, micro_batch_size=1, global_batch_size=4,
                         dtype="bf16")
    dgx1 = get_cluster("dgx-a100-80g", nodes=1)
    table = _table(cfg, model=get_model("gpt-8.3b"), cluster=dgx1)
    off = simulate(config=cfg, cost_table=table, contention=False)
    ev = simulate(config=cfg, cost_table=table, engine="evaluator")
    for mode in ("representative", "full"):
        on = simulate(config=cfg, cost_table=table, cluster=dgx1, mode=mode,
                      contention=True)
        assert on.iteration_time_s == off.iteration_time_s == ev.iteration_time_s
        assert on.trace.tp_comm and any(on.trace.tp_comm)  # really on the fabric
    # A cost table priced faster than the topology's nominal link still leaves a lone
    # collective unslowed (its demand is capped at the link's capacity).
    slow_topo = Topology(8, 1e9, 1e9)
    on = simulate(config=cfg, cost_table=table, topology=slow_topo, contention=True)
    assert on.iteration_time_s == off.iteration_time_s


# -- contention with p2p -------------------------------------------------------------
def _toy_tp_table(tp_s: float, p2p_s: float) -> CostTable:
    """Two stages, 1 s forwards whose TP collectives (tp_s, 1e9 bytes) nearly fully
    overlap their compute; the activation send takes p2p_s for 1e9 bytes."""
    base = dict(forward_s=1.0, backward_s=2.0, backward_input_s=1.0, backward_weight_s=1.0,
                recompute_s=1.0, grad_allreduce_s=0.0, optimizer_s=0.0,
                activation_bytes=1e6, checkpoint_bytes=1e5, input_bytes=1e5,
                weight_bytes=1e6, grad_bytes=1e6, optimizer_bytes=1e6, flops=1e12, layers=1,
                tp_comm_fwd_s=tp_s, tp_exposed_fwd_s=0.1 * tp_s, tp_bytes_fwd=1e9)
    return CostTable((StageCost(send_activation_s=p2p_s, p2p_bytes=1e9, **base),
                      StageCost(send_activation_s=0.0, p2p_bytes=0.0, **base)),
                     memory_capacity_bytes=80e9, peak_flops=1e14)


@pytest.mark.parametrize("mode", ["representative", "full"])
def test_tp_collective_shares_a_link_with_p2p(mode):
    # One node of 8 GPUs at 1 GB/s per port: stage 0 = GPUs 0-1, stage 1 = GPUs 2-3.
    # The send of micro-batch 0 (GPU 0 -> 2) runs while F1's collective (ring 0 <-> 1)
    # runs: both need gpu0.out at full rate, so each gets half.
    cfg = ParallelConfig(dp=1, tp=2, pp=2, micro_batch_size=1, global_batch_size=2,
                         schedule="gpipe")
    topo = Topology(8, 1e9, 1e9)
    table = _toy_tp_table(tp_s=1.0, p2p_s=1.0)
    off = simulate(config=cfg, cost_table=table, topology=topo, mode=mode,
                   contention=False)
    on = simulate(config=cfg, cost_table=table, topology=topo, mode=mode,
                  contention=True)
    assert on.iteration_time_s > off.iteration_time_s
    d_on, d_off = on.events(), off.events()

    def one(df, **match):
        sel = df
        for k, v in match.items():
            sel = sel[sel[k] == v]
        assert len(sel) == 1, match
        return sel.iloc[0]

    tp_on = one(d_on, rank=0, kind=TP_KIND, action="F1")
    tp_off = one(d_off, rank=0, kind=TP_KIND, action="F1")
    send_on = one(d_on, rank=0, kind="SEND_ACT", microbatch=0)
    assert tp_off.end_s - tp_off.start_s == pytest.approx(1.0)
    # Both flows share gpu0.out for the whole second: each runs at half speed.
    assert tp_on.end_s - tp_on.start_s == pytest.approx(2.0)
    assert send_on.end_s - send_on.start_s == pytest.approx(2.0)
    # F1 ends when its collective does; the delay counts as exposed communication.
    f1_on = one(d_on, rank=0, stream="compute", action="F1")
    assert f1_on.end_s == pytest.approx(tp_on.end_s)
    r0_on = next(r for r in on.ranks if r.rank == 0)
    r0_off = next(r for r in off.ranks if r.rank == 0)
    assert r0_on.exposed_comm_s == pytest.approx(r0_off.exposed_comm_s + 1.0)
    # Control: without the TP traffic, the same send is not slowed.
    quiet = replace(table, stages=tuple(replace(s, tp_bytes_fwd=0.0, tp_comm_fwd_s=0.0,
                                                tp_exposed_fwd_s=0.0) for s in table.stages))
    q = simulate(config=cfg, cost_table=quiet, topology=topo, mode=mode, contention=True)
    qs = one(q.events(), rank=0, kind="SEND_ACT", microbatch=0)
    assert qs.end_s - qs.start_s == pytest.approx(1.0)


def test_compiled_tp_arrays_follow_the_action_kinds():
    cfg = _cfg(schedule="zb-h1", recompute="full")
    table = _table(cfg)
    sched = schedule_for(cfg)
    c = recompute_fractions(cfg, sched)
    prog = compile_program(sched, table, c)
    for i, a in enumerate(prog.actions):
        if a.kind in (Kind.BACKWARD_WEIGHT, Kind.ALL_REDUCE, Kind.OPTIMIZER):
            assert prog.tp_s[i] == prog.tp_exposed_s[i] == prog.tp_bytes[i] == 0.0
        else:
            assert prog.tp_s[i] > 0 and prog.tp_exposed_s[i] <= prog.tp_s[i]
            assert prog.tp_exposed_s[i] <= prog.duration_s[i]


# -- notes -------------------------------------------------------------------------
def test_notes_are_not_duplicated():
    cfg = _cfg()
    res = simulate("gpt-20b", "paper-3090", cfg)
    assert len(res.notes) == len(set(res.notes))
    for n in C3090.notes:
        assert res.notes.count(n) == 1
        assert res.summary().count(n) == 1
    # A hand-made table without the cluster's notes gets them once.
    t = _table(cfg)
    bare = CostTable(t.stages, t.memory_capacity_bytes, t.peak_flops, notes=("mine",))
    res = simulate(cluster=C3090, config=cfg, cost_table=bare)
    assert res.notes == ("mine",) + tuple(C3090.notes)


def test_trace_model_fills_tp_fields_only_where_not_measured():
    from merak_sim.costs.trace_model import TraceCostModel
    from merak_sim.model import ModelSpec
    from merak_sim.trace import LayerRecord, Provenance, Trace

    spec = ModelSpec(name="toy", family="gpt", layers=4, hidden=256, heads=8, seq_len=128,
                     vocab=4096, dtype="fp32", dropout=0.0)
    prov = Provenance("cpu", "fp32", "2.13.0", "x", "test", "2026-11-30")
    cpu = get_cluster("local-cpu")
    cfg = ParallelConfig(tp=2, pp=2, micro_batch_size=2, global_batch_size=8, dtype="fp32")
    recs = tuple(LayerRecord(k, 2, 128, 1e-3, 2e-3, 1e-3, 1e3, 10.0, tp=2)
                 for k in ("block", "embedding", "head"))
    measured = TraceCostModel(Trace(prov, spec, recs, ())).cost_table(spec, cpu, cfg)
    assert all(s.tp_comm_fwd_s == s.tp_comm_bwd_s == 0.0 for s in measured.stages)
    other = TraceCostModel(Trace(prov, spec, tuple(replace(r, tp=1) for r in recs), ()))
    fallback = other.cost_table(spec, cpu, cfg)  # no tp=2 records: analytic layers
    analytic = AnalyticCostModel().cost_table(spec, cpu, cfg)
    for a, b in zip(fallback.stages, analytic.stages, strict=True):
        assert a.tp_comm_fwd_s == pytest.approx(b.tp_comm_fwd_s) and a.tp_comm_fwd_s > 0
        assert a.tp_exposed_bwd_s == pytest.approx(b.tp_exposed_bwd_s)
