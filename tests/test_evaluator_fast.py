"""The fast path of the exact evaluator: a schedule's structure compiled once and
re-priced per cost table (merak_sim.sim.program), its dependency order cached
(merak_sim.sim.evaluator.plan) and generated schedules reused per shape
(merak_sim.sim.api.schedule_of). Every registered schedule is covered, so a new
generator is checked as soon as it is registered: the re-priced program equals the
documented pricing action by action, a cached structure prices exactly as a fresh
one, and the evaluator on it equals the SimPy engine."""

import random
from dataclasses import fields, replace

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs.base import CostTable, StageCost
from merak_sim.layout import RankLayout
from merak_sim.schedule import (
    SCHEDULES,
    Action,
    Kind,
    Schedule,
    ScheduleError,
    generate,
    iter_actions,
    parse_program,
)
from merak_sim.schedule.liveness import liveness, stash_sizes
from merak_sim.sim.api import schedule_of, simulate
from merak_sim.sim.engine import run_engine
from merak_sim.sim.evaluator import evaluate, plan
from merak_sim.sim.from_config import schedule_for
from merak_sim.sim.gpu import EngineOptions
from merak_sim.sim.program import compile_program
from merak_sim.sim.structure import OP_POST, program_structure

SHAPES = [(1, 4, 1), (2, 3, 1), (3, 6, 1), (4, 8, 1), (4, 5, 1), (2, 4, 2), (3, 6, 3),
          (4, 8, 2)]


def _cases():
    for name, spec in SCHEDULES.items():
        for S, M, v in SHAPES:
            if not spec.violation(S, M, v):
                yield name, S, M, v


CASES = list(_cases())

#: Every float field of a stage's costs (all but its layer count), in field order.
STAGE_FIELDS = tuple(f.name for f in fields(StageCost) if f.name != "layers")


def uneven_table(n: int, seed: int, tied: bool = False) -> CostTable:
    """Every field of every stage different (TP collectives too)."""
    rng = random.Random(seed)
    stages = tuple(StageCost(layers=rng.randint(1, 4),
                             **{k: rng.uniform(0.05, 3.0) for k in STAGE_FIELDS}) for _ in range(n))
    return CostTable(stages, memory_capacity_bytes=40.0, peak_flops=1.0,
                     tied_embeddings=tied)


def fractions(S: int, seed: int) -> tuple[float, ...]:
    rng = random.Random(seed)
    return tuple(rng.choice((0.0, 1.0, rng.random())) for _ in range(S))


#: Documented durations (merak_sim.sim.program docstring) by kind: (stage cost, c) ->
#: (duration, recompute part).
RULES = {
    Kind.FORWARD: lambda sc, cs: (sc.forward_s, 0.0),
    Kind.FORWARD_NOGRAD: lambda sc, cs: (sc.forward_s, 0.0),
    Kind.RECOMPUTE: lambda sc, cs: (sc.forward_s, sc.forward_s),
    Kind.BACKWARD: lambda sc, cs: (sc.backward_s + cs * sc.recompute_s, cs * sc.recompute_s),
    Kind.BACKWARD_INPUT: lambda sc, cs: (sc.backward_input_s + cs * sc.recompute_s,
                                         cs * sc.recompute_s),
    Kind.BACKWARD_WEIGHT: lambda sc, cs: (sc.backward_weight_s, 0.0),
}


def check_documented_prices(sched: Schedule, table: CostTable, c) -> None:
    """compile_program's durations, memory deltas, transfer times and FLOPs equal the
    documented rules applied action by action (liveness walk for the memory)."""
    prog = compile_program(sched, table, c)
    S, st = sched.num_stages, table.stages
    cc = [0.0 if s in sched.no_recompute_stages else x for s, x in enumerate(c)]
    explicit = {(a.stage, a.chunk, a.microbatch) for p in sched.programs
                for a in iter_actions(p) if a.kind is Kind.RECOMPUTE}
    for rank in range(S):
        # the model stage each chunk holds, as the schedule places it
        at = [sched.model_stage(Action(Kind.FORWARD, rank, 0, ch))
              for ch in range(sched.virtual_stages)]
        ids = [x for code, x, _y in prog.ops[rank] if code != OP_POST]
        chunks = sorted({a.chunk for a in iter_actions(sched.programs[rank])
                         if a.kind.per_microbatch})
        flops = 0.0
        for x in ids:
            a = prog.actions[x]
            if a.kind.per_microbatch:
                sc = st[sched.model_stage(a)]
                cs = 0.0 if (rank, a.chunk, a.microbatch) in explicit else cc[rank]
                assert (prog.duration_s[x], prog.recompute_s[x]) == RULES[a.kind](sc, cs)
                if a.kind in (Kind.FORWARD, Kind.FORWARD_NOGRAD):
                    flops += sc.flops
            else:
                field = "grad_allreduce_s" if a.kind is Kind.ALL_REDUCE else "optimizer_s"
                assert prog.duration_s[x] == sum(getattr(st[at[ch]], field) for ch in chunks)
        assert prog.flops[rank] == flops
        sizes = [stash_sizes(st[g], cc[rank]) for g in at]
        assert [(prog.mem_alloc[x], prog.mem_free[x]) for x in ids] == list(
            liveness(sched, rank).deltas(sizes))
    for t, d, n in zip(prog.transfers, prog.transfer_s, prog.transfer_bytes, strict=True):
        g = t.key[1] if t.key[0] == "A" else t.key[1] - 1
        assert (t.duration_s, d, t.nbytes, n) == (st[g].send_activation_s,) * 2 + (
            st[g].p2p_bytes,) * 2


