"""The checks the fast paths of the schedule IR, the lowering, the liveness walk and
the program structure keep: every schedule's placement is checked however often its
shape was seen, actions and fused groups validate as before, the tuple walk is the
liveness walk, and the structure's integer keys never merge two transfers."""

import dataclasses
from dataclasses import FrozenInstanceError, replace

import pytest

from merak_sim.schedule import SCHEDULES, ScheduleError, generate
from merak_sim.schedule.ir import Action, Fused, Kind, Schedule
from merak_sim.schedule.liveness import liveness, transitions
from merak_sim.schedule.lowering import lower
from merak_sim.sim.api import forget_schedules, shape_schedule
from merak_sim.sim.structure import forget_structures, program_structure


def _with_step(sched: Schedule, rank: int, i: int, step) -> tuple:
    prog = list(sched.programs[rank])
    prog[i] = step
    programs = list(sched.programs)
    programs[rank] = tuple(prog)
    return tuple(programs)


@pytest.mark.parametrize("lowered", [False, True])
def test_every_schedule_of_a_known_shape_is_still_placement_checked(lowered):
    """A shape built, lowered and kept (shape_schedule) gives no pass to another
    schedule of that shape: a misplaced action, one chunk too many, or a misplaced
    part of a fused group is refused each time."""
    forget_schedules()
    good = shape_schedule("1f1b", 4, 8)
    shape_schedule("1f1b", 4, 8)  # seen twice
    base = good if lowered else SCHEDULES["1f1b"].build(4, 8)
    f0 = base.programs[1][0]
    assert f0.kind in (Kind.FORWARD, Kind.RECV_ACT)
    for bad_step, msg in ((Action(f0.kind, 2, f0.microbatch), "placed on rank 1"),
                          (Action(f0.kind, 1, f0.microbatch, 1), "uses chunk 1")):
        with pytest.raises(ScheduleError, match=msg):
            replace(base, programs=_with_step(base, 1, 0, bad_step))
    if lowered:
        i, fused = next((i, s) for i, s in enumerate(good.programs[1]) if type(s) is Fused)
        a, b = fused.parts
        with pytest.raises(ScheduleError, match="placed on rank 1"):
            replace(good, programs=_with_step(good, 1, i, Fused((a, replace(b, stage=3)))))
    forget_schedules()


def test_lowering_keeps_the_check_of_what_it_is_given():
    """lower() of a schedule built from unchecked parts still refuses them (the check
    runs in the Schedule itself, whatever path built it)."""
    sched = SCHEDULES["1f1b"].build(2, 2)
    bad = sched.programs[0] + (Action(Kind.FORWARD, 1, 0),)
    with pytest.raises(ScheduleError, match="placed on rank 0"):
        lower(replace(sched, programs=(bad, sched.programs[1])))


def test_actions_and_fused_groups_validate_and_stay_frozen_values():
    """The direct slot-setting constructors refuse what the dataclass checks refused
    and give values equal, hashed and ordered by their fields."""
    for args, msg in (((Kind.FORWARD, -1, 0), "negative stage"),
                      ((Kind.FORWARD, 0, 0, -2), "negative stage 0 or chunk -2"),
                      ((Kind.BACKWARD, 0), "BACKWARD needs a micro-batch"),
                      ((Kind.ALL_REDUCE, 0, 3), "AR takes no micro-batch")):
        with pytest.raises(ScheduleError, match=msg):
            Action(*args)
    a = Action(Kind.SEND_ACT, 1, 2, 1)
    assert a == Action(kind=Kind.SEND_ACT, stage=1, microbatch=2, chunk=1)
    assert hash(a) == hash(Action(Kind.SEND_ACT, 1, 2, 1))
    assert dataclasses.astuple(a) == (Kind.SEND_ACT, 1, 2, 1)
    assert str(a) == "1sA2" and Action.parse("1sA2", 1) == a
    assert sorted([Action(Kind.FORWARD, 0, 3), Action(Kind.FORWARD, 0, 1)])[0].microbatch == 1
    assert replace(a, microbatch=5) == Action(Kind.SEND_ACT, 1, 5, 1)
    with pytest.raises(FrozenInstanceError):
        a.stage = 0
    with pytest.raises(ScheduleError, match="at least two"):
        Fused((a,))
    with pytest.raises(ScheduleError, match="only sends and receives"):
        Fused((a, Action(Kind.FORWARD, 1, 2)))
    f = Fused((a, Action(Kind.RECV_GRAD, 1, 0)))
    assert f == Fused((a, Action(Kind.RECV_GRAD, 1, 0))) and str(f) == "1sA2/rG0"
    with pytest.raises(FrozenInstanceError):
        f.parts = ()


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_transitions_are_the_liveness_walk(name):
    """transitions() (plain tuples) is step for step what liveness() reports."""
    spec = SCHEDULES[name]
    v = 2 if spec.interleaved else 1
    sched = generate(name, 4, 8, v)
    for rank in range(4):
        steps = liveness(sched, rank).steps
        counted = transitions(sched, rank, counted=True)
        assert [(s.action, s.enters, s.leaves, s.counts) for s in steps] == counted
        assert [t[:3] for t in transitions(sched, rank)] == [t[:3] for t in counted]
        assert all(t[3] is None for t in transitions(sched, rank))


