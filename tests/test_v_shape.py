"""ZB-V and DualPipeV: golden orders, unit-cost makespans, memory, validation grid."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merak_sim.schedule import SCHEDULES, ScheduleError, format_program, generate, validate
from merak_sim.schedule.ir import Kind, iter_actions
from merak_sim.schedule.posting import check_postings
from merak_sim.schedule.replay import replay

# Compute orders (unlowered, AR/OPT appended) of rank 0..3 for S=4, M=8.
GOLDEN = {
    "zb-v": (
        "F0 F1 F2 F3 F4 F5 F6 1F0 1I0 1W0 1F1 1I1 1W1 1F2 1I2 1W2 1F3 1I3 1W3 F7 I0 W0 1F4 "
        "1I4 1W4 I1 W1 1F5 1I5 1W5 I2 W2 1F6 1I6 1W6 I3 W3 1F7 1I7 1W7 I4 W4 I5 W5 I6 W6 I7 "
        "W7 AR OPT",
        "F0 F1 F2 F3 F4 1F0 F5 1F1 1I0 1W0 1F2 1I1 1W1 1F3 1I2 1W2 F6 I0 W0 1F4 1I3 1W3 F7 "
        "I1 W1 1F5 1I4 1W4 I2 W2 1F6 1I5 1W5 I3 W3 1F7 1I6 1W6 I4 1I7 I5 W4 I6 1W7 I7 W5 W6 "
        "W7 AR OPT",
        "F0 F1 F2 1F0 F3 1F1 F4 1F2 1I0 1W0 1F3 1I1 1W1 F5 I0 W0 1F4 1I2 1W2 F6 I1 W1 1F5 "
        "1I3 1W3 F7 I2 W2 1F6 1I4 1W4 I3 W3 1F7 1I5 1W5 I4 1I6 I5 1I7 I6 W4 I7 1W6 W5 1W7 "
        "W6 W7 AR OPT",
        "F0 1F0 F1 1F1 F2 1F2 F3 1F3 1I0 1W0 F4 I0 W0 1F4 1I1 1W1 F5 I1 W1 1F5 1I2 1W2 F6 "
        "I2 W2 1F6 1I3 1W3 F7 I3 W3 1F7 1I4 1W4 I4 1I5 I5 1I6 I6 1I7 I7 W4 1W5 W5 1W6 W6 "
        "1W7 W7 AR OPT",
    ),
    "dualpipev": (
        "F0 F1 F2 F3 F4 F5 F6 1F0 1I0 1W0 1F1 1I1 1W1 1F2 1I2 1W2 1F3 F7 1B3 1F4 B0 1B4 1F5 "
        "B1 1B5 1F6 B2 1B6 1F7 B3 1B7 I4 W4 I5 W5 I6 W6 I7 W7 AR OPT",
        "F0 F1 F2 F3 F4 1F0 F5 1F1 1I0 1W0 1F2 1I1 1W1 1F3 F6 1B2 1F4 B0 F7 1B3 1F5 B1 1B4 "
        "1F6 B2 1B5 1F7 B3 1B6 B4 1I7 I5 1W7 I6 W5 I7 W6 W7 AR OPT",
        "F0 F1 F2 1F0 F3 1F1 F4 1F2 1I0 1W0 1F3 F5 1B1 1F4 B0 F6 1B2 1F5 B1 F7 1B3 1F6 B2 "
        "1B4 1F7 B3 1B5 B4 1B6 I5 1I7 I6 W5 I7 1W7 W6 W7 AR OPT",
        "F0 1F0 F1 1F1 F2 1F2 F3 1F3 F4 1B0 1F4 B0 F5 1B1 1F5 B1 F6 1B2 1F6 B2 F7 1B3 1F7 B3 "
        "1B4 B4 1B5 B5 1I6 I6 1I7 I7 1W6 W6 1W7 W7 AR OPT",
    ),
}
V_SCHEDULES = tuple(GOLDEN)


@pytest.mark.parametrize("name", V_SCHEDULES)
@pytest.mark.parametrize("rank", range(4))
def test_golden_orders_s4(name, rank):
    built = SCHEDULES[name].build(4, 8, 2)
    assert built.placement == "v"
    assert format_program(built.programs[rank]) == GOLDEN[name][rank]


def test_turn_is_local_in_the_lowered_program():
    last = format_program(generate("zb-v", 4, 8, 2).programs[3], brackets=True)
    # F0 hands 1F0 its input in memory: rank 3 receives from and sends to rank 2 only.
    assert last.startswith("rA0 F0 1F0 [1sA0/rA1] F1 1F1 [1sA1/rA2]")
    assert " sA0" not in last and " 1rA0" not in last


def _unit(name, S, M):
    return replay(generate(name, S, M, 2), f=1, b=2, w=1)  # F = I = W per chunk


@pytest.mark.parametrize(("S", "M", "zb_h1_paper", "one_f_one_b"), [(4, 8, 27, 33), (8, 16, 55, 69)])
def test_zb_v_unit_makespan_is_the_v_bound(S, M, zb_h1_paper, one_f_one_b):
    got = _unit("zb-v", S, M).makespan
    assert got == 3 * M + (S - 1) / 2  # 25.5 and 51.5 stage units
    assert got < zb_h1_paper < one_f_one_b


@pytest.mark.parametrize("w", [0.8, 1.2, 0.6])
@pytest.mark.parametrize(("S", "M"), [(2, 4), (4, 4), (4, 8), (4, 16), (8, 16), (8, 19)])
def test_v_schedules_no_slower_than_1f1b_when_i_and_w_differ(S, M, w):
    """B = 2F split unequally (I = 1.2, W = 0.8, the reverse, and W = 0.6): the V
    orders are fixed by (S, M), not tuned to F = I = W, so they keep 1F1B's lead."""
    base = replay(generate("1f1b", S, M), f=1, b=2, w=w).makespan
    for name in V_SCHEDULES:
        if not SCHEDULES[name].violation(S, M, 2):
            assert replay(generate(name, S, M, 2), f=1, b=2, w=w).makespan <= base, name


