"""The schedule IR in flat arrays (merak_sim.schedule.arrays, issue 34 item 2): rows
convert to and from Action programs exactly; the closed-form generators and the
vectorised lowering give the rows of ``generate`` on every shape; an ArraySchedule
equals the Schedule it stands for and builds its Actions only when read."""

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merak_sim.schedule import SCHEDULES, Schedule, generate, validate
from merak_sim.schedule.arrays import (
    ARRAY_ORDERS,
    ArraySchedule,
    array_schedule,
    compute_rows,
    lower_rows,
    programs_of_rows,
    rows_of,
    rows_of_programs,
)
from tests.test_schedule_generators import _valid_args


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(sorted(ARRAY_ORDERS)), pp=st.integers(1, 12),
       m=st.integers(1, 48), v=st.integers(1, 4))
def test_closed_forms_equal_the_generators(name, pp, m, v):
    """Rows, programs and the schedule equal ``generate``'s (both ways round)."""
    pp, m, v = _valid_args(name, pp, m, v)
    ref = generate(name, pp, m, v)
    got = array_schedule(SCHEDULES[name], pp, m, v)
    assert isinstance(got, ArraySchedule)
    assert got.step_rows.equals(rows_of_programs(ref.programs))
    assert "programs" not in got.__dict__  # built on first read only
    assert got.programs == ref.programs
    assert got == ref and ref == got and hash(got) == hash(ref)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(list(SCHEDULES)), pp=st.integers(1, 8), m=st.integers(1, 24),
       v=st.integers(1, 3))
def test_rows_round_trip_every_schedule(name, pp, m, v):
    """Every registered schedule, lowered or not, survives rows and back (fused groups
    and explicit sends included)."""
    pp, m, v = _valid_args(name, pp, m, v)
    sched = generate(name, pp, m, v)
    for programs in (sched.programs, SCHEDULES[name].build(pp, m, v).programs):
        rows = rows_of_programs(programs)
        assert programs_of_rows(rows) == programs
        assert rows.bounds[-1] == len(rows.kind) == sum(len(s.parts) for p in programs
                                                        for s in p)


@pytest.mark.parametrize("name", sorted(ARRAY_ORDERS))
def test_lowering_rows_equals_lower(name):
    """The vectorised lowering of the compute rows is ``lower``'s, fused groups
    included, on a shape with sends fused to both neighbours."""
    pp, m, v = (4, 8, 2) if SCHEDULES[name].interleaved else (4, 8, 1)
    spec = SCHEDULES[name]
    rows = lower_rows(compute_rows(spec, pp, m, v), spec.placement, v)
    assert rows.equals(rows_of_programs(generate(name, pp, m, v).programs))
    assert rows.joined.any()


def test_lowering_rows_refuses_placed_communication():
    rows = rows_of(generate("1f1b", 3, 4))  # lowered: it holds sends and receives
    with pytest.raises(ValueError, match="compute-only"):
        lower_rows(rows, "loop", 1)


def test_no_closed_form_gives_none_and_rows_of_converts():
    """Generators without a closed form (or cost-aware ones) keep their Actions;
    ``rows_of`` converts any schedule."""
    for name in SCHEDULES:
        if name not in ARRAY_ORDERS:
            assert array_schedule(SCHEDULES[name], 4, 8, 2) is None
    sched = generate("zb-h1", 4, 8)
    assert programs_of_rows(rows_of(sched)) == sched.programs


def test_array_schedule_checks_requirements_and_keeps_metadata():
    spec = SCHEDULES["interleaved-1f1b"]
    with pytest.raises(ValueError, match="multiple of pp"):
        array_schedule(spec, 4, 6, 2)
    got = array_schedule(spec, 4, 8, 2)
    assert (got.name, got.num_stages, got.num_microbatches, got.virtual_stages,
            got.lowered, got.placement) == ("interleaved-1f1b", 4, 8, 2, True, "loop")
    assert isinstance(got, Schedule) and got.num_actions() == len(got.step_rows.kind)
    assert validate(got).peak_in_flight == validate(generate("interleaved-1f1b", 4, 8, 2)
                                                    ).peak_in_flight


def test_array_schedule_pickles_and_prints():
    got = array_schedule(SCHEDULES["1f1b"], 3, 5, 1)
    back = pickle.loads(pickle.dumps(got))
    assert back == got and back.format() == generate("1f1b", 3, 5).format()
    assert got.to_json() == generate("1f1b", 3, 5).to_json()


def test_large_rows_stay_compact():
    """The 1T run's schedule (65,536 passes) as rows: four small integer columns."""
    got = array_schedule(SCHEDULES["interleaved-1f1b"], 64, 512, 2)
    rows = got.step_rows
    assert rows.num_ranks == 64 and len(rows.kind) > 390_000
    assert rows.kind.dtype == np.int8 and "programs" not in got.__dict__
