"""Cost rules of compiled actions: what one action of a given kind on a given model
stage costs, what one liveness history allocates or frees, and the gathers that
spread per-rule values over the actions.

:func:`~merak_sim.sim.program.compile_program` evaluates each distinct rule of a
schedule once per cost table (:class:`~merak_sim.sim.structure.ProgramStructure` lists
them) and gathers the per-action values; the rules themselves are written down in
that module's docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from operator import itemgetter

from merak_sim.costs.base import StageCost
from merak_sim.schedule.ir import Kind
from merak_sim.schedule.liveness import Held, ItemSizes

__all__ = ["rule_costs", "memory_value", "gatherer"]


def rule_costs(rule: tuple, st: tuple[StageCost, ...], c: list[float],
               chunks: tuple[tuple[int, ...], ...], chunk_stages: tuple[tuple[int, ...], ...]
               ) -> tuple[float, ...]:
    """(duration, recompute part, TP total, TP exposed, TP recompute exposed, TP bytes,
    FLOPs added) of an action following ``rule``: ``(kind, model stage, explicit R
    ran, rank)`` or ``(AR or OPT, rank)``; ``c`` the checkpointed fraction per rank,
    ``chunks`` per rank the chunks AR and OPT sum over and ``chunk_stages`` the model
    stage of each of a rank's chunks."""
    k = rule[0]
    if not k.per_microbatch:
        rank = rule[1]
        field = "grad_allreduce_s" if k is Kind.ALL_REDUCE else "optimizer_s"
        d = sum(getattr(st[chunk_stages[rank][ch]], field) for ch in chunks[rank])
        return (float(d), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    g, explicit, rank = rule[1], rule[2], rule[3]
    sc = st[g]
    cs = 0.0 if explicit else c[rank]
    fwd_flops = sc.flops / 3.0  # forward ~ 1/3 of forward+backward FLOPs
    d = r_s = fl = 0.0
    tt = tx = trx = tb = 0.0
    if k in (Kind.FORWARD, Kind.FORWARD_NOGRAD, Kind.RECOMPUTE):
        tt, tx, tb = sc.tp_comm_fwd_s, sc.tp_exposed_fwd_s, sc.tp_bytes_fwd
    elif k in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
        tt = sc.tp_comm_bwd_s + cs * sc.tp_comm_recompute_s
        trx = cs * sc.tp_exposed_recompute_s
        tx = sc.tp_exposed_bwd_s + trx
        tb = sc.tp_bytes_bwd + cs * sc.tp_bytes_recompute
    if k in (Kind.FORWARD, Kind.FORWARD_NOGRAD):
        d = sc.forward_s
        fl = sc.flops
    elif k is Kind.RECOMPUTE:
        d = r_s = sc.forward_s
        trx = tx
        fl = fwd_flops
    elif k is Kind.BACKWARD:
        r_s = cs * sc.recompute_s
        d = sc.backward_s + r_s
        fl = cs * fwd_flops
    elif k is Kind.BACKWARD_INPUT:
        r_s = cs * sc.recompute_s
        d = sc.backward_input_s + r_s
        fl = cs * fwd_flops
    elif k is Kind.BACKWARD_WEIGHT:
        d = sc.backward_weight_s
    return (float(d), float(r_s), float(tt), float(tx), float(trx), float(tb), fl)


def memory_value(rule: tuple[int, int, tuple[Held, ...], bool] | None,
                  sizes: list[list[ItemSizes]]) -> float:
    """Bytes of a memory rule: replays the item's history as
    :meth:`~merak_sim.schedule.liveness.LiveTrace.deltas` does (growth at the last
    entry, or everything held for a release)."""
    if rule is None:
        return 0.0
    rank, chunk, history, frees = rule
    per = sizes[rank][chunk]
    held = alloc = 0.0
    for i, state in enumerate(history):
        new = float(per.of(state))
        if i:
            alloc = max(0.0, new - held)
            held += alloc
        else:
            alloc = held = new
    return float(held if frees else alloc)


def _pick(ids: tuple[int, ...], values: list) -> tuple:
    return tuple(values[i] for i in ids)


def gatherer(ids: tuple[int, ...]) -> Callable[[list], tuple]:
    """A function ``values -> tuple(values[i] for i in ids)``, at C speed (picklable,
    so a structure can travel to worker processes)."""
    if len(ids) > 1:
        return itemgetter(*ids)
    return partial(_pick, ids)
