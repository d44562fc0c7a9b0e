"""The liveness walk: hand-worked counts and bytes, and one peak everywhere (the
simulator, the memory model and the planner's memory screen) on a grid of schedules,
pipeline depths, micro-batch counts and recompute policies."""

from __future__ import annotations

import random

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs.base import CostTable, StageCost
from merak_sim.memory import peak_memory
from merak_sim.planner.templates import memory_template, stage_arrays
from merak_sim.schedule import ScheduleError, generate, liveness, validate
from merak_sim.schedule.liveness import ALIVE, FULL, Held, ItemSizes
from merak_sim.sim import compile_program, simulate
from merak_sim.sim.from_config import recompute_fractions

# Sizes that tell the states apart: stash (after F) 4, input (after F*) 1, rebuilt 10.
SIZES = ItemSizes(stash=4.0, input=1.0, rebuilt=10.0)


def test_hand_worked_shifted_critical_path():
    # Rank 0 of the shifted schedule, pp=3, M=4: F*0 F1 F*2 R0 B0 F*3 B1 R2 B2 R3 B3 AR OPT
    sched = generate("shifted-critical-path", 3, 4)
    lv = liveness(sched, 0)
    assert [str(s.action) for s in lv.steps] == [
        "F*0", "F1", "F*2", "R0", "B0", "F*3", "B1", "R2", "B2", "R3", "B3", "AR", "OPT"]
    # live items per (stash, input, rebuilt) after each action
    assert [s.counts for s in lv.steps] == [
        (0, 1, 0), (1, 1, 0), (1, 2, 0), (1, 1, 1), (1, 1, 0), (1, 2, 0), (0, 2, 0),
        (0, 1, 1), (0, 1, 0), (0, 0, 1), (0, 0, 0), (0, 0, 0), (0, 0, 0)]
    assert [(s.enters, s.leaves) for s in lv.steps[:5]] == [
        (Held.INPUT, None), (Held.STASH, None), (Held.INPUT, None),
        (Held.REBUILT, Held.INPUT), (None, Held.REBUILT)]
    # bytes: F* allocates 1, F 4, R grows 1 -> 10 (allocates 9), B frees what it held
    assert lv.deltas(SIZES) == (
        (1, 0), (4, 0), (1, 0), (9, 0), (0, 10), (1, 0), (0, 4), (9, 0), (0, 10),
        (9, 0), (0, 10), (0, 0), (0, 0))
    assert lv.peak(SIZES) == 15  # after R0: F1 (4) + F*2 (1) + R0 (10)
    assert lv.peak_in_flight == 3
    assert lv.peak(ALIVE) == 3 and lv.peak(FULL) == 2  # F1 and R0 hold full sets
    assert lv.allocation_counts() == (
        (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1), (1, 2, 0))
    rep = validate(sched)
    assert rep.peak_in_flight[0] == 3 and rep.peak_full_in_flight[0] == 2


def test_hand_worked_zero_bubble_frees_at_w():
    # Rank 0 of zb-h1, pp=2, M=3: F0 F1 I0 W0 F2 I1 W1 I2 W2; I frees nothing.
    lv = liveness(generate("zb-h1", 2, 3), 0)
    live, cur = [], 0.0
    for a, f in lv.deltas(SIZES):
        cur += a - f
        live.append(cur)
    assert live[:9] == [4, 8, 8, 4, 8, 8, 4, 4, 0]
    assert lv.peak(SIZES) == 8 and lv.peak_in_flight == 2


def test_rebuilt_never_shrinks_below_input():
    lv = liveness(generate("last-no-recompute", 3, 3), 0)  # F*0 F*1 F*2 R0 B0 ...
    d = lv.deltas(ItemSizes(stash=4.0, input=5.0, rebuilt=3.0))
    assert d[3] == (0.0, 0.0) and d[4] == (0.0, 5.0)


def test_sizes_per_chunk_checked():
    lv = liveness(generate("interleaved-1f1b", 2, 4, 2), 0)
    assert lv.chunks == 2
    with pytest.raises(ValueError, match="2 chunks but 1 item sizes"):
        lv.peak([SIZES])
    # Rank 0 runs F0 F1 1F0 1F1 F2 1B0: chunk-0 items weigh 1, chunk-1 items 100, so
    # the peak is after F2 (3 + 200).
    assert lv.peak([ALIVE, ItemSizes(100, 100, 100)]) == 203


