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

So :func:`relaxed_sweep` prices each distinct value once, a block's new values in
one call on arrays stacked one row per key (the functions of one candidate at a time
take leading axes and give each row the same float as that row alone), and spreads
the results over the block's variants with numpy; the rows it decides (pruned by a
rule or by memory) go into the :class:`~merak_sim.planner.rows.RowBook` as chunks, in
enumeration order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from merak_sim.progress import PLANNER_BOUND, Progress
from merak_sim.schedule import SCHEDULES

from .bounds import bound_parts, bound_values
from .grid import rank_grid
from .relaxed import MEMORY_FIELDS, TIME_FIELDS, RelaxedPricer
from .rows import RowBook
from .screen import kept_rows, state_per_rank, worst_excess
from .space import Block, Candidate

__all__ = ["Level0", "relaxed_sweep", "bounded_reasons"]

_GiB = float(2**30)
#: The stage-array fields :func:`~merak_sim.planner.bounds.bound_parts` reads: the time
#: bound's and the tail's (zero in relaxed arrays).
_BOUND_FIELDS = TIME_FIELDS + ("optimizer_s", "grad_allreduce_s")


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
    the index of its key (module docstring). A *shape* is (relaxed key, recompute
    policy): what the memory screen reads besides the ZeRO stage."""

    rule: tuple[tuple[int, bool], ...]
    rule_idx: np.ndarray
    relaxed: tuple[tuple, ...]
    relaxed_idx: np.ndarray
    shape: tuple[tuple[int, str], ...]
    shape_idx: np.ndarray
    zero: np.ndarray
    first: dict[tuple, int]


def _distinct(keys: list[tuple]) -> tuple[tuple[tuple, ...], np.ndarray]:
    uniq: dict[tuple, int] = {}
    idx = np.array([uniq.setdefault(k, len(uniq)) for k in keys], dtype=np.int64)
    return tuple(uniq), idx


def _index(variants: tuple) -> _Index:
    rule, rule_idx = _distinct([(z, sp) for _rc, sp, _ov, z, _zg, _att, _o in variants])
    relaxed, relaxed_idx = _distinct([(sp, ov, rc == "selective", att)
                                      for rc, sp, ov, _z, _zg, att, _o in variants])
    shape, shape_idx = _distinct([(int(r), v[0]) for r, v in zip(relaxed_idx, variants)])
    first: dict[tuple, int] = {}
    for i, v in enumerate(variants):
        r = int(relaxed_idx[i])
        first.setdefault((r,), i)
        first.setdefault((r, v[0]), i)
    return _Index(rule, rule_idx, relaxed, relaxed_idx, shape, shape_idx,
                  np.array([v[3] for v in variants], dtype=np.int64), first)


@dataclass
class _Memo:
    """What the sweep has priced, shared by every block of one search. Blocks first
    queue the screens and bounds they need (:meth:`queue`), grouped by what the
    functions read of the schedule, and :meth:`flush` prices each group in one call."""

    rp: RelaxedPricer
    margin: float
    screens: dict = field(default_factory=dict)
    bounds: dict = field(default_factory=dict)
    blocks: dict = field(default_factory=dict)
    plans: dict = field(default_factory=dict)
    pending: dict = field(default_factory=dict)

    def queue(self, shape: tuple, screens: dict, bounds: dict) -> None:
        """Queue for :meth:`flush` the screens (screen key -> (array key, arrays,
        recompute policy)) and bounds (bound key -> (array key, arrays, full
        recompute, DP overlap, micro-batches)) of one schedule shape (placement,
        pp, virtual stages, never-recompute ranks, explicit re-forwards) not priced
        or queued yet."""
        todo_s, todo_b = self.pending.setdefault(shape, ({}, {}))
        for k, item in screens.items():
            todo_s.setdefault(k, item)
        for k, item in bounds.items():
            todo_b.setdefault(k, item)

    def flush(self) -> None:
        """Price every queued screen and bound, one call per shape (:meth:`fill`)."""
        for shape, (screens, bounds) in self.pending.items():
            self.fill(shape, screens, bounds)
        self.pending.clear()

    def fill(self, shape: tuple, screens: dict, bounds: dict) -> None:
        """Price for schedule shape ``shape`` (:meth:`queue`), all at once, the
        one-micro-batch screens ``screens`` and the relaxed bounds ``bounds``, with the
        functions :func:`~merak_sim.planner.screen.quick_memory` and
        :func:`~merak_sim.planner.bounds.lower_bound` use, on arrays stacked one row per
        key (each row's values equal those of that key alone). A screen is (excess,
        rank) per ZeRO stage (the kept activations do not depend on it) and a slot per
        stage for its reason, formatted by :meth:`reason` on first use."""
        placement, S, v, never, explicit = shape
        if screens:
            items = list(screens.values())
            st = state_per_rank(placement, S, v,
                                np.array([arr["state_by_zero"] for _a, arr, _rc in items]))
            ck, act = (np.array([arr[f] for _a, arr, _rc in items])
                       for f in MEMORY_FIELDS[::-1])
            rcs = [rc for *_, rc in items]
            kept = kept_rows(rank_grid(placement, S, v), ck, act,
                             np.array([rc not in ("none", "selective") for rc in rcs]),
                             np.array([rc == "full" for rc in rcs]), never)
            ex, r = worst_excess(st + kept[:, None, :], self.capacity())
            for j, k in enumerate(screens):
                # With room for its reason per ZeRO stage, formatted on first use.
                self.screens[k] = (ex[j], r[j], [None] * 4)
        if bounds:
            items = list(bounds.values())
            parts = bound_parts({f: np.array([it[1][f] for it in items])
                                 for f in _BOUND_FIELDS}, placement, S, v)
            vals = bound_values(parts, np.array([it[4] for it in items])[:, None],
                                np.array([it[2] for it in items]),
                                np.array([it[3] for it in items]), never, explicit)
            self.bounds.update(zip(bounds, vals.tolist()))

    def capacity(self) -> float:
        """Usable bytes per GPU (the probes' capacity: known once one is priced)."""
        return self.rp.capacity_bytes * (1 - self.margin)

    def reason(self, screen: tuple, z: int) -> str:
        """The memory-pruned reason of ``screen`` (an entry of ``screens``) at ZeRO
        ``z``."""
        ex, r, texts = screen
        got = texts[z]
        if got is None:
            cap = self.capacity()
            got = texts[z] = (
                f"memory: stage {int(r[z])} needs {(float(ex[z]) + cap) / _GiB:.1f} GiB "
                f"for one micro-batch > {cap / _GiB:.1f} GiB"
                + (" (unsharded state alone)" if z else ""))
        return got


def relaxed_sweep(items: Iterable[Candidate | Block], rp: RelaxedPricer, margin: float,
                  rows: RowBook, counts: dict, prog: Progress,
                  one: Callable[[Candidate], None]) -> Level0:
    """Relax every candidate of ``items`` (module docstring): rule and memory pruned
    rows into ``rows``, the rest returned sorted by bound. ``one`` takes each
    candidate the pass does not handle itself (those pruned before a block forms, and
    those whose relaxed arrays the cost model cannot give), in enumeration order;
    ``margin`` the fraction of GPU memory kept free."""
    indices: dict[int, _Index] = {}
    memo = _Memo(rp, margin)
    items = list(items)
    # First what every block needs priced, then each shape's screens and bounds in
    # one call, then the rows in enumeration order.
    ruled_of = {}
    for item in items:
        if isinstance(item, Block):
            ix = indices.get(id(item.variants))
            if ix is None:
                ix = indices[id(item.variants)] = _index(item.variants)
            ruled, reason = _ruled(item, ix)
            key = None if ruled.all() else _plan_block(item, ix, memo, ~ruled)
            ruled_of[id(item)] = ruled, reason, key
    memo.flush()
    live_b, live_p, live_v = [], [], []
    for item in items:
        if not isinstance(item, Block):
            one(item)
            continue
        b = item
        ix = indices[id(b.variants)]
        n = len(b.variants)
        counts["considered"] += n
        ruled, reason, key = ruled_of[id(b)]
        kind = ruled.astype(np.int8)  # 0: live, 1: pruned, 2: handed to ``one``
        short = np.full(n, np.nan)
        bound = short if key is None else _relax_block(key, ix, memo, kind, reason, short)
        _emit(b, rows, kind, reason, short, counts, prog, one)
        live = np.nonzero(kind == 0)[0]
        if len(live):
            live_b.append(np.full(len(live), rows.block_id(b), dtype=np.int64))
            live_p.append(live)
            live_v.append(bound[live])
    if not live_v:
        e = np.zeros(0)
        return Level0(e.astype(np.int64), e.astype(np.int64), e)
    bids, pos, bvals = (np.concatenate(live_b), np.concatenate(live_p),
                        np.concatenate(live_v))
    order = np.argsort(bvals, kind="stable")
    return Level0(bids[order], pos[order], bvals[order])


def _ruled(b: Block, ix: _Index) -> tuple[np.ndarray, np.ndarray]:
    """(whether a rule prunes it, its reason or None) per variant of ``b``."""
    rules = dict(b.rules)
    passes = b.pp * b.virtual_stages * b.microbatches
    limit = (f"{passes:,} micro-batch passes (pp x v x micro-batches) exceed the work "
             f"limit of {PLANNER_BOUND.passes:,}") if not PLANNER_BOUND.admits(passes) else ""
    rule_of = [rules[k] or limit for k in ix.rule]
    ruled = np.array([bool(r) for r in rule_of])[ix.rule_idx]
    reason = np.array([f"pruned: {r}" for r in rule_of] + [None],
                      dtype=object)[:-1][ix.rule_idx]
    return ruled, reason


def _plan_block(b: Block, ix: _Index, memo: _Memo, free: np.ndarray) -> tuple:
    """Price the relaxed arrays the variants ``free`` of ``b`` read and queue their
    screens and bounds (:meth:`_Memo.queue`); the keys go to ``memo.plans`` under
    the block's plan key, which it returns (for :func:`_relax_block`)."""
    spec = SCHEDULES[b.schedule]
    # What the bound and the screen read of the schedule: blocks of schedules alike in
    # it (and in everything else) get the same values.
    sched = (spec.placement, spec.never_recompute(b.pp), spec.explicit_recompute)
    # The micro-batch count is not in the keys: one search has one world size and one
    # global batch, so tp, cp, pp and the micro-batch size fix it.
    key = (b.tp, b.cp, b.ep, b.pp, b.virtual_stages, b.micro_batch_size, sched, id(b.variants),
           free.tobytes())
    if key in memo.plans:
        return key
    # Only keys some unpruned variant reads: a probe is a cost table.
    need = sorted(set(ix.relaxed_idx[free].tolist()))
    keys = [(b.tp, b.cp, b.micro_batch_size, *ix.relaxed[j], b.ep) for j in need]
    rel: list[tuple] = [(None, None)] * len(ix.relaxed)
    for j, arr in zip(need, memo.rp.arrays_of(keys, b.pp, b.virtual_stages), strict=True):
        # The pricer keeps the arrays for the whole search, so their id names them in
        # the keys below (cheaper to hash than the relaxed key with pp and v).
        rel[j] = (id(arr), arr)
    n_sh = len(ix.shape)
    skeys: list[tuple | None] = [None] * n_sh
    bkeys: list[tuple | None] = [None] * n_sh
    todo_s, todo_b = {}, {}
    for s_i in sorted(set(ix.shape_idx[free].tolist())):
        j, rc = ix.shape[s_i]
        akey, arr = rel[j]
        if arr is None:
            continue
        full = rc == "full"
        # Full recompute reads the schedule's never-recompute ranks and explicit
        # re-forwards; the other policies only its placement.
        where = sched if full else sched[0]
        skey = skeys[s_i] = (akey, rc, where)
        bkey = bkeys[s_i] = (akey, full, where)
        if skey not in memo.screens:
            todo_s[skey] = (akey, arr, rc)
        if bkey not in memo.bounds and bkey not in todo_b:
            # The DP overlap of the shape's first variant (the relaxed tail is zero).
            todo_b[bkey] = (akey, arr, full, b.variants[ix.first[(j, rc)]][6],
                            b.microbatches)
    memo.queue((sched[0], b.pp, b.virtual_stages, sched[1], sched[2]), todo_s, todo_b)
    none = np.array([a is None for _k, a in rel])[ix.relaxed_idx]
    memo.plans[key] = (none, skeys, bkeys)
    return key


def _relax_block(key: tuple, ix: _Index, memo: _Memo, kind: np.ndarray,
                 reason: np.ndarray, short: np.ndarray) -> np.ndarray:
    """Relaxed bound per variant of the block planned under ``key`` (by
    :func:`_plan_block`, priced by :meth:`_Memo.flush`); marks in ``kind`` /
    ``reason`` / ``short`` (GiB) the variants memory prunes (1) and those without
    relaxed arrays (2)."""
    free = kind == 0
    got = memo.blocks.get(key)
    if got is None:
        none, ex, bound, screens = _block_values(ix, memo, memo.plans[key])
        handed = none & free
        over = free & ~handed & (ex > 0)
        text = np.empty(len(ex), dtype=object)
        if over.any():
            # One reason per distinct (shape, ZeRO stage), spread over its variants.
            code = ix.shape_idx * 4 + ix.zero
            uniq, inv = np.unique(code[over], return_inverse=True)
            once = np.empty(len(uniq), dtype=object)
            for u, k in enumerate(uniq.tolist()):
                once[u] = memo.reason(screens[k // 4], k % 4)
            text[over] = once[inv]
        got = memo.blocks[key] = (handed, over, text[over], ex[over] / _GiB, bound)
    handed, over, text, gib, bound = got
    kind[handed] = 2
    kind[over] = 1
    reason[over] = text
    short[over] = gib
    return bound


def _block_values(ix: _Index, memo: _Memo, plan: tuple) -> tuple:
    """(no relaxed arrays, one-micro-batch excess, relaxed bound) per variant of a
    block, and the screen entry of each shape, from its plan (others NaN / None)."""
    none, skeys, bkeys = plan
    n_sh = len(ix.shape)
    excess = np.full((n_sh, 4), np.nan)
    bound = np.full(n_sh, np.nan)
    screens: list[tuple | None] = [None] * n_sh
    for s_i, (skey, bkey) in enumerate(zip(skeys, bkeys)):
        if skey is not None:
            screens[s_i] = memo.screens[skey]
            excess[s_i] = screens[s_i][0]
            bound[s_i] = memo.bounds[bkey]
    return none, excess[ix.shape_idx, ix.zero], bound[ix.shape_idx], screens


def _emit(b: Block, rows: RowBook, kind: np.ndarray, reason: np.ndarray,
          short: np.ndarray, counts: dict, prog: Progress,
          one: Callable[[Candidate], None]) -> None:
    """The block's pruned rows in order, handing kind-2 candidates to ``one`` where
    they fall."""
    bid = rows.block_id(b)
    handed = np.nonzero(kind == 2)[0].tolist()
    start = 0
    for stop in handed + [len(kind)]:
        pruned = np.nonzero(kind[start:stop] == 1)[0] + start
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
