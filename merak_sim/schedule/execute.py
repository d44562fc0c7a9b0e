"""Timed symbolic execution of a lowered schedule under the IR's semantics.

This is the one interpreter of the communication semantics written in
:mod:`merak_sim.schedule.ir`: the validator runs it with unit durations to prove
deadlock-freedom, the unit-cost replay runs it with toy costs, and the simulator's
fast evaluator runs it with cost-model durations. With fixed durations and
contention-free transfers the start time of every action is a longest path in the
schedule's dependency graph, which this computes exactly, in one pass over the
actions (a rank runs until it blocks; posting the matching operation wakes it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .ir import Action, Fused, Schedule, ScheduleError, Step
from .lowering import comm_key, consumed_key

__all__ = ["Execution", "DeadlockError", "execute"]


class DeadlockError(ScheduleError):
    """The schedule cannot make progress; ``stuck`` maps rank -> blocked step index."""

    def __init__(self, message: str, stuck: dict[int, int]):
        super().__init__(message)
        self.stuck = stuck


@dataclass(frozen=True)
class Execution:
    """Times of one executed schedule.

    Attributes:
        makespan: end of the last compute action or transfer.
        compute: per rank, (action, start, end) for every compute action in order.
        transfers: comm key -> (start, end) of each point-to-point transfer.
        finish: per rank, end of its last compute action.
    """

    makespan: float
    compute: tuple[tuple[tuple[Action, float, float], ...], ...]
    transfers: dict[tuple[str, int, int], tuple[float, float]]
    finish: tuple[float, ...]

    def busy(self, rank: int) -> float:
        """Total compute time of ``rank``."""
        return sum(e - s for _, s, e in self.compute[rank])

    def idle(self, rank: int) -> float:
        """Time ``rank`` spends not computing within the makespan (the bubble)."""
        return self.makespan - self.busy(rank)


def _grid(sched: Schedule, pcs: list[int], width: int = 14) -> str:
    """Rank x step grid around the point where each rank stopped (marked >>X<<)."""
    lines = []
    for r, prog in enumerate(sched.programs):
        pc = pcs[r]
        lo = max(0, pc - width // 2)
        toks = []
        for i in range(lo, min(len(prog), lo + width)):
            t = str(prog[i])
            toks.append(f">>{t}<<" if i == pc else t)
        state = "done" if pc >= len(prog) else f"stuck at step {pc}"
        lead = "... " if lo else ""
        lines.append(f"  S{r} ({state}): {lead}{' '.join(toks)}")
    return "\n".join(lines)


def execute(
    sched: Schedule,
    duration: Callable[[Action], float],
    transfer: Callable[[Action], float] | None = None,
) -> Execution:
    """Execute ``sched`` with per-action ``duration`` and per-send ``transfer`` time.

    Raises :class:`DeadlockError` (with the rank x step grid) if no rank can move,
    and :class:`ScheduleError` for a compute action whose receive was never posted
    before it, or a send/receive left unmatched at the end.
    """
    if not sched.lowered:
        raise ScheduleError("execute() needs a lowered schedule; call lower() first")
    S = sched.num_stages
    progs = sched.programs
    pcs = [0] * S
    clock = [0.0] * S
    send_post: dict = {}
    recv_post: dict = {}
    group_of: dict = {}  # recv key -> the posted receive action
    transfers: dict = {}
    waiting: dict = {}  # ("send"|"recv", key) -> rank blocked until that side is posted
    compute: list[list] = [[] for _ in range(S)]
    xfer = transfer or (lambda a: 0.0)
    ready = deque(range(S))
    queued = [True] * S

    def post(rank: int, a: Action, t: float) -> None:
        key = comm_key(sched, a)
        side, other = ("send", "recv") if a.kind.is_send else ("recv", "send")
        table = send_post if side == "send" else recv_post
        if key in table:
            raise ScheduleError(f"{a} on rank {rank} is posted twice")
        table[key] = (t, a)
        w = waiting.pop((side, key), None)
        if w is not None and not queued[w]:
            ready.append(w)
            queued[w] = True

    def completion(parts: tuple[Action, ...]) -> tuple[float | None, tuple | None]:
        """Completion time of a posted group, or (None, what-to-wait-for)."""
        done = 0.0
        for p in parts:
            key = comm_key(sched, p)
            if key in transfers:
                done = max(done, transfers[key][1])
                continue
            s, r = send_post.get(key), recv_post.get(key)
            if s is None:
                return None, ("send", key)
            if r is None:
                return None, ("recv", key)
            start = max(s[0], r[0])
            sender = s[1]
            end = start + xfer(sender)
            transfers[key] = (start, end)
            done = max(done, end)
        return done, None

    while ready:
        r = ready.popleft()
        queued[r] = False
        prog = progs[r]
        pc, t = pcs[r], clock[r]
        while pc < len(prog):
            step: Step = prog[pc]
            if isinstance(step, Fused) or step.kind.is_comm:
                for p in step.parts:
                    post(r, p, t)
                    if p.kind.is_recv:
                        group_of[comm_key(sched, p)] = p
                pc += 1
                continue
            start = t
            key = consumed_key(sched, step)
            if key is not None:
                if key not in group_of:
                    raise ScheduleError(
                        f"{step} on rank {r} consumes {key[0]} of model stage {key[1]} "
                        f"micro-batch {key[2]} but no receive for it was posted before it"
                    )
                # A compute action waits only for the receive it consumes, even when
                # that receive was posted fused with a send (semantics rule 4).
                done, wait_for = completion((group_of[key],))
                if done is None:
                    waiting[wait_for] = r
                    break
                start = max(start, done)
            end = start + duration(step)
            compute[r].append((step, start, end))
            t = end
            pc += 1
        pcs[r], clock[r] = pc, t

    if any(pcs[r] < len(progs[r]) for r in range(S)):
        stuck = {r: pcs[r] for r in range(S) if pcs[r] < len(progs[r])}
        raise DeadlockError(
            f"schedule {sched.name!r} deadlocks: no rank can make progress\n"
            + _grid(sched, pcs),
            stuck,
        )
    for key in send_post.keys() | recv_post.keys():
        if key not in transfers:
            if key in send_post and key in recv_post:
                completion((send_post[key][1],))
                continue
            a = (send_post.get(key) or recv_post.get(key))[1]
            other = "receive" if a.kind.is_send else "send"
            raise ScheduleError(f"{a} on rank {a.stage} has no matching {other}")
    end_xfer = max((e for _, e in transfers.values()), default=0.0)
    makespan = max(max(clock, default=0.0), end_xfer)
    return Execution(
        makespan=makespan,
        compute=tuple(tuple(c) for c in compute),
        transfers=transfers,
        finish=tuple(clock),
    )
