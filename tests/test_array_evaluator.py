"""The evaluator's array path (issue 34 item 2): the ranks timed in sweeps without a
dependency graph, the memory replayed with numpy and the breakdown summed with numpy
equal the graph walk, the per-action replay and the per-action loop, on every
registered schedule with random costs (the same floats: each sum adds the same terms
in the same order); ``simulate`` over an array-built schedule equals it over the
Action schedule to 1e-12."""

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merak_sim.config import ParallelConfig
from merak_sim.layout import RankLayout
from merak_sim.schedule import SCHEDULES, Kind, Schedule, ScheduleError, generate
from merak_sim.schedule.arrays import ARRAY_ORDERS
from merak_sim.schedule.ir import Action
from merak_sim.sim.api import ARRAY_PASSES, evaluator_trace, forget_schedules, simulate
from merak_sim.sim.entities import HBM
from merak_sim.sim.evaluator import evaluate, plan
from merak_sim.sim.program import compile_program
from merak_sim.sim.result import build_result
from tests.test_evaluator_cold import flat, table
from tests.test_schedule_generators import _valid_args

SHAPES = st.tuples(st.sampled_from(list(SCHEDULES)), st.integers(1, 6), st.integers(1, 16),
                   st.integers(1, 3))


def _program(name, pp, m, v, seed, tp_exposed=True):
    pp, m, v = _valid_args(name, pp, m, v)
    tab = table(pp * v, "random", seed, tied=bool(seed % 2))
    if not tp_exposed:  # the branch without exposed TP collectives
        tab = replace(tab, stages=tuple(replace(s, tp_exposed_fwd_s=0.0, tp_exposed_bwd_s=0.0,
                                                tp_exposed_recompute_s=0.0)
                                        for s in tab.stages))
    rng = random.Random(seed)
    rc = [rng.choice([0.0, 0.5, 1.0]) for _ in range(pp)]
    return compile_program(generate(name, pp, m, v), tab, rc), pp, m, v


@settings(max_examples=100, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 10**6), overlap=st.booleans(), zero=st.integers(0, 1))
def test_sweeps_equal_the_graph_walk(shape, seed, overlap, zero):
    prog, *_ = _program(*shape, seed)
    walked = evaluate(prog, plan(prog), overlap_dp=overlap, buckets=3, zero=zero)
    swept = evaluate(prog, overlap_dp=overlap, buckets=3, zero=zero)
    assert swept == walked


def _log_rows(tr):
    """The same log with its rows as lists and no arrays: the per-action paths."""
    return replace(tr, times=None, acts=[list(rows) for rows in tr.acts])


@settings(max_examples=80, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 10**6), overlap=st.booleans(),
       tp_exposed=st.booleans(), squeeze=st.sampled_from([None, 0.0, 0.5, 1.0]))
def test_array_trace_and_result_equal_the_loops(shape, seed, overlap, tp_exposed, squeeze):
    """Memory (peak, final use, first out-of-memory action and time, overflow,
    timeline) and every figure of the result are the per-action loops'; ``squeeze``
    puts the capacity between a rank's resident bytes and its peak."""
    prog, pp, m, v = _program(*shape, seed, tp_exposed)
    cfg = ParallelConfig(dp=2, tp=2, pp=pp, virtual_stages=v, micro_batch_size=1,
                         global_batch_size=2 * m, schedule=shape[0])
    layout = RankLayout.of(cfg)
    probe = evaluator_trace(prog, layout, 1e30, overlap_dp=overlap, buckets=2)
    cap = 1e30
    if squeeze is not None:
        h = max(probe.memory, key=lambda x: x.peak - x.used)
        cap = prog.state_bytes[probe.memory.index(h)] + squeeze * (h.peak - h.used)
    tr = evaluator_trace(prog, layout, cap, overlap_dp=overlap, buckets=2)
    for r, hbm in enumerate(tr.memory):
        ref = HBM(cap, prog.state_bytes[r])
        start = {a: s for rows in tr.acts for a, s, _e in rows}
        end = {a: e for rows in tr.acts for a, _s, e in rows}
        ref.replay(prog.structure.compute_ids[r], start, end, prog.mem_alloc, prog.mem_free)
        assert (hbm.peak, hbm.used, hbm.oom_time, hbm.oom_action, hbm.overflow,
                list(hbm.timeline)) == (ref.peak, ref.used, ref.oom_time, ref.oom_action,
                                        ref.overflow, ref.timeline)
    kw = dict(capacity=cap, peak_flops=1.0, engine="evaluator", global_batch=2 * m, seq_len=8)
    assert build_result(tr, **kw).to_dict() == build_result(_log_rows(tr), **kw).to_dict()


