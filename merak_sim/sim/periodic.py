"""Exact evaluation of a periodic schedule with many micro-batches from one small
one.

A generator that declares a :class:`~merak_sim.schedule.spec.Period` promises that
M + p micro-batches insert one block of compute steps on every rank and change
nothing else. With fixed costs the evaluator's times are a max-plus linear system:
every time is a maximum of earlier times plus durations. Index the blocks from the
prefix (block j of every rank is one period) and call the blocks every rank has the
*complete* ones, the last J; the blocks after J (only some ranks have them) and the
suffixes form the *ending*. Then, for the evaluation of a base schedule G(n):

1. if every node of the complete blocks J-w+1 .. J depends only on nodes of blocks
   j - w + 1 .. j through the same pattern in every block, with the same cost
   rules, the blocks obey one recursion X_j = F(X_{j-1}, .., X_{j-w+1}) with F
   max-plus linear, so F(X + c) = F(X) + c;
2. if the times of blocks J-w .. J are an arithmetic progression X_j = X_{j-1} + L
   (every start, end and consumed transfer of every rank), the recursion keeps it
   for every inserted block;
3. if the ending depends only on itself and on blocks J-w .. J, and nothing before
   the ending depends on the ending, then in G(n + k) the prefix and the first J
   blocks have G(n)'s times, the k inserted blocks repeat block J shifted by L, 2L,
   .., and the ending is G(n)'s shifted by k L.

So every figure of :func:`~merak_sim.sim.result.build_result` is affine in k: the
makespan gains k L when G(n)'s is reached in the ending (checked), each GPU's
compute, recompute and exposed communication gain k times what block J adds
(:func:`~merak_sim.sim.result.rank_breakdown` of block J after its predecessor),
and the FLOPs k times block J's; peak memory is G(n)'s when each block frees what
it allocates (checked, as is the absence of out-of-memory). Rounding: the maps are
non-expansive in the maximum norm, so a progression that holds to a tolerance keeps
every extended time within it.

Bases: the first has :data:`BASE_BLOCKS` more blocks than the generator's smallest
schedule, or fewer where that would exceed :data:`BASE_SHARE` of the micro-batches
(interleaved 1F1B at M = 8 pp, the published runs' shape, has room for three: a
base of 5 pp micro-batches, enough where the transient ends within the first block,
as it does on near-uniform stages). A base still in its transient (checks 1 to 3
fail on its dependencies or times) is retried with twice the blocks while it stays
within that share; a base that cannot apply whatever its size (out of memory, blocks
that do not free what they allocate, programs of another shape) stops the search at
once. Either way the caller then evaluates in full, so the bases tried cost at most
about one full evaluation more.

The checks read the base's arrays (:attr:`ProgramStructure.arrays`, the trace's
:attr:`~merak_sim.sim.engine.EventLog.times`): each block's actions against their
counterparts in block J, as whole-array comparisons, so a base of tens of thousands
of passes is checked in milliseconds (the same decisions and the same figures as the
per-action loops they replace).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from merak_sim.schedule.spec import Period

from .engine import EventLog
from .evaluator import rank_tails
from .program import Compiled
from .result import SimResult, range_breakdown
from .structure import FORWARD_KINDS, RECOMPUTING_KINDS

__all__ = ["Evaluated", "Extended", "extended", "BASE_BLOCKS"]

#: Blocks the first base adds to the generator's smallest schedule (doubled while
#: the transient has not ended).
BASE_BLOCKS = 6
#: The largest base, as a share of the micro-batches: beyond it the base saves too
#: little over evaluating in full.
BASE_SHARE = 0.65
#: Blocks whose dependencies and times are checked (a block may depend on the
#: WINDOW - 1 blocks before it): one-block recursions cover every declared period
#: (1F1B, ZB-H1, interleaved 1F1B) and need the fewest blocks in a base.
WINDOW = 2
#: What :func:`_checked` says of a base that does not extend: a larger base may
#: (its transient has not ended), or no base will.
GROW, STOP = "grow", "stop"
#: Relative tolerance of the progression checks (times are sums of a few thousand
#: durations, so rounding stays far below it).
TOLERANCE = 1e-12


@dataclass(frozen=True)
class Evaluated:
    """One schedule evaluated by the exact path: its program, timeline and result."""

    prog: Compiled
    trace: EventLog
    result: SimResult


@dataclass(frozen=True)
class Extended:
    """The figures :func:`~merak_sim.sim.result.result_of` needs, for M micro-batches.

    Attributes:
        makespan: iteration time.
        figures: per simulated GPU (global rank, stage, compute, recompute, exposed
            communication seconds, peak bytes).
        flops, recompute_flops: one pipeline's model and recomputation FLOPs.
    """

    makespan: float
    figures: list[tuple[int, int, float, float, float, float]]
    flops: float
    recompute_flops: float


def _layout(prog: Compiled, period: Period) -> list[int] | None:
    """Complete blocks per rank, or None if the programs do not have the declared
    shape."""
    out = []
    counts = np.diff(prog.structure.arrays.first).tolist()
    for r, n in enumerate(counts):
        body = n - period.prefix[r] - period.suffix[r]
        blk = period.block[r]
        if body < 0 or blk <= 0 or body % blk:
            return None
        out.append(body // blk)
    return out


@dataclass(frozen=True)
class _Blocks:
    """Where every action id of a base sits (arrays over action ids, one slot more
    at the end for id -1, "none": in no block, neither early nor ending).

    Attributes:
        first: rank r's action ids start at ``first[r]``.
        pre, blk: per rank, its prefix and block length.
        rank, block, offset: per action id, its rank and, inside blocks 0 .. last,
            its block and offset (-1 elsewhere).
        ending: after block ``last`` (the ending).
        early: before block ``last - window``.
    """

    first: np.ndarray
    pre: np.ndarray
    blk: np.ndarray
    rank: np.ndarray
    block: np.ndarray
    offset: np.ndarray
    ending: np.ndarray
    early: np.ndarray


def _blocks(prog: Compiled, period: Period, last: int, window: int) -> _Blocks:
    """The :class:`_Blocks` of ``prog`` with complete blocks 0 .. ``last``."""
    first = prog.structure.arrays.first
    S = len(first) - 1
    rank = np.repeat(np.arange(S), np.diff(first))
    pre, blk = np.array(period.prefix[:S]), np.array(period.block[:S])
    q = np.arange(first[-1]) - first[rank]
    p, b = pre[rank], blk[rank]
    j = (q - p) // b
    inside = (q >= p) & (j <= last)
    pad = np.append  # the slot of id -1
    return _Blocks(first, pre, blk, pad(rank, -1), pad(np.where(inside, j, -1), -1),
                   pad(np.where(inside, (q - p) % b, -1), -1),
                   pad(q >= p + (last + 1) * b, False), pad(q < p + (last - window) * b, False))


def _pattern_ok(prog: Compiled, bl: _Blocks, last: int, window: int) -> bool:
    """Checks 1 and 3 of the module docstring on the base's dependencies (each
    per-micro-batch action's previous action on its rank and the actions before its
    transfer's two postings)."""
    fa = prog.structure.arrays
    tails = rank_tails(prog)
    if tails is None:
        return False
    ids = np.concatenate([np.arange(lo, hi) for lo, hi in zip(fa.first[:-1].tolist(),
                                                               tails[0], strict=True)])
    has = fa.consumed[ids] >= 0
    dep = np.where(has, fa.consumed[ids], 0)
    deps = (np.where(ids > bl.first[bl.rank[ids]], ids - 1, -1),
            np.where(has, np.append(fa.send_prev, -1)[dep], -1),
            np.where(has, np.append(fa.recv_prev, -1)[dep], -1))
    end = bl.ending[ids]
    if any((end & bl.early[x]).any() | (~end & bl.ending[x]).any() for x in deps):
        return False
    j = bl.block[ids]
    chk = ~end & (j > last - window)
    c, jc = ids[chk], j[chk]
    cols = [fa.rule[c], fa.alloc[c], fa.free[c], has[chk],
            np.where(has[chk], np.append(np.asarray(prog.transfer_s, dtype=float), 0.0)
                     [dep[chk]], 0.0)]
    for x in (d[chk] for d in deps):
        none = x < 0
        back = jc - bl.block[x]
        if (~none & ((bl.block[x] < 0) | (back < 0) | (back >= window))).any():
            return False
        cols += [np.where(none, -1, bl.rank[x]), np.where(none, -1, back),
                 np.where(none, -1, bl.offset[x])]
    # Each checked action against the action at its offset in block ``last``.
    at = np.full(len(bl.rank), -1)
    at[c] = np.arange(len(c))
    ref = at[c + (last - jc) * bl.blk[bl.rank[c]]]
    if any((col != col[ref]).any() for col in cols):
        return False
    # AR, OPT and the gradient buckets read the rank's last actions and backwards.
    before = np.array([t[2] for t in tails[2]], dtype=np.int64)
    backs = np.array([x for xs in prog.last_backward for x in xs], dtype=np.int64)
    return not (bl.early[before].any() or bl.early[backs].any())


