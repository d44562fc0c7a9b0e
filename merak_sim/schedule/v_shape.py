"""V-shaped two-chunk schedules: ZB-V and DualPipeV.

Both run two model chunks per rank under the ``"v"`` placement
(:meth:`merak_sim.schedule.ir.Schedule.rank_of`): chunk 0 of rank r is model stage r,
chunk 1 is model stage 2S-1-r, so a micro-batch goes down the ranks and comes back up,
the turn at rank S-1 is local, and rank 0 holds both the first and the last model stage
(its loss and a tied embedding stay on one rank). Each rank's first forward and last
backward both sit at the top of the V, which halves the warm-up of a single-chunk
pipeline.

- :func:`zb_v` follows ZB-V (Qi et al., "Pipeline Parallelism with Controllable
  Memory", NeurIPS 2024; the V schedule of "Zero Bubble Pipeline Parallelism", ICLR
  2024): backward split into I (input gradient) and W (weight gradient), I passes on
  the critical path first, forwards as long as the rank holds fewer than 2S chunk
  micro-batches (1F1B's peak of S stage micro-batches, a chunk's counting one half),
  W passes filling what is left. The order is built by replaying those rules at unit
  cost (F = I = W per chunk), so it is the list schedule they define; at that cost its
  makespan is 3M + (S-1)/2 stage units for S=4, M=8 and S=8, M=16.
- :func:`dualpipev` follows DeepSeek's DualPipeV (DeepSeek-V3 report's DualPipe cut in
  half, as PyTorch's ScheduleDualPipeV orders it): micro-batches enter at rank 0 and
  run down chunk 0 and back up chunk 1; in the steady phase a forward of one chunk is
  paired with a backward of the other (the pair DualPipe overlaps with its
  all-to-all; here the two run back to back on the compute stream), and zero-bubble
  I/W splits appear only where they fill the warm-up and the cool-down. Peak
  activations: 2S+1 chunk micro-batches per rank (1F1B's peak plus half a stage
  micro-batch). Needs M >= 2S.
"""

from __future__ import annotations

from collections import deque

from .ir import Action, Kind, ScheduleError, Step

__all__ = ["zb_v", "dualpipev"]

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT  # noqa: E741


def _v_stage(S: int, r: int, c: int) -> int:
    return r if c == 0 else 2 * S - 1 - r


def zb_v(S: int, M: int, v: int = 2) -> list[list[Step]]:
    """ZB-V: the list schedule of ZB-V's rules at unit cost (module docstring).

    At every unit step each rank runs the first ready action of: an I (lowest
    micro-batch, then the later model stage), a forward if the rank holds fewer than
    2S chunk micro-batches (chunk 1 first, then the lowest micro-batch), the oldest
    pending W. Ready means its inputs were produced in an earlier step; every I runs
    before its W, which frees the micro-batch.
    """
    cap = 2 * S
    G = 2 * S
    done: set[tuple[Kind, int, int]] = set()
    nxt = {(k, r, c): 0 for k in (F, I) for r in range(S) for c in (0, 1)}
    pending_w: list[deque[tuple[int, int]]] = [deque() for _ in range(S)]
    held = [0] * S
    progs: list[list[Step]] = [[] for _ in range(S)]
    left = 6 * S * M
    while left:
        picks = []
        for r in range(S):
            a = _zb_v_pick(S, M, r, cap, G, done, nxt, pending_w[r], held[r])
            if a is not None:
                picks.append(a)
        if not picks:
            raise ScheduleError(f"zb-v made no progress for pp={S}, microbatches={M}")
        for a in picks:  # an action's output is visible from the next step on
            progs[a.stage].append(a)
            done.add((a.kind, _v_stage(S, a.stage, a.chunk), a.microbatch))
            left -= 1
            if a.kind is F:
                nxt[(F, a.stage, a.chunk)] += 1
                held[a.stage] += 1
            elif a.kind is I:
                nxt[(I, a.stage, a.chunk)] += 1
                pending_w[a.stage].append((a.chunk, a.microbatch))
            else:
                held[a.stage] -= 1
    return progs


