"""Exact evaluation of a periodic schedule with many micro-batches from two small
ones.

A generator that declares a :class:`~merak_sim.schedule.spec.Period` promises that
M + p micro-batches insert one block of compute steps on every rank and change
nothing else. With fixed costs the evaluator's times are a max-plus linear system:
every time is a maximum of earlier times plus durations. Index the blocks from the
prefix (block j of every rank is one period) and call the blocks every rank has the
*complete* ones, the last J; the blocks after J (only some ranks have them) and the
suffixes form the *ending*. Then, for the evaluation of the base schedule G(n):

1. if every node of the complete blocks J-w+1 .. J depends only on nodes of blocks
   j - d .. j (d < w) through the same pattern in every block, with the same cost
   rules, the blocks obey one recursion X_j = F(X_{j-1}, .., X_{j-d}) with F
   max-plus linear, so F(X + c) = F(X) + c;
2. if the times of blocks J-w .. J are an arithmetic progression X_j = X_{j-1} + L
   (every start, end and consumed transfer of every rank), the recursion keeps it
   for every inserted block;
3. if the ending depends only on itself and on blocks J-w .. J, and nothing before
   the ending depends on the ending, then in G(n + k) the prefix and the first J
   blocks have G(n)'s times, the k inserted blocks repeat block J shifted by L, L2,
   .., and the ending is G(n)'s shifted by k L.

So every figure of :func:`~merak_sim.sim.result.build_result` is affine in k: the
makespan (T(n+1) - T(n) = L is checked), the per-GPU compute, recompute and exposed
communication sums (each inserted block adds what block J adds), and the FLOPs; peak
memory is G(n)'s when each block frees what it allocates (checked, as is the absence
of out-of-memory in both bases). The slopes are read off G(n) and G(n+1), both
evaluated by the one exact path. Rounding: the maps are non-expansive in the maximum
norm, so a progression that holds to a tolerance tol keeps every extended time
within tol. Any failed check returns None and the caller evaluates in full.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from merak_sim.schedule.spec import Period

from .engine import EventLog
from .evaluator import DependencyGraph, plan
from .program import Compiled
from .result import SimResult

__all__ = ["Evaluated", "Extended", "extended", "BASE_BLOCKS"]

#: Complete blocks the first base tries (doubled while the transient has not ended).
BASE_BLOCKS = 4
#: Blocks whose dependencies and times are checked (a block may depend on the
#: WINDOW - 1 blocks before it).
WINDOW = 3
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
    for r, ids in enumerate(prog.structure.compute_ids):
        body = len(ids) - period.prefix[r] - period.suffix[r]
        blk = period.block[r]
        if body < 0 or blk <= 0 or body % blk:
            return None
        out.append(body // blk)
    return out


def _block_map(prog: Compiled, period: Period, blocks: list[int], last: int
               ) -> tuple[list, list[bool]]:
    """Per action id, (rank, block, offset) for blocks 0 .. ``last`` (None for the
    prefix and the ending), and whether it belongs to the ending."""
    n = len(prog.actions)
    where: list = [None] * (n + 1)
    ending = [False] * (n + 1)
    for r, ids in enumerate(prog.structure.compute_ids):
        pre, blk = period.prefix[r], period.block[r]
        for j in range(last + 1):
            base = pre + j * blk
            for o in range(blk):
                where[ids[base + o]] = (r, j, o)
        for x in ids[pre + (last + 1) * blk:]:
            ending[x] = True
    return where, ending


def _pattern_ok(prog: Compiled, pl: DependencyGraph, where: list, ending: list[bool],
                last: int, window: int) -> bool:
    """Checks 1 and 3 of the module docstring on the base's dependency graph."""
    lo = last - window
    sig: dict[tuple[int, int], tuple] = {}
    rules = prog.structure.rule_of_action
    alloc, free = prog.structure.alloc_rule, prog.structure.free_rule
    xs = prog.transfer_s
    for i, prev, dep, sp, rp in pl.nodes:
        if ending[i]:
            for x in (prev, sp, rp):
                if x >= 0 and not ending[x] and (where[x] is None or where[x][1] < lo):
                    return False
            continue
        w = where[i]
        if any(x >= 0 and ending[x] for x in (prev, sp, rp)):
            return False
        if w is None or w[1] <= lo:
            continue
        r, j, o = w
        s = []
        for x in (prev, sp, rp):
            if x < 0:
                s.append(None)
                continue
            wx = where[x]
            if wx is None or wx[1] > j or j - wx[1] >= window:
                return False
            s.append((wx[0], j - wx[1], wx[2]))
        s.append((rules[i], alloc[i], free[i], xs[dep] if dep >= 0 else None))
        key = (r, o)
        if sig.setdefault(key, tuple(s)) != tuple(s):
            return False
    # AR, OPT and the gradient buckets read the rank's last actions and backwards.
    for ar, opt, before in pl.tails:
        if before >= 0 and not ending[before] and (where[before] is None
                                                   or where[before][1] < lo):
            return False
    for ids in prog.last_backward:
        for x in ids:
            if not ending[x] and (where[x] is None or where[x][1] < lo):
                return False
    return True


