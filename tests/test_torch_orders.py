"""torch.distributed.pipelining's schedule orders converted into the IR: every class
validates (complete, deadlock-free, NCCL posting rule) over a few (S, M), lands on
the placement torch uses, and matches our generators where the schedules coincide."""

from __future__ import annotations

import pytest

from merak_exec.torch_orders import (
    TORCH_SCHEDULES,
    from_torch_order,
    torch_pipeline_order,
    torch_schedule,
)
from merak_sim.schedule import (
    Kind,
    ScheduleError,
    generate,
    iter_actions,
    lower,
    replay,
    validate,
)
from merak_sim.schedule.posting import check_postings

SIZES = [(3, 6), (4, 4), (4, 8), (8, 16)]
LOOP = [c for c, i in TORCH_SCHEDULES.items() if i.placement == "loop"]
V = [c for c, i in TORCH_SCHEDULES.items() if i.placement == "v"]


def _compute(sched, rank):
    return [(a.kind, a.chunk, a.microbatch) for a in iter_actions(sched.programs[rank])
            if a.kind.is_compute and a.kind.per_microbatch]


@pytest.mark.parametrize("cls", LOOP)
@pytest.mark.parametrize("S,M", SIZES)
def test_loop_placed_torch_schedules_validate(cls, S, M):
    sched = torch_schedule(cls, S, M)
    info = TORCH_SCHEDULES[cls]
    assert sched.virtual_stages == info.local_stages and sched.lowered
    check = validate(sched)  # completeness, order, deadlock, NCCL posting rule
    assert check_postings(sched) > 0
    # every rank holds what torch's own stage -> rank map puts there
    _, mapping = torch_pipeline_order(cls, S, M)
    for g, r in mapping.items():
        assert sched.rank_of(g) == (r, g // S)
    assert max(check.peak_in_flight) <= M * info.local_stages


@pytest.mark.parametrize("cls", V)
@pytest.mark.parametrize("S,M", [(2, 4), (3, 6), (4, 8), (8, 16)])
def test_v_placed_torch_schedules_validate(cls, S, M):
    """ZBV and DualPipeV: complete, each local hand-off at the V's turn in program
    order, deadlock-free and NCCL-safe, on the ranks torch's V map names."""
    order, mapping = torch_pipeline_order(cls, S, M)
    compute_only = from_torch_order(order, S, M, local_stages=2, placement="v",
                                    stage_to_rank=mapping)
    assert compute_only.placement == "v"
    sched = torch_schedule(cls, S, M)
    assert sched.programs == lower(compute_only).programs
    validate(sched)
    assert check_postings(sched) > 0
    for g, r in mapping.items():
        assert sched.rank_of(g)[0] == r
    kinds = {a.kind for p in sched.programs for a in iter_actions(p)}
    assert {Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT} <= kinds
    assert (Kind.BACKWARD in kinds) == (cls == "ScheduleDualPipeV")  # its overlapped pairs
    unit = replay(sched, f=1, b=2, w=1).makespan
    assert unit < replay(generate("1f1b", S, M), f=1, b=2, w=1).makespan


@pytest.mark.parametrize("cls,ours,v", [("Schedule1F1B", "1f1b", 1), ("ScheduleGPipe", "gpipe", 1),
                                         ("ScheduleInterleaved1F1B", "interleaved-1f1b", 2),
                                         ("ScheduleDualPipeV", "dualpipev", 2),
                                         ("ScheduleInterleavedZeroBubble", "zb-interleaved", 2)])
@pytest.mark.parametrize("S,M", [(4, 8), (8, 16)])
def test_torch_orders_equal_ours_where_the_schedules_coincide(cls, ours, v, S, M):
    assert torch_schedule(cls, S, M).programs == generate(ours, S, M, v).programs


def test_interleaved_with_one_round_warms_up_by_the_usual_formula():
    """With M == S our interleaved 1F1B warms up as for M > S (Megatron runs every
    forward first): torch's order action for action, the same makespan, and the last
    ranks hold fewer chunk micro-batches than with every forward first."""
    t, o = torch_schedule("ScheduleInterleaved1F1B", 4, 4), generate("interleaved-1f1b", 4, 4, 2)
    assert t.programs == o.programs
    assert validate(o).peak_in_flight == (8, 8, 7, 5)
    assert replay(o, f=1, b=2).makespan == 16.5


def test_zero_bubble_splits_every_backward_and_beats_1f1b_at_unit_costs():
    sched = torch_schedule("ScheduleInterleavedZeroBubble", 4, 8)
    kinds = {a.kind for p in sched.programs for a in iter_actions(p)}
    assert Kind.BACKWARD not in kinds and {Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT} <= kinds
    zb = replay(sched, f=1, b=2, w=1).makespan
    assert zb == 25.5 and zb < replay(generate("1f1b", 4, 8), f=1, b=2, w=1).makespan


@pytest.mark.parametrize("S,M", [(2, 4), (3, 6), (4, 4), (4, 8), (4, 13), (8, 16), (8, 24)])
def test_zb_v_no_slower_than_torchs_zbv_when_costs_differ(S, M):
    """I slower than W, a dearer backward, a transfer time, and (from M = 2S on) W
    slower than I: our ZB-V order never trails torch's ZBV order nor holds more
    micro-batches. (With M < 2S and W slower than I the Ws the deep ranks postpone
    lengthen the tail; that case is left out.)"""
    t, o = torch_schedule("ScheduleZBVZeroBubble", S, M), generate("zb-v", S, M, 2)
    costs = [(1, 2, 1, 0), (1, 2, 0.8, 0), (1, 3, 1, 0), (1, 2, 0.6, 0.2)]
    if M >= 2 * S:
        costs += [(1, 2, 1.2, 0), (1, 2, 1.4, 0.1)]
    for f, b, w, comm in costs:
        assert replay(o, f=f, b=b, w=w, comm=comm).makespan \
            <= replay(t, f=f, b=b, w=w, comm=comm).makespan + 1e-9
    assert max(validate(o).peak_in_flight) <= max(validate(t).peak_in_flight)


def test_single_stage_orders_are_numbered_as_torchs_counters_run_them():
    """torch 2.13's Schedule1F1B.pipeline_order labels the last rank's forwards 1..M;
    read verbatim that order is incomplete, numbered by occurrence it is our 1F1B."""
    order, _ = torch_pipeline_order("Schedule1F1B", 4, 8)
    labels = [a.microbatch_index for a in order[3] if a is not None
              and a.computation_type.value == "F"]
    assert labels == list(range(1, 9))
    verbatim = from_torch_order(order, 4, 8, local_stages=1)
    with pytest.raises(ScheduleError, match="backward without a forward"):
        validate(verbatim)
    fixed = from_torch_order(order, 4, 8, local_stages=1, by_counter=True)
    assert [_compute(fixed, r) for r in range(4)] == \
        [_compute(generate("1f1b", 4, 8), r) for r in range(4)]


def test_pp2_zero_bubble_interleaves_the_two_channels_between_a_pair():
    """At pp=2 rank 0 sends rank 1 activations and gradients; torch interleaves the
    two, which validates because send order is matched per channel."""
    validate(torch_schedule("ScheduleInterleavedZeroBubble", 2, 4))


def test_bad_inputs_are_one_line_schedule_errors():
    with pytest.raises(ScheduleError, match="unknown torch schedule"):
        torch_schedule("ScheduleNope", 4, 8)
    with pytest.raises(ScheduleError, match="torch Schedule1F1B refuses"):
        torch_schedule("Schedule1F1B", 4, 2)
    order, mapping = torch_pipeline_order("ScheduleInterleaved1F1B", 4, 8)
    with pytest.raises(ScheduleError, match="placement 'v' puts it"):
        from_torch_order(order, 4, 8, local_stages=2, placement="v", stage_to_rank=mapping)


def test_benchmark_rows_pair_torch_with_ours(load_benchmark):
    bench = load_benchmark("bench_torch_schedules")
    rows = bench.rows(((4, 4),))
    by = {(r["cls"], r["schedule"]): r for r in rows}
    same = by[("Schedule1F1B", "1f1b")]
    assert all(same[f"{k} ratio"] == pytest.approx(1.0) for k in ("unit", "ms", "act", "GiB"))
    assert "at least as many microbatches" in by[("ScheduleDualPipeV", "torch")]["note"]
    assert by[("ScheduleInterleavedZeroBubble", "torch")]["unit"] == 13.5
    # No slower and no larger than torch's for the same (S, M), M = S included.
    for key in (("ScheduleInterleavedZeroBubble", "zb-interleaved"),
                ("ScheduleInterleaved1F1B", "interleaved-1f1b")):
        assert all(by[key][f"{k} ratio"] <= 1 + 1e-12 for k in ("unit", "ms", "act", "GiB"))
    assert "| S | M |" in bench.table(rows)


def test_benchmark_prices_a_schedule_the_configuration_builds_alike(load_benchmark):
    """The cost-aware path (the configuration builds the schedule from its cost table)
    prices a fixed schedule exactly as the converted-order path does."""
    bench = load_benchmark("bench_torch_schedules")
    sched = generate("1f1b", 4, 4)
    assert bench.measure(sched, "1f1b", from_costs=True) == bench.measure(sched, "1f1b")
