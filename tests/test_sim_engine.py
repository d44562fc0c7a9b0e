"""SimPy engine vs fast evaluator, representative vs full mode, toy makespans,
bubbles, stragglers, contention, memory and out-of-memory results."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from merak_sim.config import ParallelConfig
from merak_sim.costs.base import CostTable, StageCost
from merak_sim.layout import RankLayout
from merak_sim.schedule import generate
from merak_sim.sim import (
    EngineOptions,
    Topology,
    compile_program,
    evaluate,
    evaluator_trace,
    run_engine,
    simulate,
    uniform_table,
)

SCHEDS = [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 3, 2, 1),
          ("interleaved-1f1b", 4, 8, 2), ("zb-h1", 4, 8, 1), ("pre-recompute", 4, 8, 1),
          ("last-no-recompute", 5, 7, 1), ("shifted-critical-path", 4, 8, 1),
          ("shifted-critical-path", 8, 16, 1), ("1f1b", 1, 4, 1), ("1f1b-split", 4, 8, 1),
          ("zb-h2", 4, 8, 1), ("zb-auto", 4, 8, 1), ("zb-scp", 4, 8, 1), ("zb-h1", 3, 2, 1),
          ("zb-v", 4, 8, 2), ("zb-v", 2, 3, 2), ("dualpipev", 4, 8, 2),
          ("zb-interleaved", 4, 8, 2), ("zb-interleaved", 3, 6, 3)]


def random_table(n: int, seed: int) -> CostTable:
    """Different costs on every stage, so equal answers are not a coincidence."""
    rng = random.Random(seed)
    stages = []
    for g in range(n):
        f = rng.uniform(0.5, 2.0)
        b = rng.uniform(1.0, 4.0)
        w = rng.uniform(0.2, 0.8) * b
        stages.append(StageCost(
            forward_s=f, backward_s=b, backward_input_s=b - w, backward_weight_s=w,
            recompute_s=rng.uniform(0.5, 1.0) * f,
            send_activation_s=rng.uniform(0.0, 0.3) if g < n - 1 else 0.0,
            grad_allreduce_s=rng.uniform(0.1, 2.0), optimizer_s=rng.uniform(0.0, 0.2),
            activation_bytes=rng.uniform(1e9, 2e9), checkpoint_bytes=1e8, input_bytes=5e7,
            weight_bytes=1e9, grad_bytes=1e9, optimizer_bytes=6e9, p2p_bytes=1e8,
            flops=1e12, layers=2))
    return CostTable(tuple(stages), memory_capacity_bytes=80e9, peak_flops=312e12)


def assert_same_times(tr, ev):
    """The engine's makespan and every action's start and end equal the evaluator's."""
    assert tr.makespan == pytest.approx(ev.makespan, rel=1e-9)
    for acts in tr.acts:
        for aid, st, en in acts:
            assert st == pytest.approx(ev.start[aid], rel=1e-9, abs=1e-12)
            assert en == pytest.approx(ev.end[aid], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name, S, M, v", SCHEDS)
@pytest.mark.parametrize("overlap, zero", [(False, 0), (True, 0), (True, 1)])
def test_simpy_agrees_with_evaluator(name, S, M, v, overlap, zero):
    sched = generate(name, S, M, v)
    table = random_table(S * v, seed=S * 100 + M)
    c = tuple(random.Random(M).uniform(0, 1) for _ in range(S))
    prog = compile_program(sched, table, c)
    ev = evaluate(prog, overlap_dp=overlap, buckets=3, zero=zero)
    tr = run_engine(prog, RankLayout(1, 1, S), 80e9,
                    EngineOptions(overlap_dp=overlap, buckets=3, zero=zero))
    assert_same_times(tr, ev)
    xs, xe = tr.xfers[0]
    assert xs == pytest.approx(ev.xfer_start, rel=1e-9)
    assert xe == pytest.approx(ev.xfer_end, rel=1e-9)
    # and both agree with the schedule package's reference interpreter
    from merak_sim.schedule import execute

    if not overlap:
        ref = execute(sched, lambda a: prog.duration_s[prog.actions.index(a)],
                      lambda a: next(t.duration_s for t in prog.transfers if t.send == a))
        assert ref.makespan == pytest.approx(ev.makespan, rel=1e-9)


def _cfg(**kw):
    base = dict(dp=2, tp=2, pp=4, micro_batch_size=1, global_batch_size=16,
                schedule="1f1b", recompute="full")
    base.update(kw)
    return ParallelConfig(**base)


TOPO = Topology(gpus_per_node=4, intra_Bps=100e9, inter_Bps=50e9)


@pytest.mark.parametrize("contention", [False, True])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("cfg", [
    _cfg(), _cfg(schedule="shifted-critical-path", dp=2, tp=1),
    _cfg(schedule="interleaved-1f1b", virtual_stages=2, dp=1, tp=4, pp=2),
    _cfg(schedule="zb-h1", zero=1),
])
def test_representative_and_full_agree(cfg, contention, overlap):
    n = cfg.pp * cfg.virtual_stages
    table = uniform_table(n, comm=0.05, allreduce=0.4, optimizer=0.1, p2p_bytes=4e9,
                          grad_bytes=16e9)
    kw = dict(cost_table=table, contention=contention, topology=TOPO,
              overlap_dp=overlap, buckets=2)
    rep = simulate(config=cfg, mode="representative", **kw)
    full = simulate(config=cfg, mode="full", **kw)
    assert full.iteration_time_s == pytest.approx(rep.iteration_time_s, rel=1e-9)
    assert len(full.ranks) == cfg.world_size and len(rep.ranks) == cfg.pp
    assert full.peak_memory_bytes == pytest.approx(rep.peak_memory_bytes)
    for r in full.ranks:
        twin = rep.ranks[r.stage]
        assert r.bubble_s == pytest.approx(twin.bubble_s, rel=1e-6, abs=1e-9)
        assert r.exposed_comm_s == pytest.approx(twin.exposed_comm_s, rel=1e-6, abs=1e-9)


def test_contention_slows_shared_links():
    # tp=4 ranks of a stage share one node's adapters when the pipeline crosses nodes
    cfg = _cfg(dp=1, tp=4, pp=2)
    table = uniform_table(2, comm=1.0, p2p_bytes=50e9)  # demand 50 GB/s per transfer
    off = simulate(config=cfg, cost_table=table, topology=TOPO, contention=False)
    on = simulate(config=cfg, cost_table=table, topology=TOPO, contention=True)
    assert on.iteration_time_s > off.iteration_time_s
    # alone a transfer takes 1 s; four of them share 50 GB/s of demand 200 GB/s -> 4 s
    xs, xe = on.trace.xfers[0]
    assert max(e - s for s, e in zip(xs, xe, strict=False)) == pytest.approx(4.0)


def test_fabric_two_flows_share_then_speed_up():
    import simpy

    from merak_sim.sim import Fabric

    env = simpy.Environment()
    fab = Fabric(env, Topology(1, 10.0, 10.0))
    ends = {}
    a = fab.start([("L", 1.0)], 1.0, 10.0)  # alone: 1 s at full link speed
    b_holder = {}

    def later():
        yield env.timeout(0.5)
        b_holder["b"] = fab.start([("L", 1.0)], 1.0, 10.0)
        yield b_holder["b"]
        ends["b"] = env.now

    def wait_a():
        yield a
        ends["a"] = env.now

    env.process(later())
    env.process(wait_a())
    env.run()
    # a: 0.5 s alone, then half speed for its remaining 0.5 -> ends at 1.5
    assert ends["a"] == pytest.approx(1.5)
    # b: half speed 0.5..1.5 (0.5 done), then alone -> ends at 2.0
    assert ends["b"] == pytest.approx(2.0)


TOY = {
    (4, 8): {"1f1b": 44, "pre-recompute": 41, "last-no-recompute": 39,
             "shifted-critical-path": 38},
    (8, 16): {"1f1b": 92, "pre-recompute": 85, "last-no-recompute": 83,
              "shifted-critical-path": 82},
}


@pytest.mark.parametrize("S, M", list(TOY))
@pytest.mark.parametrize("name", list(TOY[(4, 8)]))
def test_toy_makespans_from_full_engine(S, M, name):
    cfg = ParallelConfig(dp=2, tp=2, pp=S, global_batch_size=2 * M, schedule=name,
                         recompute="full")
    res = simulate(config=cfg, cost_table=uniform_table(S), mode="full", contention=False)
    assert res.iteration_time_s == pytest.approx(TOY[(S, M)][name])


@pytest.mark.parametrize("S, M, expected", [(4, 8, 36.8), (8, 16, 78.1)])
def test_toy_stage_aware_from_full_engine(S, M, expected):
    cfg = ParallelConfig(dp=2, tp=1, pp=S, global_batch_size=2 * M,
                         schedule="shifted-critical-path", recompute="stage-aware",
                         recompute_c0=0.75)
    res = simulate(config=cfg, cost_table=uniform_table(S), mode="full")
    assert res.iteration_time_s == pytest.approx(expected, abs=0.05)
    none = ParallelConfig(dp=2, tp=1, pp=S, global_batch_size=2 * M, recompute="none")
    assert simulate(config=none, cost_table=uniform_table(S),
                    mode="full").iteration_time_s == pytest.approx(3 * M + 3 * (S - 1))


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (8, 32), (5, 7)])
def test_1f1b_bubble_fraction(p, m):
    cfg = ParallelConfig(dp=1, tp=1, pp=p, global_batch_size=m, schedule="1f1b")
    res = simulate(config=cfg, cost_table=uniform_table(p))
    assert res.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    for r in res.ranks:
        assert r.exposed_comm_s == 0
        assert r.compute_s + r.bubble_s == pytest.approx(res.iteration_time_s)


