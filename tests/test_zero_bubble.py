"""Zero-bubble schedules: unit-cost targets, memory, validity and the cost-aware and
recompute variants (:mod:`merak_sim.schedule.zero_bubble`)."""

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merak_sim.schedule import SCHEDULES, generate, liveness, replay, validate
from merak_sim.schedule.execute import execute
from merak_sim.schedule.ir import Kind, iter_actions
from merak_sim.schedule.zero_bubble import StageTimes, ZeroBubbleCosts
from merak_sim.sim.from_config import recompute_fractions

NEW = ("1f1b-split", "zb-h1", "zb-h2", "zb-auto", "zb-scp")


def unit(sched):
    """Makespan at F = I = W = 1."""
    return replay(sched, f=1, b=2, w=1).makespan


def bound(S, M):
    """Fewest unit-cost steps of any single-chunk schedule (module docstring)."""
    return max(3 * M + S - 1, 2 * M + 2 * S - 1)


@pytest.mark.parametrize("S, M, zb, ofb", [(4, 8, 27, 33), (8, 16, 55, 69)])
def test_zb_h1_paper_targets(S, M, zb, ofb):
    assert unit(generate("zb-h1", S, M)) == zb
    assert unit(generate("1f1b", S, M)) == ofb
    assert unit(generate("1f1b-split", S, M)) == 3 * M + 2 * (S - 1)


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2", "zb-auto"])
def test_unit_makespan_is_the_bound_over_a_grid(name):
    for S in range(1, 7 if name == "zb-auto" else 9):
        for M in range(1, 3 * S + 2):
            # zb-auto given unit costs explicitly builds and weighs every candidate
            costs = ZeroBubbleCosts((StageTimes(),) * S) if name == "zb-auto" else None
            assert unit(generate(name, S, M, costs=costs)) == bound(S, M), (S, M)
            if M >= S:
                assert bound(S, M) == 3 * M + S - 1


def test_zb_h1_memory_is_1f1b_peak():
    for S, M in [(4, 8), (8, 16), (4, 2), (5, 5)]:
        zb, base = validate(generate("zb-h1", S, M)), validate(generate("1f1b", S, M))
        assert zb.peak_in_flight == (min(S, M),) * S
        assert zb.peak_in_flight[0] == base.peak_in_flight[0] == max(base.peak_in_flight)


def test_1f1b_split_memory_equals_1f1b_on_every_rank():
    for S, M in [(4, 8), (3, 2)]:
        assert validate(generate("1f1b-split", S, M)).peak_in_flight == \
            validate(generate("1f1b", S, M)).peak_in_flight


@pytest.mark.parametrize("S, M", [(2, 3), (4, 8), (4, 12), (8, 16), (8, 24)])
def test_zb_h2_idles_only_in_the_corners(S, M):
    """Rank s is busy without a gap from s to 3M + s (the parallelogram)."""
    ex = replay(generate("zb-h2", S, M), f=1, b=2, w=1).execution
    for s in range(S):
        runs = [(a0, e) for a, a0, e in ex.compute[s] if a.kind.per_microbatch]
        assert runs[0][0] == s and runs[-1][1] == 3 * M + s
        assert all(b[0] == a[1] for a, b in zip(runs, runs[1:], strict=False))


def test_zb_h2_states_its_activation_memory():
    """2S - 1 micro-batches per rank through the liveness walk (1F1B's peak: S)."""
    for S, M in [(4, 8), (8, 16), (3, 4)]:
        sched = generate("zb-h2", S, M)
        peaks = [liveness(sched, r).peak_in_flight for r in range(S)]
        assert peaks == [min(2 * S - 1, M)] * S
        assert max(peaks) <= 2 * validate(generate("1f1b", S, M)).peak_in_flight[0]


def _times(sched, times):
    """Makespan under per-rank times, transfers over the link after rank s taking
    ``times[s].send``."""
    def send(a):
        return times[a.stage if a.kind is Kind.SEND_ACT else a.stage - 1].send
    return execute(sched, lambda a: times[a.stage].of(a.kind), send).makespan


def test_zb_auto_strictly_faster_with_a_heavy_last_stage():
    """An LM head making F and I of the last rank twice as long (W half as long)."""
    S, M = 4, 8
    t = (StageTimes(),) * 3 + (StageTimes(2.0, 2.0, 0.5),)
    auto = generate("zb-auto", S, M, costs=ZeroBubbleCosts(t, 2 * S - 1))
    assert _times(auto, t) == 39.5 < _times(generate("zb-h1", S, M), t) == 41.0
    assert max(validate(auto).peak_in_flight) <= 2 * S - 1


@settings(max_examples=25, deadline=None)
@given(S=st.integers(2, 6), M=st.integers(1, 14), seed=st.integers(0, 10**6),
       extra=st.integers(0, 8))
