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
    run = _Run(sched, duration, transfer or (lambda a: 0.0))
    while run.ready:
        run.advance(run.ready.popleft())
    return run.result()


class _Run:
    """The state of one symbolic execution: program counters and clocks per rank, the
    posted sends and receives, the transfers matched so far and who waits for what."""

    def __init__(self, sched: Schedule, duration, xfer) -> None:
        S = sched.num_stages
        self.sched, self.duration, self.xfer = sched, duration, xfer
        self.pcs, self.clock = [0] * S, [0.0] * S
        self.send_post: dict = {}
        self.recv_post: dict = {}
        self.group_of: dict = {}  # recv key -> the posted receive action
        self.transfers: dict = {}
        self.waiting: dict = {}  # ("send"|"recv", key) -> rank blocked until it is posted
        self.compute: list[list] = [[] for _ in range(S)]
        self.ready = deque(range(S))
        self.queued = [True] * S

    def post(self, rank: int, a: Action, t: float) -> None:
        """Post send or receive ``a`` at time ``t``; wake a rank waiting for it."""
        key = comm_key(self.sched, a)
        side = "send" if a.kind.is_send else "recv"
        table = self.send_post if side == "send" else self.recv_post
        if key in table:
            raise ScheduleError(f"{a} on rank {rank} is posted twice")
        table[key] = (t, a)
        w = self.waiting.pop((side, key), None)
        if w is not None and not self.queued[w]:
            self.ready.append(w)
            self.queued[w] = True

    def completion(self, parts: tuple[Action, ...]) -> tuple[float | None, tuple | None]:
        """Completion time of a posted group, or (None, what-to-wait-for)."""
        done = 0.0
        for p in parts:
            key = comm_key(self.sched, p)
            if key in self.transfers:
                done = max(done, self.transfers[key][1])
                continue
            s, r = self.send_post.get(key), self.recv_post.get(key)
            if s is None:
                return None, ("send", key)
            if r is None:
                return None, ("recv", key)
            start = max(s[0], r[0])
            end = start + self.xfer(s[1])
            self.transfers[key] = (start, end)
            done = max(done, end)
        return done, None

    def advance(self, r: int) -> None:
        """Run rank ``r`` until it ends or waits for a transfer not yet posted."""
        self.queued[r] = False
        prog = self.sched.programs[r]
        pc, t = self.pcs[r], self.clock[r]
        while pc < len(prog):
            step: Step = prog[pc]
            if isinstance(step, Fused) or step.kind.is_comm:
                for p in step.parts:
                    self.post(r, p, t)
                    if p.kind.is_recv:
                        self.group_of[comm_key(self.sched, p)] = p
                pc += 1
                continue
            start = self._input_ready(r, step, t)
            if start is None:
                break
            end = start + self.duration(step)
            self.compute[r].append((step, start, end))
            t = end
            pc += 1
        self.pcs[r], self.clock[r] = pc, t

    def _input_ready(self, r: int, step: Action, t: float) -> float | None:
        """When ``step`` may start on rank ``r`` (free at ``t``), or None while the
        receive it consumes has not completed (the rank then waits for it)."""
        key = consumed_key(self.sched, step)
        if key is None:
            return t
        if key not in self.group_of:
            raise ScheduleError(
                f"{step} on rank {r} consumes {key[0]} of model stage {key[1]} "
                f"micro-batch {key[2]} but no receive for it was posted before it")
        # A compute action waits only for the receive it consumes, even when that
        # receive was posted fused with a send (semantics rule 4).
        done, wait_for = self.completion((self.group_of[key],))
        if done is None:
            self.waiting[wait_for] = r
            return None
        return max(t, done)

    def result(self) -> Execution:
        """The execution, after proving every rank finished and every post matched."""
        sched, pcs = self.sched, self.pcs
        S = sched.num_stages
        if any(pcs[r] < len(sched.programs[r]) for r in range(S)):
            stuck = {r: pcs[r] for r in range(S) if pcs[r] < len(sched.programs[r])}
            raise DeadlockError(
                f"schedule {sched.name!r} deadlocks: no rank can make progress\n"
                + _grid(sched, pcs), stuck)
        for key in self.send_post.keys() | self.recv_post.keys():
            if key not in self.transfers:
                if key in self.send_post and key in self.recv_post:
                    self.completion((self.send_post[key][1],))
                    continue
                a = (self.send_post.get(key) or self.recv_post.get(key))[1]
                other = "receive" if a.kind.is_send else "send"
                raise ScheduleError(f"{a} on rank {a.stage} has no matching {other}")
        end_xfer = max((e for _, e in self.transfers.values()), default=0.0)
        return Execution(makespan=max(max(self.clock, default=0.0), end_xfer),
                         compute=tuple(tuple(c) for c in self.compute),
                         transfers=self.transfers, finish=tuple(self.clock))