def test_straggler_slows_iteration_by_expected_amount():
    # pp=1, dp=2, M=4: the slow replica's compute is scaled, the all-reduce waits for it
    cfg = ParallelConfig(dp=2, tp=1, pp=1, global_batch_size=8, schedule="1f1b")
    table = uniform_table(1, f=1.0, b=2.0, allreduce=0.5, optimizer=0.25)
    base = simulate(config=cfg, cost_table=table, mode="full")
    slow = simulate(config=cfg, cost_table=table, mode="full", slowdown={1: 1.5})
    assert base.iteration_time_s == pytest.approx(4 * 3 + 0.5 + 0.25)
    assert slow.iteration_time_s == pytest.approx(1.5 * 4 * 3 + 0.5 + 1.5 * 0.25)
    fast = next(r for r in slow.ranks if r.rank == 0)
    assert fast.bubble_s == pytest.approx(0.5 * 12 + 0.125)  # waits for the straggler


def test_straggler_in_pipeline_equals_scaled_stage():
    # Slowing one GPU of a tensor-parallel group slows its whole stage (lockstep), and
    # the data-parallel reduction makes every replica wait: the same as scaling the
    # stage's compute costs in representative mode.
    cfg = _cfg(dp=2, tp=2, pp=4, recompute="none")
    table = random_table(4, seed=7)
    slow = simulate(config=cfg, cost_table=table, mode="full", slowdown={5: 2.0})
    st = list(table.stages)
    from dataclasses import replace

    st[1] = replace(st[1], forward_s=2 * st[1].forward_s, backward_s=2 * st[1].backward_s,
                    optimizer_s=2 * st[1].optimizer_s)
    scaled = CostTable(tuple(st), table.memory_capacity_bytes, table.peak_flops)
    # replica 0 of stage 1 is fast but waits for replica 1 at the all-reduce; the
    # representative model of "stage 1 twice as slow everywhere" bounds it from above
    rep = simulate(config=cfg, cost_table=scaled)
    assert slow.iteration_time_s == pytest.approx(rep.iteration_time_s, rel=1e-9)