def test_zb_v_with_slow_input_gradient_beats_1f1b_by_a_margin():
    # S=4, M=16, W = 0.6 (I twice W): 1F1B takes 57.0, DualPipeV 50.8.
    got = replay(generate("zb-v", 4, 16, 2), f=1, b=2, w=0.6).makespan
    assert got == pytest.approx(50.4)
    assert got < replay(generate("1f1b", 4, 16), f=1, b=2, w=0.6).makespan == pytest.approx(57.0)


@pytest.mark.parametrize(("S", "M", "one_f_one_b"), [(4, 8, 33), (8, 16, 69)])
def test_dualpipev_unit_makespan_below_1f1b(S, M, one_f_one_b):
    assert replay(generate("1f1b", S, M), f=1, b=2, w=1).makespan == one_f_one_b
    got = _unit("dualpipev", S, M).makespan
    assert got == 3 * M + (S - 1) / 2 < one_f_one_b


@pytest.mark.parametrize("S", [2, 4, 8])
def test_memory_in_stage_micro_batches(S):
    """A chunk's micro-batch counts 1/2 of a stage's: ZB-V holds at most 1F1B's peak
    (S stage micro-batches) on every rank, DualPipeV at most that plus one."""
    M = 2 * S
    one_f_one_b = max(validate(generate("1f1b", S, M)).peak_in_flight)
    assert one_f_one_b == S
    zbv = validate(generate("zb-v", S, M, 2)).peak_in_flight
    assert all(p / 2 <= one_f_one_b for p in zbv) and max(zbv) == 2 * S
    dpv = validate(generate("dualpipev", S, M, 2)).peak_in_flight
    assert all(p / 2 <= one_f_one_b + 1 for p in dpv) and max(dpv) == 2 * S + 1


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(V_SCHEDULES), pp=st.integers(2, 16), extra=st.integers(0, 24))
def test_every_v_schedule_validates_and_posts_safely(name, pp, extra):
    M = SCHEDULES[name].min_microbatches(pp) + extra
    sched = generate(name, pp, M, 2)
    validate(sched)  # complete, deadlock-free, per-channel order, NCCL posting rule
    check_postings(sched)
    seen = sorted((sched.model_stage(a), a.microbatch) for p in sched.programs
                  for a in iter_actions(p) if a.kind is Kind.FORWARD)
    assert seen == [(g, m) for g in range(2 * pp) for m in range(M)]


