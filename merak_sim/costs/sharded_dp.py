"""Sharded data parallelism: ZeRO 1-3, FSDP and HSDP communication and working memory.

Groups (:func:`sync_groups`): gradients are synchronised over every rank that holds the
same weights, dp x cp of them (context-parallel ranks hold the same layers). ZeRO
shards over groups of ``ParallelConfig.shard_group`` consecutive ones (HSDP: shard
inside a group, replicate across; torch's HSDP mesh has the shard dimension fastest)
and replicates across the ``replicate`` groups.

Per iteration (:func:`grad_sync_seconds`, outside the compute, ``grad_allreduce_s``):
- ZeRO 0: one all-reduce of the 16-bit gradients over the sync group.
- ZeRO 1 / 2 (Megatron's distributed optimizer; DeepSpeed ZeRO-2): a reduce-scatter of
  the gradients and, after the step, an all-gather of the updated 16-bit weights over
  the shard group; with HSDP an all-reduce of the 1/g gradient shard across replicas.
- ZeRO 3 (FSDP): only the HSDP all-reduce of the gradient shard; the rest is per layer.

Per micro-batch under ZeRO 3 (:func:`fsdp_pass`), as torch FSDP2 runs it with
``reshard_after_forward=True``: every unit (each transformer layer; the embedding and
the head as units of their own) all-gathers its weights before its forward and again
before its backward, and reduce-scatters its gradients after its backward: 2 all-gathers
and 1 reduce-scatter per unit per micro-batch. Prefetching overlaps the next unit's
all-gather with the current unit's compute (forward), and the previous unit's
reduce-scatter plus the next unit's all-gather with the current backward; what does not
fit behind the compute, the first all-gather and the last reduce-scatter are exposed.
The re-forward of a checkpointed layer runs after the backward's all-gather and needs
none of its own. Working memory (:func:`fsdp_working_bytes`): two units' gathered
16-bit weights (current and prefetched) and one unit's unsharded gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from merak_sim.layout import RankLayout, layout_key

__all__ = ["FsdpPass", "sync_groups", "grad_sync_seconds", "fsdp_collectives", "fsdp_pass",
           "fsdp_working_bytes", "sixteen_bit_bytes"]

Comm = Callable[[str, float, tuple[int, ...], Any], float]


def sixteen_bit_bytes(dtype: str) -> int:
    """Bytes per element of the weights and gradients that are communicated (fp32
    training: 4; bf16 / fp16 / fp8 training: the 16-bit copies, 2)."""
    return 4 if dtype == "fp32" else 2


def sync_groups(config: Any, pp_rank: int, tp_rank: int = 0
                ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(sync group, shard group, replicate group) of global ranks of pipeline rank
    ``pp_rank`` (module docstring); the first shard group and the replicate group of
    its first rank."""
    shard = config.shard_group if config.zero else 0
    key = layout_key(config)
    if key is not None and all(type(x) is int for x in (shard, pp_rank, tp_rank)):
        # Memoised on the values: a planner asks for the same groups per stage of
        # every table (plain values only, so one the layout rejects still raises).
        return _sync_groups_of(*key, shard, pp_rank, tp_rank)
    return _sync_groups(RankLayout.of(config), shard, pp_rank, tp_rank)


