"""``validate(schedule)``: prove a schedule correct under the IR's semantics.

Checks, in order (the first failure raises :class:`ScheduleError`; a deadlock raises
:class:`~merak_sim.schedule.execute.DeadlockError` whose message draws the rank x step
grid with the point where each rank stopped):

1. Completeness: every (model stage, micro-batch) gets exactly one forward (F or F*)
   and one complete backward (B, or I then W); F* is followed by exactly one R before
   its backward; an R only follows an F*; nothing runs before its forward. An
   evaluation schedule (no backward on any rank, :mod:`~merak_sim.schedule.evaluation`)
   is complete when every (model stage, micro-batch) had its one forward.
   A local hand-off (two consecutive model stages on one rank, :mod:`~merak_sim.schedule.
   lowering`) is ordered by the program: the consumer's forward after the producer's,
   the producer's backward (B or I) after the consumer's.
2. Sends carry data that exists: ``sA`` comes after that micro-batch's forward on the
   rank, ``sG`` after its B or I.
3. Point-to-point order: on every channel (activations or gradients from one rank to
   another, :func:`~merak_sim.schedule.posting.channel`) the receiver posts its
   receives in the order the sender posts the sends (NCCL matches by order on the
   channel's communicator).
4. Deadlock-freedom and matching: symbolic execution with unit durations finishes,
   every compute action's receive was posted before it, every send has a receive.
5. AR and OPT, if present, come once each, after every backward, AR before OPT.
6. NCCL posting: the runtime's postings (:func:`~merak_sim.schedule.posting.runtime_postings`)
   meet on one communicator at both ends and finish without buffering NCCL does not
   promise (:func:`~merak_sim.schedule.posting.check_postings`; a failure raises
   :class:`~merak_sim.schedule.posting.PostingError` with the rank x step grid).

It returns a :class:`ScheduleCheck` with the peak number of micro-batches whose
activations are held on each rank (forward done, backward not yet complete), counted
by the :func:`~merak_sim.schedule.liveness.liveness` walk with unit sizes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .evaluation import is_forward_only
from .execute import execute
from .ir import Kind, Schedule, ScheduleError, iter_actions
from .liveness import FULL, liveness
from .lowering import comm_key
from .posting import channel, check_postings

__all__ = ["ScheduleCheck", "validate"]


@dataclass(frozen=True)
class ScheduleCheck:
    """What validate() proved and measured.

    Attributes:
        peak_in_flight: per rank, the most micro-batch chunks alive at once
            (activations held between a forward and the end of its backward).
        peak_full_in_flight: per rank, the most alive chunks that hold their full
            activation set (F, or F* after its R); F* chunks awaiting R hold only input.
        makespan_unit: makespan with unit durations and free communication.
    """

    peak_in_flight: tuple[int, ...]
    peak_full_in_flight: tuple[int, ...]
    makespan_unit: float


def _check_rank(sched: Schedule, rank: int, evaluation: bool = False) -> None:
    state: dict[tuple[int, int], str] = {}  # (chunk, mb) -> last phase
    n_ar = n_opt = 0
    for a in iter_actions(sched.programs[rank]):
        key = (a.chunk, a.microbatch)
        k = a.kind
        where = f"rank {rank}: {a}"
        if k is Kind.ALL_REDUCE:
            n_ar += 1
            continue
        if k is Kind.OPTIMIZER:
            n_opt += 1
            if n_ar == 0 and sched.num_microbatches:
                raise ScheduleError(f"{where}: optimizer step before the gradient all-reduce")
            continue
        if n_ar or n_opt:
            raise ScheduleError(f"{where}: action after the all-reduce/optimizer step")
        if a.microbatch >= sched.num_microbatches:
            raise ScheduleError(
                f"{where}: micro-batch {a.microbatch} >= microbatches {sched.num_microbatches}"
            )
        s = state.get(key)
        if k in (Kind.FORWARD, Kind.FORWARD_NOGRAD):
            if s is not None:
                raise ScheduleError(f"{where}: second forward of this micro-batch")
            state[key] = "F*" if k is Kind.FORWARD_NOGRAD else "F"
        elif k is Kind.RECOMPUTE:
            if s != "F*":
                raise ScheduleError(f"{where}: R without a pending F* (state {s})")
            state[key] = "R"
        elif k in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
            if s == "F*":
                raise ScheduleError(f"{where}: backward of an F* micro-batch before its R")
            if s not in ("F", "R"):
                raise ScheduleError(f"{where}: backward without a forward (state {s})")
            state[key] = "done" if k is Kind.BACKWARD else "I"
        elif k is Kind.BACKWARD_WEIGHT:
            if s != "I":
                raise ScheduleError(f"{where}: W without a preceding I (state {s})")
            state[key] = "done"
        elif k is Kind.SEND_ACT:
            if s is None:
                raise ScheduleError(f"{where}: sends an activation not yet computed")
        elif k is Kind.SEND_GRAD:
            if s not in ("I", "done"):
                raise ScheduleError(f"{where}: sends a gradient not yet computed")
    for c in range(sched.virtual_stages):
        for m in range(sched.num_microbatches):
            s = state.get((c, m))
            if s != "done" and not (evaluation and s in ("F", "F*")):
                what = "forward" if s is None else "complete backward"
                g = sched.stage_of(rank, c)
                raise ScheduleError(
                    f"rank {rank}: model stage {g} micro-batch {m} is missing its {what}"
                )
    if n_ar > 1 or n_opt > 1:
        raise ScheduleError(f"rank {rank}: AR or OPT appears more than once")


def _check_local(sched: Schedule, rank: int) -> None:
    """Program order carries every local hand-off on ``rank`` (module docstring, 1)."""
    pos: dict[tuple[str, int, int], int] = {}
    for i, a in enumerate(iter_actions(sched.programs[rank])):
        if a.kind in (Kind.FORWARD, Kind.FORWARD_NOGRAD):
            pos[("F", a.chunk, a.microbatch)] = i
        elif a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
            pos[("B", a.chunk, a.microbatch)] = i
    for g in range(sched.num_model_stages - 1):
        here, nxt = sched.rank_of(g), sched.rank_of(g + 1)
        if here[0] != rank or nxt[0] != rank:
            continue
        for m in range(sched.num_microbatches):
            for phase, first, then in (("F", here[1], nxt[1]), ("B", nxt[1], here[1])):
                a, b = pos.get((phase, first, m)), pos.get((phase, then, m))
                if a is not None and b is not None and b < a:
                    what = "forward" if phase == "F" else "backward"
                    raise ScheduleError(
                        f"rank {rank}: the {what} of chunk {then} micro-batch {m} runs before "
                        f"the chunk {first} {what} it takes its input from (local hand-off "
                        f"between model stages {g} and {g + 1})")


def _check_order(sched: Schedule) -> None:
    sends: dict = defaultdict(list)
    recvs: dict = defaultdict(list)
    for rank, prog in enumerate(sched.programs):
        for a in iter_actions(prog):
            if a.kind.is_send:
                sends[channel(sched, rank, a)].append(comm_key(sched, a))
            elif a.kind.is_recv:
                recvs[channel(sched, rank, a)].append(comm_key(sched, a))
    for pair in sends.keys() | recvs.keys():
        s, r = sends.get(pair, []), recvs.get(pair, [])
        for i, (ks, kr) in enumerate(zip(s, r, strict=False)):
            if ks != kr:
                raise ScheduleError(
                    f"ranks {pair[1]}->{pair[2]} ({'activations' if pair[0] == 'A' else 'gradients'}): send #{i} carries {ks} but the receiver's "
                    f"#{i} receive expects {kr} (point-to-point order must match)"
                )
        if len(s) != len(r):
            raise ScheduleError(
                f"ranks {pair[1]}->{pair[2]}: {len(s)} {pair[0]} sends but {len(r)} receives"
            )


def validate(sched: Schedule) -> ScheduleCheck:
    """Prove ``sched`` complete, well-ordered and deadlock-free (see module docstring)."""
    evaluation = is_forward_only(sched)
    for rank in range(sched.num_stages):
        _check_rank(sched, rank, evaluation)
        _check_local(sched, rank)
    if sched.lowered:
        _check_order(sched)
        ex = execute(sched, lambda a: 1.0 if a.kind.per_microbatch else 0.0)
        makespan = ex.makespan
        check_postings(sched)
    else:
        makespan = float("nan")
    lives = [liveness(sched, rank) for rank in range(sched.num_stages)]
    return ScheduleCheck(tuple(lv.peak_in_flight for lv in lives),
                         tuple(int(lv.peak(FULL)) for lv in lives), makespan)
