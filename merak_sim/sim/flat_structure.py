"""The cost-independent half of a compiled schedule, built from its rows with numpy.

:func:`~merak_sim.sim.structure.program_structure` walks a schedule's Action programs
once (about 5 us per micro-batch pass); for a schedule held as
:class:`~merak_sim.schedule.arrays.StepRows` (an
:class:`~merak_sim.schedule.arrays.ArraySchedule`) :func:`structure_fields` computes
the same :class:`~merak_sim.sim.structure.ProgramStructure` fields with array
operations and no sort: ids numbered by first appearance in the walk's order (ranks in
turn, each in program order) come from ``np.minimum.at`` over dense keys, and an
item's liveness history from the few occurrences each (chunk, micro-batch) item has.
Fields that only some consumers read (the Action objects, the op words, the
per-rank dictionaries) are built on first use (:class:`Deferred`, :class:`PerRank`).
:class:`FlatArrays` keeps the integer arrays the fast evaluator reads
(:mod:`merak_sim.sim.flat_eval`). A schedule these arrays cannot represent the way
the walk does (a transfer without both ends, a receive after its consumer, a history
too long for 64-bit codes) returns None, and the caller walks it, which also words
the error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from merak_sim.schedule.arrays import KIND_OF_CODE, StepRows, model_stages
from merak_sim.schedule.ir import Kind, Schedule
from merak_sim.schedule.liveness import Held
from merak_sim.schedule.placement import placed_rank, placed_stage
from merak_sim.schedule.unchecked import action

from .deferred import Deferred, PerRank
from .ops import OP_AR, OP_COMPUTE, OP_POST

__all__ = ["FlatArrays", "structure_fields", "history_of_code",
           "flat_arrays_of_ops"]

_F, _FN, _R, _B, _I, _W = (k.code for k in (Kind.FORWARD, Kind.FORWARD_NOGRAD,
                                            Kind.RECOMPUTE, Kind.BACKWARD,
                                            Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT))
_SA, _RA, _SG, _RG = (k.code for k in (Kind.SEND_ACT, Kind.RECV_ACT, Kind.SEND_GRAD,
                                       Kind.RECV_GRAD))
_AR, _OPT = Kind.ALL_REDUCE.code, Kind.OPTIMIZER.code
_NK = len(Kind)
#: History codes hold at most this many states (4 ** 31 < 2 ** 63).
_MOST_STATES = 30


@dataclass(frozen=True, eq=False)
class FlatArrays:
    """The integer arrays of a program structure that the fast evaluator reads.

    Attributes:
        first: rank r's actions (compute, AR and OPT) have ids ``first[r]`` ..
            ``first[r + 1] - 1`` (int64, ranks + 1).
        kind: :attr:`~merak_sim.schedule.ir.Kind.code` per action id (int64).
        consumed: per action id, the transfer it waits for, or -1 (int64).
        send_prev, recv_prev: per transfer id, the compute action before the posting
            of its send (receive) on that rank, or -1 (int64).
        rule, alloc, free: per action id, its cost rule and its memory rules (the
            structure's ``rule_of_action``, ``alloc_rule``, ``free_rule``; int64).
        chunk: per action id, its chunk (int64).
        send_rank, recv_rank: per transfer id, the ranks posting its send and its
            receive (int64).
    """

    first: np.ndarray
    kind: np.ndarray
    consumed: np.ndarray
    send_prev: np.ndarray
    recv_prev: np.ndarray
    rule: np.ndarray
    alloc: np.ndarray
    free: np.ndarray
    chunk: np.ndarray
    send_rank: np.ndarray
    recv_rank: np.ndarray


def history_of_code(code: int) -> tuple[Held, ...]:
    """The states an item entered, from its integer code (base 4, the first state the
    most significant digit, each digit the state + 1)."""
    out: list[Held] = []
    while code:
        code, d = divmod(code, 4)
        out.append(Held(d - 1))
    return tuple(reversed(out))


def _first_numbered(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(id of each key, position of each id's first occurrence) with the distinct
    non-negative ``keys`` numbered by first occurrence, as a walk that hands out ids
    as it meets keys numbers them."""
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    top = int(keys.max()) + 1
    if top > 8 * n + 4096:  # sparse keys: dense ones first (one sort)
        _u, keys = np.unique(keys, return_inverse=True)
        top = len(_u)
    first = np.full(top, n, dtype=np.int64)
    np.minimum.at(first, keys, np.arange(n, dtype=np.int64))
    is_first = np.zeros(n, dtype=bool)
    is_first[first[first < n]] = True
    return (np.cumsum(is_first) - 1)[first[keys]], np.flatnonzero(is_first)


def _row_ids(values: np.ndarray) -> tuple:
    """A tuple of Python ints (what the walk's tuples hold)."""
    return tuple(values.tolist())


def _actions(kind: np.ndarray, rank: np.ndarray, mb: np.ndarray, ch: np.ndarray) -> list:
    """Action objects of rows (unchecked: they came from checked actions or ranges)."""
    kinds = KIND_OF_CODE
    return [action(kinds[k], r, m, c) for k, r, m, c in
            zip(kind.tolist(), rank.tolist(), mb.tolist(), ch.tolist(), strict=True)]


def _rank_words(bounds: list[int], words: Deferred, r: int) -> tuple:
    return tuple(words[0][3 * bounds[r]: 3 * bounds[r + 1]])


def _rank_consumed(first: list[int], consumed: np.ndarray, r: int) -> dict[int, int]:
    lo = first[r]
    part = consumed[lo: first[r + 1]]
    at = np.flatnonzero(part >= 0)
    return dict(zip((at + lo).tolist(), part[at].tolist(), strict=True))


def _rank_ids(first: list[int], r: int) -> tuple[int, ...]:
    return tuple(range(first[r], first[r + 1]))


@dataclass(frozen=True)
class _Rows:
    """The columns the build reads, with the walk's derived ones."""

    kind: np.ndarray
    rank: np.ndarray
    mb: np.ndarray
    ch: np.ndarray
    g: np.ndarray
    comm: np.ndarray
    aid: np.ndarray  # per row: id of the last compute action at or before it
    first: np.ndarray  # per rank: first action id (ranks + 1)


def _columns(sched: Schedule, rows: StepRows) -> _Rows:
    kind = rows.kind.astype(np.int64)
    comm = (kind >= _SA) & (kind <= _RG)
    counted = np.concatenate([[0], np.cumsum(~comm)])  # compute rows before each row
    return _Rows(kind, rows.rank, rows.microbatch, rows.chunk,
                 model_stages(rows, sched.placement, sched.virtual_stages), comm,
                 counted[1:] - 1, counted[rows.bounds])


def _transfers(c: _Rows, width: int) -> dict | None:
    """Transfer ids of the sends and receives (numbered as the walk meets them), their
    ends and boundaries, or None where a transfer lacks an end or has two."""
    ci = np.flatnonzero(c.comm)
    kc = c.kind[ci]
    is_send = (kc == _SA) | (kc == _SG)
    grad = kc >= _SG
    src = c.g[ci] + (kc == _RG) - (kc == _RA)
    key = c.mb[ci] * width + (src + 1) * 2 + grad
    tid, firsts = _first_numbered(key)
    nt = len(firsts)
    st, rt = tid[is_send], tid[~is_send]
    if len(st) != nt or len(rt) != nt or (nt and not (
            np.bincount(st, minlength=nt).max() == 1 == np.bincount(rt, minlength=nt).max())):
        return None
    send_row = np.empty(nt, dtype=np.int64)
    recv_row = np.empty(nt, dtype=np.int64)
    send_row[st] = ci[is_send]
    recv_row[rt] = ci[~is_send]
    # the compute action before each posting on its rank, or -1
    before = np.where(c.aid >= c.first[c.rank], c.aid, -1)
    bound = np.empty(nt, dtype=np.int64)
    bound[tid] = src - grad
    return dict(rows=ci, tid=tid, is_send=is_send, key=key, first_row=ci[firsts],
                send_row=send_row, recv_row=recv_row, send_prev=before[send_row],
                recv_prev=before[recv_row], bound=bound)


def _consumed(sched: Schedule, c: _Rows, ai: np.ndarray, xf: dict, width: int
              ) -> np.ndarray | None:
    """Per compute action, the transfer it waits for or -1; None where a consumer
    comes before any end of its transfer in the walk."""
    S, G = sched.num_stages, sched.num_model_stages
    holder = np.array([placed_rank(sched.placement, S, x)[0] for x in range(G)] + [-1, -1],
                      dtype=np.int64)
    local = holder[:-1] == holder[1:]  # model stages x and x + 1 on one rank
    local[G - 1:] = False
    k, g = c.kind[ai], c.g[ai]
    fwd = ((k == _F) | (k == _FN)) & (g > 0)
    fwd &= ~local[np.maximum(g - 1, 0)]
    bwd = ((k == _B) | (k == _I)) & (g < G - 1) & ~local[g]
    src = np.where(fwd, g - 1, g + 1)
    key = np.where(fwd | bwd, c.mb[ai] * width + (src + 1) * 2 + bwd, -1)
    out = np.full(len(ai), -1, dtype=np.int64)
    need = np.flatnonzero(key >= 0)
    if not len(need):
        return out
    top = max(int(xf["key"].max(initial=-1)), int(key.max())) + 1
    tid_of = np.full(top, -1, dtype=np.int64)
    tid_of[xf["key"]] = xf["tid"]
    t = tid_of[key[need]]
    if np.any(t < 0) or np.any(xf["first_row"][np.maximum(t, 0)] > ai[need]):
        return None
    out[need] = t
    return out


def _rules(sched: Schedule, c: _Rows, ai: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
    """Per compute action its cost rule id, and the rules, as the walk numbers them
    (:attr:`~merak_sim.sim.structure.ProgramStructure.rules`)."""
    S, v = sched.num_stages, sched.virtual_stages
    k, rank, ch, mb = c.kind[ai], c.rank[ai], c.ch[ai], c.mb[ai]
    per_mb = (k != _AR) & (k != _OPT)
    flag = np.zeros(len(ai), dtype=bool)
    rebuilt = k == _R
    if rebuilt.any():  # B and I read whether an explicit R ran for their item
        top = int(mb.max()) + 1
        item = (rank * v + ch) * top + np.maximum(mb, 0)
        table = np.zeros(S * v * top, dtype=bool)
        table[item[rebuilt]] = True
        flag = ((k == _B) | (k == _I)) & table[item]
    key = ((rank * _NK + k) * v + np.where(per_mb, ch, 0)) * 2 + flag
    rid, firsts = _first_numbered(key)
    rules: list[tuple] = []
    for kk, r, cc, f, pm in zip(k[firsts].tolist(), rank[firsts].tolist(),
                                ch[firsts].tolist(), flag[firsts].tolist(),
                                per_mb[firsts].tolist(), strict=True):
        kind = KIND_OF_CODE[kk]
        rules.append((kind, placed_stage(sched.placement, S, r, cc), f, r) if pm
                     else (kind, r))
    return rid, rules


def _histories(c: _Rows, ai: np.ndarray, v: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(compute actions that enter or free a state, the state entered or -1, whether
    it frees, the item's history code there: after the entry, or what a free
    releases, 0 if its item is not live), as the walk's ``history`` keeps them."""
    k = c.kind[ai]
    enters = np.select([k == _F, k == _FN, k == _R],
                       [int(Held.STASH), int(Held.INPUT), int(Held.REBUILT)], -1)
    frees = (k == _B) | (k == _W)
    ev = np.flatnonzero((enters >= 0) | frees)
    e, f = enters[ev], frees[ev]
    mb = c.mb[ai[ev]]
    top = int(mb.max(initial=0)) + 1
    item = (c.rank[ai[ev]] * v + c.ch[ai[ev]]) * top + mb
    code = np.zeros(len(ev), dtype=np.int64)
    last = np.full(int(item.max(initial=0)) + 1, -1, dtype=np.int64)
    left = np.arange(len(ev), dtype=np.int64)
    level = 0
    while left.size:  # the items' first occurrences left, then the next ones
        level += 1
        if level > _MOST_STATES:
            return None
        it = item[left]
        firstpos = np.full(len(last), len(ev), dtype=np.int64)
        np.minimum.at(firstpos, it, left)
        sel = firstpos[it] == left
        now = left[sel]
        p = last[item[now]]
        base = np.where((p >= 0) & ~f[np.maximum(p, 0)], code[np.maximum(p, 0)], 0)
        code[now] = np.where(e[now] >= 0, base * 4 + e[now] + 1, base)
        last[item[now]] = now
        left = left[~sel]
    return ev, e, f, code


def _memory(sched: Schedule, c: _Rows, ai: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, list] | None:
    """(alloc rule, free rule) per compute action and the memory rules, as the walk
    numbers them (:attr:`~merak_sim.sim.structure.ProgramStructure.memory_rules`)."""
    S, v = sched.num_stages, sched.virtual_stages
    got = _histories(c, ai, v)
    if got is None:
        return None
    ev, e, f, code = got
    makes = (e >= 0) | (f & (code > 0))
    at = ev[makes]
    frees = f[makes]
    ch = c.ch[ai[at]]
    rank = c.rank[ai[at]]
    mid, firsts = _first_numbered(((code[makes] * v + ch) * 2 + frees) * S + rank)
    alloc = np.zeros(len(ai), dtype=np.int64)
    free = np.zeros(len(ai), dtype=np.int64)
    alloc[at[~frees]] = mid[~frees] + 1
    free[at[frees]] = mid[frees] + 1
    rules: list = [None]
    for r, cc, cd, fr in zip(rank[firsts].tolist(), ch[firsts].tolist(),
                             code[makes][firsts].tolist(), frees[firsts].tolist(),
                             strict=True):
        rules.append((r, cc, history_of_code(cd), fr))
    return alloc, free, rules


def _per_rank(values: np.ndarray, rank: np.ndarray, S: int) -> tuple[tuple, ...]:
    """``values`` split by ``rank`` (non-decreasing), one tuple of ints per rank."""
    cut = np.searchsorted(rank, np.arange(S + 1))
    return tuple(tuple(values[cut[r]:cut[r + 1]].tolist()) for r in range(S))


def _chunk_facts(sched: Schedule, c: _Rows, ai: np.ndarray) -> dict:
    """Per rank: chunks with per-micro-batch actions, chunks in the order their last
    backward (B or W) comes and the ids of those backwards."""
    S, v = sched.num_stages, sched.virtual_stages
    per_mb = (c.kind != _AR) & (c.kind != _OPT)
    present = (np.bincount((c.rank * v + c.ch)[per_mb], minlength=S * v) > 0).reshape(S, v)
    k = c.kind[ai]
    bw = (k == _B) | (k == _W)
    last = np.full(S * v, -1, dtype=np.int64)
    np.maximum.at(last, c.rank[ai[bw]] * v + c.ch[ai[bw]], np.flatnonzero(bw))
    order, ids = [], []
    for r in range(S):
        row = last[r * v:(r + 1) * v].tolist()
        chs = sorted((ch for ch in range(v) if row[ch] >= 0), key=row.__getitem__)
        order.append(tuple(chs))
        ids.append(tuple(row[ch] for ch in chs))
    return dict(chunks=tuple(tuple(np.flatnonzero(present[r]).tolist()) for r in range(S)),
                ar_order=tuple(order), last_backward=tuple(ids))


def _op_words(c: _Rows, xf: dict, consumed: np.ndarray) -> tuple[list[int]]:
    """Three words per row (:class:`~merak_sim.sim.structure.ProgramStructure`
    ``op_words``), flattened, as a list in a 1-tuple (built on first use)."""
    n = len(c.kind)
    words = np.empty((n, 3), dtype=np.int64)
    words[:, 0] = np.where(c.kind == _AR, OP_AR, OP_COMPUTE)
    words[:, 1] = c.aid
    words[:, 2] = -1
    words[~c.comm, 2] = consumed  # -1 for AR and OPT
    ci = xf["rows"]
    words[ci, 0] = OP_POST
    words[ci, 1] = xf["tid"]
    words[ci, 2] = xf["is_send"]
    return (words.ravel().tolist(),)


def structure_fields(sched: Schedule, rows: StepRows) -> dict | None:
    """Keyword arguments of :class:`~merak_sim.sim.structure.ProgramStructure` for the
    lowered ``sched`` held as ``rows``, equal to the walk's (module docstring; lazy
    fields as :class:`Deferred` and :class:`PerRank`), plus ``flat``
    (:class:`FlatArrays`); None where the walk must build it."""
    S = sched.num_stages
    width = 2 * (sched.num_model_stages + 2)  # the walk's transfer numbers
    c = _columns(sched, rows)
    ai = np.flatnonzero(~c.comm)
    xf = _transfers(c, width)
    consumed = None if xf is None else _consumed(sched, c, ai, xf, width)
    mem = None if consumed is None else _memory(sched, c, ai)
    if mem is None:
        return None
    rid, rules = _rules(sched, c, ai)
    k, rank = c.kind[ai], c.rank[ai]
    first = c.first.tolist()
    bounds = rows.bounds.tolist()
    model = (k == _F) | (k == _FN)
    rec = (k == _R) | (k == _B) | (k == _I)
    act = (k, rank, c.mb[ai], c.ch[ai])
    ends = [tuple(getattr(c, f)[xf[row]] for f in ("kind", "rank", "mb", "ch"))
            for row in ("send_row", "recv_row")]
    return dict(
        schedule=sched,
        op_words=PerRank(S, partial(_rank_words, bounds, Deferred(
            partial(_op_words, c, xf, consumed), 1))),
        actions=Deferred(partial(_actions, *act), len(ai)),
        rank_of_action=Deferred(rank.tolist, len(ai)),
        num_actions=len(c.kind),
        transfer_sends=Deferred(partial(_actions, *ends[0]), len(xf["send_row"])),
        transfer_recvs=Deferred(partial(_actions, *ends[1]), len(xf["recv_row"])),
        transfer_boundary=_row_ids(xf["bound"]),
        rules=tuple(rules), rule_of_action=_row_ids(rid),
        memory_rules=tuple(mem[2]), alloc_rule=_row_ids(mem[0]), free_rule=_row_ids(mem[1]),
        flops_rules=_per_rank(rid[model], rank[model], S),
        recompute_rules=_per_rank(rid[rec], rank[rec], S),
        chunk_stages=tuple(tuple(sched.stage_of(r, ch) for ch in range(sched.virtual_stages))
                           for r in range(S)),
        compute_ids=PerRank(S, partial(_rank_ids, first)),
        consumed=PerRank(S, partial(_rank_consumed, first, consumed)),
        flat=FlatArrays(c.first, k, consumed, xf["send_prev"], xf["recv_prev"], rid,
                        mem[0], mem[1], c.ch[ai], c.rank[xf["send_row"]],
                        c.rank[xf["recv_row"]]),
        **_chunk_facts(sched, c, ai))


def flat_arrays_of_ops(op_words: Sequence[Sequence[int]], actions: Sequence,
                       rules: Sequence[Sequence[int]]) -> FlatArrays:
    """The :class:`FlatArrays` of a walked structure, from its op words, its actions
    (by id) and their rule, alloc and free rule ids (``rules``)."""
    first, consumed = [0], []
    send_prev: dict[int, int] = {}
    recv_prev: dict[int, int] = {}
    send_rank: dict[int, int] = {}
    recv_rank: dict[int, int] = {}
    for rank, words in enumerate(op_words):
        last = -1
        it = iter(words)
        for code, x, y in zip(it, it, it, strict=True):
            if code == OP_POST:
                (send_prev if y else recv_prev)[x] = last
                (send_rank if y else recv_rank)[x] = rank
                continue
            consumed.append(y)
            last = x
        first.append(len(consumed))
    nt = len(send_prev)

    def ints(values: Sequence[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    return FlatArrays(ints(first), ints([a.kind.code for a in actions]), ints(consumed),
                      ints([send_prev[t] for t in range(nt)]),
                      ints([recv_prev[t] for t in range(nt)]), *(ints(x) for x in rules),
                      ints([a.chunk for a in actions]), ints([send_rank[t] for t in range(nt)]),
                      ints([recv_rank[t] for t in range(nt)]))
