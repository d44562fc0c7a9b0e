"""The exact fast evaluator: contention-free critical path over the schedule's
dependency graph.

Under the IR's semantics (merak_sim/schedule/ir.py) with fixed durations and
contention-free transfers, every time is a longest path: a compute action starts at
``max(end of the previous compute action on its rank, end of the transfer it
consumes)`` and a transfer starts when both its send and its receive are posted, i.e.
at the later of the ends of the compute actions preceding the two postings; the AR of
the two ranks of a tied embedding (``Compiled.tied_ar``) is a rendezvous: each rank's AR
starts when that rank reaches it and its reduction begins when the later of the two
has (so the wait shows inside the AR, as the runtime records it). The
processing order that makes every dependency available is a property of the schedule
alone, so :func:`plan` computes it once (integer arrays) and :func:`evaluate` with it
is a single pass of additions and maxima, which the planner can call for many cost
tables of the same schedule. Without a plan, :func:`evaluate` times the ranks in
sweeps down and up the pipeline, each rank as far as its transfers allow (one pass
that finds an order as it goes, from the structure's arrays; a cold evaluation pays
for no dependency list), and the transfers' times follow from their ends' with numpy.
Any order that makes every dependency available gives the same floats, since each
time is the same maxima and additions of the same values. It is the same arithmetic
the discrete-event engine performs event by event with contention off, which is why
the two agree to rounding.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np

from merak_sim.schedule.execute import execute
from merak_sim.schedule.ir import Kind, ScheduleError

from .buckets import chunk_buckets, overlapped_share
from .program import Compiled
from .structure import OP_AR, OP_POST, ProgramStructure

__all__ = ["DependencyGraph", "Evaluation", "plan", "evaluate", "ar_buckets", "rank_tails"]


@dataclass(frozen=True)
class DependencyGraph:
    """Dependency structure of a compiled schedule, in a valid processing order.

    Attributes:
        nodes: ``(action_id, previous action id on the rank or -1, consumed transfer
            or -1, action id before the send's posting or -1, action id before the
            receive's posting or -1)`` for every compute action except AR and OPT,
            in an order where every referenced action comes first.
        tails: per rank, (AR action id or -1, OPT action id or -1, action id before
            AR or -1).
    """

    nodes: tuple[tuple[int, int, int, int, int], ...]
    tails: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Evaluation:
    """Times of one contention-free evaluation.

    Attributes:
        makespan: end of the last action or transfer.
        start, end: per action id (AR: its collective interval on the collective
            stream when overlapped).
        xfer_start, xfer_end: per transfer id.
        buckets: per rank, (chunk, start, end) of each gradient bucket (overlapped AR,
            and the ZeRO-1 all-gather after OPT as chunk -1), else empty.
        arrays: where the ranks were timed without a graph, (start, end, xfer_start,
            xfer_end) as numpy arrays too (what the trace reads); else None.
    """

    makespan: float
    start: list[float]
    end: list[float]
    xfer_start: list[float]
    xfer_end: list[float]
    buckets: tuple[tuple[tuple[int, float, float], ...], ...]
    arrays: tuple[np.ndarray, ...] | None = field(default=None, compare=False, repr=False)


#: Dependency graphs by program structure: the order is a property of the schedule.
_GRAPHS: weakref.WeakKeyDictionary[ProgramStructure, DependencyGraph] = \
    weakref.WeakKeyDictionary()


def plan(prog: Compiled) -> DependencyGraph:
    """Order the compute actions so that every dependency comes first (a rank runs
    until it needs a transfer whose send is not posted yet); computed once per
    :class:`~merak_sim.sim.structure.ProgramStructure`, so every pricing of one
    schedule object shares it."""
    pl = _GRAPHS.get(prog.structure)
    if pl is None:
        pl = _GRAPHS[prog.structure] = _order(prog)
    return pl


def _order(prog: Compiled) -> DependencyGraph:
    """:func:`plan`'s walk."""
    S = prog.num_ranks
    nx = len(prog.transfer_s)
    send_prev = [None] * nx
    recv_prev = [-1] * nx
    last = [-1] * S
    nodes = []
    tails = [[-1, -1, -1] for _ in range(S)]
    waiting: dict[int, list[int]] = {}
    ready = list(range(S))[::-1]
    actions = prog.actions
    optimizer = Kind.OPTIMIZER
    post, all_reduce = OP_POST, OP_AR
    # Each rank's ops read through one iterator per rank (rank_ops): it keeps
    # the rank's place between runs, and ``held`` the (action, transfer) of the op
    # a rank stopped at, taken up first when it runs again.
    runs = [prog.structure.rank_ops(r) for r in range(S)]
    held: list[tuple[int, int] | None] = [None] * S
    done = [False] * S

    add = nodes.append
    while ready:
        r = ready.pop()
        lr = last[r]
        tail = tails[r]
        h = held[r]
        if h is not None:
            x, y = h
            if send_prev[y] is None:
                waiting.setdefault(y, []).append(r)
                continue
            add((x, lr, y, send_prev[y], recv_prev[y]))
            lr = x
            held[r] = None
        for code, x, y in runs[r]:
            if code == post:
                if y:
                    send_prev[x] = lr
                    if x in waiting:
                        ready.extend(waiting.pop(x))
                else:
                    recv_prev[x] = lr
            elif code == all_reduce:
                tail[0] = x
                tail[2] = lr
                lr = x
            elif y < 0:
                if actions[x].kind is optimizer:
                    tail[1] = x
                    if tail[0] < 0:
                        tail[2] = lr
                else:
                    add((x, lr, -1, -1, -1))
                lr = x
            elif send_prev[y] is None:
                waiting.setdefault(y, []).append(r)
                held[r] = (x, y)
                break
            else:
                add((x, lr, y, send_prev[y], recv_prev[y]))
                lr = x
        else:
            done[r] = True
        last[r] = lr
    if not all(done):
        # Let the reference interpreter produce its rank x step grid.
        execute(prog.schedule, lambda a: 1.0)
        raise ScheduleError(f"schedule {prog.schedule.name!r} deadlocks")
    for t, sp in enumerate(send_prev):
        if sp is None:
            raise ScheduleError(f"transfer {prog.transfers[t].key} is never sent")
    return DependencyGraph(tuple(nodes), tuple(tuple(t) for t in tails))


def ar_buckets(
    prog: Compiled,
    rank: int,
    start: list[float],
    end: list[float],
    buckets: int,
    zero: int,
) -> list[tuple[int, float, float]]:
    """(chunk, ready time, duration) of each gradient bucket of ``rank`` when the
    data-parallel reduction overlaps the last backwards (:mod:`merak_sim.sim.buckets`)."""
    out = []
    for (chunk, ar_s), aid in zip(prog.ar_chunks[rank], prog.last_backward[rank], strict=False):
        s = start[aid]
        out += [(chunk, ready, d)
                for ready, d in chunk_buckets(s, end[aid] - s, ar_s, buckets, zero)]
    return out


def _finish_ranks(prog: Compiled, pl: DependencyGraph, start: list[float], end: list[float],
                  overlap_dp: bool, buckets: int, zero: int
                  ) -> list[tuple[tuple[int, float, float], ...]]:
    """Time every rank's AR and OPT (in place) once its last compute action is timed;
    returns each rank's gradient buckets (see :class:`Evaluation`)."""
    dur = prog.duration_s
    # The tied ranks' AR is a rendezvous: neither passes it before both reached it.
    meet = max((end[pl.tails[prog.rank_of_action[x]][2]] for x in prog.tied_ar),
               default=None)
    all_buckets = []
    for r, (ar, opt, before) in enumerate(pl.tails):
        clock = end[before]
        rb: list[tuple[int, float, float]] = []
        if ar >= 0:
            if overlap_dp and prog.ar_chunks[r]:
                cs = 0.0
                first = None
                for ch, ready, d in ar_buckets(prog, r, start, end, buckets, zero):
                    s0 = ready if ready > cs else cs
                    cs = s0 + d
                    rb.append((ch, s0, cs))
                    if first is None:
                        first = s0
                start[ar] = first if first is not None else clock
                if ar in prog.tied_ar and meet > cs:
                    cs = meet
                end[ar] = cs
                if cs > clock:
                    clock = cs
            else:
                # the AR starts when its rank reaches it; a tied rank waits inside it
                start[ar] = clock
                if ar in prog.tied_ar and meet > clock:
                    clock = meet
                clock += dur[ar]
                end[ar] = clock
        if opt >= 0:
            start[opt] = clock
            clock += dur[opt]
            end[opt] = clock
            if ar >= 0 and overlap_dp and zero == 1 and rb:
                ag = dur[ar] * (1 - overlapped_share(zero))
                rb.append((-1, clock, clock + ag))
                clock += ag
        all_buckets.append(tuple(rb))
    return all_buckets


def evaluate(
    prog: Compiled,
    pl: DependencyGraph | None = None,
    *,
    overlap_dp: bool = False,
    buckets: int = 1,
    zero: int = 0,
) -> Evaluation:
    """Exact contention-free times of every action and transfer of ``prog``.

    Args:
        pl: a precomputed :func:`plan`, walked in its order; without one the ranks
            are timed as they run (:func:`_run_times`, one pass that finds the order
            as it goes; the same additions and maxima, so the same times).
        overlap_dp: overlap the data-parallel gradient reduction with the last
            backwards (bucketed, see :func:`ar_buckets`); otherwise AR runs on the
            compute stream after the last backward.
        buckets: gradient buckets per chunk when overlapping.
        zero: ZeRO stage (1: only the reduce-scatter half overlaps).
    """
    run = None if pl is not None else _run_times(prog)
    arrays = None
    if run is None:
        if pl is None:
            pl = plan(prog)
        start, end, xs, xe = _graph_times(prog, pl)
    else:
        start, end, pl = run
    all_buckets = _finish_ranks(prog, pl, start, end, overlap_dp, buckets, zero)
    start.pop()
    end.pop()
    if run is not None:  # every end is known now: the transfers' times from them
        ends = np.array(end, dtype=float)
        arrays = (np.array(start, dtype=float), ends, *_transfer_times(prog, ends))
        xs, xe = arrays[2].tolist(), arrays[3].tolist()
    if arrays is not None:  # the same maximum, over the arrays
        makespan = max(float(arrays[1].max(initial=0.0)), float(arrays[3].max(initial=0.0)))
    else:
        makespan = max(max(end, default=0.0), max(xe, default=0.0))
    for rb in all_buckets:
        for _c, _s, e in rb:
            if e > makespan:
                makespan = e
    return Evaluation(makespan, start, end, xs, xe, tuple(all_buckets), arrays)


def _graph_times(prog: Compiled, pl: DependencyGraph
                 ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Start and end of every compute action (one slot more, index -1: 0.0) and of
    every transfer, walking ``pl``'s nodes in order; AR and OPT are left to
    :func:`_finish_ranks`."""
    n = len(prog.actions)
    dur = prog.duration_s
    xdur = prog.transfer_s
    nx = len(xdur)
    # Index -1 reads the extra last slot, which stays 0.0: "no predecessor".
    start = [0.0] * (n + 1)
    end = [0.0] * (n + 1)
    xs = [0.0] * nx
    xe = [0.0] * nx
    for i, prev, dep, sp, rp in pl.nodes:
        t = end[prev]
        if dep >= 0:
            a = end[sp]
            b = end[rp]
            if b > a:
                a = b
            xs[dep] = a
            a += xdur[dep]
            xe[dep] = a
            if a > t:
                t = a
        start[i] = t
        end[i] = t + dur[i]
    return start, end, xs, xe


def rank_tails(prog: Compiled) -> tuple[list[int], list[int], list] | None:
    """Per rank, the end (exclusive) of its per-micro-batch actions and its
    (AR, OPT, action before them) as :attr:`DependencyGraph.tails`; None where a rank
    does not end in them (AR then OPT, either alone, or neither) or a posting follows
    them, which only the walk of :func:`plan` times."""
    fa = prog.structure.arrays
    first = fa.first.tolist()
    kind = fa.kind
    ar, opt = Kind.ALL_REDUCE.code, Kind.OPTIMIZER.code
    tail_kinds = (kind == ar) | (kind == opt)
    ends, tails = [], []
    for r in range(len(first) - 1):
        lo, hi = first[r], first[r + 1]
        k = kind[lo:hi].tolist()
        stop = hi
        while stop > lo and k[stop - lo - 1] in (ar, opt):
            stop -= 1
        got = k[stop - lo:]
        if got not in ([], [ar], [opt], [ar, opt]):
            return None
        ends.append(stop)
        tails.append((stop if got and got[0] == ar else -1, hi - 1 if got and got[-1] == opt
                      else -1, stop - 1 if stop > lo else -1))
    posts = np.concatenate([fa.send_prev, fa.recv_prev])
    if tail_kinds.sum() != sum(hi - e for hi, e in zip(first[1:], ends, strict=True)) or \
            tail_kinds[posts[posts >= 0]].any():
        return None
    return ends, first, tails


def _run_times(prog: Compiled) -> tuple[list[float], list, DependencyGraph] | None:
    """:func:`_graph_times` without a graph: the ranks run in sweeps (down the
    pipeline, then up), each timing its actions until one needs a transfer whose send
    is not posted yet (the action before the send not timed yet), until every rank is
    done (:func:`_transfer_times` then gives the transfers' times). Also the graph's
    tails; None where :func:`rank_tails` says the walk of :func:`plan` must time
    it."""
    got = rank_tails(prog)
    if got is None:
        return None
    stop, first, tails = got
    fa = prog.structure.arrays
    n = len(prog.duration_s)
    has = fa.consumed >= 0
    dep = np.where(has, fa.consumed, 0)
    # Per action: the end slots its transfer's start reads and its time (one slot
    # more, so that a schedule without transfers reads from it). Where the receive
    # is posted right after the action before (the lowering's place for it: the
    # receive's end slot is then the rank's clock), ``sp`` is the send's slot;
    # elsewhere -3 - that slot, and ``rp`` the receive's; -2 without a transfer.
    ids = np.arange(n)
    sp = np.append(fa.send_prev, -2)[dep]
    rp = np.append(fa.recv_prev, -1)[dep]
    rank_first = np.zeros(n, dtype=bool)
    rank_first[np.array(first[:-1])[np.array(first[:-1]) < n]] = True
    after = (rp == ids - 1) | ((rp == -1) & rank_first)
    sp = np.where(has, np.where(after, sp, -3 - sp), -2).tolist()
    rp = rp.tolist()
    xd = np.append(np.asarray(prog.transfer_s, dtype=float), 0.0)[dep].tolist()
    start = [0.0] * (n + 1)
    end: list = [None] * n + [0.0]  # None: not timed yet; index -1: no predecessor
    if not _sweep(stop, first[:-1], sp, rp, xd, prog.duration_s, start, end):
        # Let the reference interpreter produce its rank x step grid.
        execute(prog.schedule, lambda a: 1.0)
        raise ScheduleError(f"schedule {prog.schedule.name!r} deadlocks")
    return start, end, DependencyGraph((), tuple(tails))


def _sweep(stop: list[int], pos: list[int], sp: list[int], rp: list[int], xd: list[float],
           dur: tuple[float, ...], start: list[float], end: list) -> bool:
    """Time every rank's actions ``pos[r]`` .. ``stop[r] - 1`` in sweeps (see
    :func:`_run_times`); False where a sweep times nothing and some are left (a
    deadlock)."""
    S = len(stop)
    clock = [0.0] * S
    orders = (list(range(S)), list(range(S))[::-1])
    left = sum(stop) - sum(pos)
    sweeps = 0
    while left:
        timed = 0
        for r in orders[sweeps & 1]:
            i0, hi = pos[r], stop[r]
            if i0 == hi:
                continue
            t = clock[r]
            for i in range(i0, hi):
                p = sp[i]
                if p > -2:  # the receive's end is the clock ``t``
                    a = end[p]
                    if a is None:  # its send is not posted yet
                        break
                    if t > a:
                        a = t
                    a += xd[i]
                    if a > t:
                        t = a
                elif p < -2:
                    a = end[-3 - p]
                    if a is None:
                        break
                    b = end[rp[i]]
                    if b > a:
                        a = b
                    a += xd[i]
                    if a > t:
                        t = a
                start[i] = t
                t += dur[i]
                end[i] = t
            else:
                i = hi
            timed += i - i0
            pos[r] = i
            clock[r] = t
        if not timed:
            return False
        left -= timed
        sweeps += 1
    return True


def _transfer_times(prog: Compiled, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every transfer that a compute action consumes (0.0 for the
    others, as the walk leaves them): the later end of the actions before its two
    postings, plus its time (the walk's maximum and addition)."""
    fa = prog.structure.arrays
    nx = len(prog.transfer_s)
    xs = np.zeros(nx)
    xe = np.zeros(nx)
    used = np.zeros(nx, dtype=bool)
    used[fa.consumed[fa.consumed >= 0]] = True
    used = np.flatnonzero(used)
    if len(used):
        ends = np.append(end, 0.0)  # slot -1: no action before
        a, b = ends[fa.send_prev[used]], ends[fa.recv_prev[used]]
        xs[used] = np.where(b > a, b, a)
        xe[used] = xs[used] + np.asarray(prog.transfer_s, dtype=float)[used]
    return xs, xe
