"""The evaluator's cold path: a schedule seen for the first time is evaluated from
one small base of the same generator and extended (merak_sim.sim.periodic) where
the generator declares a Period; every figure must equal the full evaluation's.

The reference is the same simulate() with keep_trace=True, which always evaluates
the whole schedule. Every registered schedule is run (those without a Period go the
full way), over a seeded grid of pp, micro-batches, virtual stages and costs:
uniform stages, strongly unequal ones, a heavy first and last stage (embedding and
head), overlap of the data-parallel reduction on and off, ZeRO-1, tied embeddings
and checkpointed fractions."""

import random

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs.base import CostTable, StageCost
from merak_sim.layout import RankLayout
from merak_sim.schedule import SCHEDULES, generate, iter_actions
from merak_sim.sim.api import evaluator_trace, shape_schedule, simulate
from merak_sim.sim.from_config import recompute_fractions
from merak_sim.sim.periodic import Evaluated, extended
from merak_sim.sim.program import compile_program
from merak_sim.sim.result import build_result
from tests.test_evaluator_fast import STAGE_FIELDS


def table(n: int, kind: str, seed: int, tied: bool = False) -> CostTable:
    """``n`` stages: "uniform" (all equal), "ends" (first and last 1.5-3x heavier),
    "random" (every field of every stage drawn in [0.05, 3])."""
    rng = random.Random(seed)
    base = {k: rng.uniform(0.05, 3.0) for k in STAGE_FIELDS}
    stages = []
    for g in range(n):
        if kind == "random":
            vals = {k: rng.uniform(0.05, 3.0) for k in STAGE_FIELDS}
        else:
            f = rng.uniform(1.5, 3.0) if kind == "ends" and g in (0, n - 1) else 1.0
            vals = {k: v * f for k, v in base.items()}
        stages.append(StageCost(layers=2, **vals))
    return CostTable(tuple(stages), memory_capacity_bytes=1e9, peak_flops=1.0,
                     tied_embeddings=tied)


def flat(x, key=""):
    """Every number of a ``SimResult.to_dict()``, by path."""
    if isinstance(x, dict):
        return {k: v for name, y in x.items() for k, v in flat(y, f"{key}.{name}").items()}
    if isinstance(x, (list, tuple)):
        return {k: v for i, y in enumerate(x) for k, v in flat(y, f"{key}[{i}]").items()}
    return {key: x}


def assert_same(cold, full):
    """Equal to 1e-9: seconds relative to the iteration time, fractions absolutely,
    everything else relative to itself."""
    assert (cold.meta, cold.peak_flops, cold.trace) == (full.meta, full.peak_flops, None)
    a, b = flat(cold.to_dict()), flat(full.to_dict())
    assert a.keys() == b.keys()
    T = full.iteration_time_s
    for k, y in b.items():
        x = a[k]
        if not isinstance(y, float):
            assert x == y, k
            continue
        scale = T if k.endswith("_s") and not k.endswith("per_s") else (
            1.0 if k.endswith("fraction") else max(abs(y), 1e-300))
        assert abs(x - y) <= 1e-9 * scale, (k, x, y)


def run(name, S, M, v, tab, **kw):
    cfg = dict(dp=2, tp=1, pp=S, virtual_stages=v, micro_batch_size=1,
               global_batch_size=2 * M, schedule=name, recompute="full")
    cfg.update(kw.pop("config", {}))
    args = dict(config=cfg, cost_table=tab, engine="evaluator", **kw)
    return simulate(**args, keep_trace=False), simulate(**args, keep_trace=True)


def _grid():
    """Every schedule on a few shapes; the ones with a Period (which the cold path
    extends) on many."""
    rng = random.Random(7)
    for name, spec in SCHEDULES.items():
        shapes = [(S, M, v) for S, v in ((1, 1), (2, 1), (3, 1), (4, 1), (4, 2), (5, 1),
                                         (8, 1), (3, 3))
                  for M in (S, 2 * S + 1, 4 * S, 24, 40) if not spec.violation(S, M, v)]
        if spec.steady_period(4) is None:
            shapes = rng.sample(shapes, min(3, len(shapes)))
        for S, M, v in shapes:
            yield name, S, M, v, rng.choice(("uniform", "ends", "random")), \
                rng.randrange(1000)


GRID = list(_grid())


@pytest.mark.parametrize("name,S,M,v,kind,seed", GRID)
def test_cold_equals_full_evaluation(name, S, M, v, kind, seed):
    cold, full = run(name, S, M, v, table(S * v, kind, seed))
    assert_same(cold, full)


@pytest.mark.parametrize("overlap,zero,tied,recompute", [
    (False, 0, False, "none"), (True, 0, False, "full"), (True, 1, False, "full"),
    (False, 1, True, "selective"), (True, 0, True, "none"), (True, 1, True, "full")])
