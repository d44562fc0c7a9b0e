"""Evaluation schedules (a training schedule's forwards only) are proven like any
schedule: every registered schedule's forward-only form validates; a missing forward
is caught; only activations travel."""

import pytest

from merak_sim.schedule import SCHEDULES, Kind, ScheduleError, generate, iter_actions, validate
from merak_sim.schedule.evaluation import forward_only, is_forward_only
from merak_sim.schedule.ir import Schedule


def _built(name, S, M, v):
    try:
        return generate(name, S, M, v)
    except ValueError:
        return None


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_forward_only_of_every_schedule_validates(name):
    checked = 0
    for S in (1, 2, 3, 4):
        for v in (1, 2, 3):
            for M in (S, 2 * S, 3 * S + 1):
                sched = _built(name, S, M, v)
                if sched is None:
                    continue
                ev = forward_only(sched)
                validate(ev)
                kinds = {a.kind for p in ev.programs for a in iter_actions(p)}
                assert kinds <= {Kind.FORWARD_NOGRAD, Kind.SEND_ACT, Kind.RECV_ACT}
                assert is_forward_only(ev) and not is_forward_only(sched)
                n_fwd = sum(a.kind is Kind.FORWARD_NOGRAD for p in ev.programs
                            for a in iter_actions(p))
                assert n_fwd == S * v * M
                checked += 1
    assert checked > 0


def test_an_evaluation_schedule_missing_a_forward_is_refused():
    ev = forward_only(generate("1f1b", 2, 4))
    progs = list(ev.programs)
    progs[1] = tuple(s for s in progs[1]
                     if not (s.kind is Kind.FORWARD_NOGRAD and s.microbatch == 3))
    cut = Schedule(ev.name, 2, 4, 1, tuple(progs), lowered=True)
    with pytest.raises(ScheduleError, match="micro-batch 3 is missing its forward"):
        validate(cut)