def _progression(ev: Evaluated, period: Period, last: int, window: int
                 ) -> float | None:
    """The common shift L of blocks ``last - window`` .. ``last`` (check 2), or None."""
    tr, prog = ev.trace, ev.prog
    xs, xe = tr.xfers[0]
    consumed = prog.structure.consumed
    tol = TOLERANCE * max(tr.makespan, 1e-300)
    shift = None
    for r, acts in enumerate(tr.acts):  # each rank's compute steps in program order
        pre, blk = period.prefix[r], period.block[r]
        for j in range(last - window + 1, last + 1):
            for o in range(blk):
                a, b = acts[pre + j * blk + o], acts[pre + (j - 1) * blk + o]
                pairs = [(a[1], b[1]), (a[2], b[2])]
                ya, yb = consumed[r].get(a[0]), consumed[r].get(b[0])
                if (ya is None) != (yb is None):
                    return None
                if ya is not None:
                    pairs += [(xs[ya], xs[yb]), (xe[ya], xe[yb])]
                for u, v in pairs:
                    d = u - v
                    if shift is None:
                        shift = d
                    elif abs(d - shift) > tol:
                        return None
    return shift


def _balanced(prog: Compiled, period: Period, last: int) -> bool:
    """Each rank's block ``last`` frees exactly what it allocates."""
    alloc, free = prog.mem_alloc, prog.mem_free
    for r, ids in enumerate(prog.structure.compute_ids):
        pre, blk = period.prefix[r], period.block[r]
        block = ids[pre + last * blk: pre + (last + 1) * blk]
        if sum(alloc[x] for x in block) != sum(free[x] for x in block):
            return False
    return True


def _figures(ev: Evaluated) -> list[tuple[int, int, float, float, float, float]]:
    return [(r.rank, r.stage, r.compute_s, r.recompute_s, r.exposed_comm_s,
             r.peak_memory_bytes) for r in ev.result.ranks]


def _checked(one: Evaluated, two: Evaluated, period: Period) -> bool:
    """Every check of the module docstring on the bases G(n) and G(n+1)."""
    if one.result.oom is not None or two.result.oom is not None:
        return False
    b1, b2 = _layout(one.prog, period), _layout(two.prog, period)
    if b1 is None or b2 is None or any(y != x + 1 for x, y in zip(b1, b2, strict=True)):
        return False
    last = min(b1) - 1
    window = WINDOW
    if last - window < 0:
        return False
    where, ending = _block_map(one.prog, period, b1, last)
    if not _pattern_ok(one.prog, plan(one.prog), where, ending, last, window):
        return False
    shift = _progression(one, period, last, window)
    if shift is None or _progression(two, period, last + 1, window) is None:
        return False
    tol = TOLERANCE * max(one.trace.makespan, 1e-300)
    if abs(two.trace.makespan - one.trace.makespan - shift) > tol:
        return False
    if not _balanced(one.prog, period, last):
        return False
    return all(a[5] == b[5] for a, b in zip(_figures(one), _figures(two), strict=True))


def extended(period: Period | None, microbatches: int,
             evaluated: Callable[[int], Evaluated]) -> Extended | None:
    """The figures for ``microbatches`` micro-batches from bases evaluated by
    ``evaluated(M)`` (the exact path at M micro-batches), or None where the schedule
    declares no period, M is too small to gain, or a check fails."""
    if period is None:
        return None
    m0, p = period.first_microbatches, period.microbatches
    if microbatches < m0 or (microbatches - m0) % p:
        return None
    q = BASE_BLOCKS
    while m0 + p * (q + 1) < microbatches:
        m1 = m0 + p * q
        one, two = evaluated(m1), evaluated(m1 + p)
        if _checked(one, two, period):
            k = (microbatches - m1) // p
            f1, f2 = _figures(one), _figures(two)
            figures = [(a[0], a[1], *(x + k * (y - x) for x, y in zip(a[2:5], b[2:5],
                                                                     strict=True)), a[5])
                       for a, b in zip(f1, f2, strict=True)]
            t1, t2 = one.trace.makespan, two.trace.makespan
            fl1, fl2 = sum(one.prog.flops), sum(two.prog.flops)
            rf1, rf2 = sum(one.prog.recompute_flops), sum(two.prog.recompute_flops)
            return Extended(t1 + k * (t2 - t1), figures, fl1 + k * (fl2 - fl1),
                            rf1 + k * (rf2 - rf1))
        q *= 2
    return None