def test_zb_auto_no_slower_than_zb_h1_within_its_memory(S, M, seed, extra):
    rng = random.Random(seed)
    t = tuple(StageTimes(rng.uniform(0.5, 2), rng.uniform(0.5, 2), rng.uniform(0.2, 2),
                         send=rng.uniform(0, 0.5)) for _ in range(S))
    limit = tuple(min(S, M) + rng.randint(0, extra) for _ in range(S))
    auto = generate("zb-auto", S, M, costs=ZeroBubbleCosts(t, limit))
    assert _times(auto, t) <= _times(generate("zb-h1", S, M), t) + 1e-9
    assert all(p <= lim for p, lim in zip(validate(auto).peak_in_flight, limit, strict=True))


@settings(max_examples=15, deadline=None)
@given(S=st.integers(2, 6), M=st.integers(1, 12), limit=st.integers(1, 4))
def test_zb_auto_never_exceeds_a_tight_memory_limit(S, M, limit):
    t = (StageTimes(1, 1, 1),) * (S - 1) + (StageTimes(1.5, 1.5, 1),)
    auto = generate("zb-auto", S, M, costs=ZeroBubbleCosts(t, limit))
    assert max(validate(auto).peak_in_flight) <= limit


@pytest.mark.parametrize("S, M, zb, scp", [(4, 8, 34, 38), (8, 16, 70, 82)])
def test_zb_scp_faster_than_shifted_critical_path_with_recompute(S, M, zb, scp):
    """Full recompute, r = 1: the memory-limiting rank 0 holds S micro-batches in
    both (every live micro-batch counted, full activations or input only)."""
    ours, merak = generate("zb-scp", S, M), generate("shifted-critical-path", S, M)
    kw = dict(f=1, b=2, w=1, r=1, recompute=1.0)
    assert replay(ours, **kw).makespan == zb < replay(merak, **kw).makespan == scp
    a, b = validate(ours), validate(merak)
    assert max(a.peak_in_flight) == max(b.peak_in_flight) == S
    assert max(a.peak_full_in_flight) == max(b.peak_full_in_flight) == S
    assert any(x.kind is Kind.RECOMPUTE for p in ours.programs for x in iter_actions(p))


def test_zb_scp_declares_merak_recompute():
    spec = SCHEDULES["zb-scp"]
    assert spec.explicit_recompute and spec.never_recompute(4) == {3}
    assert spec.pairs_with("stage-aware") and not spec.pairs_with("none")
    assert spec.stage_fractions(4, 0.5) == (0.5,) * 4  # the last rank masked by never_recompute


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(NEW), pp=st.integers(2, 16), m=st.integers(1, 40))
def test_new_generators_validate_and_post_safely(name, pp, m):
    """validate() proves completeness, order, deadlock-freedom and the NCCL posting
    rule (check_postings)."""
    check = validate(generate(name, pp, m))
    assert check.makespan_unit > 0
    assert max(check.peak_in_flight) <= min(2 * pp - 1, m)


def test_cost_aware_flag_only_on_zb_auto():
    assert [n for n, s in SCHEDULES.items() if s.cost_aware] == ["zb-auto"]
    with pytest.raises(ValueError, match="times for 3 ranks"):
        generate("zb-auto", 4, 8, costs=ZeroBubbleCosts((StageTimes(),) * 3))


