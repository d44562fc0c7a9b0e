"""The program structure built from rows with numpy (merak_sim.sim.flat_structure,
issue 34 item 2) equals the walk's, field by field, on every registered schedule; the
deferred fields build on first use and pickle as tuples; a schedule the arrays cannot
represent falls back to the walk, which words the error."""

import pickle
from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merak_sim.schedule import SCHEDULES, Kind, Schedule, ScheduleError, generate
from merak_sim.schedule.arrays import array_schedule
from merak_sim.schedule.ir import Action
from merak_sim.sim.deferred import Deferred, PerRank
from merak_sim.sim.structure import ProgramStructure, build_structure, program_structure
from tests.test_schedule_generators import _valid_args

FLAT_FIELDS = ("first", "kind", "consumed", "send_prev", "recv_prev", "rule", "alloc", "free",
               "chunk", "send_rank", "recv_rank")


def assert_same_structure(walked: ProgramStructure, built: ProgramStructure) -> None:
    """Every field equal (deferred ones read in full), and the flat arrays equal to
    those derived from the walk."""
    assert built.flat is not None
    for f in fields(ProgramStructure):
        if f.name not in ("schedule", "flat"):
            assert getattr(built, f.name) == getattr(walked, f.name), f.name
    for f in FLAT_FIELDS:
        assert np.array_equal(getattr(built.flat, f), getattr(walked.arrays, f)), f
    assert built.ops == walked.ops and built.tied_candidates == walked.tied_candidates


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(list(SCHEDULES)), pp=st.integers(1, 8), m=st.integers(1, 24),
       v=st.integers(1, 3))
def test_rows_build_equals_the_walk(name, pp, m, v):
    pp, m, v = _valid_args(name, pp, m, v)
    sched = generate(name, pp, m, v)
    assert_same_structure(build_structure(sched, rows=False),
                          build_structure(sched, rows=True))


def test_array_schedules_build_from_rows():
    """An ArraySchedule's structure is the array build (nothing built per action until
    read); a Schedule's is the walk's."""
    arr = array_schedule(SCHEDULES["interleaved-1f1b"], 4, 8, 2)
    ps = program_structure(arr)
    assert ps.flat is not None and isinstance(ps.actions, Deferred)
    assert isinstance(ps.op_words, PerRank) and "programs" not in arr.__dict__
    assert program_structure(generate("1f1b", 4, 8)).flat is None
    assert_same_structure(build_structure(generate("interleaved-1f1b", 4, 8, 2), rows=False),
                          ps)


def test_deferred_structure_pickles_as_the_walks():
    sched = generate("zb-h1", 3, 6)
    built = pickle.loads(pickle.dumps(build_structure(sched, rows=True)))
    assert_same_structure(build_structure(sched, rows=False), built)


def test_deferred_sequences():
    made = []
    d = Deferred(lambda: made.append(1) or [1, 2, 3], length=3)
    assert len(d) == 3 and not made
    assert d[1] == 2 and list(d) == [1, 2, 3] and d == (1, 2, 3) and made == [1]
    p = PerRank(3, lambda r: (made.append(r), r * 10)[1])
    assert p[2] == 20 and p[-1] == 20 and made == [1, 2]
    assert p[0:2] == (0, 10) and tuple(p) == (0, 10, 20) and p == (0, 10, 20)


def _broken(programs) -> Schedule:
    return Schedule("broken", len(programs), 1, 1, tuple(tuple(p) for p in programs))


def test_unrepresentable_schedules_fall_back_to_the_walk():
    """A send without its receive, or a consumer before its receive: the array build
    declines and the walk raises its own message."""
    F, B, SA, RA, RG, SG = (Kind.FORWARD, Kind.BACKWARD, Kind.SEND_ACT, Kind.RECV_ACT,
                            Kind.RECV_GRAD, Kind.SEND_GRAD)
    lone = _broken([[Action(F, 0, 0), Action(SA, 0, 0)], [Action(B, 1, 0)]])
    with pytest.raises(ScheduleError, match="no matching"):
        build_structure(lone, rows=True)
    late = _broken([[Action(F, 0, 0), Action(SA, 0, 0), Action(B, 0, 0), Action(RG, 0, 0)],
                    [Action(RA, 1, 0), Action(F, 1, 0), Action(B, 1, 0), Action(SG, 1, 0)]])
    with pytest.raises(ScheduleError, match="before its receive"):
        build_structure(late, rows=True)
