"""Action tokens, fused groups and Schedule persistence round-trip."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from merak_sim.schedule import (
    SCHEDULES,
    Action,
    Fused,
    Kind,
    Schedule,
    ScheduleError,
    generate,
    parse_step,
)

kinds = st.sampled_from([k for k in Kind if k.per_microbatch])


@given(kind=kinds, stage=st.integers(0, 31), mb=st.integers(0, 999), chunk=st.integers(0, 7))
def test_action_token_round_trip(kind, stage, mb, chunk):
    a = Action(kind, stage, mb, chunk)
    assert Action.parse(str(a), stage) == a


@pytest.mark.parametrize("tok", ["AR", "OPT"])
def test_once_per_iteration_tokens(tok):
    a = Action.parse(tok, 3)
    assert str(a) == tok and a.microbatch == -1


def test_examples_from_the_issue():
    assert Action.parse("F*3", 0) == Action(Kind.FORWARD_NOGRAD, 0, 3)
    assert Action.parse("1F3", 0) == Action(Kind.FORWARD, 0, 3, 1)
    assert Action.parse("rG3", 2) == Action(Kind.RECV_GRAD, 2, 3)
    f = parse_step("[sA3/rG0]", 1)
    assert isinstance(f, Fused) and str(f) == "sA3/rG0"
    assert parse_step(str(f), 1) == f


@pytest.mark.parametrize("bad", ["", "X3", "F", "F*", "sA", "AR3", "3", "F3x", "F-1", "1AR"])
def test_malformed_tokens_rejected(bad):
    with pytest.raises(ScheduleError):
        Action.parse(bad, 0)


def test_fusing_compute_rejected():
    with pytest.raises(ScheduleError):
        parse_step("F3/rG0", 0)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_csv_and_json_round_trip(name):
    v = 2 if SCHEDULES[name].interleaved else 1
    s = generate(name, 4, 8, v)
    assert Schedule.from_csv(s.to_csv()) == s
    assert Schedule.from_json(s.to_json()) == s


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not a schedule",
        "# merak-schedule/1 name=x S=2 M=1 v=1\n0,F0,Q1\n",
        "# merak-schedule/1 name=x M=1 v=1\n0,F0\n",
        "# merak-schedule/1 name=x S=2 M=1 v=1\n1,F0\n",
    ],
)
def test_malformed_csv_rejected(text):
    with pytest.raises(ScheduleError):
        Schedule.from_csv(text)


@pytest.mark.parametrize("text", ["{", "[]", '{"format": "merak-schedule/1"}', '{"format": "x"}'])
def test_malformed_json_rejected(text):
    with pytest.raises(ScheduleError):
        Schedule.from_json(text)


def test_action_placed_on_wrong_rank_rejected():
    with pytest.raises(ScheduleError):
        Schedule("x", 2, 1, 1, ((Action(Kind.FORWARD, 1, 0),), ()))