@lru_cache(maxsize=4096)
def _sync_groups_of(dp: int, tp: int, pp: int, cp: int, order: str, shard: int,
                    pp_rank: int, tp_rank: int
                    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    return _split(_sync_ranks_of(dp, tp, pp, cp, order, pp_rank, tp_rank), shard)


@lru_cache(maxsize=4096)
def _sync_ranks_of(dp: int, tp: int, pp: int, cp: int, order: str, pp_rank: int,
                   tp_rank: int) -> tuple[int, ...]:
    # Memoised apart from the shard group: ZeRO 0 and the sharded stages of one
    # layout synchronise over the same ranks.
    return _sync_ranks(RankLayout(dp, tp, pp, cp, order), pp_rank, tp_rank)


def _sync_ranks(lay: RankLayout, pp_rank: int, tp_rank: int) -> tuple[int, ...]:
    # A rank is affine in its coordinates: the corner (which checks pp_rank and
    # tp_rank) plus the data and context strides, not dp x cp calls of ``rank``.
    base = lay.rank(pp_rank, 0, tp_rank, 0)
    step_d = lay.rank(pp_rank, 1, tp_rank, 0) - base if lay.dp > 1 else 0
    step_c = lay.rank(pp_rank, 0, tp_rank, 1) - base if lay.cp > 1 else 0
    grid = base + np.arange(lay.dp)[:, None] * step_d + np.arange(lay.cp)[None, :] * step_c
    return tuple(np.sort(grid, axis=None).tolist())


def _split(ranks: tuple[int, ...], shard: int
           ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    g = shard or len(ranks)
    return ranks, ranks[:g], ranks[::g]


@lru_cache(maxsize=4096)
def _sync_groups(lay: RankLayout, shard: int, pp_rank: int, tp_rank: int
                 ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    # Memoised: a planner prices the same groups for many cost tables.
    return _split(_sync_ranks(lay, pp_rank, tp_rank), shard)


def grad_sync_seconds(comm: Comm, cluster: Any, config: Any, pp_rank: int,
                      params: float) -> float:
    """Seconds of the per-iteration gradient synchronisation of a stage holding
    ``params`` parameters per GPU (module docstring)."""
    ranks, shard, rep = sync_groups(config, pp_rank)
    if len(ranks) == 1:
        return 0.0
    nbytes = params * sixteen_bit_bytes(config.dtype)
    if config.zero == 0:
        return comm("all-reduce", nbytes, ranks, cluster)
    t = 0.0
    if config.zero in (1, 2):
        t += comm("reduce-scatter", nbytes, shard, cluster)
        t += comm("all-gather", nbytes, shard, cluster)
    if len(rep) > 1:
        t += comm("all-reduce", nbytes / len(shard), rep, cluster)
    return t


def fsdp_collectives(comm: Comm, unit_bytes: Sequence[float], shard: tuple[int, ...],
                     cluster: Any) -> tuple[list[float], list[float]]:
    """(all-gather, reduce-scatter) seconds of each ZeRO-3 unit of ``unit_bytes`` over
    the shard group ``shard``; each distinct size priced once (the layers' units are
    all alike)."""
    once = {b: (comm("all-gather", b, shard, cluster), comm("reduce-scatter", b, shard,
                                                            cluster))
            for b in dict.fromkeys(unit_bytes)}
    return [once[b][0] for b in unit_bytes], [once[b][1] for b in unit_bytes]


@dataclass(frozen=True, slots=True)
class FsdpPass:
    """ZeRO-3 communication of one micro-batch through a stage's units.

    Attributes:
        fwd_total_s / bwd_total_s: every collective of the pass priced alone.
        fwd_exposed_s / bwd_exposed_s: what the compute cannot hide (module docstring).
        all_gathers / reduce_scatters: collectives of the micro-batch (forward and
            backward together).
    """

    fwd_total_s: float
    fwd_exposed_s: float
    bwd_total_s: float
    bwd_exposed_s: float
    all_gathers: int
    reduce_scatters: int


def fsdp_pass(ag_s: Sequence[float], rs_s: Sequence[float], fwd_s: Sequence[float],
              bwd_s: Sequence[float]) -> FsdpPass:
    """Exposure of one micro-batch's FSDP collectives over units in forward order:
    ``ag_s`` / ``rs_s`` the all-gather / reduce-scatter seconds of each unit, ``fwd_s`` /
    ``bwd_s`` their forward / backward compute (module docstring)."""
    n = len(ag_s)
    if n == 0:
        return FsdpPass(0.0, 0.0, 0.0, 0.0, 0, 0)
    f_exp = ag_s[0] + sum(max(0.0, ag_s[i] - fwd_s[i - 1]) for i in range(1, n))
    # Backward visits the units in reverse; while unit j computes, the stream
    # reduce-scatters unit j+1 and gathers unit j-1.
    b_exp = ag_s[n - 1] + rs_s[0]
    for j in range(n - 1, -1, -1):
        work = (rs_s[j + 1] if j + 1 < n else 0.0) + (ag_s[j - 1] if j > 0 else 0.0)
        b_exp += max(0.0, work - bwd_s[j])
    return FsdpPass(sum(ag_s), f_exp, sum(ag_s) + sum(rs_s), b_exp, 2 * n, n)


def fsdp_working_bytes(unit_params: Sequence[float], dtype: str) -> tuple[float, float]:
    """(gathered weights, unsharded gradients) bytes FSDP holds at its peak: the two
    largest units' weights and the largest unit's gradients, 16-bit."""
    if not unit_params:
        return 0.0, 0.0
    e = sixteen_bit_bytes(dtype)
    top = sorted(unit_params, reverse=True)
    return float(sum(top[:2]) * e), float(top[0] * e)
