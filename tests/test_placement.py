"""The V placement of model stages on (rank, chunk): mapping, round trips, local hand-offs."""

import pytest

from merak_sim.schedule.ir import Action, Kind, Schedule, ScheduleError
from merak_sim.schedule.lowering import lower
from merak_sim.schedule.placement import placed_rank, placed_stage
from merak_sim.schedule.posting import channels
from merak_sim.schedule.validate import validate


def _two_chunk(S: int, placement: str, M: int = 1) -> Schedule:
    """Every micro-batch through both chunks, then back (a GPipe over the 2S stages)."""
    progs = []
    for r in range(S):
        p = [Action(Kind.FORWARD, r, m, c) for c in (0, 1) for m in range(M)]
        p += [Action(Kind.BACKWARD, r, m, c) for c in (1, 0) for m in range(M)]
        progs.append(tuple(p))
    return Schedule("t", S, M, 2, tuple(progs), lowered=False, placement=placement)


@pytest.mark.parametrize("S", [1, 2, 3, 4, 8])
def test_v_mapping_is_a_bijection_with_its_inverse(S):
    seen = set()
    for r in range(S):
        for c in (0, 1):
            g = placed_stage("v", S, r, c)
            assert placed_rank("v", S, g) == (r, c)
            seen.add(g)
    assert seen == set(range(2 * S))
    assert placed_stage("v", S, 0, 1) == 2 * S - 1
    assert placed_stage("v", S, S - 1, 1) == S


def test_loop_mapping_is_unchanged():
    assert [placed_stage("loop", 4, r, c) for c in (0, 1) for r in range(4)] == list(range(8))
    s = _two_chunk(4, "loop")
    assert s.rank_of(5) == (1, 1) and s.tied_ranks() == (0, 3)


def test_v_first_and_last_model_stage_on_rank_zero():
    s = _two_chunk(4, "v")
    assert s.rank_of(0) == (0, 0) and s.rank_of(7) == (0, 1)
    assert s.tied_ranks() == (0,)
    assert s.is_local(3) and not s.is_local(2) and not s.is_local(4)


def test_v_needs_two_chunks_and_known_placement():
    with pytest.raises(ScheduleError, match="virtual stages 2"):
        Schedule("t", 2, 1, 1, ((), ()), placement="v")
    with pytest.raises(ScheduleError, match="placement 'w'"):
        Schedule("t", 2, 1, 2, ((), ()), placement="w")


@pytest.mark.parametrize("S", [2, 3, 4])
def test_v_lowering_keeps_the_turn_local_and_validates(S):
    s = lower(_two_chunk(S, "v", M=2))
    last = [str(x) for x in s.programs[S - 1]]
    # The turn at rank S-1: chunk 0's output feeds chunk 1 with no send or receive.
    assert not any(t in last for t in ("sA0", "1rA0", "1sG0", "rG0"))
    validate(s)
    used = {("A" if a.kind in (Kind.SEND_ACT, Kind.RECV_ACT) else "G",) for p in s.programs
            for a in p if isinstance(a, Action) and a.kind.is_comm}
    assert used
    assert set(channels(S, 2, "v")) >= {("A", S - 1, S - 2), ("G", S - 2, S - 1)}


def test_v_local_order_is_checked():
    s = _two_chunk(2, "v")
    progs = list(s.programs)
    p = list(progs[1])
    p[0], p[1] = p[1], p[0]  # chunk 1's forward before chunk 0's on the turning rank
    progs[1] = tuple(p)
    bad = Schedule("t", 2, 1, 2, tuple(progs), lowered=False, placement="v")
    with pytest.raises(ScheduleError, match="local hand-off"):
        validate(lower(bad))


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_placement_round_trips(fmt):
    s = lower(_two_chunk(3, "v", M=2))
    text = s.to_json() if fmt == "json" else s.to_csv()
    back = Schedule.from_json(text) if fmt == "json" else Schedule.from_csv(text)
    assert back == s and back.placement == "v"