def _zb_v_pick(S: int, M: int, r: int, cap: int, G: int, done: set, nxt: dict,
               pending: deque, held: int) -> Action | None:
    """The action rank ``r`` starts this step under ZB-V's rules (see :func:`zb_v`)."""
    ready_i = []
    for c in (0, 1):
        g, m = _v_stage(S, r, c), nxt[(I, r, c)]
        if m < M and (F, g, m) in done and (g == G - 1 or (I, g + 1, m) in done):
            ready_i.append((m, -g, c))
    if ready_i:
        m, _g, c = min(ready_i)
        return Action(I, r, m, c)
    if held < cap:
        for c in (1, 0):
            g, m = _v_stage(S, r, c), nxt[(F, r, c)]
            if m < M and (g == 0 or (F, g - 1, m) in done):
                return Action(F, r, m, c)
    if pending:
        c, m = pending.popleft()
        return Action(W, r, m, c)
    return None


class _RankOrder:
    """One rank's order under construction: next micro-batch per (kind, chunk) and the
    queue of postponed W passes."""

    def __init__(self, rank: int):
        self.rank = rank
        self.prog: list[Step] = []
        self.count = {(k, c): 0 for k in (F, B) for c in (0, 1)}
        self.postponed: deque[tuple[int, int]] = deque()

    def fwd(self, c: int) -> None:
        """The next forward of chunk ``c``."""
        self.prog.append(Action(F, self.rank, self.count[(F, c)], c))
        self.count[(F, c)] += 1

    def bwd(self, c: int, split: bool = False, w_now: bool = False) -> None:
        """The next backward of chunk ``c``: whole, or I with its W now or postponed."""
        m = self.count[(B, c)]
        self.count[(B, c)] += 1
        if not split:
            self.prog.append(Action(B, self.rank, m, c))
            return
        self.prog.append(Action(I, self.rank, m, c))
        if w_now:
            self.prog.append(Action(W, self.rank, m, c))
        else:
            self.postponed.append((c, m))

    def weight(self) -> None:
        """The oldest postponed W."""
        c, m = self.postponed.popleft()
        self.prog.append(Action(W, self.rank, m, c))


def dualpipev(S: int, M: int, v: int = 2) -> list[list[Step]]:
    """DualPipeV's per-rank order in eight phases (module docstring); rank r runs:

    1. 2(S-1-r) chunk-0 forwards (the deepest ranks start their chunk 1 soonest);
    2. r+1 pairs of a chunk-0 and a chunk-1 forward (2S micro-batch chunks now held);
    3. S-1-r times: chunk-1 I, its W at once, a chunk-1 forward;
    4. M-2S+r+1 times: (chunk-0 forward, chunk-1 backward), (chunk-1 forward, chunk-0
       backward): the overlapped pairs of the steady state;
    5. S-1-r times: a chunk-1 backward, then the pair (chunk-1 forward, chunk-0 backward);
    6. r+1 times: chunk-1 backward, chunk-0 backward; from the middle on (from the
       chunk-1 backward on odd ranks, the chunk-0 one on even ranks) each is split into
       I with its W postponed;
    7. S-1-r times: the oldest postponed W, then a chunk-0 I (its W postponed);
    8. the r+1 postponed Ws left.
    """
    progs: list[list[Step]] = []
    for r in range(S):
        o, deep = _RankOrder(r), S - 1 - r
        for _ in range(2 * deep):
            o.fwd(0)
        for _ in range(r + 1):
            o.fwd(0)
            o.fwd(1)
        for _ in range(deep):
            o.bwd(1, split=True, w_now=True)
            o.fwd(1)
        for _ in range(M - 2 * S + r + 1):
            o.fwd(0)
            o.bwd(1)
            o.fwd(1)
            o.bwd(0)
        for _ in range(deep):
            o.bwd(1)
            o.fwd(1)
            o.bwd(0)
        half = (r + 1) // 2
        for i in range(r + 1):
            o.bwd(1, split=i > half or (i == half and r % 2 == 1))
            o.bwd(0, split=i >= half)
        for _ in range(deep):
            o.weight()
            o.bwd(0, split=True)
        while o.postponed:
            o.weight()
        progs.append(o.prog)
    return progs
