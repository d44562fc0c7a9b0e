"""Tensor-parallel collectives of one layer pass: their total time, what stays exposed
and the bytes each GPU sends.

A pass (forward or backward) of a layer makes ``count`` collectives of ``nbytes``
(:attr:`~merak_sim.costs.layers.LayerCost.tp_fwd` / ``tp_bwd``) over the TP group:
all-reduces, or with sequence parallelism an all-gather plus a reduce-scatter in place
of each (same bytes). Without overlap every collective is synchronous and exposed.
Sub-pipelined TP (Merak T3) hides all but the last collective of the pass behind the
pass's compute, as far as that compute (less the first part's first sub-layer) allows.
The chunked overlaps ("te-chunked", "async-tp": sequence parallelism's all-gathers and
reduce-scatters pipelined chunk by chunk with their GEMMs, at any micro-batch) are
priced by :mod:`merak_sim.costs.tp_overlap`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from merak_sim.costs.comm import group_ranks
from merak_sim.costs.tp_overlap import CHUNKED_OVERLAPS, chunked_pass

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig
    from merak_sim.costs.layers import LayerCost

__all__ = ["tp_pass"]

#: Seconds of a collective: (kind, bytes, global ranks, cluster) -> seconds.
Comm = Callable[[str, float, tuple[int, ...], Any], float]


def tp_pass(comm: Comm, lay: LayerCost, which: str, cluster: Any, config: ParallelConfig,
            pp_rank: int, compute_s: float) -> tuple[float, float, float]:
    """(total, exposed, bytes sent per GPU) of the TP collectives of one ``which``
    ("fwd"/"bwd") pass of ``lay`` whose compute takes ``compute_s``, priced by
    ``comm`` on the TP group of pipeline rank ``pp_rank`` (module docstring)."""
    if config.tp == 1:
        return 0.0, 0.0, 0.0
    nbytes, count = lay.tp_fwd if which == "fwd" else lay.tp_bwd
    if count == 0:
        return 0.0, 0.0, 0.0
    ranks = group_ranks("tp", config, pp_rank)
    if config.sequence_parallel:
        ag = comm("all-gather", nbytes, ranks, cluster)
        rs = comm("reduce-scatter", nbytes, ranks, cluster)
        one = ag + rs
        if config.tp_overlap in CHUNKED_OVERLAPS:
            t = config.tp
            sent = count * 2.0 * (t - 1) / t * nbytes
            attn = lay.attn_fwd_s if which == "fwd" else lay.attn_bwd_s
            gemm = max(0.0, compute_s - attn) if compute_s > 0 else 0.0
            return (count * one, chunked_pass(config.tp_overlap, ag, rs, count, t, gemm),
                    sent)
    else:
        one = comm("all-reduce", nbytes, ranks, cluster)
    t = config.tp
    # Ring algorithms: an all-reduce (or all-gather + reduce-scatter) sends
    # 2 (t-1)/t of its payload from every GPU.
    sent = count * 2.0 * (t - 1) / t * nbytes
    total = count * one
    parts = config.tp_overlap_parts if config.tp_overlap == "sub-pipelined" else 1
    if parts == 1 or count < 2:
        return total, total, sent
    # Sub-pipelined: the last collective of the pass is exposed; the others hide
    # behind the pass's compute (all but the first part's first sub-layer).
    hidden_room = compute_s * (1 - 1 / count)
    return total, one + max(0.0, (count - 1) * one - hidden_room), sent
