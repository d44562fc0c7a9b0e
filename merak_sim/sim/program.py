"""Compile a lowered Schedule plus a CostTable into flat per-rank programs.

Both simulation back ends (the SimPy engine and the fast evaluator) consume the same
:class:`Compiled` object, so they read identical durations, transfer times and memory
deltas and can only differ in how they advance time. Compiling is done once per
(schedule, cost table); evaluating is the hot loop.

Durations (see :mod:`merak_sim.costs.base` for the fields): F and F* cost
``forward_s``; R costs ``forward_s``; B costs ``backward_s + c_s * recompute_s`` and I
``backward_input_s + c_s * recompute_s`` (c_s the rank's checkpointed fraction, 0 if
an explicit R ran for that micro-batch); W costs ``backward_weight_s``; AR sums
``grad_allreduce_s`` and OPT ``optimizer_s`` over the rank's chunks. A transfer across
the boundary between model stages g and g+1 (activation forward or gradient back)
takes ``stages[g].send_activation_s`` and carries ``stages[g].p2p_bytes``.

Tensor-parallel collectives: each compute action also carries the TP collective time
it contains (:mod:`merak_sim.costs.base`, ``tp_*`` fields): F, F* and R the stage's
forward collectives; B and I the backward ones plus ``c_s`` times the re-forward's;
W, AR and OPT none. ``tp_s`` is the collectives' total (alone, synchronous),
``tp_exposed_s`` the part already included in ``duration_s`` (the rest overlaps the
action's compute under sub-pipelined TP), ``tp_bytes`` what one GPU sends. Durations
are unchanged by them: the engine only uses them to draw the collective and to put it
on the links.

Memory (bytes per GPU): model state of every chunk is resident from the start; the
activation deltas of each compute action are those of the rank's
:func:`~merak_sim.schedule.liveness.liveness` walk priced with
:func:`~merak_sim.schedule.liveness.stash_sizes` at the rank's c_s (F allocates
``kept_bytes(c_s)`` when it starts, F* ``input_bytes``, R grows the micro-batch to
``activation_bytes``; B, or W after I, frees what it held when it ends). Transient
buffers are not counted (see that module).

Compiling has two halves. The schedule's structure (:class:`ProgramStructure`: ops,
actions, transfers, which cost rule every action follows and which liveness history
its memory delta has) depends on the schedule alone, so :func:`program_structure`
builds it once per schedule object and keeps the most recent ones. Pricing a cost
table then evaluates each distinct rule once (a few per model stage) and gathers
the per-action tuples, with the same float operations in the same order as pricing
action by action, so the result does not depend on whether the structure was cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property, reduce
from operator import add

from merak_sim.costs.base import CostTable
from merak_sim.schedule.ir import Action, Kind, Schedule, ScheduleError
from merak_sim.schedule.liveness import Held, liveness, stash_sizes
from merak_sim.schedule.lowering import comm_key, consumed_key

from .action_costs import gatherer, memory_value, rule_costs

__all__ = ["Compiled", "Transfer", "ProgramStructure", "program_structure", "compile_program",
           "OP_COMPUTE", "OP_POST", "OP_AR", "FORWARD_KINDS", "RECOMPUTING_KINDS"]

#: Op codes of a compiled program step.
OP_COMPUTE, OP_POST, OP_AR = 0, 1, 2

#: Kinds whose rule FLOPs count as model FLOPs, and as recomputation FLOPs.
FORWARD_KINDS = (Kind.FORWARD, Kind.FORWARD_NOGRAD)
RECOMPUTING_KINDS = (Kind.RECOMPUTE, Kind.BACKWARD, Kind.BACKWARD_INPUT)

#: How many schedules' structures :func:`program_structure` keeps (least recently
#: used dropped first): enough for a fit's rows or a planner's shapes in flight.
STRUCTURES_KEPT = 64
_STRUCTURES: OrderedDict[int, ProgramStructure] = OrderedDict()


@dataclass(frozen=True, slots=True)
class Transfer:
    """One point-to-point transfer (a send matched with its receive).

    Attributes:
        key: the IR's comm key (tensor "A"/"G", source model stage, micro-batch).
        src, dst: pipeline ranks that send and receive.
        send, recv: the IR actions.
        duration_s: contention-free transfer time.
        nbytes: bytes moved per GPU.
    """

    key: tuple[str, int, int]
    src: int
    dst: int
    send: Action
    recv: Action
    duration_s: float
    nbytes: float


@dataclass(frozen=True, eq=False)
class ProgramStructure:
    """The cost-independent half of a compiled schedule (module docstring); one per
    schedule object, hashed by identity.

    Attributes:
        schedule: the lowered schedule.
        ops, actions, rank_of_action, num_actions: as in :class:`Compiled`.
        transfer_ends: per transfer id, (comm key, src rank, dst rank, send, recv).
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
    """

    schedule: Schedule
    ops: tuple[tuple[tuple[int, int, int], ...], ...]
    actions: tuple[Action, ...]
    rank_of_action: tuple[int, ...]
    num_actions: int
    transfer_ends: tuple[tuple[tuple[str, int, int], int, int, Action, Action], ...]
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
    def compute_ids(self) -> tuple[tuple[int, ...], ...]:
        """Per rank, the ids of its compute actions (AR, OPT too), program order."""
        return tuple(tuple(x for code, x, _y in ops if code != OP_POST) for ops in self.ops)

    @cached_property
    def consumed(self) -> tuple[dict[int, int], ...]:
        """Per rank, action id -> id of the transfer it waits for."""
        return tuple({x: y for code, x, y in ops if code == OP_COMPUTE and y >= 0}
                     for ops in self.ops)

    @cached_property
    def tied_candidates(self) -> tuple[int, ...]:
        """AR action ids of the distinct ranks holding the first and the last model
        stage (the ranks a tied embedding joins) when there are two and both end in
        an AR, else ()."""
        last = len(self.ops) * len(self.chunk_stages[0]) - 1 if self.ops else -1
        ranks = sorted({r for r, stages in enumerate(self.chunk_stages)
                        for g in stages if g in (0, last)})
        if len(ranks) < 2:
            return ()
        ids = [x for r in ranks for code, x, _y in self.ops[r] if code == OP_AR]
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
    ps = _build_structure(sched)
    # The entry holds the schedule, so its id cannot be reused while it is kept.
    _STRUCTURES[key] = ps
    while len(_STRUCTURES) > STRUCTURES_KEPT:
        _STRUCTURES.popitem(last=False)
    return ps


def _step_facts(sched: Schedule, a: Action) -> tuple:
    """Facts of ``a``'s (kind, rank, chunk), whatever its micro-batch: a send or
    receive's (is send, comm key less its micro-batch); a compute action's (per
    micro-batch, model stage, reads the explicit-R flag, FLOPs class 1 model / 2
    recompute / 0, is B or W, is AR, consumed key less its micro-batch or None)."""
    k = a.kind
    if k.is_comm:
        return (k.is_send, comm_key(sched, a)[:2])
    ck = consumed_key(sched, a) if k.per_microbatch else None
    return (k.per_microbatch, sched.model_stage(a) if k.per_microbatch else -1,
            k in (Kind.BACKWARD, Kind.BACKWARD_INPUT),
            1 if k in FORWARD_KINDS else 2 if k in RECOMPUTING_KINDS else 0,
            k in (Kind.BACKWARD, Kind.BACKWARD_WEIGHT), k is Kind.ALL_REDUCE,
            None if ck is None else ck[:2])


def _build_structure(sched: Schedule) -> ProgramStructure:
    """One walk of ``sched``: everything :func:`compile_program` needs but the costs
    (a receive precedes its consumer, so its transfer has an id by then; facts per
    (kind, chunk) of a rank are keyed by the kind's identity: enum hashing is slow)."""
    explicit_r = {(a.stage, a.chunk, a.microbatch) for prog in sched.programs for a in prog
                  if type(a) is Action and a.kind is Kind.RECOMPUTE}  # never fused
    tid: dict = {}
    sends: dict = {}
    recvs: dict = {}
    rules: list[tuple] = []
    rule_ids: dict[tuple, int] = {}
    mem_rules: dict = {None: 0}
    actions: list[Action] = []
    rank_of: list[int] = []
    rule_of: list[int] = []
    alloc_of: list[int] = []
    free_of: list[int] = []
    ops_all, flops_r, rec_r, ar_order, last_bwd, chunks_all = [], [], [], [], [], []
    n_actions = 0
    for rank, prog in enumerate(sched.programs):
        ops = []
        steps = iter(liveness(sched, rank).steps)
        history: dict[tuple[int, int], tuple[Held, ...]] = {}
        last_b: dict[int, int] = {}
        fl: list[int] = []
        rf: list[int] = []
        facts: dict[tuple[int, int], tuple] = {}
        first = len(actions)
        for step in prog:
            if type(step) is not Action or step.kind.is_comm:
                for p in step.parts:
                    f = facts.get((id(p.kind), p.chunk)) or facts.setdefault(
                        (id(p.kind), p.chunk), _step_facts(sched, p))
                    key = (*f[1], p.microbatch)
                    (sends if f[0] else recvs)[key] = p
                    t = tid.get(key)
                    if t is None:
                        t = tid[key] = len(tid)
                    ops.append((OP_POST, t, int(f[0])))
                    n_actions += 1
                continue
            a = step
            k = a.kind
            f = facts.get((id(k), a.chunk)) or facts.setdefault((id(k), a.chunk),
                                                                  _step_facts(sched, a))
            per_mb, g, reads, flops_class, is_last, is_ar, head = f
            aid = len(actions)
            actions.append(a)
            live = next(steps)
            al = fr = 0
            if live.enters is not None:
                item = (a.chunk, a.microbatch)
                h = history[item] = history.get(item, ()) + (live.enters,)
                al = mem_rules.setdefault((rank, a.chunk, h, False), len(mem_rules))
            elif live.leaves is not None:
                h = history.pop((a.chunk, a.microbatch), ())
                fr = mem_rules.setdefault((rank, a.chunk, h, True), len(mem_rules))
            alloc_of.append(al)
            free_of.append(fr)
            if per_mb:
                explicit = reads and (rank, a.chunk, a.microbatch) in explicit_r
                rk = (id(k), g, explicit, rank)
            else:
                rk = (id(k), rank)
            rid = rule_ids.get(rk)
            if rid is None:
                rid = rule_ids[rk] = len(rules)
                rules.append((k, g, explicit, rank) if per_mb else (k, rank))
            rule_of.append(rid)
            if flops_class == 1:
                fl.append(rid)
            elif flops_class == 2:
                rf.append(rid)
            if is_last:
                last_b[a.chunk] = aid
            if is_ar:
                ops.append((OP_AR, aid, -1))
            elif head is None:
                ops.append((OP_COMPUTE, aid, -1))
            else:
                ck = (*head, a.microbatch)
                if ck not in tid:
                    raise ScheduleError(f"{a} on rank {rank} consumes {ck} before its "
                                        "receive; lower the schedule")
                ops.append((OP_COMPUTE, aid, tid[ck]))
        n_actions += len(actions) - first
        rank_of += [rank] * (len(actions) - first)
        # chunks with per-micro-batch actions (sends and receives all are)
        chunks_all.append(tuple(sorted({ch for (_k, ch), f in facts.items()
                                        if len(f) == 2 or f[0]})))
        ops_all.append(tuple(ops))
        order = sorted(last_b, key=lambda ch: last_b[ch])
        ar_order.append(tuple(order))
        last_bwd.append(tuple(last_b[ch] for ch in order))
        flops_r.append(tuple(fl))
        rec_r.append(tuple(rf))
    ends, bounds = [], []
    for key in tid:  # insertion order is id order
        s, r = sends.get(key), recvs.get(key)
        if s is None or r is None:
            a = s or r
            raise ScheduleError(f"{a} on rank {a.stage} has no matching "
                                f"{'receive' if a.kind.is_send else 'send'}")
        ends.append((key, s.stage, r.stage, s, r))
        bounds.append(key[1] if key[0] == "A" else key[1] - 1)
    return ProgramStructure(
        schedule=sched, ops=tuple(ops_all), actions=tuple(actions),
        rank_of_action=tuple(rank_of), num_actions=n_actions, transfer_ends=tuple(ends),
        transfer_boundary=tuple(bounds), rules=tuple(rules), rule_of_action=tuple(rule_of),
        memory_rules=tuple(mem_rules), alloc_rule=tuple(alloc_of), free_rule=tuple(free_of),
        flops_rules=tuple(flops_r), recompute_rules=tuple(rec_r), chunks=tuple(chunks_all),
        chunk_stages=tuple(tuple(sched.stage_of(r, ch) for ch in range(sched.virtual_stages))
                           for r in range(sched.num_stages)),
        ar_order=tuple(ar_order), last_backward=tuple(last_bwd))


def _gathered(gather: str, source: str, column: int | None, doc: str) -> cached_property:
    """A :class:`Compiled` attribute gathered on first use: the structure's gather
    ``gather`` applied to field ``source`` (its ``column`` when given)."""

    def get(self: Compiled) -> tuple:
        values = getattr(self, source)
        return self.structure.gathers[gather](values if column is None else values[column])

    get.__doc__ = doc
    return cached_property(get)


@dataclass(frozen=True)
class Compiled:
    """Flat, integer-indexed form of a schedule with its costs.

    Attributes:
        schedule: the lowered schedule.
        structure: its cost-independent half (:class:`ProgramStructure`), shared by
            every pricing of the same schedule object.
        ops: per rank, a tuple of ops: ``(OP_COMPUTE, action_id, consumed_transfer or
            -1)``, ``(OP_POST, transfer_id, is_send)`` or ``(OP_AR, action_id, -1)``.
        actions: every compute action (AR and OPT included), indexed by action id.
        rank_of_action: pipeline rank of each action id.
        duration_s: contention-free duration of each action id.
        transfer_s: per transfer id, contention-free time (:attr:`transfers` pairs it
            with the ends and the bytes).
        rule_values: per cost rule of the structure, (duration, recompute part, TP
            total, TP exposed, TP recompute exposed, TP bytes, FLOPs added), from which
            the per-action attributes below are gathered on first use (the evaluator
            reads only ``duration_s`` and ``transfer_s``).
        memory_values: bytes of each memory rule of the structure.
        boundary_bytes: per model stage, bytes a transfer leaving it moves per GPU.
        state_bytes: per rank, resident model-state bytes (weights, grads, optimizer).
        grad_bytes: per rank, gradient bytes (the data-parallel reduction's payload).
        ar_chunks: per rank, (chunk, all-reduce seconds) in the order the chunks' last
            backward finishes (for bucketed overlap).
        last_backward: per rank, action id of each chunk's last backward (B or W).
        flops: per rank, model FLOPs of one iteration (no recompute).
        recompute_flops: per rank, extra FLOPs of recomputation in one iteration.
        recompute_fraction: per rank, the checkpointed fraction c_s used.
        num_actions: total IR actions (fused parts counted, every send and receive).
        tied_ar: action ids of the AR steps of the first and the last pipeline rank
            when the table's model ties its embeddings across them (a two-rank
            collective both must reach, :mod:`merak_sim.schedule.ir` rule 6); else
            empty.
    """

    schedule: Schedule
    structure: ProgramStructure
    ops: tuple[tuple[tuple[int, int, int], ...], ...]
    actions: tuple[Action, ...]
    rank_of_action: tuple[int, ...]
    duration_s: tuple[float, ...]
    transfer_s: tuple[float, ...]
    rule_values: tuple[tuple[float, ...], ...]
    memory_values: tuple[float, ...]
    boundary_bytes: tuple[float, ...]
    state_bytes: tuple[float, ...]
    grad_bytes: tuple[float, ...]
    ar_chunks: tuple[tuple[tuple[int, float], ...], ...]
    last_backward: tuple[tuple[int, ...], ...]
    flops: tuple[float, ...]
    recompute_flops: tuple[float, ...]
    recompute_fraction: tuple[float, ...]
    num_actions: int
    tied_ar: tuple[int, ...] = ()

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks."""
        return self.schedule.num_stages

    recompute_s = _gathered("action", "rule_values", 1, "Per action id, the part of its "
                            "duration that is recomputation.")
    tp_s = _gathered("action", "rule_values", 2, "Per action id, seconds of its TP "
                     "collectives (alone, synchronous; module docstring).")
    tp_exposed_s = _gathered("action", "rule_values", 3, "Per action id, the part of "
                             "``tp_s`` included in ``duration_s``.")
    tp_recompute_exposed_s = _gathered("action", "rule_values", 4, "Per action id, the part "
                                       "of ``tp_exposed_s`` that belongs to recomputation.")
    tp_bytes = _gathered("action", "rule_values", 5, "Per action id, bytes one GPU sends "
                         "for its TP collectives.")
    mem_alloc = _gathered("alloc", "memory_values", None, "Per action id, bytes allocated "
                          "when it starts.")
    mem_free = _gathered("free", "memory_values", None, "Per action id, bytes freed when "
                         "it ends.")
    transfer_bytes = _gathered("transfer", "boundary_bytes", None, "Per transfer id, bytes "
                               "moved per GPU.")

    @cached_property
    def transfers(self) -> tuple[Transfer, ...]:
        """Every transfer by id (built on first use; the evaluator reads transfer_s)."""
        return tuple(Transfer(key, s, d, snd, rcv, x, n) for (key, s, d, snd, rcv), x, n
                     in zip(self.structure.transfer_ends, self.transfer_s,
                            self.transfer_bytes, strict=True))

    def repriced(self, duration_s: tuple[float, ...], transfer_s: list[float],
                 ar_chunks: tuple[tuple[tuple[int, float], ...], ...],
                 tied: bool | None = None) -> Compiled:
        """The same program with new action durations, transfer times (one per
        transfer, in order) and all-reduce chunks: how the planner re-prices one
        compiled schedule for many cost tables without compiling it again. Transfer
        byte counts are kept as compiled (the evaluator reads only times); ``tied``
        (the new table's ``tied_embeddings``) resets :attr:`tied_ar`, None keeps it."""
        if len(transfer_s) != len(self.transfer_s):
            raise ValueError(f"{len(transfer_s)} transfer times for "
                             f"{len(self.transfer_s)} transfers")
        tied_ar = self.tied_ar if tied is None else (
            self.structure.tied_candidates if tied else ())
        return replace(self, duration_s=duration_s,
                       transfer_s=tuple(float(x) for x in transfer_s),
                       ar_chunks=ar_chunks, tied_ar=tied_ar)


def compile_program(
    sched: Schedule,
    table: CostTable,
    recompute: tuple[float, ...] | None = None,
) -> Compiled:
    """Compile ``sched`` with the durations of ``table``.

    Args:
        recompute: checkpointed fraction c_s per pipeline rank (``config.
            recompute_per_stage(schedule)``); None means 0 everywhere. Ranks the
            schedule marks as never recomputing use 0 whatever is given.
    """
    if not sched.lowered:
        raise ScheduleError("the simulator needs a lowered schedule; call lower() first")
    S = sched.num_stages
    if len(table.stages) != sched.num_model_stages:
        raise ValueError(
            f"cost table has {len(table.stages)} stages but the schedule has "
            f"{sched.num_model_stages} model stages (pp * virtual stages); build the table "
            "for the same configuration"
        )
    c = list(recompute) if recompute is not None else [0.0] * S
    if len(c) != S:
        raise ValueError(f"recompute has {len(c)} fractions for pp={S}")
    c = [0.0 if s in sched.no_recompute_stages else float(x) for s, x in enumerate(c)]
    st = table.stages
    ps = program_structure(sched)
    cols = list(zip(*(rule_costs(r, st, c, ps.chunks, ps.chunk_stages) for r in ps.rules),
                    strict=True))
    if not cols:
        cols = [()] * 7
    get = ps.gathers
    at = ps.chunk_stages
    sizes = [[stash_sizes(st[g], c[r]) for g in at[r]] for r in range(S)]
    fl = cols[6]
    return Compiled(
        schedule=sched,
        structure=ps,
        ops=ps.ops,
        actions=ps.actions,
        rank_of_action=ps.rank_of_action,
        duration_s=get["action"](cols[0]),
        transfer_s=get["transfer"]([float(s.send_activation_s) for s in st]),
        rule_values=tuple(cols),
        memory_values=tuple(memory_value(m, sizes) for m in ps.memory_rules),
        boundary_bytes=tuple(float(s.p2p_bytes) for s in st),
        state_bytes=tuple(float(sum(st[g].state_bytes for g in at[r])) for r in range(S)),
        grad_bytes=tuple(float(sum(st[g].grad_bytes for g in at[r])) for r in range(S)),
        ar_chunks=tuple(tuple((ch, float(st[at[r][ch]].grad_allreduce_s)) for ch in order)
                        for r, order in enumerate(ps.ar_order)),
        last_backward=ps.last_backward,
        flops=tuple(reduce(add, get[f"flops {r}"](fl), 0.0) for r in range(S)),
        recompute_flops=tuple(reduce(add, get[f"recompute {r}"](fl), 0.0) for r in range(S)),
        recompute_fraction=tuple(c),
        num_actions=ps.num_actions,
        tied_ar=ps.tied_candidates if table.tied_embeddings else (),
    )