@pytest.mark.parametrize("name, S, M, v", CASES)
def test_repriced_structure_follows_the_documented_rules(name, S, M, v):
    sched = generate(name, S, M, v)
    for seed in range(3):  # the same structure, three cost tables
        check_documented_prices(sched, uneven_table(S * v, seed, tied=seed == 1),
                                fractions(S, seed))
    assert program_structure(sched) is compile_program(sched, uneven_table(S * v, 9)).structure


@pytest.mark.parametrize("name, S, M, v", CASES)
def test_cached_structure_prices_as_a_fresh_one(name, S, M, v):
    sched = generate(name, S, M, v)
    first = uneven_table(S * v, 1)
    compile_program(sched, first, fractions(S, 1))  # leaves its structure cached
    table, c = uneven_table(S * v, 2, tied=True), fractions(S, 2)
    again = compile_program(sched, table, c)
    fresh = Schedule.from_json(sched.to_json())
    assert fresh is not sched and fresh == sched
    new = compile_program(fresh, table, c)
    assert new.structure is not again.structure
    assert replace(new, schedule=sched, structure=again.structure) == again
    assert new.transfers == again.transfers
    assert evaluate(new) == evaluate(again)


@pytest.mark.parametrize("name, S, M, v", CASES)
@pytest.mark.parametrize("overlap, zero", [(False, 0), (True, 0), (True, 1)])
def test_fast_path_equals_the_engine(name, S, M, v, overlap, zero):
    sched = generate(name, S, M, v)
    for seed in (3, 4):  # the second pricing reuses the structure and the order
        prog = compile_program(sched, uneven_table(S * v, seed, tied=seed == 4),
                               fractions(S, seed))
        ev = evaluate(prog, overlap_dp=overlap, buckets=2, zero=zero)
        tr = run_engine(prog, RankLayout(1, 1, S), 1e12,
                        EngineOptions(overlap_dp=overlap, buckets=2, zero=zero))
        assert tr.makespan == pytest.approx(ev.makespan, rel=1e-9)
        for acts in tr.acts:
            for aid, st, en in acts:
                assert (st, en) == pytest.approx((ev.start[aid], ev.end[aid]), rel=1e-9,
                                                 abs=1e-12)
        assert tr.xfers[0][1] == pytest.approx(ev.xfer_end, rel=1e-9)


def test_plan_is_shared_by_every_pricing_of_a_structure():
    sched = generate("interleaved-1f1b", 4, 8, 2)
    a = compile_program(sched, uneven_table(8, 1))
    b = compile_program(sched, uneven_table(8, 2))
    assert plan(a) is plan(b)
    assert plan(compile_program(Schedule.from_json(sched.to_json()), uneven_table(8, 1))) \
        == plan(a)


def test_deadlock_is_still_reported():
    # rank 0 posts its activation only after the backward that needs rank 1's gradient
    bad = Schedule("custom", 2, 1, 1, (parse_program("F0 rG0 B0 sA0 AR OPT", 0),
                                       parse_program("rA0 F0 B0 sG0 AR OPT", 1)))
    with pytest.raises(ScheduleError, match="deadlocks"):
        plan(compile_program(bad, uneven_table(2, 0)))


def test_repriced_checks_transfer_count():
    prog = compile_program(generate("1f1b", 2, 2), uneven_table(2, 0))
    with pytest.raises(ValueError, match="transfer times"):
        prog.repriced(prog.duration_s, [0.0], prog.ar_chunks)


def test_schedule_of_reuses_one_object_per_shape():
    cfg = ParallelConfig(dp=1, tp=1, pp=4, micro_batch_size=1, global_batch_size=8,
                         schedule="1f1b")
    other = replace(cfg, dp=2, global_batch_size=16)  # same (schedule, pp, M, v)
    sched = schedule_of(cfg)
    assert sched == schedule_for(cfg)
    assert schedule_of(other) is sched
    assert schedule_of(replace(cfg, global_batch_size=16)) is not sched


def test_simulate_unchanged_by_the_reused_schedule():
    table = uneven_table(4, 5)
    kw = dict(config=dict(dp=1, tp=1, pp=4, micro_batch_size=1, global_batch_size=8,
                          schedule="zb-h1", recompute="full"), cost_table=table,
              engine="evaluator")
    a, b = simulate(**kw), simulate(**kw)
    assert b.trace.prog.structure is a.trace.prog.structure
    ref = simulate(**kw, custom_schedule=Schedule.from_json(schedule_of(
        ParallelConfig.from_dict(kw["config"])).to_json()))
    assert (a.iteration_time_s, a.ranks, a.peak_memory_bytes) == (
        ref.iteration_time_s, ref.ranks, ref.peak_memory_bytes)


def test_compiled_program_pickles_after_use():
    import pickle

    sched = generate("1f1b", 1, 1)  # one-action gathers too
    prog = compile_program(sched, uneven_table(1, 0))
    ev = evaluate(prog)
    _ = prog.mem_alloc, prog.transfers
    back = pickle.loads(pickle.dumps(prog))
    assert evaluate(back) == ev and back.mem_alloc == prog.mem_alloc
