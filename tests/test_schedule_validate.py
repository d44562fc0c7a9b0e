"""The validator catches planted deadlocks, missing backwards and unmatched sends."""

from dataclasses import replace

import pytest

from merak_sim.schedule import DeadlockError, Schedule, ScheduleError, generate, validate
from merak_sim.schedule.ir import parse_program


def _sched(*programs, M=2, name="planted"):
    return Schedule(name, len(programs), M, 1,
                    tuple(parse_program(p, r) for r, p in enumerate(programs)))


def test_planted_deadlock_reports_grid():
    # Each rank waits for a gradient before sending the activation the other needs.
    s = _sched("F0 rG0 B0 sA0 AR OPT", "rA0 F0 B0 sG0 AR OPT", M=1)
    with pytest.raises(ScheduleError):
        validate(s)  # sA0 after B0: sends a gradient-order violation first
    s = _sched("F0 sA0 rG0 B0 AR OPT", "rA0 rG5 F0 B0 sG0 AR OPT", M=1)
    with pytest.raises(ScheduleError):
        validate(s)


def test_cyclic_wait_is_a_deadlock_with_grid():
    # Rank 1 posts its receive for A1 only after B0, whose gradient needs... rank 0's
    # F1 waits for nothing, but rank 0's B0 waits for G0 that rank 1 sends after F1,
    # and F1 on rank 1 needs A1 that rank 0 sends only after B0: a cycle.
    s = _sched(
        "F0 sA0 rG0 B0 F1 sA1 rG1 B1 AR OPT",
        "rA0 F0 rA1 F1 B0 sG0 B1 sG1 AR OPT",
    )
    with pytest.raises(DeadlockError) as e:
        validate(s)
    msg = str(e.value)
    assert "deadlocks" in msg and ">>" in msg and "S0" in msg and "S1" in msg
    assert e.value.stuck  # which ranks stopped where


def test_missing_backward_detected():
    s = _sched("F0 sA0 F1 sA1 rG0 B0 AR OPT", "rA0 F0 B0 sG0 rA1 F1 AR OPT")
    with pytest.raises(ScheduleError, match="missing its complete backward"):
        validate(s)


def test_missing_forward_detected():
    s = _sched("F0 B0 AR OPT", M=2)
    with pytest.raises(ScheduleError, match="missing its forward"):
        validate(s)


def test_backward_of_nograd_forward_needs_recompute():
    with pytest.raises(ScheduleError, match="before its R"):
        validate(_sched("F*0 B0 AR OPT", M=1))
    with pytest.raises(ScheduleError, match="R without"):
        validate(_sched("F0 R0 B0 AR OPT", M=1))


def test_unmatched_send_detected():
    s = _sched("F0 sA0 B0 AR OPT", "F0 B0 AR OPT", M=1)
    with pytest.raises(ScheduleError):
        validate(s)


def test_receive_order_mismatch_detected():
    s = _sched(
        "F0 sA0 F1 sA1 rG0 B0 rG1 B1 AR OPT",
        "rA1 rA0 F0 F1 B0 sG0 B1 sG1 AR OPT",
    )
    with pytest.raises(ScheduleError, match="order"):
        validate(s)


def test_dropping_one_action_from_a_real_schedule_is_caught():
    good = generate("shifted-critical-path", 4, 8)
    validate(good)
    prog = list(good.programs[1])
    prog.remove(next(s for s in prog if str(s) == "R6"))
    bad = replace(good, programs=(good.programs[0], tuple(prog), *good.programs[2:]))
    with pytest.raises(ScheduleError):
        validate(bad)
