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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from merak_sim.costs.base import CostTable
from merak_sim.schedule.ir import Action, Fused, Kind, Schedule, ScheduleError, iter_actions
from merak_sim.schedule.liveness import liveness, stash_sizes
from merak_sim.schedule.lowering import comm_key, consumed_key

__all__ = ["Compiled", "Transfer", "compile_program", "OP_COMPUTE", "OP_POST", "OP_AR"]

#: Op codes of a compiled program step.
OP_COMPUTE, OP_POST, OP_AR = 0, 1, 2


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


@dataclass(frozen=True)
class Compiled:
    """Flat, integer-indexed form of a schedule with its costs.

    Attributes:
        schedule: the lowered schedule.
        ops: per rank, a tuple of ops: ``(OP_COMPUTE, action_id, consumed_transfer or
            -1)``, ``(OP_POST, transfer_id, is_send)`` or ``(OP_AR, action_id, -1)``.
        actions: every compute action (AR and OPT included), indexed by action id.
        rank_of_action: pipeline rank of each action id.
        duration_s: contention-free duration of each action id.
        recompute_s: the part of each action's duration that is recomputation.
        mem_alloc / mem_free: bytes allocated at the action's start / freed at its end.
        transfers: every transfer, indexed by transfer id.
        state_bytes: per rank, resident model-state bytes (weights, grads, optimizer).
        grad_bytes: per rank, gradient bytes (the data-parallel reduction's payload).
        ar_chunks: per rank, (chunk, all-reduce seconds) in the order the chunks' last
            backward finishes (for bucketed overlap).
        last_backward: per rank, action id of each chunk's last backward (B or W).
        flops: per rank, model FLOPs of one iteration (no recompute).
        recompute_flops: per rank, extra FLOPs of recomputation in one iteration.
        recompute_fraction: per rank, the checkpointed fraction c_s used.
        num_actions: total IR actions (fused parts counted, every send and receive).
        tp_s: per action id, seconds of its tensor-parallel collectives (alone,
            synchronous; module docstring); empty when compiled elsewhere (all 0).
        tp_exposed_s: per action id, the part of ``tp_s`` included in ``duration_s``.
        tp_recompute_exposed_s: per action id, the part of ``tp_exposed_s`` that
            belongs to recomputation (included in ``recompute_s``).
        tp_bytes: per action id, bytes one GPU sends for those collectives.
        tied_ar: action ids of the AR steps of the first and the last pipeline rank
            when the table's model ties its embeddings across them (a two-rank
            collective both must reach, :mod:`merak_sim.schedule.ir` rule 6); else
            empty.
    """

    schedule: Schedule
    ops: tuple[tuple[tuple[int, int, int], ...], ...]
    actions: tuple[Action, ...]
    rank_of_action: tuple[int, ...]
    duration_s: tuple[float, ...]
    recompute_s: tuple[float, ...]
    mem_alloc: tuple[float, ...]
    mem_free: tuple[float, ...]
    transfers: tuple[Transfer, ...]
    state_bytes: tuple[float, ...]
    grad_bytes: tuple[float, ...]
    ar_chunks: tuple[tuple[tuple[int, float], ...], ...]
    last_backward: tuple[tuple[int, ...], ...]
    flops: tuple[float, ...]
    recompute_flops: tuple[float, ...]
    recompute_fraction: tuple[float, ...]
    num_actions: int
    tp_s: tuple[float, ...] = ()
    tp_exposed_s: tuple[float, ...] = ()
    tp_recompute_exposed_s: tuple[float, ...] = ()
    tp_bytes: tuple[float, ...] = ()
    tied_ar: tuple[int, ...] = ()

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks."""
        return self.schedule.num_stages

    def repriced(self, duration_s: tuple[float, ...], transfer_s: list[float],
                 ar_chunks: tuple[tuple[tuple[int, float], ...], ...],
                 tied: bool | None = None) -> Compiled:
        """The same program with new action durations, transfer times (one per
        transfer, in order) and all-reduce chunks: how the planner re-prices one
        compiled schedule for many cost tables without compiling it again. Transfer
        byte counts are kept as compiled (the evaluator reads only times); ``tied``
        (the new table's ``tied_embeddings``) resets :attr:`tied_ar`, None keeps it."""
        xfers = tuple(Transfer(t.key, t.src, t.dst, t.send, t.recv, d, t.nbytes)
                      for t, d in zip(self.transfers, transfer_s, strict=True))
        tied_ar = self.tied_ar if tied is None else _tied_ar(self.schedule, self.ops, tied)
        return replace(self, duration_s=duration_s, transfers=xfers,
                       ar_chunks=ar_chunks, tied_ar=tied_ar)


def _tied_ar(sched: Schedule, ops: tuple[tuple[tuple[int, int, int], ...], ...], tied: bool
             ) -> tuple[int, ...]:
    """AR action ids of the ranks holding the first and the last model stage when they
    meet (``tied`` and both ranks distinct and ending in an AR; under the ``"v"``
    placement both stages live on rank 0 and the tie is local)."""
    ranks = sched.tied_ranks()
    if not tied or len(ranks) < 2:
        return ()
    ids = [x for r in ranks for code, x, _y in ops[r] if code == OP_AR]
    return tuple(ids) if len(ids) == 2 else ()


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
    explicit_r = {
        (a.stage, a.chunk, a.microbatch)
        for p in sched.programs
        for a in iter_actions(p)
        if a.kind is Kind.RECOMPUTE
    }

    # Transfers, keyed by the IR's comm key.
    tid: dict = {}
    sends: dict = {}
    recvs: dict = {}
    for p in sched.programs:
        for a in iter_actions(p):
            if a.kind.is_comm:
                key = comm_key(sched, a)
                (sends if a.kind.is_send else recvs)[key] = a
                tid.setdefault(key, len(tid))
    transfers = []
    for key, _i in sorted(tid.items(), key=lambda kv: kv[1]):
        s, r = sends.get(key), recvs.get(key)
        if s is None or r is None:
            a = s or r
            raise ScheduleError(f"{a} on rank {a.stage} has no matching "
                                f"{'receive' if a.kind.is_send else 'send'}")
        boundary = key[1] if key[0] == "A" else key[1] - 1
        transfers.append(Transfer(key, s.stage, r.stage, s, r,
                                  float(st[boundary].send_activation_s),
                                  float(st[boundary].p2p_bytes)))

    actions: list[Action] = []
    rank_of: list[int] = []
    dur: list[float] = []
    rec: list[float] = []
    alloc: list[float] = []
    free: list[float] = []
    tp_t: list[float] = []
    tp_x: list[float] = []
    tp_rx: list[float] = []
    tp_b: list[float] = []
    ops_all = []
    ar_chunks = []
    last_bwd = []
    flops, rflops = [], []
    n_actions = 0
    for rank, prog in enumerate(sched.programs):
        ops = []
        mem = iter(liveness(sched, rank).deltas(
            [stash_sizes(st[sched.stage_of(rank, ch)], c[rank]) for ch in range(sched.virtual_stages)]))
        chunks = sorted({a.chunk for a in iter_actions(prog) if a.kind.per_microbatch})
        last_b: dict[int, int] = {}
        rank_flops = rank_rflops = 0.0
        for step in prog:
            n_actions += len(step.parts)
            if isinstance(step, Fused) or step.kind.is_comm:
                for p in step.parts:
                    ops.append((OP_POST, tid[comm_key(sched, p)], int(p.kind.is_send)))
                continue
            a = step
            k = a.kind
            aid = len(actions)
            actions.append(a)
            rank_of.append(rank)
            al, fr = next(mem)
            d = r_s = 0.0
            tt = tx = trx = tb = 0.0
            if k.per_microbatch:
                sc = st[sched.model_stage(a)]
                cs = 0.0 if (rank, a.chunk, a.microbatch) in explicit_r else c[rank]
                fwd_flops = sc.flops / 3.0  # forward ~ 1/3 of forward+backward FLOPs
                if k in (Kind.FORWARD, Kind.FORWARD_NOGRAD, Kind.RECOMPUTE):
                    tt, tx, tb = sc.tp_comm_fwd_s, sc.tp_exposed_fwd_s, sc.tp_bytes_fwd
                elif k in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
                    tt = sc.tp_comm_bwd_s + cs * sc.tp_comm_recompute_s
                    trx = cs * sc.tp_exposed_recompute_s
                    tx = sc.tp_exposed_bwd_s + trx
                    tb = sc.tp_bytes_bwd + cs * sc.tp_bytes_recompute
                if k in (Kind.FORWARD, Kind.FORWARD_NOGRAD):
                    d = sc.forward_s
                    rank_flops += sc.flops
                elif k is Kind.RECOMPUTE:
                    d = r_s = sc.forward_s
                    trx = tx
                    rank_rflops += fwd_flops
                elif k is Kind.BACKWARD:
                    r_s = cs * sc.recompute_s
                    d = sc.backward_s + r_s
                    last_b[a.chunk] = aid
                    rank_rflops += cs * fwd_flops
                elif k is Kind.BACKWARD_INPUT:
                    r_s = cs * sc.recompute_s
                    d = sc.backward_input_s + r_s
                    rank_rflops += cs * fwd_flops
                elif k is Kind.BACKWARD_WEIGHT:
                    d = sc.backward_weight_s
                    last_b[a.chunk] = aid
            elif k is Kind.ALL_REDUCE:
                d = sum(st[sched.stage_of(rank, ch)].grad_allreduce_s for ch in chunks)
            elif k is Kind.OPTIMIZER:
                d = sum(st[sched.stage_of(rank, ch)].optimizer_s for ch in chunks)
            dur.append(float(d))
            rec.append(float(r_s))
            alloc.append(float(al))
            free.append(float(fr))
            tp_t.append(float(tt))
            tp_x.append(float(tx))
            tp_rx.append(float(trx))
            tp_b.append(float(tb))
            if k is Kind.ALL_REDUCE:
                ops.append((OP_AR, aid, -1))
            else:
                ck = consumed_key(sched, a)
                ops.append((OP_COMPUTE, aid, tid[ck] if ck is not None else -1))
        ops_all.append(tuple(ops))
        order = sorted(last_b, key=lambda ch: last_b[ch])
        ar_chunks.append(tuple((ch, float(st[sched.stage_of(rank, ch)].grad_allreduce_s)) for ch in order))
        last_bwd.append(tuple(last_b[ch] for ch in order))
        flops.append(rank_flops)
        rflops.append(rank_rflops)
    state = tuple(
        float(sum(st[sched.stage_of(r, ch)].state_bytes for ch in range(sched.virtual_stages)))
        for r in range(S)
    )
    grads = tuple(
        float(sum(st[sched.stage_of(r, ch)].grad_bytes for ch in range(sched.virtual_stages)))
        for r in range(S)
    )
    return Compiled(
        schedule=sched,
        ops=tuple(ops_all),
        actions=tuple(actions),
        rank_of_action=tuple(rank_of),
        duration_s=tuple(dur),
        recompute_s=tuple(rec),
        mem_alloc=tuple(alloc),
        mem_free=tuple(free),
        transfers=tuple(transfers),
        state_bytes=state,
        grad_bytes=grads,
        ar_chunks=tuple(ar_chunks),
        last_backward=tuple(last_bwd),
        flops=tuple(flops),
        recompute_flops=tuple(rflops),
        recompute_fraction=tuple(c),
        num_actions=n_actions,
        tp_s=tuple(tp_t),
        tp_exposed_s=tuple(tp_x),
        tp_recompute_exposed_s=tuple(tp_rx),
        tp_bytes=tuple(tp_b),
        tied_ar=_tied_ar(sched, tuple(ops_all), table.tied_embeddings),
    )