@pytest.mark.parametrize("kind", ["uniform", "ends", "random"])
def test_cold_equals_full_with_overlap_zero_and_tied(overlap, zero, tied, recompute, kind):
    for S, M in ((1, 12), (4, 20), (6, 33)):
        cold, full = run("1f1b", S, M, 1, table(S, kind, S + M, tied), overlap_dp=overlap,
                         config=dict(zero=zero, recompute=recompute))
        assert_same(cold, full)


def _bases(name, S, v, tab, overlap=False):
    """``evaluated(M)`` as simulate's cold path builds it."""
    cfg = ParallelConfig(dp=1, tp=1, pp=S, virtual_stages=v, micro_batch_size=1,
                         global_batch_size=S, schedule=name, recompute="full")
    assert not SCHEDULES[name].violation(S, S, v)
    common = dict(capacity=1e9, peak_flops=1.0, global_batch=S, seq_len=None)

    def evaluated(m):
        sched = shape_schedule(name, S, m, v)
        prog = compile_program(sched, tab, recompute_fractions(cfg, sched))
        tr = evaluator_trace(prog, RankLayout(1, 1, S), 1e9, overlap_dp=overlap,
                             record_memory=False)
        return Evaluated(prog, tr, build_result(tr, engine="evaluator", keep_trace=False,
                                                **common))

    return evaluated


#: Every shape the periodic schedules accept (interleaved 1F1B needs pp >= 2).
EXTENDED = [(name, v, kind, S)
            for name, v in (("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2))
            for kind in ("uniform", "ends", "random") for S in (1, 2, 4, 8)
            if not SCHEDULES[name].violation(S, 2 * S, v)]


@pytest.mark.parametrize("name,v,kind,S", EXTENDED)
def test_periodic_schedules_are_extended_not_evaluated_in_full(name, v, kind, S):
    period = SCHEDULES[name].steady_period(S, v)
    # Enough blocks that the longest transient here (random costs: 24 blocks) fits in
    # a base within periodic.BASE_SHARE of the micro-batches.
    M = period.first_microbatches + 60 * period.microbatches
    tab = table(S * v, kind, 3)
    ext = extended(period, M, _bases(name, S, v, tab))
    assert ext is not None
    full = simulate(config=dict(dp=1, tp=1, pp=S, virtual_stages=v, micro_batch_size=1,
                                global_batch_size=M, schedule=name, recompute="full"),
                    cost_table=tab, engine="evaluator")
    assert ext.makespan == pytest.approx(full.iteration_time_s, rel=1e-12)


def test_falls_back_where_a_check_fails():
    period = SCHEDULES["1f1b"].steady_period(4)
    tab = table(4, "random", 1)
    # too few micro-batches to gain from a base
    assert extended(period, period.first_microbatches + 3, _bases("1f1b", 4, 1, tab)) is None
    # no declared period
    assert extended(SCHEDULES["gpipe"].steady_period(4), 40, _bases("gpipe", 4, 1, tab)) \
        is None
    # a base that runs out of memory
    small = CostTable(tab.stages, memory_capacity_bytes=1.0, peak_flops=1.0)
    assert run("1f1b", 4, 40, 1, small)[0].oom is not None
    # a period that does not describe the programs (wrong block length)
    wrong = type(period)(period.first_microbatches, 1, period.prefix, (3,) * 4,
                         period.suffix)
    assert extended(wrong, 40, _bases("1f1b", 4, 1, tab)) is None


PERIODIC = [(name, S, v) for name, spec in SCHEDULES.items() for S in (1, 2, 3, 5, 8)
            for v in (1, 2, 3) if spec.steady_period(S, v) is not None
            and not spec.violation(S, spec.steady_period(S, v).first_microbatches, v)]


@pytest.mark.parametrize("name,S,v", PERIODIC)
def test_declared_period_describes_the_generated_programs(name, S, v):
    """M + p inserts one block before every rank's suffix and changes nothing else
    (the micro-batches after it move up by p)."""
    period = SCHEDULES[name].steady_period(S, v)
    p = period.microbatches
    for M in range(period.first_microbatches, period.first_microbatches + 5 * p, p):
        a, b = generate(name, S, M, v), generate(name, S, M + p, v)
        for r in range(S):
            steps = [[x for x in iter_actions(prog) if x.kind.is_compute] for prog in
                     (a.programs[r], b.programs[r])]
            pre, blk, suf = period.prefix[r], period.block[r], period.suffix[r]
            assert (len(steps[0]) - pre - suf) % blk == 0
            assert len(steps[1]) == len(steps[0]) + blk
            cut = len(steps[0]) - suf
            assert cut >= pre and steps[1][:cut] == steps[0][:cut]
            tail = steps[1][cut + blk:]
            assert [(x.kind, x.chunk, x.microbatch - p if x.kind.per_microbatch else -1)
                    for x in tail] == [(x.kind, x.chunk, x.microbatch) for x in
                                       steps[0][cut:]]
            assert all(x.kind.per_microbatch for x in steps[1][cut:cut + blk])
