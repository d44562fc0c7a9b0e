"""The unchecked builders (merak_sim.schedule.unchecked) give what the checked ones
give: 1F1B's programs equal the order its rule states, built with make_action, and the
lowering's copy equals the one dataclasses.replace checks field by field."""

from dataclasses import replace

import pytest

from merak_sim.schedule import SCHEDULES
from merak_sim.schedule.generators import one_f_one_b
from merak_sim.schedule.ir import Action, Fused, Kind, Schedule, make_action, make_fused
from merak_sim.schedule.lowering import lower
from merak_sim.schedule.unchecked import action, fused


def _rule_1f1b(S: int, M: int, s: int) -> list[Action]:
    """1F1B of rank s as its definition states it: min(S-1-s, M) warm-up forwards,
    then (F, B) pairs, then the remaining backwards."""
    warm = min(S - 1 - s, M)
    order = [(Kind.FORWARD, m) for m in range(warm)]
    for i in range(M - warm):
        order += [(Kind.FORWARD, warm + i), (Kind.BACKWARD, i)]
    order += [(Kind.BACKWARD, m) for m in range(M - warm, M)]
    return [make_action(k, s, m) for k, m in order]


@pytest.mark.parametrize("S", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("M", [1, 2, 3, 6, 9])
def test_1f1b_is_its_rule_in_real_actions(S, M):
    progs = one_f_one_b(S, M)
    assert progs == [_rule_1f1b(S, M, s) for s in range(S)]
    assert all(type(a) is Action for p in progs for a in p)
    # Each is a value: hashed by its fields, and refusing assignment.
    a = progs[-1][-1]
    assert hash(a) == hash(Action(a.kind, a.stage, a.microbatch, a.chunk))
    with pytest.raises(AttributeError):
        a.stage = 0


def test_action_and_fused_are_the_checked_values():
    got = [action(Kind.RECOMPUTE, 3, m, 1) for m in range(5)]
    assert got == [make_action(Kind.RECOMPUTE, 3, m, 1) for m in range(5)]
    assert {type(a) for a in got} == {Action}
    s, r = action(Kind.SEND_ACT, 1, 2, 0), action(Kind.RECV_GRAD, 1, 0, 0)
    f = fused((s, r))
    assert f == make_fused((s, r)) and type(f) is Fused


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_lowered_copy_equals_the_checked_replace(name):
    spec = SCHEDULES[name]
    raw = spec.build(4, 8, 2 if spec.interleaved else 1)
    assert not raw.lowered
    got = lower(raw)
    want = replace(raw, programs=got.programs, lowered=True)  # runs every check
    assert type(got) is Schedule and got.lowered
    assert vars(got) == vars(want)
    assert lower(got) is got