def _table(n: int, seed: int) -> CostTable:
    """Different bytes on every stage, so equal peaks are not a coincidence."""
    rng = random.Random(seed)
    stages = []
    for g in range(n):
        act = rng.uniform(1e9, 2e9)
        stages.append(StageCost(
            forward_s=rng.uniform(0.5, 2.0), backward_s=2.0, backward_input_s=1.2,
            backward_weight_s=0.8, recompute_s=1.0,
            send_activation_s=0.1 if g < n - 1 else 0.0, grad_allreduce_s=0.2,
            optimizer_s=0.05, activation_bytes=act, checkpoint_bytes=rng.uniform(5e7, 2e8),
            input_bytes=rng.uniform(1e7, 5e7), weight_bytes=1e9, grad_bytes=1e9,
            optimizer_bytes=6e9, p2p_bytes=rng.uniform(1e7, 5e7), flops=1e12,
            layers=rng.randint(1, 6)))
    return CostTable(tuple(stages), memory_capacity_bytes=80e9, peak_flops=312e12)


SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "shifted-critical-path",
             "last-no-recompute")
# "selective" checkpoints no layer (fraction 0, like "none"; only its cost table differs).
POLICIES = ("none", "full", "stage-aware", "stage-aware-explicit")


def _grid():
    for name in SCHEDULES:
        for pp in range(2, 9):
            for M in range(1, 17):
                yield name, pp, M


@pytest.mark.parametrize("name", SCHEDULES)
def test_planner_memory_model_and_simulator_report_one_peak(name):
    checked = 0
    for sname, pp, M in _grid():
        if sname != name:
            continue
        v = 2 if name == "interleaved-1f1b" else 1
        try:
            sched = generate(name, pp, M, v)
        except ScheduleError:
            continue  # the schedule's own requirements (e.g. M % pp for interleaving)
        table = _table(pp * v, seed=pp * 100 + M)
        arr = stage_arrays(table)
        mt = memory_template(name, pp, M, v)
        rng = random.Random(pp * 7 + M)
        for policy in POLICIES:
            kw = {"recompute": policy}
            if policy == "stage-aware-explicit":
                kw = {"recompute": "stage-aware",
                      "recompute_fractions": tuple(rng.uniform(0, 1) for _ in range(pp))}
            cfg = ParallelConfig(pp=pp, virtual_stages=v, micro_batch_size=1,
                                 global_batch_size=M, schedule=name, **kw)
            fr = recompute_fractions(cfg, sched)
            sim = simulate(config=cfg, cost_table=table, engine="evaluator",
                           keep_trace=False)
            model = [m.total_bytes for m in peak_memory(table, cfg, sched)]
            screen = [mt.peak_bytes(arr, r, fr[r]) for r in range(pp)]
            assert model == pytest.approx(sim.peak_memory_bytes, rel=1e-12), (pp, M, policy)
            assert screen == pytest.approx(sim.peak_memory_bytes, rel=1e-12), (pp, M, policy)
            checked += 1
    assert checked >= 5 * len(POLICIES)


@pytest.mark.parametrize("name, pp, M", [("shifted-critical-path", 4, 8), ("zb-h1", 3, 5),
                                         ("interleaved-1f1b", 2, 4)])
def test_simpy_engine_reports_the_walk_peak(name, pp, M):
    v = 2 if name == "interleaved-1f1b" else 1
    cfg = ParallelConfig(pp=pp, virtual_stages=v, micro_batch_size=1, global_batch_size=M,
                         schedule=name, recompute="stage-aware",
                         recompute_fractions=(0.5,) * pp)
    table = _table(pp * v, seed=11)
    sim = simulate(config=cfg, cost_table=table, engine="simpy", keep_trace=False)
    model = [m.total_bytes for m in peak_memory(table, cfg)]
    assert model == pytest.approx(sim.peak_memory_bytes, rel=1e-12)


def test_compiled_program_deltas_are_the_walk():
    sched = generate("shifted-critical-path", 4, 8)
    table = _table(4, seed=3)
    c = (0.25, 0.5, 0.75, 0.0)
    prog = compile_program(sched, table, c)
    for r in range(4):
        ids = [i for i, rk in enumerate(prog.rank_of_action) if rk == r]
        got = [(prog.mem_alloc[i], prog.mem_free[i]) for i in ids]
        lv = liveness(sched, r)
        assert [s.action for s in lv.steps] == [prog.actions[i] for i in ids]
        want = lv.deltas(ItemSizes(table.stages[r].kept_bytes(c[r]),
                                   table.stages[r].input_bytes,
                                   table.stages[r].activation_bytes))
        assert got == list(want)