def test_simulate_builds_zb_auto_from_the_cost_table():
    """The heavy-last-stage case through simulate(): the cost table's times and memory
    (capacity for 7 micro-batches beside the state) reach the order, the simulated
    iteration beats zb-h1's, and the SimPy engine equals the exact evaluator."""
    from dataclasses import replace

    from merak_sim.config import ParallelConfig
    from merak_sim.memory import peak_memory
    from merak_sim.sim import simulate
    from merak_sim.sim.toy import uniform_table

    base = uniform_table(4, f=1.0, b=2.0, w=1.0, capacity=4e9 + 7.5e9)
    heavy = replace(base.stages[3], forward_s=2.0, backward_input_s=2.0,
                    backward_weight_s=0.5, backward_s=2.5)
    table = replace(base, stages=(*base.stages[:3], heavy))
    cfg = dict(pp=4, micro_batch_size=1, global_batch_size=8, recompute="none")
    auto = ParallelConfig(schedule="zb-auto", **cfg)
    runs = {e: simulate(config=auto, cost_table=table, engine=e, keep_trace=False)
            for e in ("simpy", "evaluator")}
    h1 = simulate(config=ParallelConfig(schedule="zb-h1", **cfg), cost_table=table,
                  engine="evaluator", keep_trace=False)
    assert runs["simpy"].iteration_time_s == pytest.approx(
        runs["evaluator"].iteration_time_s, rel=1e-9)
    assert runs["evaluator"].iteration_time_s < h1.iteration_time_s
    assert [m.total_bytes for m in peak_memory(table, auto)] == pytest.approx(
        runs["simpy"].peak_memory_bytes, rel=1e-12)
    assert max(runs["simpy"].peak_memory_bytes) <= table.memory_capacity_bytes


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2", "zb-scp"])
def test_stage_aware_fractions_balance_zero_bubble_memory(name):
    """Every rank holds rank 0's count, so T2's rule gives every recomputing rank c0:
    equal activation peaks on equal stages (the last rank of zb-scp keeps all)."""
    from merak_sim.config import ParallelConfig
    from merak_sim.memory import peak_memory
    from merak_sim.sim.toy import uniform_table

    cfg = ParallelConfig(pp=4, micro_batch_size=1, global_batch_size=8, schedule=name,
                         recompute="stage-aware", recompute_c0=0.5)
    c = recompute_fractions(cfg)
    assert c[:3] == (0.5,) * 3 and c[3] == (0.0 if name == "zb-scp" else 0.5)
    peaks = [m.activation_peak_bytes for m in peak_memory(uniform_table(4), cfg)]
    if name != "zb-scp":  # zb-scp's F* micro-batches hold only their input
        assert peaks == pytest.approx([peaks[0]] * 4)


def test_cli_schedule_and_simulate_take_the_new_names(capsys):
    from merak_sim.cli import main

    assert main(["schedule", "--schedule", "zb-h1", "--pp", "4", "--microbatches", "8",
                 "--recompute", "none"]) == 0
    out = capsys.readouterr().out
    assert "peak in-flight micro-batches per rank: [4, 4, 4, 4]" in out
    assert "makespan (f=1, b=2, recompute=0): 27" in out
    base = ["simulate", "--model", "gpt-1.5b", "--cluster", "paper-3090", "--dp", "1",
            "--tp", "1", "--pp", "4", "--micro-batch-size", "1", "--global-batch-size", "16",
            "--sub-cluster", "--recompute", "none", "--engine", "evaluator", "--json",
            # Unfused attention's scores fill the memory that keeps zb-auto below zb-h2
            # (with flash it has room for zb-h2's order itself).
            "--attention", "unfused"]
    times = {}
    for name in ("1f1b", "zb-h1", "zb-h2", "zb-auto"):
        assert main([*base, "--schedule", name]) == 0
        out = capsys.readouterr().out
        times[name] = json.loads(out)["iteration_time_s"]
    assert times["zb-h2"] < times["zb-auto"] < times["zb-h1"] < times["1f1b"]


def _marked(base, waits):
    """``base`` (an unlowered ZB-H1) with the micro-batches in ``waits[s]`` run as F*
    and re-forwarded right before their I."""
    from dataclasses import replace

    from merak_sim.schedule import Action, lower

    progs = []
    for s, prog in enumerate(base.programs):
        out = []
        for a in prog:
            if a.kind.per_microbatch and a.microbatch in waits[s] and a.kind is Kind.FORWARD:
                out.append(Action(Kind.FORWARD_NOGRAD, s, a.microbatch))
                continue
            if (a.kind.per_microbatch and a.microbatch in waits[s]
                    and a.kind is Kind.BACKWARD_INPUT):
                out.append(Action(Kind.RECOMPUTE, s, a.microbatch))
            out.append(a)
        progs.append(tuple(out))
    S = base.num_stages
    return lower(replace(base, programs=tuple(progs), no_recompute_stages=frozenset({S - 1})))


def test_zb_scp_waits_are_the_fixed_point_of_marking_waiting_backwards():
    """Marking every backward that waits (F = R = I = W = 1, full recompute) until none
    is left reaches zb-scp's makespan."""
    kw = dict(f=1, b=2, w=1, r=1, recompute=1.0)
    for S in range(2, 7):
        for M in range(1, 2 * S + 1):
            base = SCHEDULES["zb-h1"].build(S, M)
            waits = [set() for _ in range(S)]
            while True:
                res = replay(_marked(base, waits), **kw)
                new = {(s, a.microbatch) for s in range(S - 1)
                       for (a, st0, _e), (_p, _s, prev) in zip(
                           res.execution.compute[s][1:], res.execution.compute[s],
                           strict=False)
                       if a.kind in (Kind.BACKWARD_INPUT, Kind.RECOMPUTE) and st0 > prev
                       and a.microbatch not in waits[s]}
                if not new:
                    break
                for s, m in new:
                    waits[s].add(m)
            assert res.makespan == replay(generate("zb-scp", S, M), **kw).makespan, (S, M)
