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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from merak_sim.schedule.spec import Period

from .engine import EventLog
from .evaluator import DependencyGraph, plan
from .program import Compiled
from .structure import FORWARD_KINDS, RECOMPUTING_KINDS
from .result import SimResult, rank_breakdown

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
    for r, ids in enumerate(prog.structure.compute_ids):
        body = len(ids) - period.prefix[r] - period.suffix[r]
        blk = period.block[r]
        if body < 0 or blk <= 0 or body % blk:
            return None
        out.append(body // blk)
    return out


def _block_map(prog: Compiled, period: Period, last: int, window: int
               ) -> tuple[list, list[bool], list[bool]]:
    """Per action id, with one more slot for -1 ("none": None, False, False):
    (rank, block, offset) for blocks 0 .. ``last`` (None for the prefix and the
    ending); whether it belongs to the ending; and whether it comes before block
    ``last - window`` (the prefix or an earlier block: what the ending may not
    read)."""
    n = len(prog.actions)
    where: list = [None] * (n + 1)
    ending = [False] * (n + 1)
    early = [False] * (n + 1)
    lo = last - window
    for r, ids in enumerate(prog.structure.compute_ids):
        pre, blk = period.prefix[r], period.block[r]
        for j in range(last + 1):
            base = pre + j * blk
            for o in range(blk):
                where[ids[base + o]] = (r, j, o)
        for x in ids[:pre + lo * blk]:
            early[x] = True
        for x in ids[pre + (last + 1) * blk:]:
            ending[x] = True
    return where, ending, early


def _pattern_ok(prog: Compiled, pl: DependencyGraph, maps: tuple[list, list[bool], list[bool]],
                last: int, window: int) -> bool:
    """Checks 1 and 3 of the module docstring on the base's dependency graph
    (``maps`` from :func:`_block_map`; an id of -1 reads the "none" slot)."""
    where, ending, early = maps
    lo = last - window
    sig: dict[tuple[int, int], tuple] = {}
    rules = prog.structure.rule_of_action
    alloc, free = prog.structure.alloc_rule, prog.structure.free_rule
    xs = prog.transfer_s
    for i, prev, dep, sp, rp in pl.nodes:
        if ending[i]:
            if early[prev] or early[sp] or early[rp]:
                return False
            continue
        if ending[prev] or ending[sp] or ending[rp]:
            return False
        w = where[i]
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
    if any(early[before] for _ar, _opt, before in pl.tails):
        return False
    return not any(early[x] for ids in prog.last_backward for x in ids)


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
    """Each rank's block ``last`` frees what it allocates (to rounding)."""
    alloc, free = prog.mem_alloc, prog.mem_free
    for r, ids in enumerate(prog.structure.compute_ids):
        pre, blk = period.prefix[r], period.block[r]
        block = ids[pre + last * blk: pre + (last + 1) * blk]
        grown, freed = sum(alloc[x] for x in block), sum(free[x] for x in block)
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
    if blocks is None:
        return STOP
    last = min(blocks) - 1
    if last - WINDOW < 0:
        return GROW
    if not _balanced(ev.prog, period, last):
        return STOP
    maps = _block_map(ev.prog, period, last, WINDOW)
    if not _pattern_ok(ev.prog, plan(ev.prog), maps, last, WINDOW):
        return GROW
    shift = _progression(ev, period, last, WINDOW)
    if shift is None or shift < 0:
        return GROW
    tr = ev.trace
    top = max((e for rows in tr.buckets for _c, _s, e in rows), default=0.0)
    for r, rows in enumerate(tr.acts):
        for _aid, _s, e in rows[period.prefix[r] + (last + 1) * period.block[r]:]:
            if e > top:  # max(top, e), written as the comparison it makes
                top = e
    return (last, shift) if top == tr.makespan else GROW


def _block_breakdown(tr: EventLog, period: Period, last: int
                     ) -> list[tuple[float, float, float]]:
    """What block ``last`` adds to each entity's breakdown: the breakdown of the
    last step before it plus the block, less that step's alone (both start from
    the same state, so only the block's share remains)."""
    out = []
    for e, s in enumerate(tr.stage_of):
        first = period.prefix[s] + last * period.block[s]
        rows = tr.acts[e][first - 1: first + period.block[s]]
        out.append(tuple(x - y for x, y in zip(rank_breakdown(tr, e, rows),
                                              rank_breakdown(tr, e, rows[:1]), strict=True)))
    return out


def _flops_of(prog: Compiled, ids: tuple[int, ...]) -> tuple[float, float]:
    """Model and recomputation FLOPs of the actions ``ids``, counted as
    ``Compiled.flops`` and ``Compiled.recompute_flops`` count them."""
    fl = prog.rule_values[6]
    rule = prog.structure.rule_of_action
    model = rec = 0.0
    for x in ids:
        k = prog.actions[x].kind
        if k in FORWARD_KINDS:
            model += fl[rule[x]]
        elif k in RECOMPUTING_KINDS:
            rec += fl[rule[x]]
    return model, rec


def _extend(ev: Evaluated, period: Period, last: int, shift: float, k: int) -> Extended:
    """The figures with ``k`` more blocks than the base ``ev``."""
    tr, prog = ev.trace, ev.prog
    pre, blk = period.prefix, period.block
    figures = []
    for r, add in zip(ev.result.ranks, _block_breakdown(tr, period, last), strict=True):
        base = (r.compute_s, r.recompute_s, r.exposed_comm_s)
        figures.append((r.rank, r.stage, *(b + k * x for b, x in zip(base, add, strict=True)),
                        r.peak_memory_bytes))
    fl = rf = 0.0
    for r, ids in enumerate(prog.structure.compute_ids):
        f, c = _flops_of(prog, ids[pre[r] + last * blk[r]: pre[r] + (last + 1) * blk[r]])
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
