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
  2024): backward split into I (input gradient) and W (weight gradient); a warm-up of
  forwards up to 2S chunk micro-batches per rank (1F1B's peak of S stage micro-batches,
  a chunk's counting one half), a steady state of per-chunk groups (forward, I, W) with
  the two chunks alternating, and a cool-down whose Ws are postponed behind the I
  passes to fill the waits for them. The order is fixed by (S, M) alone, not timed at
  one cost ratio, so it holds up when I, W and F differ (profiled costs; I slower than
  W or the reverse; only with M < 2S and W slower than I do the postponed Ws
  lengthen the tail). At unit cost (F = I = W per chunk) its makespan is 3M + (S-1)/2
  stage units for S=4, M=8 and S=8, M=16.
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

from .ir import Action, Kind, Step

__all__ = ["zb_v", "dualpipev"]

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT  # noqa: E741


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


def zb_v(S: int, M: int, v: int = 2) -> list[list[Step]]:
    """ZB-V's per-rank order in three phases (module docstring); rank r runs:

    1. warm-up: 2(S-1-r)+1 chunk-0 forwards, then r times a chunk-1 and a chunk-0
       forward, then one chunk-1 forward (forwards past micro-batch M-1 skipped), so
       the rank holds 2S chunk micro-batches, 1F1B's peak;
    2. steady state: S-r chunk-1 groups, then chunk-0 and chunk-1 groups alternating
       until both chunks have run M backwards; a group is the chunk's next forward
       (while any is left; the first chunk-1 group has none, its forward closed the
       warm-up), its next I and that I's W, so a W frees a micro-batch before the
       next forward holds one;
    3. cool-down: in the groups after the one holding the rank's last forward, each
       W is postponed and the oldest runs only once more than 2r wait (the I passes,
       on the critical path back to rank 0, go first; the Ws fill the waits for
       them, longer the farther the rank is from rank 0); the rest run at the end.
    """
    progs: list[list[Step]] = []
    for r in range(S):
        o, lag = _RankOrder(r), 2 * r
        warm = [0] * (2 * (S - 1 - r) + 1) + [1, 0] * r + [1]
        for c in warm:
            if o.count[(F, c)] < M:
                o.fwd(c)
        order = [1] * (S - r) + [0, 1] * M
        for i, c in enumerate(order):
            if o.count[(B, c)] == M:
                continue
            cooling = o.count[(F, 0)] == M and o.count[(F, 1)] == M
            if i and o.count[(F, c)] < M:
                o.fwd(c)
            o.bwd(c, split=True, w_now=not cooling)
            while len(o.postponed) > lag:
                o.weight()
        while o.postponed:
            o.weight()
        progs.append(o.prog)
    return progs


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
