"""Interleaved zero bubble: ZB-H1's I/W split on Megatron's interleaved placement.

``zb-interleaved`` runs v >= 2 model chunks per rank in the loop placement (chunk c
of rank s is model stage c S + s, as in interleaved 1F1B) and splits every backward
into I (input gradient) and W (weight gradient), as the zero-bubble schedules of Qi
et al. ("Zero Bubble Pipeline Parallelism", ICLR 2024) do: the I passes carry the
gradient back up the pipeline, the W passes only feed the optimizer step, so a W can
wait and fill a slot where the rank would otherwise idle.

Each rank keeps interleaved 1F1B's two sequences: forwards in virtual micro-batch
order (S micro-batches of chunk 0, the same S of chunk 1, ..., then the next S) and
input gradients in the same order with the chunks reversed. As in ZB-H1, the order
on rank s is a warm-up of forwards, a steady state of (I, W, F) and a cool-down of
I passes, with every W postponed by s I passes, so the W passes of the deep ranks
fill the time their gradients take to come back:

- warm-up: (v - 1) S + S - s forwards, one chunk micro-batch fewer per rank down the
  pipeline (interleaved 1F1B warms up with 2 (S - s - 1) + (v - 1) S: the shorter
  warm-up is what the postponed W passes pay for);
- steady state and cool-down: the k-th I, then the W of the (k - s)-th I (if any),
  then the next forward (while any is left); the s last W passes close the order.

A chunk micro-batch is held from its F to its W, so every rank holds at most v S
chunk micro-batches: S stage micro-batches (a chunk's counting 1/v), 1F1B's peak on
rank 0, and below interleaved 1F1B's (2 (S - 1) + (v - 1) S + 1) / v on rank 0
(5.5 at S=4, v=2).

With F = I = W = 1 per stage (``replay(s, f=1, b=2, w=1)``; a chunk pass costs 1/v)
no loop-placed schedule ends before 3M + (S - 1)/v: the last rank has 3M of work and
its first input arrives after S - 1 chunk forwards. This order reaches it (13.5 at
S=4, M=4; 25.5 at S=4, M=8; 51.5 at S=8, M=16 with v = 2; tests check a grid). The
order is fixed by (S, M, v) alone, not timed at one cost ratio, so profiled costs
run the same order.
"""

from __future__ import annotations

from .ir import Action, Kind, Step

__all__ = ["zb_interleaved"]

F, I, W = Kind.FORWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT  # noqa: E741

#: A chunk micro-batch: (chunk, micro-batch).
Item = tuple[int, int]


def _sequence(S: int, M: int, v: int, reverse: bool) -> list[Item]:
    """Interleaved 1F1B's virtual micro-batch order: S micro-batches per chunk in
    turn, chunks ascending for forwards and descending for input gradients."""
    out = []
    for k in range(M * v):
        c = (k // S) % v
        out.append((v - 1 - c if reverse else c, (k // (S * v)) * S + k % S))
    return out


def zb_interleaved(S: int, M: int, v: int) -> list[list[Step]]:
    """Interleaved zero bubble (module docstring): rank s warms up with
    (v - 1) S + S - s forwards, then runs the k-th I, the W of the (k - s)-th and
    the next forward, and ends with its s postponed W passes. Holds at most v S chunk
    micro-batches per rank. Needs v >= 2 and M a multiple of S (its spec)."""
    fwd, bwd = _sequence(S, M, v, False), _sequence(S, M, v, True)
    n = M * v
    progs: list[list[Step]] = []
    for s in range(S):
        warm, lag = min(v * S - s, n), s
        prog: list[Step] = [Action(F, s, m, c) for c, m in fwd[:warm]]
        for k in range(n):
            c, m = bwd[k]
            prog.append(Action(I, s, m, c))
            if k >= lag:
                c, m = bwd[k - lag]
                prog.append(Action(W, s, m, c))
            if warm + k < n:
                c, m = fwd[warm + k]
                prog.append(Action(F, s, m, c))
        prog += [Action(W, s, m, c) for c, m in bwd[max(0, n - lag):]]
        progs.append(prog)
    return progs
