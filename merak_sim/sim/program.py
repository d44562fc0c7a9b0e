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

Compiling has two halves. The schedule's structure
(:class:`~merak_sim.sim.structure.ProgramStructure`: ops, actions, transfers, which
cost rule every action follows and which liveness history its memory delta has)
depends on the schedule alone, so
:func:`~merak_sim.sim.structure.program_structure` builds it once per schedule
object and keeps the most recent ones. Pricing a cost
table then evaluates each distinct rule once (a few per model stage) and gathers
the per-action tuples, with the same float operations in the same order as pricing
action by action, so the result does not depend on whether the structure was cached.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, reduce
from operator import add

import numpy as np

from merak_sim.costs.base import CostTable
from merak_sim.schedule.ir import Action, Schedule, ScheduleError
from merak_sim.schedule.liveness import stash_sizes

from .action_costs import memory_value, rule_costs
from .structure import ProgramStructure, program_structure

__all__ = ["Compiled", "Transfer", "compile_program"]

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
        state_bytes: per rank, resident bytes: model state (weights, grads, optimizer)
            and the allocator's reservations (:attr:`CostTable.reserved_bytes`).
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
    def ops(self) -> tuple[tuple[tuple[int, int, int], ...], ...]:
        """Per rank, its ops (class docstring): the structure's, built on first use."""
        return self.structure.ops

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
    def action_arrays(self) -> dict[str, np.ndarray]:
        """Per action id as numpy arrays (for the array paths of the result):
        ``duration_s``, and ``recompute_s``, ``tp_exposed_s``,
        ``tp_recompute_exposed_s`` gathered from :attr:`rule_values`."""
        rule = self.structure.arrays.rule
        out = {"duration_s": np.array(self.duration_s, dtype=float)}
        for name, j in (("recompute_s", 1), ("tp_exposed_s", 3),
                        ("tp_recompute_exposed_s", 4)):
            out[name] = np.asarray(self.rule_values[j], dtype=float)[rule] if len(rule) \
                else np.zeros(0)
        return out

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
        recompute: checkpointed fraction c_s per pipeline rank (:func:`~merak_sim.sim.
            from_config.recompute_fractions`); None means 0 everywhere. Ranks the
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
        actions=ps.actions,
        rank_of_action=ps.rank_of_action,
        duration_s=get["action"](cols[0]),
        transfer_s=get["transfer"]([float(s.send_activation_s) for s in st]),
        rule_values=tuple(cols),
        memory_values=tuple(memory_value(m, sizes) for m in ps.memory_rules),
        boundary_bytes=tuple(float(s.p2p_bytes) for s in st),
        state_bytes=tuple(float(sum(st[g].state_bytes for g in at[r])) + table.reserved(r)
                          for r in range(S)),
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