def test_memory_peak_and_timeline():
    # 1F1B without recompute: stage s holds S - s micro-batches of full activations
    S = 4
    cfg = ParallelConfig(pp=S, global_batch_size=8, recompute="none")
    t = uniform_table(S, activation_bytes=1e9, state_bytes=4e9)
    res = simulate(config=cfg, cost_table=t)
    assert res.peak_memory_bytes == pytest.approx([4e9 + (S - s) * 1e9 for s in range(S)])
    mt = res.memory_timeline(rank=0)
    assert mt["bytes"].iloc[0] == 4e9 and mt["bytes"].iloc[-1] == pytest.approx(4e9)
    assert mt["bytes"].max() == pytest.approx(8e9)
    # full recompute keeps checkpoint bytes only
    full = simulate(config=ParallelConfig(pp=S, global_batch_size=8, recompute="full"),
                    cost_table=t)
    assert full.peak_memory_bytes[0] == pytest.approx(4e9 + 4 * 1e8)


def test_out_of_memory_is_a_result():
    S = 4
    cfg = ParallelConfig(pp=S, global_batch_size=8, recompute="none")
    t = uniform_table(S, activation_bytes=1e9, state_bytes=4e9, capacity=6.5e9)
    res = simulate(config=cfg, cost_table=t)
    assert not res.fits_in_memory
    assert res.oom.rank == 0 and res.oom.stage == 0
    assert res.oom.overflow_bytes == pytest.approx(1.5e9)  # peak 8e9 - 6.5e9
    assert res.oom.action == "F2"  # third micro-batch in flight crosses 6.5 GB
    assert res.oom.time_s == pytest.approx(2.0)
    assert res.to_dict()["fits_in_memory"] is False
    ok = simulate(config=cfg, cost_table=uniform_table(S, activation_bytes=1e9,
                                                       state_bytes=4e9, capacity=9e9))
    assert ok.fits_in_memory and ok.oom is None