@pytest.mark.parametrize("name", sorted(ARRAY_ORDERS))
@pytest.mark.parametrize("keep", [False, True])
def test_simulate_over_rows_equals_over_actions(name, keep):
    """``simulate`` builds a schedule of at least ARRAY_PASSES passes from rows; the
    figures equal those of the same schedule given as Actions to 1e-12."""
    pp, m, v = (8, 48, 2) if SCHEDULES[name].interleaved else (8, 48, 1)
    assert pp * m * v >= ARRAY_PASSES
    cfg = ParallelConfig(dp=1, tp=1, pp=pp, virtual_stages=v, micro_batch_size=1,
                         global_batch_size=m, schedule=name, recompute="full")
    tab = table(pp * v, "ends", 3)
    forget_schedules()
    rows = simulate(config=cfg, cost_table=tab, engine="evaluator", keep_trace=keep)
    objs = simulate(config=cfg, cost_table=tab, engine="evaluator", keep_trace=keep,
                    custom_schedule=generate(name, pp, m, v))
    a, b = flat(rows.to_dict()), flat(objs.to_dict())
    assert a.keys() == b.keys()
    for k, x in a.items():
        y = b[k]
        if isinstance(x, float):
            assert x == pytest.approx(y, rel=1e-12, abs=1e-12 * objs.iteration_time_s), k
        else:
            assert x == y, k
    if keep:
        assert rows.trace.times is not None
        assert rows.events().equals(objs.events())


def test_deadlock_found_by_the_sweeps():
    """Two ranks each waiting for the other's gradient first: the sweeps stop and the
    reference interpreter words the deadlock."""
    F, B, SA, RA, RG, SG = (Kind.FORWARD, Kind.BACKWARD, Kind.SEND_ACT, Kind.RECV_ACT,
                            Kind.RECV_GRAD, Kind.SEND_GRAD)
    stuck = Schedule("stuck", 2, 1, 1, (
        (Action(F, 0, 0), Action(RG, 0, 0), Action(B, 0, 0), Action(SA, 0, 0)),
        (Action(RA, 1, 0), Action(F, 1, 0), Action(B, 1, 0), Action(SG, 1, 0))))
    prog = compile_program(stuck, table(2, "uniform", 1))
    with pytest.raises(ScheduleError, match="deadlock"):
        evaluate(prog)


@pytest.mark.parametrize("record", [False, True])
@pytest.mark.parametrize("capacity", [1e12, 40.0, 5.0])
def test_replay_arrays_equals_the_loop(record, capacity):
    """The numpy replay of a rank's actions: the same peak, final use, timeline and
    first out-of-memory action and time as the per-action loop (zero allocations and
    frees included)."""
    import numpy as np

    rng = random.Random(11)
    n = 400
    alloc = [rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(n)]
    free = [rng.choice([0.0, rng.uniform(0, 1)]) for _ in range(n)]
    start = sorted(rng.uniform(0, 10) for _ in range(n))
    end = [s + rng.uniform(0, 1) for s in start]
    for lo, hi in ((0, n), (37, 301)):
        loop, arr = HBM(capacity, 6.0, record), HBM(capacity, 6.0, record)
        loop.replay(range(lo, hi), start, end, alloc, free)
        arr.replay_arrays(range(lo, hi), np.array(start), np.array(end), np.array(alloc),
                          np.array(free))
        assert (arr.peak, arr.used, arr.oom_time, arr.oom_action, arr.overflow,
                list(arr.timeline)) == (loop.peak, loop.used, loop.oom_time, loop.oom_action,
                                        loop.overflow, loop.timeline)
