"""The cost-independent half of a compiled schedule (:class:`ProgramStructure`).

Ops, actions, transfers, which cost rule every action follows and which liveness
history its memory delta has depend on the schedule alone, so
:func:`program_structure` builds them once per schedule object and keeps the most
recent ones; :func:`~merak_sim.sim.program.compile_program` then prices a cost table
against them.

The build is one walk of the lowered programs. Facts that depend only on an
action's (kind, chunk) on its rank (model stage, consumed tensor, cost rule, peer)
are derived once per rank and reused for every micro-batch, and the liveness
history of an item is tracked as a small integer code next to its states, so the
walk hashes integers instead of enum members and tuples of them.

A schedule held as rows (:class:`~merak_sim.schedule.arrays.ArraySchedule`, what the
simulator builds from a few hundred passes on) is not walked: the same fields come
from array operations (:mod:`merak_sim.sim.flat_structure`), equal field by field
(tests/test_array_structure.py), the per-action objects only when read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from itertools import repeat

import numpy as np

from merak_sim.schedule.arrays import ArraySchedule, rows_of
from merak_sim.schedule.ir import Action, Kind, Schedule, ScheduleError
from merak_sim.schedule.liveness import FREES, REBUILDS, Held, entered_by
from merak_sim.schedule.lowering import comm_key, consumed_key

from .action_costs import gatherer
from .flat_structure import FlatArrays, flat_arrays_of_ops, structure_fields
from .ops import OP_AR, OP_COMPUTE, OP_POST

__all__ = ["ProgramStructure", "program_structure", "build_structure", "forget_structures",
           "OP_COMPUTE",
           "OP_POST", "OP_AR", "FORWARD_KINDS", "RECOMPUTING_KINDS"]


#: Kinds whose rule FLOPs count as model FLOPs, and as recomputation FLOPs.
FORWARD_KINDS = (Kind.FORWARD, Kind.FORWARD_NOGRAD)
RECOMPUTING_KINDS = (Kind.RECOMPUTE, Kind.BACKWARD, Kind.BACKWARD_INPUT)

#: How many schedules' structures :func:`program_structure` keeps (least recently
#: used dropped first): enough for a fit's rows or a planner's shapes in flight.
STRUCTURES_KEPT = 64
_STRUCTURES: OrderedDict[int, ProgramStructure] = OrderedDict()


@dataclass(frozen=True, eq=False)
class ProgramStructure:
    """The cost-independent half of a compiled schedule (module docstring); one per
    schedule object, hashed by identity.

    Attributes:
        schedule: the lowered schedule.
        op_words: per rank, its ops (:attr:`ops`) flattened, three integers per op:
            one tuple per rank, not one per op, so a cold evaluation allocates, and
            the cyclic collector walks, thousands of objects fewer.
        actions, rank_of_action, num_actions: as in
            :class:`~merak_sim.sim.program.Compiled`.
        transfer_sends, transfer_recvs: per transfer id, its send and its receive
            (:attr:`transfer_ends` pairs them with the tag).
        transfer_boundary: per transfer id, the model-stage boundary g it crosses
            (between g and g+1; its time is ``stages[g].send_activation_s``).
        rules: the distinct cost rules: ``(kind, model stage, explicit R ran for the
            micro-batch, rank)`` of a per-micro-batch action (the flag only for B and
            I, the two that read it), ``(kind, rank)`` of AR and OPT.
        rule_of_action: per action id, its index in ``rules``.
        memory_rules: the distinct memory rules ``(rank, chunk, history, frees)``:
            the states a live item entered so far (liveness history, program order),
            and whether the rule is the item's release (all it holds) rather than the
            growth at its last entry; index 0 is None, no change.
        alloc_rule, free_rule: per action id, index in ``memory_rules`` of what it
            allocates at its start and frees at its end.
        flops_rules, recompute_rules: per rank, rule ids of the actions adding model
            FLOPs (F, F*) and recompute FLOPs (R, B, I), in program order.
        chunks: per rank, chunks with per-micro-batch actions (AR and OPT sum them).
        chunk_stages: per rank, the model stage each of its chunks holds (as the
            schedule places it, :meth:`~merak_sim.schedule.ir.Schedule.model_stage`).
        ar_order: per rank, those chunks in the order their last backward comes.
        last_backward: per rank, action id of each of them (B or W).
        compute_ids: per rank, the ids of its compute actions (AR, OPT too), program
            order.
        consumed: per rank, action id -> id of the transfer it waits for.
        flat: the integer arrays the fast evaluator reads, where the array build
            made them (:attr:`arrays` derives them otherwise).

    Built from a schedule's rows (:mod:`merak_sim.sim.flat_structure`), the fields
    that only some consumers read (``actions``, ``op_words``, ``consumed`` ...) are
    sequences that build themselves on first use, equal to the walk's tuples.
    """

    schedule: Schedule
    op_words: tuple[tuple[int, ...], ...]
    actions: tuple[Action, ...]
    rank_of_action: tuple[int, ...]
    num_actions: int
    transfer_sends: tuple[Action, ...]
    transfer_recvs: tuple[Action, ...]
    transfer_boundary: tuple[int, ...]
    rules: tuple[tuple, ...]
    rule_of_action: tuple[int, ...]
    memory_rules: tuple[tuple[int, int, tuple[Held, ...], bool] | None, ...]
    alloc_rule: tuple[int, ...]
    free_rule: tuple[int, ...]
    flops_rules: tuple[tuple[int, ...], ...]
    recompute_rules: tuple[tuple[int, ...], ...]
    chunks: tuple[tuple[int, ...], ...]
    chunk_stages: tuple[tuple[int, ...], ...]
    ar_order: tuple[tuple[int, ...], ...]
    last_backward: tuple[tuple[int, ...], ...]
    compute_ids: tuple[tuple[int, ...], ...]
    consumed: tuple[dict[int, int], ...]
    flat: FlatArrays | None = None

    @cached_property
    def arrays(self) -> FlatArrays:
        """:attr:`flat`, or the same arrays derived from the op words."""
        if self.flat is not None:
            return self.flat
        return flat_arrays_of_ops(self.op_words, self.actions,
                                  (self.rule_of_action, self.alloc_rule, self.free_rule))

    def rank_ops(self, rank: int) -> Iterator[tuple[int, int, int]]:
        """Rank ``rank``'s ops as (code, x, y), read from :attr:`op_words` (one pass:
        the iterator keeps its place, so a reader can stop and go on)."""
        it = iter(self.op_words[rank])
        return zip(it, it, it, strict=True)

    @cached_property
    def ops(self) -> tuple[tuple[tuple[int, int, int], ...], ...]:
        """Per rank, its ops as in :class:`~merak_sim.sim.program.Compiled`, built
        from :attr:`op_words` on first use (the evaluator reads the words)."""
        return tuple(tuple(self.rank_ops(r)) for r in range(len(self.op_words)))

    @cached_property
    def gathers(self) -> dict[str, Callable[[list], tuple]]:
        """Per-action gathers from per-rule values ("action", "alloc", "free"), per
        transfer from per-boundary values ("transfer"), and per rank from per-rule
        values ("flops r", "recompute r"), built once."""
        out = {"action": gatherer(self.rule_of_action), "alloc": gatherer(self.alloc_rule),
               "free": gatherer(self.free_rule), "transfer": gatherer(self.transfer_boundary)}
        for r, (f, rc) in enumerate(zip(self.flops_rules, self.recompute_rules, strict=True)):
            out[f"flops {r}"] = gatherer(f)
            out[f"recompute {r}"] = gatherer(rc)
        return out

    @cached_property
    def transfer_ends(self) -> tuple[tuple[tuple[str, int, int], int, int, Action, Action],
                                     ...]:
        """Per transfer id, (comm key, src rank, dst rank, send, recv), built on first
        use (the evaluator reads none of it)."""
        sched = self.schedule
        return tuple((comm_key(sched, s), s.stage, r.stage, s, r)
                     for s, r in zip(self.transfer_sends, self.transfer_recvs, strict=True))

    @cached_property
    def tied_candidates(self) -> tuple[int, ...]:
        """AR action ids of the distinct ranks holding the first and the last model
        stage (the ranks a tied embedding joins) when there are two and both end in
        an AR, else ()."""
        last = len(self.op_words) * len(self.chunk_stages[0]) - 1 if self.op_words else -1
        ranks = sorted({r for r, stages in enumerate(self.chunk_stages)
                        for g in stages if g in (0, last)})
        if len(ranks) < 2:
            return ()
        if self.flat is not None:  # from the arrays: the op words are built on first use
            fa = self.flat
            ids = [int(lo) + x for r in ranks for lo in (fa.first[r],) for x in
                   np.flatnonzero(fa.kind[lo:fa.first[r + 1]] == Kind.ALL_REDUCE.code)]
            return tuple(ids) if len(ids) == 2 else ()
        ids = [x for r in ranks for code, x, _y in self.rank_ops(r) if code == OP_AR]
        return tuple(ids) if len(ids) == 2 else ()


def program_structure(sched: Schedule) -> ProgramStructure:
    """The :class:`ProgramStructure` of the lowered schedule ``sched``, built once per
    schedule object (the :data:`STRUCTURES_KEPT` most recent are kept): pricing the
    same schedule object again (a fit, a planner, a cached generator) skips the walk."""
    key = id(sched)
    ps = _STRUCTURES.get(key)
    if ps is not None and ps.schedule is sched:
        _STRUCTURES.move_to_end(key)
        return ps
    ps = build_structure(sched)
    # The entry holds the schedule, so its id cannot be reused while it is kept.
    _STRUCTURES[key] = ps
    while len(_STRUCTURES) > STRUCTURES_KEPT:
        _STRUCTURES.popitem(last=False)
    return ps


def build_structure(sched: Schedule, rows: bool | None = None) -> ProgramStructure:
    """A new :class:`ProgramStructure` of the lowered ``sched``: built from its rows
    with numpy (:mod:`merak_sim.sim.flat_structure`) where ``rows`` is True, or is None
    and ``sched`` is an :class:`~merak_sim.schedule.arrays.ArraySchedule`; else (or
    where the arrays cannot represent it) by one walk of its Action programs."""
    if rows is None:
        rows = isinstance(sched, ArraySchedule)
    if rows:
        fields = structure_fields(sched, rows_of(sched))
        if fields is not None:
            return ProgramStructure(**fields)
    return _build_structure(sched)


def forget_structures() -> None:
    """Drop every kept structure (the next pricing of any schedule walks it again)."""
    _STRUCTURES.clear()


def _tag_base(tensor: str, src: int) -> int:
    """The part of a transfer's integer number that its tensor and source model stage
    fix (``src`` is in -1 .. model stages, so it is below :func:`_tag_width`): the
    micro-batch m adds ``m * _tag_width``, which makes the number unique per tag."""
    return (src + 1) * 2 + (tensor == "G")


def _tag_width(sched: Schedule) -> int:
    """Numbers of (tensor, source) pairs a transfer number leaves room for."""
    return 2 * (sched.num_model_stages + 2)


def _step_facts(sched: Schedule, a: Action) -> list:
    """Facts of ``a``'s (kind, rank, chunk), whatever its micro-batch: a send or
    receive's [is send (1 or 0), tag base, model-stage boundary its transfer
    crosses]; a compute action's [per micro-batch, model stage, reads the
    explicit-R flag, FLOPs class 1 model / 2 recompute / 0, is B or W, is AR,
    consumed (tensor, source stage) or None, its tag base, rule id without and with
    an explicit R (-1 until first used), the state it enters
    (:func:`~merak_sim.schedule.liveness.entered_by`), whether it frees its item
    (:data:`~merak_sim.schedule.liveness.FREES`)]."""
    k = a.kind
    if k.is_comm:
        tensor, src = comm_key(sched, a)[:2]
        return [1 if k.is_send else 0, _tag_base(tensor, src),
                src if tensor == "A" else src - 1]
    ck = consumed_key(sched, a) if k.per_microbatch else None
    return [k.per_microbatch, sched.model_stage(a) if k.per_microbatch else -1,
            k in (Kind.BACKWARD, Kind.BACKWARD_INPUT),
            1 if k in FORWARD_KINDS else 2 if k in RECOMPUTING_KINDS else 0,
            k in (Kind.BACKWARD, Kind.BACKWARD_WEIGHT), k is Kind.ALL_REDUCE,
            None if ck is None else ck[:2], -1 if ck is None else _tag_base(*ck[:2]),
            -1, -1, entered_by(k), k in FREES]


def _history(code: int) -> tuple[Held, ...]:
    """The states an item entered, from the walk's integer code (base 4, the first
    state the most significant digit, each digit the state + 1)."""
    out: list[Held] = []
    while code:
        code, d = divmod(code, 4)
        out.append(Held(d - 1))
    return tuple(reversed(out))


def _build_structure(sched: Schedule) -> ProgramStructure:
    """One walk of ``sched`` (module docstring): everything
    :func:`~merak_sim.sim.program.compile_program` needs but the costs (a receive
    precedes its consumer, so its transfer has an id by then)."""
    w = _Walk(sched)
    for rank, prog in enumerate(sched.programs):
        w.rank(rank, prog)
    return ProgramStructure(**w.fields())


class _Walk:
    """The state of :func:`_build_structure`'s walk: what every rank adds to, and the
    rank being walked.

    Transfers, facts, items and memory rules are keyed by integers built from the
    fields that identify them (chunks are below v, micro-batches >= 0: Schedule and
    Action check both), so the walk builds and hashes no tuples for its lookups.
    """

    def __init__(self, sched: Schedule):
        self.sched = sched
        self.v = sched.virtual_stages
        self.width = _tag_width(sched)
        self.tid: dict[int, int] = {}  # transfer number -> id
        self.sends: list[Action | None] = []  # per transfer id
        self.recvs: list[Action | None] = []
        self.bounds: list[int] = []
        self.paired = 0  # transfers with both a send and a receive
        self.rules: list[tuple] = []
        self.mem_rules: list = [None]
        self.actions: list[Action] = []
        self.rank_of: list[int] = []
        self.rule_of: list[int] = []
        self.alloc_of: list[int] = []
        self.free_of: list[int] = []
        self.out: dict[str, list] = {k: [] for k in (
            "op_words", "flops_rules", "recompute_rules", "ar_order", "last_backward",
            "chunks", "compute_ids", "consumed")}

    def rank(self, rank: int, prog: tuple) -> None:
        """Walk rank ``rank``'s program ``prog``."""
        v = self.v
        rebuilds = REBUILDS
        self.ops: list[int] = []  # three words per op
        self.consumed: dict[int, int] = {}
        # (chunk, micro-batch) of every explicit R (its item rebuilt) on the rank; the
        # scan for one runs at C speed (a fused group has no kind: None).
        self.explicit_r = ({(a.chunk, a.microbatch) for a in prog
                            if type(a) is Action and a.kind is rebuilds}
                           if rebuilds in map(getattr, prog, repeat("kind"), repeat(None))
                           else None)
        # The liveness walk of :func:`~merak_sim.schedule.liveness.transitions`,
        # inlined: an item is live exactly while ``history`` holds it. ``history``:
        # (chunk, micro-batch) -> code of the states it entered (base 4, states + 1:
        # unique per history), so rules are keyed by integers.
        self.history: dict[int, int] = {}  # key m * v + chunk
        self.mem_ids: dict[int, int] = {}  # key (code * v + chunk) * 2 + frees
        self.last_b: dict[int, int] = {}
        self.fl: list[int] = []
        self.rf: list[int] = []
        self.facts: list[list | None] = [None] * (len(Kind) * v)  # kind code * v + chunk
        first = len(self.actions)
        post, compute = self._post, self._compute
        for step in prog:
            if type(step) is not Action:
                for p in step.parts:
                    post(p)
            elif step.kind.is_comm:
                post(step)
            else:
                compute(rank, step)
        self._end_rank(rank, first)

    def _facts(self, a: Action) -> list:
        fk = a.kind.code * self.v + a.chunk
        f = self.facts[fk]
        if f is None:
            f = self.facts[fk] = _step_facts(self.sched, a)
        return f

    def _post(self, p: Action) -> None:
        """A send or receive: its transfer's id (a new one where the tag is new)."""
        is_send, base, bound = self._facts(p)
        key = p.microbatch * self.width + base
        t = self.tid.get(key)
        if t is None:
            t = self.tid[key] = len(self.bounds)
            self.bounds.append(bound)
            (self.sends if is_send else self.recvs).append(p)
            (self.recvs if is_send else self.sends).append(None)
        elif is_send:
            if self.sends[t] is None:
                self.paired += 1
            self.sends[t] = p
        else:
            if self.recvs[t] is None:
                self.paired += 1
            self.recvs[t] = p
        self.ops += (OP_POST, t, is_send)

    def _memory(self, rank: int, ch: int, mb: int, enters: Held | None, frees: bool
                ) -> tuple[int, int]:
        """(alloc rule, free rule) of a compute action (0: none)."""
        v, history, mem_ids, mem_rules = self.v, self.history, self.mem_ids, self.mem_rules
        if enters is not None:
            item = mb * v + ch
            code = history[item] = history.get(item, 0) * 4 + enters + 1
            mk = (code * v + ch) * 2
            al = mem_ids.get(mk, -1)
            if al < 0:
                al = mem_ids[mk] = len(mem_rules)
                mem_rules.append((rank, ch, _history(code), False))
            return al, 0
        if frees:  # its item, if live
            code = history.pop(mb * v + ch, None)
            if code is not None:
                mk = (code * v + ch) * 2 + 1
                fr = mem_ids.get(mk, -1)
                if fr < 0:
                    fr = mem_ids[mk] = len(mem_rules)
                    mem_rules.append((rank, ch, _history(code), True))
                return 0, fr
        return 0, 0

    def _compute(self, rank: int, a: Action) -> None:
        """A compute action: its id, rules, memory rules and op."""
        ch, mb = a.chunk, a.microbatch
        f = self._facts(a)
        (per_mb, g, reads, flops_class, is_last, is_ar, head, head_base, rid, rid_r,
         enters, frees) = f
        aid = len(self.actions)
        self.actions.append(a)
        al, fr = self._memory(rank, ch, mb, enters, frees)
        self.alloc_of.append(al)
        self.free_of.append(fr)
        rules = self.rules
        if reads and self.explicit_r is not None and (ch, mb) in self.explicit_r:
            if rid_r < 0:
                rid_r = f[9] = len(rules)
                rules.append((a.kind, g, True, rank))
            rid = rid_r
        elif rid < 0:
            rid = f[8] = len(rules)
            rules.append((a.kind, g, False, rank) if per_mb else (a.kind, rank))
        self.rule_of.append(rid)
        if flops_class == 1:
            self.fl.append(rid)
        elif flops_class == 2:
            self.rf.append(rid)
        if is_last:
            self.last_b[ch] = aid
        if is_ar:
            self.ops += (OP_AR, aid, -1)
        elif head is None:
            self.ops += (OP_COMPUTE, aid, -1)
        else:
            t = self.tid.get(mb * self.width + head_base)
            if t is None:
                raise ScheduleError(f"{a} on rank {rank} consumes {(*head, mb)} before its "
                                    "receive; lower the schedule")
            self.consumed[aid] = t
            self.ops += (OP_COMPUTE, aid, t)

    def _end_rank(self, rank: int, first: int) -> None:
        """What the rank just walked adds to the per-rank fields."""
        v, out, last_b = self.v, self.out, self.last_b
        aid = len(self.actions)
        self.rank_of += [rank] * (aid - first)
        # chunks with per-micro-batch actions (sends and receives all are)
        out["chunks"].append(tuple(sorted({fk % v for fk, f in enumerate(self.facts)
                                           if f is not None and (len(f) == 3 or f[0])})))
        out["op_words"].append(tuple(self.ops))
        out["compute_ids"].append(tuple(range(first, aid)))
        out["consumed"].append(self.consumed)
        order = sorted(last_b, key=lambda ch: last_b[ch])
        out["ar_order"].append(tuple(order))
        out["last_backward"].append(tuple(last_b[ch] for ch in order))
        out["flops_rules"].append(tuple(self.fl))
        out["recompute_rules"].append(tuple(self.rf))

    def fields(self) -> dict:
        """:class:`ProgramStructure`'s fields (ScheduleError for a send or receive
        without its other end)."""
        sched = self.sched
        if self.paired != len(self.bounds):
            for s, r in zip(self.sends, self.recvs, strict=True):
                if s is None or r is None:
                    a = s or r
                    raise ScheduleError(f"{a} on rank {a.stage} has no matching "
                                        f"{'receive' if a.kind.is_send else 'send'}")
        ops_all = self.out["op_words"]
        return dict(
            schedule=sched, actions=tuple(self.actions), rank_of_action=tuple(self.rank_of),
            num_actions=sum(map(len, ops_all)) // 3,
            transfer_sends=tuple(self.sends), transfer_recvs=tuple(self.recvs),
            transfer_boundary=tuple(self.bounds), rules=tuple(self.rules),
            rule_of_action=tuple(self.rule_of), memory_rules=tuple(self.mem_rules),
            alloc_rule=tuple(self.alloc_of), free_rule=tuple(self.free_of),
            chunk_stages=tuple(tuple(sched.stage_of(r, ch) for ch in range(self.v))
                               for r in range(sched.num_stages)),
            **{k: tuple(x) for k, x in self.out.items()})