def test_events_and_chrome_trace_one_event_per_action():
    import json

    cfg = _cfg(schedule="shifted-critical-path", dp=1, tp=1)
    res = simulate(config=cfg, cost_table=uniform_table(4, comm=0.1, allreduce=0.2))
    df = res.events()
    assert list(df.columns) == ["rank", "stage", "chunk", "stream", "kind", "action",
                                "microbatch", "start_s", "end_s", "bytes"]
    n = res.trace.prog.num_actions
    assert len(df) == n
    assert set(df["stream"]) == {"compute", "p2p", "collective"}
    assert (df["end_s"] >= df["start_s"]).all()
    doc = json.loads(json.dumps(res.chrome_trace()))
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == n
    assert {e["name"] for e in xs} >= {"F*0", "R0", "B0", "sA0", "rG1", "AR", "OPT"}


def test_evaluator_engine_matches_simpy_result():
    cfg = _cfg(schedule="interleaved-1f1b", virtual_stages=2, dp=2, tp=1)
    t = random_table(8, seed=3)
    a = simulate(config=cfg, cost_table=t, engine="evaluator")
    b = simulate(config=cfg, cost_table=t, engine="simpy")
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-9)
    assert a.peak_memory_bytes == pytest.approx(b.peak_memory_bytes)
    assert [r.bubble_s for r in a.ranks] == pytest.approx([r.bubble_s for r in b.ranks])


def test_evaluator_trace_matches_engine_memory():
    sched = generate("1f1b", 4, 8)
    prog = compile_program(sched, random_table(4, 1), (0.5,) * 4)
    a = evaluator_trace(prog, RankLayout(1, 1, 4), 80e9)
    b = run_engine(prog, RankLayout(1, 1, 4), 80e9, EngineOptions())
    assert [m.peak for m in a.memory] == pytest.approx([m.peak for m in b.memory])


def test_plots_write_files(tmp_path):
    res = simulate(config=_cfg(dp=1, tp=1), cost_table=uniform_table(4, comm=0.1))
    res.plot_gantt(tmp_path / "g.png")
    res.plot_memory(tmp_path / "m.png")
    assert (tmp_path / "g.png").stat().st_size > 1000
    assert (tmp_path / "m.png").stat().st_size > 1000


def test_bad_input_errors():
    from merak_sim.sim import SimulationError

    t = uniform_table(4)
    with pytest.raises(SimulationError, match="mode"):
        simulate(config=_cfg(), cost_table=t, mode="bogus")
    with pytest.raises(SimulationError, match="need mode='full'|need\\s+mode"):
        simulate(config=_cfg(), cost_table=t, slowdown={0: 2.0})
    with pytest.raises(ValueError, match="cost table has 3 stages"):
        simulate(config=_cfg(), cost_table=uniform_table(3))
    with pytest.raises(ValueError, match="not divisible"):
        simulate(dp=2, pp=4, global_batch_size=7, cost_table=t)
    with pytest.raises(ValueError, match="microbatches >= max"):
        simulate(config=_cfg(schedule="shifted-critical-path", global_batch_size=4),
                 cost_table=t)


def test_degraded_link_slows_transfers_in_full_mode():
    cfg = ParallelConfig(dp=1, tp=1, pp=2, global_batch_size=4)
    topo = Topology(gpus_per_node=1, intra_Bps=100e9, inter_Bps=50e9)
    t = uniform_table(2, comm=0.1, p2p_bytes=1e8)  # demand 1 GB/s per transfer
    base = simulate(config=cfg, cost_table=t, topology=topo, mode="full")
    slow = simulate(config=cfg, cost_table=t, topology=topo, mode="full",
                    degraded_links={"node0.nic.out": 0.01})  # 0.5 GB/s left
    assert slow.iteration_time_s > base.iteration_time_s
    df = slow.events()
    fwd = df[(df["action"].str.startswith("sA"))]
    assert (fwd["end_s"] - fwd["start_s"]).to_numpy() == pytest.approx(0.2)
    bwd = df[(df["action"].str.startswith("sG"))]  # the other direction is untouched
    assert (bwd["end_s"] - bwd["start_s"]).to_numpy() == pytest.approx(0.1)
    with pytest.raises(ValueError, match="unknown link name"):
        simulate(config=cfg, cost_table=t, topology=topo, mode="full",
                 degraded_links={"wire7": 0.5})