def _block_ids(bl: _Blocks, j: int) -> np.ndarray:
    """Action ids of block ``j`` of every rank, ranks in order."""
    lo = bl.first[:-1] + bl.pre + j * bl.blk
    return np.concatenate([np.arange(a, a + n) for a, n in zip(lo.tolist(), bl.blk.tolist(),
                                                               strict=True)])


def _progression(ev: Evaluated, bl: _Blocks, last: int, window: int) -> float | None:
    """The common shift L of blocks ``last - window`` .. ``last`` (check 2), or None:
    every start, end and consumed transfer's start and end of block j minus its
    counterpart's in block j - 1 equals the first of those differences (rank 0's
    first start) to the tolerance."""
    tr = ev.trace
    start, end, xs, xe = tr.times
    consumed = ev.prog.structure.arrays.consumed
    tol = TOLERANCE * max(tr.makespan, 1e-300)
    diffs = []
    for j in range(last - window + 1, last + 1):
        a = _block_ids(bl, j)
        b = a - bl.blk[bl.rank[a]]
        ya, yb = consumed[a], consumed[b]
        if ((ya < 0) != (yb < 0)).any():
            return None
        y = ya >= 0
        diffs += [start[a] - start[b], end[a] - end[b], xs[ya[y]] - xs[yb[y]],
                  xe[ya[y]] - xe[yb[y]]]
    if not len(diffs[0]):
        return None
    shift = float(diffs[0][0])
    if any((np.abs(d - shift) > tol).any() for d in diffs):
        return None
    return shift


