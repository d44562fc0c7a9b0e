"""The relaxed pass over a whole space, a block of candidates at a time.

A full 405B space has a million candidates, but only a few thousand blocks
(:class:`~merak_sim.planner.space.Block`: one (dp, tp, pp, virtual stages,
micro-batch, schedule, cp) with the product of its variants), and inside a block
what the relaxed pass reads depends on few fields:

- the rule that prunes a variant: its (ZeRO stage, sequence parallelism) and the
  block's work (pp x v x micro-batches);
- its relaxed arrays (:class:`~merak_sim.planner.relaxed.RelaxedPricer`): sequence
  parallelism, TP overlap, selective recompute, attention;
- its one-micro-batch memory screen: those, the recompute policy (with the schedule
  under full recompute, else its placement) and the ZeRO stage;
- its lower bound (:func:`~merak_sim.planner.bounds.lower_bound`): the same without
  the ZeRO stage, and without the policy except whether it is full recompute (the
  relaxed arrays have no tail, so the DP overlap does not enter either).

So :func:`relaxed_sweep` prices each distinct value once, with the same functions
and the same arguments as one candidate at a time, and spreads the results over the
block's variants with numpy; the rows it decides (pruned by a rule or by memory) go
into the :class:`~merak_sim.planner.rows.RowBook` as chunks, in enumeration order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from merak_sim.progress import WORK_LIMIT, Progress
from merak_sim.schedule import SCHEDULES

from .bounds import bound_parts, lower_bound
from .relaxed import RelaxedPricer
from .rows import RowBook
from .screen import kept_one, state_per_rank, worst_excess
from .space import Block, Candidate

__all__ = ["Level0", "relaxed_sweep", "bounded_reasons"]

_GiB = float(2**30)


@dataclass(frozen=True)
class Level0:
    """The candidates that passed the relaxed pass, sorted by (relaxed bound,
    enumeration order): ``book.block(block_ids[j]).candidate(positions[j])`` has bound
    ``bounds[j]``."""

    block_ids: np.ndarray
    positions: np.ndarray
    bounds: np.ndarray

    def __len__(self) -> int:
        return len(self.bounds)


@dataclass(frozen=True)
class _Index:
    """Per variant set: the distinct keys each quantity depends on, and per variant
    the index of its key (module docstring)."""

    rule: tuple[tuple[int, bool], ...]
    rule_idx: np.ndarray
    relaxed: tuple[tuple, ...]
    relaxed_idx: np.ndarray
    memory: tuple[tuple, ...]
    memory_idx: np.ndarray
    bound: tuple[tuple, ...]
    bound_idx: np.ndarray
    first: dict[tuple, int]


def _distinct(keys: list[tuple]) -> tuple[tuple[tuple, ...], np.ndarray]:
    uniq: dict[tuple, int] = {}
    idx = np.array([uniq.setdefault(k, len(uniq)) for k in keys], dtype=np.int64)
    return tuple(uniq), idx


def _index(variants: tuple) -> _Index:
    rule, rule_idx = _distinct([(z, sp) for _rc, sp, _ov, z, _zg, _att, _o in variants])
    relaxed, relaxed_idx = _distinct([(sp, ov, rc == "selective", att)
                                      for rc, sp, ov, _z, _zg, att, _o in variants])
    # Memory and bound keys name their relaxed key by its index.
    memory, memory_idx = _distinct([(int(r), v[0], v[3])
                                    for r, v in zip(relaxed_idx, variants)])
    bound, bound_idx = _distinct([(int(r), v[0] == "full")
                                  for r, v in zip(relaxed_idx, variants)])
    first: dict[tuple, int] = {}
    for i, v in enumerate(variants):
        r = int(relaxed_idx[i])
        first.setdefault((r,), i)
        first.setdefault((r, v[0], v[3]), i)
        first.setdefault((r, v[0] == "full"), i)
    return _Index(rule, rule_idx, relaxed, relaxed_idx, memory, memory_idx, bound,
                  bound_idx, first)


def relaxed_sweep(items: Iterable[Candidate | Block], rp: RelaxedPricer, margin: float,
                  rows: RowBook, counts: dict, prog: Progress,
                  one: Callable[[Candidate], None]) -> Level0:
    """Relax every candidate of ``items`` (module docstring): rule and memory pruned
    rows into ``rows``, the rest returned sorted by bound. ``one`` takes each
    candidate the pass does not handle itself (those pruned before a block forms, and
    those whose relaxed arrays the cost model cannot give), in enumeration order;
    ``margin`` the fraction of GPU memory kept free."""
    indices: dict[int, _Index] = {}
    arrays: dict[tuple, Any] = {}
    memory: dict[tuple, tuple[float, str]] = {}
    bounds: dict[tuple, float] = {}
    parts: dict[tuple, tuple] = {}
    states: dict[tuple, np.ndarray] = {}
    screens: dict[tuple, tuple] = {}
    live_b, live_p, live_v = [], [], []
    for item in items:
        if not isinstance(item, Block):
            one(item)
            continue
        b = item
        ix = indices.get(id(b.variants))
        if ix is None:
            ix = indices[id(b.variants)] = _index(b.variants)
        n = len(b.variants)
        counts["considered"] += n
        rules = dict(b.rules)
        passes = b.pp * b.virtual_stages * b.microbatches
        limit = (f"{passes:,} micro-batch passes (pp x v x micro-batches) exceed the work "
                 f"limit of {WORK_LIMIT:,}") if passes > WORK_LIMIT else ""
        rule_of = [rules[k] or limit for k in ix.rule]
        ruled = np.array([bool(r) for r in rule_of])[ix.rule_idx]
        reason = np.array([f"pruned: {r}" for r in rule_of] + [None],
                          dtype=object)[:-1][ix.rule_idx]
        kind = ruled.astype(np.int8)  # 0: live, 1: pruned, 2: handed to ``one``
        if ruled.all():
            _emit(b, rows, kind, reason, np.full(n, np.nan), counts, prog, one)
            continue
        spec = SCHEDULES[b.schedule]
        # Only keys some unpruned variant reads: a probe is a cost table.
        free = ~ruled
        need = set(ix.relaxed_idx[free].tolist())
        rel_arr = []
        for j, (sp, ov, sel, att) in enumerate(ix.relaxed):
            if j not in need:
                rel_arr.append((None, None))
                continue
            akey = ((b.tp, b.cp, b.micro_batch_size, sp, ov, sel, att), b.pp,
                    b.virtual_stages)
            if akey not in arrays:
                arrays[akey] = rp.arrays(b.candidate(ix.first[(j,)]))
            rel_arr.append((akey, arrays[akey]))
        excess = np.full(len(ix.memory), np.nan)
        mem_reason = np.empty(len(ix.memory), dtype=object)
        need = set(ix.memory_idx[free].tolist())
        for m, (j, rc, z) in enumerate(ix.memory):
            akey, arr = rel_arr[j]
            if m not in need or arr is None:
                continue
            shape = (akey, rc, b.schedule if rc == "full" else spec.placement)
            got = memory.get((shape, z))
            if got is None:
                got = memory[shape, z] = _memory(rp, margin, shape, z, arr, states,
                                                 screens, b.candidate(ix.first[(j, rc, z)]))
            excess[m], mem_reason[m] = got
        bnd = np.full(len(ix.bound), np.nan)
        need = set(ix.bound_idx[free].tolist())
        for m, (j, full) in enumerate(ix.bound):
            akey, arr = rel_arr[j]
            if m not in need or arr is None:
                continue
            bkey = (akey, full, b.schedule if full else spec.placement)
            if bkey not in bounds:
                pkey = (akey, spec.placement)
                if pkey not in parts:
                    parts[pkey] = bound_parts(arr, spec.placement, b.pp, b.virtual_stages)
                bounds[bkey] = lower_bound(b.candidate(ix.first[(j, full)]), arr,
                                           parts[pkey])
            bnd[m] = bounds[bkey]
        none = np.array([a is None for _k, a in rel_arr])[ix.relaxed_idx]
        kind[none & ~ruled] = 2
        ex = excess[ix.memory_idx]
        over = (kind == 0) & (ex > 0)
        short = np.where(over, ex / _GiB, np.nan)
        if over.any():
            reason[over] = mem_reason[ix.memory_idx[over]]
            kind[over] = 1
        _emit(b, rows, kind, reason, short, counts, prog, one)
        live = np.nonzero(kind == 0)[0]
        if len(live):
            live_b.append(np.full(len(live), rows.block_id(b), dtype=np.int64))
            live_p.append(live)
            live_v.append(bnd[ix.bound_idx[live]])
    if not live_v:
        e = np.zeros(0)
        return Level0(e.astype(np.int64), e.astype(np.int64), e)
    bids, pos, bvals = (np.concatenate(live_b), np.concatenate(live_p),
                        np.concatenate(live_v))
    order = np.argsort(bvals, kind="stable")
    return Level0(bids[order], pos[order], bvals[order])


def _memory(rp: RelaxedPricer, margin: float, shape: tuple, z: int, arr: dict,
            states: dict, screens: dict, c: Candidate) -> tuple[float, str]:
    """(excess, reason) of the one-micro-batch screen of ``shape`` at ZeRO ``z``: the
    screen of :func:`~merak_sim.planner.screen.quick_memory`, every ZeRO stage at once
    (the kept activations do not depend on it)."""
    # The probes' capacity: known once a probe is priced.
    capacity = rp.capacity_bytes * (1 - margin)
    got = screens.get(shape)
    if got is None:
        akey = shape[0]
        placement = SCHEDULES[c.schedule].placement
        skey = (akey, placement)
        if skey not in states:
            states[skey] = state_per_rank(placement, c.pp, c.virtual_stages,
                                          np.stack(arr["state_by_zero"]))
        got = screens[shape] = worst_excess(states[skey] + kept_one(c, arr), capacity)
    ex = float(got[0][z])
    if ex <= 0:
        return ex, ""
    return ex, (f"memory: stage {int(got[1][z])} needs {(ex + capacity) / _GiB:.1f} GiB "
                f"for one micro-batch > {capacity / _GiB:.1f} GiB"
                + (" (unsharded state alone)" if z else ""))


def _emit(b: Block, rows: RowBook, kind: np.ndarray, reason: np.ndarray,
          short: np.ndarray, counts: dict, prog: Progress,
          one: Callable[[Candidate], None]) -> None:
    """The block's pruned rows in order, handing kind-2 candidates to ``one`` where
    they fall."""
    bid = rows.block_id(b)
    handed = np.nonzero(kind == 2)[0]
    start = 0
    for stop in list(handed) + [len(kind)]:
        sl = np.arange(start, stop)
        pruned = sl[kind[sl] == 1]
        if len(pruned):
            rows.extend(np.full(len(pruned), bid), pruned, "pruned", reason[pruned],
                        shortfalls=short[pruned])
            ruled = int(np.isnan(short[pruned]).sum())
            counts["pruned_rule"] += ruled
            counts["pruned_memory"] += len(pruned) - ruled
            prog.advance(len(pruned))
        if stop < len(kind):
            counts["considered"] -= 1  # ``one`` counts it again
            one(b.candidate(int(stop)))
        start = stop + 1


def bounded_reasons(bounds: np.ndarray, kth: float, top_k: int) -> np.ndarray:
    """The "bounded" reason of each bound (formatted once per distinct value)."""
    uniq, inv = np.unique(bounds, return_inverse=True)
    text = np.empty(len(uniq), dtype=object)
    for j, b in enumerate(uniq.tolist()):
        text[j] = (f"bounded: busiest rank alone needs {b:.3f} s, "
                   f"{(b / kth - 1) * 100:.1f} % above the top-{top_k} cut "
                   f"({kth:.3f} s); not simulated")
    return text[inv]