def test_mixed_gpu_types_priced_by_peak_ratio():
    from merak_sim.hardware import get_cluster, get_gpu

    cl = get_cluster("dgx-a100-80g", nodes=1)
    cfg = ParallelConfig(dp=2, tp=2, pp=2, global_batch_size=16, micro_batch_size=2,
                         dtype="bf16")
    kw = dict(model="gpt-2.5b", cluster=cl, config=cfg, mode="full", contention=False)
    mixed = simulate(gpu_types={3: "V100-32GB"}, **kw)
    ratio = cl.gpu.peak("bf16") / get_gpu("V100-32GB").peak("bf16")
    manual = simulate(slowdown={3: ratio}, **kw)
    assert mixed.iteration_time_s == pytest.approx(manual.iteration_time_s, rel=1e-12)
    assert mixed.iteration_time_s > simulate(**kw).iteration_time_s
    # the V100 has its own (smaller) memory
    assert mixed.trace.memory[3].capacity < mixed.trace.memory[0].capacity


@settings(max_examples=30, deadline=None)
@given(name=hst.sampled_from(["gpipe", "1f1b", "zb-h1", "pre-recompute", "last-no-recompute",
                             "shifted-critical-path", "interleaved-1f1b", "1f1b-split",
                             "zb-h2", "zb-auto", "zb-scp"]),
       S=hst.integers(1, 6), mult=hst.integers(1, 3), seed=hst.integers(0, 10**6),
       overlap=hst.booleans(), buckets=hst.integers(1, 4))