def _balanced(prog: Compiled, bl: _Blocks, last: int) -> bool:
    """Each rank's block ``last`` frees what it allocates (to rounding)."""
    fa = prog.structure.arrays
    mem = np.array(prog.memory_values)
    for a, n in zip((bl.first[:-1] + bl.pre + last * bl.blk).tolist(), bl.blk.tolist(),
                    strict=True):
        grown = float(np.cumsum(mem[fa.alloc[a:a + n]])[-1]) if n else 0.0
        freed = float(np.cumsum(mem[fa.free[a:a + n]])[-1]) if n else 0.0
        if abs(grown - freed) > TOLERANCE * max(grown, freed):  # rounding only
            return False
    return True


def _checked(ev: Evaluated, period: Period) -> tuple[int, float] | str:
    """(last complete block J, shift L) when every check of the module docstring
    holds for the base ``ev``; else :data:`GROW` where a larger base may pass, or
    :data:`STOP` where none will."""
    if ev.result.oom is not None:
        return STOP  # a larger base holds at least as much
    blocks = _layout(ev.prog, period)
    if blocks is None or ev.trace.times is None:
        return STOP
    last = min(blocks) - 1
    if last - WINDOW < 0:
        return GROW
    bl = _blocks(ev.prog, period, last, WINDOW)
    if not _balanced(ev.prog, bl, last):
        return STOP
    if not _pattern_ok(ev.prog, bl, last, WINDOW):
        return GROW
    shift = _progression(ev, bl, last, WINDOW)
    if shift is None or shift < 0:
        return GROW
    tr = ev.trace
    top = max((e for rows in tr.buckets for _c, _s, e in rows), default=0.0)
    ends = tr.times[1][bl.ending[:-1]]
    if len(ends) and ends.max() > top:  # max(top, e), written as the comparison it makes
        top = float(ends.max())
    return (last, shift) if top == tr.makespan else GROW