@pytest.mark.parametrize(("name", "v"), [("1f1b", 1), ("interleaved-1f1b", 2),
                                         ("zb-v", 2)])
def test_structure_keeps_transfers_apart_for_any_micro_batch_numbers(name, v):
    """The structure numbers transfers, items and memory rules by integers: with the
    micro-batches renumbered sparsely (large and far apart) it finds the same
    transfers, with the renumbered tags, and the same rules."""
    sched = generate(name, 4, 8, v)

    def renumber(a: Action) -> Action:
        return replace(a, microbatch=1000 * a.microbatch + 7) if a.kind.per_microbatch else a

    programs = tuple(tuple(Fused(tuple(map(renumber, s.parts))) if type(s) is Fused
                           else renumber(s) for s in p) for p in sched.programs)
    sparse = replace(sched, num_microbatches=8008, programs=programs)
    forget_structures()
    ps, qs = program_structure(sched), program_structure(sparse)
    assert [(tensor, src, 1000 * m + 7) for (tensor, src, m), *_ in ps.transfer_ends] == \
        [key for key, *_ in qs.transfer_ends]
    assert ps.ops == qs.ops and ps.memory_rules == qs.memory_rules
    assert ps.rules == qs.rules and ps.chunks == qs.chunks
    forget_structures()


def test_make_action_and_the_twin_built_values_behave_as_actions():
    """make_action, Action() and Fused() (built on a twin of their slots) give frozen
    values of their own class that check, compare, hash, pickle, copy and replace
    as dataclasses do, with no twin left behind."""
    import copy
    import pickle

    from merak_sim.schedule.ir import make_action

    a = make_action(Kind.SEND_ACT, 1, 2, 1)
    assert type(a) is Action and a == Action(Kind.SEND_ACT, 1, 2, 1)
    assert hash(a) == hash(Action(Kind.SEND_ACT, 1, 2, 1)) and str(a) == "1sA2"
    with pytest.raises(ScheduleError, match="negative stage"):
        make_action(Kind.FORWARD, -1, 0)
    with pytest.raises(ScheduleError, match="AR takes no micro-batch"):
        make_action(Kind.ALL_REDUCE, 0, 3)
    f = Fused((a, Action(Kind.RECV_GRAD, 1, 0)))
    for x in (a, f):
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            y = pickle.loads(pickle.dumps(x, proto))
            assert y == x and type(y) is type(x)
        assert copy.copy(x) == x and copy.deepcopy(x) == x
        with pytest.raises(FrozenInstanceError):
            setattr(x, "parts" if x is f else "stage", 0)
    assert replace(a, chunk=0) == Action(Kind.SEND_ACT, 1, 2, 0)
    assert type(replace(f, parts=f.parts[::-1])) is Fused
    sched = generate("1f1b", 3, 5)
    assert {type(s) for p in sched.programs for s in p} == {Action, Fused}


def test_make_fused_is_fused_and_checks_as_it_does():
    """make_fused (the lowering's constructor) gives the frozen Fused value that
    Fused() gives and refuses what Fused() refuses."""
    from merak_sim.schedule.ir import make_fused

    s, r = Action(Kind.SEND_ACT, 1, 2), Action(Kind.RECV_GRAD, 1, 0)
    f = make_fused((s, r))
    assert type(f) is Fused and f == Fused((s, r)) and hash(f) == hash(Fused((s, r)))
    with pytest.raises(FrozenInstanceError):
        setattr(f, "parts", ())
    for make in (make_fused, Fused):
        with pytest.raises(ScheduleError, match="at least two"):
            make((s,))
        with pytest.raises(ScheduleError, match="only sends and receives"):
            make((s, Action(Kind.FORWARD, 1, 0)))


def test_kind_codes_index_the_members():
    """Kind.code is each member's position, so per-kind lists indexed by it hold one
    slot per member."""
    assert [k.code for k in Kind] == list(range(len(Kind)))