def test_property_engine_equals_evaluator(name, S, mult, seed, overlap, buckets):
    v = 2 if name == "interleaved-1f1b" and S >= 2 else 1
    # A multiple of S (interleaving needs it) and >= max(S, 4) (the shifted schedule).
    M = S * -(-4 // S) * mult
    sched = generate(name, S, M, v)
    prog = compile_program(sched, random_table(S * v, seed),
                           tuple(random.Random(seed).random() for _ in range(S)))
    ev = evaluate(prog, overlap_dp=overlap, buckets=buckets)
    tr = run_engine(prog, RankLayout(1, 1, S), 80e9,
                    EngineOptions(overlap_dp=overlap, buckets=buckets))
    assert tr.makespan == pytest.approx(ev.makespan, rel=1e-9)


def _tied(table: CostTable) -> CostTable:
    from dataclasses import replace

    return replace(table, tied_embeddings=True)


def _ar_reach(prog, ev, rank):
    """End of the action before the rank's AR (when the program reaches AR)."""
    ids = [x for code, x, _y in prog.ops[rank] if code != 1]
    ar = next(i for i, x in enumerate(ids) if prog.actions[x].kind.value == "AR")
    return ev.end[ids[ar - 1]], ids[ar]


def test_tied_all_reduce_on_the_critical_path():
    # 1F1B: rank 0 reaches AR last; the last stage's long AR + OPT must wait for it.
    S, M = 4, 8
    st = list(uniform_table(S).stages)
    from dataclasses import replace

    st[-1] = replace(st[-1], grad_allreduce_s=3.0, optimizer_s=1.0)
    table = CostTable(tuple(st), 80e9, 312e12)
    sched = generate("1f1b", S, M)
    free = evaluate(compile_program(sched, table))
    prog = compile_program(sched, _tied(table))
    assert prog.tied_ar and len(prog.tied_ar) == 2
    ev = evaluate(prog)
    reach0, ar0 = _ar_reach(prog, ev, 0)
    reach_last, ar_last = _ar_reach(prog, ev, S - 1)
    assert reach_last < reach0
    # each AR starts where its rank reaches it; the last rank's waits inside it
    assert ev.start[ar_last] == pytest.approx(reach_last)
    assert ev.end[ar_last] == pytest.approx(reach0 + 3.0)
    assert ev.start[ar0] == pytest.approx(reach0)
    assert ev.makespan == pytest.approx(reach0 + 4.0)
    assert ev.makespan > free.makespan + 1.0
    tr = run_engine(prog, RankLayout(1, 1, S), 80e9, EngineOptions())
    assert_same_times(tr, ev)
    # a simulation reports the wait as the last rank's exposed communication (its AR),
    # not as bubble, as a measured timeline shows it
    cfg = ParallelConfig(pp=S, global_batch_size=M, schedule="1f1b")
    res = simulate(config=cfg, cost_table=_tied(table))
    untied = simulate(config=cfg, cost_table=table)
    assert res.iteration_time_s == pytest.approx(ev.makespan)
    wait = reach0 - reach_last
    assert res.ranks[-1].exposed_comm_s == pytest.approx(untied.ranks[-1].exposed_comm_s + wait)


def test_tied_all_reduce_first_rank_waits():
    # ZB-H1 with a slow weight-gradient pass on the last stage: rank 0 waits at AR.
    S, M = 4, 8
    st = list(uniform_table(S).stages)
    from dataclasses import replace

    st[-1] = replace(st[-1], backward_s=6.0, backward_input_s=1.0, backward_weight_s=5.0)
    prog = compile_program(generate("zb-h1", S, M), _tied(CostTable(tuple(st), 80e9, 1.0)))
    ev = evaluate(prog)
    reach0, ar0 = _ar_reach(prog, ev, 0)
    reach_last, _ = _ar_reach(prog, ev, S - 1)
    assert reach_last > reach0 and ev.start[ar0] == pytest.approx(reach0)
    assert ev.end[ar0] == pytest.approx(reach_last + prog.duration_s[ar0])
    tr = run_engine(prog, RankLayout(1, 1, S), 80e9, EngineOptions())
    assert tr.makespan == pytest.approx(ev.makespan, rel=1e-9)
    assert_same_times(tr, ev)


@pytest.mark.parametrize("name", ["zb-v", "dualpipev"])
def test_tied_embedding_is_local_under_the_v(name):
    S, M = 4, 8
    table = random_table(2 * S, seed=5)
    sched = generate(name, S, M, 2)
    assert sched.tied_ranks() == (0,)
    tied, free = compile_program(sched, _tied(table)), compile_program(sched, table)
    assert tied.tied_ar == ()
    assert evaluate(tied).makespan == evaluate(free).makespan


@pytest.mark.parametrize("name, S, M, v", SCHEDS)
@pytest.mark.parametrize("overlap, zero", [(False, 0), (True, 0), (True, 1)])
def test_tied_engine_agrees_with_evaluator(name, S, M, v, overlap, zero):
    table = _tied(random_table(S * v, seed=S * 7 + M))
    sched = generate(name, S, M, v)
    prog = compile_program(sched, table,
                           tuple(random.Random(S).uniform(0, 1) for _ in range(S)))
    # under the V placement rank 0 holds both ends of the tie: no rendezvous
    assert bool(prog.tied_ar) == (S > 1 and sched.placement == "loop")
    ev = evaluate(prog, overlap_dp=overlap, buckets=3, zero=zero)
    tr = run_engine(prog, RankLayout(1, 1, S), 80e9,
                    EngineOptions(overlap_dp=overlap, buckets=3, zero=zero))
    assert_same_times(tr, ev)
    # every (dp, tp) copy of the two ends meets in full mode: same answer
    full = run_engine(prog, RankLayout(2, 2, S), 80e9,
                      EngineOptions(mode="full", overlap_dp=overlap, buckets=3, zero=zero))
    assert full.makespan == pytest.approx(ev.makespan, rel=1e-9)


def test_cost_tables_mark_tied_embeddings():
    from merak_sim.costs import AnalyticCostModel
    from merak_sim.hardware import get_cluster
    from merak_sim.model import get_model

    cl = get_cluster("dgx-a100-80g", nodes=1)
    cm = AnalyticCostModel()
    cfg = ParallelConfig(dp=2, tp=1, pp=4, global_batch_size=16)
    assert cm.cost_table(get_model("gpt-2.5b"), cl, cfg).tied_embeddings
    assert not cm.cost_table(get_model("llama2-7b"), cl, cfg).tied_embeddings
    one = ParallelConfig(dp=8, tp=1, pp=1, global_batch_size=16)
    assert not cm.cost_table(get_model("gpt-2.5b"), cl, one).tied_embeddings