@pytest.mark.parametrize(("args", "needle"), [
    (("zb-v", 4, 8, 1), "needs virtual stages 2, got 1"),
    (("zb-v", 4, 8, 3), "needs virtual stages 2, got 3"),
    (("dualpipev", 4, 7, 2), "needs microbatches >= 2 * pp = 8, got 7"),
    (("zb-v", 1, 4, 2), "pp >= 2"),
])
def test_requirements_are_one_sentence(args, needle):
    with pytest.raises(ScheduleError, match=needle.replace("*", r"\*")):
        generate(*args)


def test_costs_follow_the_v_placement():
    """The turn sends nothing, chunk 1 sends back up the ranks, and a tied embedding adds
    no all-reduce between pipeline ranks (rank 0 holds both ends)."""
    from merak_sim.config import ParallelConfig
    from merak_sim.costs.analytic import AnalyticCostModel
    from merak_sim.hardware import get_cluster
    from merak_sim.model import get_model

    model, cluster = get_model("gpt-2.5b"), get_cluster("paper-3090", nodes=2)
    assert model.tied_embeddings

    def table(schedule):
        cfg = ParallelConfig(dp=2, pp=4, virtual_stages=2, global_batch_size=16,
                             schedule=schedule)
        return AnalyticCostModel().cost_table(model, cluster, cfg).stages

    v, loop = table("zb-v"), table("interleaved-1f1b")
    assert v[3].send_activation_s == 0.0 < loop[3].send_activation_s  # local turn
    assert v[5].send_activation_s == v[1].send_activation_s  # rank 2 -> 1 as 1 -> 2
    assert v[0].grad_allreduce_s < loop[0].grad_allreduce_s  # no tied all-reduce
    assert v[0].grad_allreduce_s == pytest.approx(v[1].grad_allreduce_s, rel=0.2)


@pytest.mark.parametrize("S", [2, 4])
def test_memory_model_counts_a_chunk_as_half_a_stage(S):
    """Cutting the layers into 2S model stages halves each stage's activations, so the
    memory model's peak under zb-v equals 1F1B's over S stages (dualpipev: one half
    stage more)."""
    from merak_sim.config import ParallelConfig
    from merak_sim.memory import peak_memory
    from merak_sim.sim import uniform_table

    M, act = 2 * S, 2e9

    def peaks(schedule, v):
        cfg = ParallelConfig(pp=S, virtual_stages=v, global_batch_size=M, schedule=schedule)
        table = uniform_table(S * v, activation_bytes=act / v, state_bytes=0.0)
        return [m.total_bytes for m in peak_memory(table, cfg)]

    base, zbv, dpv = peaks("1f1b", 1), peaks("zb-v", 2), peaks("dualpipev", 2)
    assert max(base) == S * act
    assert zbv == [S * act] * S
    assert dpv == [(S + 0.5) * act] * S


SIM_V = ["simulate", "--model", "gpt-2.5b", "--cluster", "paper-3090", "--nodes", "2", "--dp",
         "2", "--tp", "1", "--pp", "4", "--micro-batch-size", "1", "--global-batch-size", "32",
         "--recompute", "none"]


@pytest.mark.parametrize("name", V_SCHEDULES)
def test_cli_simulates_v_schedules_and_refuses_bad_requirements(name, capsys):
    from merak_sim.cli import main

    assert main([*SIM_V, "--schedule", name, "--virtual-stages", "2"]) == 0
    assert "iteration time" in capsys.readouterr().out
    assert main([*SIM_V, "--schedule", name]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "virtual stages 2, got 1" in err
    assert "set virtual stages to 2" in err
