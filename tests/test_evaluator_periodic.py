"""The periodic shortcut's bases (issue 34): interleaved 1F1B at M = 8 pp (the shape of
the published 1T and 530B runs) is extended from a base within periodic.BASE_SHARE of
the micro-batches, equal to the full evaluation; a base that cannot apply (out of
memory) stops the search at its first base; a base still in its transient is
retried larger."""

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.layout import RankLayout
from merak_sim.schedule import SCHEDULES
from merak_sim.sim import periodic
from merak_sim.sim.api import evaluator_trace, shape_schedule, simulate
from merak_sim.sim.from_config import recompute_fractions
from merak_sim.sim.program import compile_program
from merak_sim.sim.result import build_result
from tests.test_evaluator_cold import _bases, table


def counted(evaluated):
    """``evaluated`` that records the micro-batches of every base it builds."""
    seen = []

    def wrapped(m):
        seen.append(m)
        return evaluated(m)

    return wrapped, seen


def full_run(name, S, v, M, tab):
    return simulate(config=dict(dp=1, tp=1, pp=S, virtual_stages=v, micro_batch_size=1,
                                global_batch_size=M, schedule=name, recompute="full"),
                    cost_table=tab, engine="evaluator")


@pytest.mark.parametrize("S,v,kind", [(4, 2, "uniform"), (8, 2, "uniform"),
                                      (8, 3, "uniform"), (8, 2, "random"),
                                      (16, 4, "uniform")])
def test_interleaved_at_eight_pp_is_extended(S, v, kind):
    name = "interleaved-1f1b"
    period = SCHEDULES[name].steady_period(S, v)
    M = 8 * S
    tab = table(S * v, kind, 11)
    evaluated, seen = counted(_bases(name, S, v, tab))
    ext = periodic.extended(period, M, evaluated)
    assert ext is not None
    assert seen and max(seen) <= periodic.BASE_SHARE * M
    assert ext.makespan == pytest.approx(full_run(name, S, v, M, tab).iteration_time_s,
                                         rel=1e-12)


def test_a_transient_longer_than_the_share_falls_back():
    """Heavy first and last stages keep interleaved 1F1B (8 ranks, 2 chunks) in its
    transient for two blocks: at M = 8 pp no base within the share passes, and the
    cold path evaluates in full (simulate's figures are the full ones)."""
    name, S, v = "interleaved-1f1b", 8, 2
    tab = table(S * v, "ends", 11)
    evaluated, seen = counted(_bases(name, S, v, tab))
    assert periodic.extended(SCHEDULES[name].steady_period(S, v), 8 * S, evaluated) is None
    assert seen and max(seen) <= periodic.BASE_SHARE * 8 * S
    cfg = dict(dp=1, tp=1, pp=S, virtual_stages=v, micro_batch_size=1,
               global_batch_size=8 * S, schedule=name, recompute="full")
    cold = simulate(config=cfg, cost_table=tab, engine="evaluator", keep_trace=False)
    assert cold.iteration_time_s == full_run(name, S, v, 8 * S, tab).iteration_time_s


def test_a_base_out_of_memory_stops_at_once():
    name, S = "1f1b", 4
    tab = table(S, "uniform", 1)
    cfg = ParallelConfig(dp=1, tp=1, pp=S, micro_batch_size=1, global_batch_size=S,
                         schedule=name, recompute="full")
    seen = []

    def evaluated(m):  # as simulate's cold path, with 1 byte of memory per GPU
        seen.append(m)
        sched = shape_schedule(name, S, m, 1)
        prog = compile_program(sched, tab, recompute_fractions(cfg, sched))
        tr = evaluator_trace(prog, RankLayout(1, 1, S), 1.0, record_memory=False)
        return periodic.Evaluated(prog, tr, build_result(
            tr, engine="evaluator", keep_trace=False, capacity=1.0, peak_flops=1.0,
            global_batch=S, seq_len=None))

    assert periodic.extended(SCHEDULES[name].steady_period(S), 64, evaluated) is None
    assert len(seen) == 1


def test_a_base_in_its_transient_is_retried_larger():
    """Random stage costs keep 1F1B on 4 ranks in its transient for many blocks on
    some seeds: there the first base fails, a larger one within the share passes, and
    the extension equals the full evaluation."""
    period = SCHEDULES["1f1b"].steady_period(4)
    M = period.first_microbatches + 60
    retried = 0
    for seed in range(12):
        tab = table(4, "random", seed)
        evaluated, seen = counted(_bases("1f1b", 4, 1, tab))
        ext = periodic.extended(period, M, evaluated)
        assert seen == sorted(seen) and max(seen) <= periodic.BASE_SHARE * M
        if ext is None or len(seen) == 1:
            continue
        retried += 1
        assert ext.makespan == pytest.approx(full_run("1f1b", 4, 1, M, tab).iteration_time_s,
                                             rel=1e-12)
    assert retried
