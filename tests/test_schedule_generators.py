"""Every generator validates over a grid; golden sequences; requirement errors."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merak_sim.schedule import SCHEDULES, ScheduleError, generate, validate
from merak_sim.schedule.ir import Kind, iter_actions

REFERENCE_1F1B_S0 = (
    "F0 sA0 F1 sA1 F2 sA2 F3 [sA3/rG0] B0 F4 [sA4/rG1] B1 F5 [sA5/rG2] B2 F6 [sA6/rG3] B3 "
    "F7 [sA7/rG4] B4 rG5 B5 rG6 B6 rG7 B7 AR OPT"
)
# Merak (Lai et al., TPDS 2023): the shifted critical path schedule, S=4, M=8.
SHIFTED = {
    0: "F0 sA0 F1 sA1 F2 sA2 F3 [sA3/rG0] B0 F4 [sA4/rG1] B1 F*5 [sA5/rG2] B2 F*6 [sA6/rG3] B3 "
    "F*7 [sA7/rG4] B4 R5 rG5 B5 R6 rG6 B6 R7 rG7 B7 AR OPT",
    1: "rA0 F*0 sA0 rA1 F1 sA1 rA2 F2 sA2 R0 rG0 B0 [sG0/rA3] F3 [sA3/rG1] B1 [sG1/rA4] F4 "
    "[sA4/rG2] B2 [sG2/rA5] F5 [sA5/rG3] B3 [sG3/rA6] F*6 [sA6/rG4] B4 [sG4/rA7] F*7 "
    "[sA7/rG5] B5 sG5 R6 rG6 B6 sG6 R7 rG7 B7 sG7 AR OPT",
    2: "rA0 F*0 sA0 rA1 F*1 rA2 F2 R0 rG0 sA1 B0 sG0 R1 rG1 sA2 B1 [sG1/rA3] F3 [sA3/rG2] B2 "
    "[sG2/rA4] F4 [sA4/rG3] B3 [sG3/rA5] F5 [sA5/rG4] B4 [sG4/rA6] F6 [sA6/rG5] B5 "
    "[sG5/rA7] F7 [sA7/rG6] B6 sG6 rG7 B7 sG7 AR OPT",
    3: "rA0 F0 B0 sG0 rA1 F1 B1 sG1 rA2 F2 B2 [sG2/rA3] F3 B3 [sG3/rA4] F4 B4 [sG4/rA5] F5 B5 "
    "[sG5/rA6] F6 B6 [sG6/rA7] F7 B7 sG7 AR OPT",
}


def _tokens(sched, rank):
    from merak_sim.schedule import format_program

    return format_program(sched.programs[rank], brackets=True)


def test_golden_1f1b_first_stage():
    assert _tokens(generate("1f1b", 4, 8), 0) == REFERENCE_1F1B_S0


@pytest.mark.parametrize("rank", range(4))
def test_golden_shifted_critical_path(rank):
    assert _tokens(generate("shifted-critical-path", 4, 8), rank) == SHIFTED[rank]


def _valid_args(name, pp, m, v):
    spec = SCHEDULES[name]
    if spec.placement == "v":  # two chunks in a V, on at least two ranks
        pp, v = max(pp, 2), 2
        return pp, max(m, spec.min_microbatches(pp)), v
    if spec.min_virtual_stages > 1:  # chunks on at least two ranks
        pp, v = max(pp, 2), max(v, spec.min_virtual_stages)
    m = max(m, spec.min_microbatches(pp))
    if spec.interleaved:
        if pp == 1:
            v = 1
        m = max(pp, (m // pp) * pp)
    else:
        v = 1
    return pp, m, v


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(list(SCHEDULES)),
    pp=st.integers(1, 16),
    m=st.integers(1, 64),
    v=st.integers(1, 4),
)
def test_every_generator_validates(name, pp, m, v):
    pp, m, v = _valid_args(name, pp, m, v)
    sched = generate(name, pp, m, v)
    report = validate(sched)
    assert len(report.peak_in_flight) == pp
    # Every (model stage, micro-batch) has exactly one forward.
    fwd = [
        (sched.model_stage(a), a.microbatch)
        for p in sched.programs
        for a in iter_actions(p)
        if a.kind in (Kind.FORWARD, Kind.FORWARD_NOGRAD)
    ]
    assert sorted(fwd) == sorted((g, mb) for g in range(pp * v) for mb in range(m))


@pytest.mark.parametrize("name", ["1f1b", "shifted-critical-path", "last-no-recompute"])
def test_1f1b_family_memory_bound(name):
    """1F1B-like schedules keep at most S - s micro-batches alive on stage s (Merak's
    S-2 holds 3 at its start, which is why it takes stage S-3's checkpoint ratio)."""
    S = 6
    rep = validate(generate(name, S, 12))
    for s, peak in enumerate(rep.peak_in_flight):
        assert peak <= max(S - s, 3 if name == "shifted-critical-path" and s == S - 2 else 0)


def test_gpipe_holds_everything():
    assert validate(generate("gpipe", 4, 8)).peak_in_flight == (8, 8, 8, 8)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("nope", 4, 8), "unknown schedule"),
        (("1f1b", 0, 8), "pp must be >= 1"),
        (("1f1b", 4, 0), "microbatches must be >= 1"),
        (("shifted-critical-path", 8, 6), "max(pp, 4)"),
        (("shifted-critical-path", 2, 3), "max(pp, 4)"),
        (("interleaved-1f1b", 4, 6, 2), "multiple of pp"),
        (("interleaved-1f1b", 1, 4, 2), "pp >= 2"),
        (("1f1b", 4, 8, 2), "no virtual stages"),
        (("interleaved-1f1b", 4, 8, 0), "virtual stages must be >= 1"),
    ],
)
def test_requirements_rejected(args, fragment):
    with pytest.raises(ScheduleError, match=None) as e:
        generate(*args)
    assert fragment in str(e.value)
