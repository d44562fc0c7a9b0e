"""zb-interleaved: golden S=4 orders, unit-cost makespans, memory, validation grid,
requirements."""

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merak_sim.schedule import SCHEDULES, ScheduleError, format_program, generate, validate
from merak_sim.schedule.ir import Kind, iter_actions
from merak_sim.schedule.posting import check_postings
from merak_sim.schedule.replay import replay

# Compute orders (unlowered, AR/OPT appended) of rank 0..3 for S=4, M=8, v=2.
GOLDEN = (
    "F0 F1 F2 F3 1F0 1F1 1F2 1F3 1I0 1W0 F4 1I1 1W1 F5 1I2 1W2 F6 1I3 1W3 F7 I0 W0 1F4 I1 "
    "W1 1F5 I2 W2 1F6 I3 W3 1F7 1I4 1W4 1I5 1W5 1I6 1W6 1I7 1W7 I4 W4 I5 W5 I6 W6 I7 W7 AR "
    "OPT",
    "F0 F1 F2 F3 1F0 1F1 1F2 1I0 1F3 1I1 1W0 F4 1I2 1W1 F5 1I3 1W2 F6 I0 1W3 F7 I1 W0 1F4 "
    "I2 W1 1F5 I3 W2 1F6 1I4 W3 1F7 1I5 1W4 1I6 1W5 1I7 1W6 I4 1W7 I5 W4 I6 W5 I7 W6 W7 AR "
    "OPT",
    "F0 F1 F2 F3 1F0 1F1 1I0 1F2 1I1 1F3 1I2 1W0 F4 1I3 1W1 F5 I0 1W2 F6 I1 1W3 F7 I2 W0 "
    "1F4 I3 W1 1F5 1I4 W2 1F6 1I5 W3 1F7 1I6 1W4 1I7 1W5 I4 1W6 I5 1W7 I6 W4 I7 W5 W6 W7 AR "
    "OPT",
    "F0 F1 F2 F3 1F0 1I0 1F1 1I1 1F2 1I2 1F3 1I3 1W0 F4 I0 1W1 F5 I1 1W2 F6 I2 1W3 F7 I3 W0 "
    "1F4 1I4 W1 1F5 1I5 W2 1F6 1I6 W3 1F7 1I7 1W4 I4 1W5 I5 1W6 I6 1W7 I7 W4 W5 W6 W7 AR OPT",
)


@pytest.mark.parametrize("rank", range(4))
def test_golden_orders_s4(rank):
    built = SCHEDULES["zb-interleaved"].build(4, 8, 2)
    assert built.placement == "loop"
    assert format_program(built.programs[rank]) == GOLDEN[rank]


def _unit(S, M, v=2):
    return replay(generate("zb-interleaved", S, M, v), f=1, b=2, w=1).makespan


@pytest.mark.parametrize(("S", "M", "want"), [(4, 4, 13.5), (4, 8, 25.5), (8, 16, 51.5)])
def test_unit_cost_makespans(S, M, want):
    """F = I = W = 1 per stage: 3M + (S - 1)/2, torch's interleaved zero bubble's
    figures, below zb-h1's (15, 27, 55) and interleaved 1F1B's (16.5, 28.5, 58.5)."""
    assert _unit(S, M) == want
    assert want < replay(generate("zb-h1", S, M), f=1, b=2, w=1).makespan
    assert want < replay(generate("interleaved-1f1b", S, M, 2), f=1, b=2).makespan


@pytest.mark.parametrize("S", range(2, 9))
@pytest.mark.parametrize("rounds", (1, 2, 3))
@pytest.mark.parametrize("v", (2, 3))
def test_unit_cost_reaches_the_loop_bound(S, rounds, v):
    """No loop-placed schedule ends before 3M + (S - 1)/v at unit costs."""
    M = rounds * S
    assert _unit(S, M, v) == pytest.approx(3 * M + (S - 1) / v, abs=1e-9)


@pytest.mark.parametrize("S", range(2, 9))
@pytest.mark.parametrize("v", (2, 3))
def test_holds_one_f_one_b_peak_below_interleaved_1f1b(S, v):
    """v S chunk micro-batches (S stage micro-batches) on every rank: 1F1B's rank-0
    peak, below interleaved 1F1B's memory-limiting rank 0 (its deep ranks, with
    shorter warm-ups, hold fewer)."""
    M = 2 * S
    zbi = validate(generate("zb-interleaved", S, M, v)).peak_in_flight
    il = validate(generate("interleaved-1f1b", S, M, v)).peak_in_flight
    assert zbi == (v * S,) * S
    assert max(zbi) < max(il) == il[0]
    assert max(zbi) / v == max(validate(generate("1f1b", S, M)).peak_in_flight)


@settings(max_examples=30, deadline=None)
@given(pp=st.integers(2, 16), rounds=st.integers(1, 3), v=st.integers(2, 3))
def test_validates_and_posts_safely(pp, rounds, v):
    M = rounds * pp
    sched = generate("zb-interleaved", pp, M, v)
    validate(sched)  # complete, deadlock-free, per-channel order, NCCL posting rule
    check_postings(sched)
    kinds = {a.kind for p in sched.programs for a in iter_actions(p)}
    assert Kind.BACKWARD not in kinds
    seen = sorted((sched.model_stage(a), a.microbatch) for p in sched.programs
                  for a in iter_actions(p) if a.kind is Kind.BACKWARD_WEIGHT)
    assert seen == [(g, m) for g in range(v * pp) for m in range(M)]


@pytest.mark.parametrize(("args", "needle"), [
    (("zb-interleaved", 4, 8, 1), "needs virtual stages >= 2, got 1"),
    (("zb-interleaved", 4, 6, 2), "multiple of pp"),
    (("zb-interleaved", 1, 4, 2), "pp >= 2"),
])
def test_requirements_are_one_sentence(args, needle):
    with pytest.raises(ScheduleError, match=needle):
        generate(*args)


def test_cli_without_virtual_stages_is_one_line_exit_2():
    r = subprocess.run(
        [sys.executable, "-m", "merak_sim.cli", "simulate", "--model", "gpt-8.3b",
         "--cluster", "dgx-a100-80g", "--dp", "2", "--tp", "1", "--pp", "4",
         "--micro-batch-size", "1", "--global-batch-size", "16", "--recompute", "none",
         "--schedule", "zb-interleaved"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs virtual stages >= 2, got 1" in lines[0]