def _block_breakdown(tr: EventLog, bl: _Blocks, last: int
                     ) -> list[tuple[float, float, float]]:
    """What block ``last`` adds to each entity's breakdown: the breakdown of the
    last step before it plus the block, less that step's alone (both start from
    the same state, so only the block's share remains)."""
    out = []
    for e, s in enumerate(tr.stage_of):
        lo = int(bl.first[s] + bl.pre[s] + last * bl.blk[s])
        out.append(tuple(x - y for x, y in zip(
            range_breakdown(tr, e, lo - 1, lo + int(bl.blk[s])),
            range_breakdown(tr, e, lo - 1, lo), strict=True)))
    return out


def _flops_of(prog: Compiled, ids: np.ndarray) -> tuple[float, float]:
    """Model and recomputation FLOPs of the actions ``ids``, counted as
    ``Compiled.flops`` and ``Compiled.recompute_flops`` count them (in order)."""
    fa = prog.structure.arrays
    fl = np.asarray(prog.rule_values[6], dtype=float)[fa.rule[ids]]
    k = fa.kind[ids]
    out = []
    for kinds in (FORWARD_KINDS, RECOMPUTING_KINDS):
        sel = fl[np.isin(k, [x.code for x in kinds])]
        out.append(float(np.cumsum(sel)[-1]) if len(sel) else 0.0)
    return out[0], out[1]


def _extend(ev: Evaluated, period: Period, last: int, shift: float, k: int) -> Extended:
    """The figures with ``k`` more blocks than the base ``ev``."""
    tr, prog = ev.trace, ev.prog
    bl = _blocks(prog, period, last, WINDOW)
    figures = []
    for r, add in zip(ev.result.ranks, _block_breakdown(tr, bl, last), strict=True):
        base = (r.compute_s, r.recompute_s, r.exposed_comm_s)
        figures.append((r.rank, r.stage, *(b + k * x for b, x in zip(base, add, strict=True)),
                        r.peak_memory_bytes))
    fl = rf = 0.0
    for r in range(len(bl.pre)):
        lo = int(bl.first[r] + bl.pre[r] + last * bl.blk[r])
        f, c = _flops_of(prog, np.arange(lo, lo + int(bl.blk[r])))
        fl += f
        rf += c
    return Extended(tr.makespan + k * shift, figures, sum(prog.flops) + k * fl,
                    sum(prog.recompute_flops) + k * rf)


def extended(period: Period | None, microbatches: int,
             evaluated: Callable[[int], Evaluated]) -> Extended | None:
    """The figures for ``microbatches`` micro-batches from a base evaluated by
    ``evaluated(M)`` (the exact path at M micro-batches), or None where the schedule
    declares no period, M is too small to gain, or no base passes the checks (module
    docstring: which bases are tried)."""
    if period is None:
        return None
    m0, p = period.first_microbatches, period.microbatches
    if microbatches < m0 or (microbatches - m0) % p:
        return None
    most = (int(microbatches * BASE_SHARE) - m0) // p  # blocks a base may add
    q = min(BASE_BLOCKS, most)
    while q >= 1:
        m1 = m0 + p * q
        ev = evaluated(m1)
        found = _checked(ev, period)
        if not isinstance(found, str):
            return _extend(ev, period, *found, (microbatches - m1) // p)
        if found == STOP or q == most:
            return None
        q = min(2 * q, most)
    return None
