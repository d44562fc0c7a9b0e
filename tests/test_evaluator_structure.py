"""The evaluator's building blocks on the cold path: the program structure's walk
(merak_sim.sim.structure), the one-loop memory replay (HBM.replay), forgetting
kept structures, the collector paused while evaluating (merak_sim.sim.api)."""

import gc
import random

import pytest

from merak_sim.layout import RankLayout
from merak_sim.schedule import SCHEDULES, ScheduleError, generate
from merak_sim.sim.api import (SimulationError, evaluator_trace, forget_schedules,
                               shape_schedule, simulate)
from merak_sim.sim.program import compile_program
from merak_sim.sim.result import build_result
from tests.test_evaluator_cold import table
from merak_sim.sim.entities import HBM
from merak_sim.sim.structure import OP_COMPUTE, OP_POST, program_structure


def _shapes():
    for name in SCHEDULES:
        for S, M, v in ((1, 3, 1), (2, 4, 1), (3, 5, 1), (4, 8, 1), (2, 4, 2), (4, 8, 2),
                        (3, 6, 3)):
            try:
                generate(name, S, M, v)
            except (ScheduleError, ValueError):
                continue
            yield name, S, M, v


@pytest.mark.parametrize(("name", "S", "M", "v"), list(_shapes()))
def test_walk_fills_ids_and_consumed_as_the_ops_say(name, S, M, v):
    """compute_ids and consumed (filled during the walk) are what the ops list, and
    every memory rule is distinct (the integer history codes never collide)."""
    ps = program_structure(generate(name, S, M, v))
    assert ps.compute_ids == tuple(tuple(x for code, x, _y in ops if code != OP_POST)
                                   for ops in ps.ops)
    assert ps.consumed == tuple({x: y for code, x, y in ops if code == OP_COMPUTE and y >= 0}
                                for ops in ps.ops)
    assert len(set(ps.memory_rules)) == len(ps.memory_rules)
    assert len(set(ps.rules)) == len(ps.rules)
    assert ps.num_actions == sum(len(ops) for ops in ps.ops)


@pytest.mark.parametrize("record", [False, True])
@pytest.mark.parametrize("capacity", [1e12, 40.0, 5.0])
def test_replay_equals_alloc_and_free_one_by_one(record, capacity):
    """Same peak, final use, timeline and first out-of-memory action and time."""
    rng = random.Random(7)
    n = 200
    alloc = [rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(n)]
    free = [rng.choice([0.0, rng.uniform(0, 1)]) for _ in range(n)]
    start = sorted(rng.uniform(0, 10) for _ in range(n))
    end = [s + rng.uniform(0, 1) for s in start]
    ids = list(range(0, n, 2)) + list(range(1, n, 2))
    one, loop = HBM(capacity, 6.0, record), HBM(capacity, 6.0, record)
    for x in ids:
        if alloc[x]:
            one.alloc(start[x], alloc[x], x)
        if free[x]:
            one.free(end[x], free[x])
    loop.replay(ids, start, end, alloc, free)
    for f in HBM.__slots__:
        assert getattr(loop, f) == getattr(one, f), f
    if capacity == 5.0:
        assert loop.oom_action == -1  # resident state alone overflows
    elif capacity == 40.0:
        assert loop.oom_time is not None and loop.oom_action >= 0


def test_forget_schedules_forgets_structures():
    sched = shape_schedule("1f1b", 3, 5)
    ps = program_structure(sched)
    assert program_structure(sched) is ps
    forget_schedules()
    assert program_structure(sched) is not ps
    assert shape_schedule("1f1b", 3, 5) is not sched


def _collections_during(fn) -> int:
    """Automatic collections while ``fn`` runs (an explicit one is never started)."""
    seen = []

    def count(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(count)
    try:
        fn()
    finally:
        gc.callbacks.remove(count)
    return len(seen)


def test_the_collector_is_paused_while_evaluating_and_restored():
    """A cold evaluation of a large 1F1B shape allocates tens of thousands of
    objects without starting the cyclic collector (at most one collection, as it
    resumes); the collector is on again afterwards, also after a failure, and one
    the caller turned off stays off."""
    cfg = dict(dp=1, tp=1, pp=16, micro_batch_size=1, global_batch_size=64,
               schedule="1f1b", recompute="full")
    tab = table(16, "ends", 3)
    assert gc.isenabled()
    forget_schedules()
    base = _collections_during(lambda: build_result(
        evaluator_trace(compile_program(generate("1f1b", 16, 22), tab), RankLayout(1, 1, 16),
                        1e9, record_memory=False), capacity=1e9, peak_flops=1.0,
        engine="evaluator", global_batch=1, seq_len=None, keep_trace=False))
    assert base >= 3  # the same work with the collector running: several
    forget_schedules()
    assert _collections_during(lambda: simulate(config=cfg, cost_table=tab,
                                                engine="evaluator", keep_trace=False)) <= 1
    assert gc.isenabled()
    with pytest.raises(SimulationError):
        simulate(config=cfg, cost_table=tab, engine="evaluator",
                 custom_schedule=generate("1f1b", 16, 8))
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(config=cfg, cost_table=tab, engine="evaluator", keep_trace=False)
        assert not gc.isenabled()
    finally:
        gc.enable()
    forget_schedules()
