"""Context parallelism: ring attention's key/value exchange and its overlap.

With cp ranks per sequence (Liu et al., Ring Attention, 2023; Megatron-LM's context
parallelism), every GPU keeps s/cp tokens and attends its queries to all keys in cp
steps: at each step it computes attention against the key/value block it holds while
sending that block to the next rank of the ring and receiving the next one from the
previous rank. A forward pass therefore makes cp - 1 exchanges of one K and V block
(2 b (s/cp) kv e bytes); the backward circulates the key/value blocks and their
gradients (twice the bytes) in cp - 1 exchanges. Each exchange overlaps one step's
attention compute (1/cp of the pass's attention time); only what exceeds it is exposed.
Sequences are split into 2 cp chunks and paired (first with last) so causal work is
balanced, which needs the sequence length divisible by 2 cp.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from merak_sim.layout import RankLayout, layout_key
from merak_sim.memo import PROCESS_MEMO_ENTRIES, IdentityMemo

__all__ = ["RingPass", "ring_steps", "ring_pass", "check_cp", "clear_ring_cache"]

Comm = Callable[[str, float, tuple[int, ...], Any], float]


def check_cp(model: Any, cp: int) -> None:
    """Raise ValueError if context parallelism ``cp`` cannot split ``model``'s
    sequences (a causal model needs 2 cp chunks per sequence)."""
    if cp == 1:
        return
    chunks = 2 * cp if model.causal else cp
    if model.seq_len % chunks:
        raise ValueError(f"cp={cp} does not divide the sequence: {model.seq_len} tokens "
                         f"into {chunks} chunks; choose cp with seq_len % "
                         f"{'2*cp' if model.causal else 'cp'} == 0")


def ring_steps(cp: int) -> tuple[int, int]:
    """(attention steps, key/value exchanges) of one pass around a ring of ``cp``."""
    return cp, max(cp - 1, 0)


@dataclass(frozen=True, slots=True)
class RingPass:
    """Context-parallel exchanges of one layer pass: (total, exposed) seconds, forward
    and backward, the bytes one GPU sends in each, and the working bytes held while one
    layer runs (0 for the ring; the other variants of :mod:`merak_sim.costs.cp`)."""

    fwd_total_s: float
    fwd_exposed_s: float
    bwd_total_s: float
    bwd_exposed_s: float
    fwd_bytes: float
    bwd_bytes: float
    working_bytes: float = 0.0


def ring_pass(comm: Comm, cluster: Any, config: Any, pp_rank: int, kv_bytes: float,
              attn_fwd_s: float, attn_bwd_s: float) -> RingPass:
    """Ring exchanges of one layer pass on pipeline rank ``pp_rank`` for a K/V block
    of ``kv_bytes`` and the pass's attention compute (module docstring). A step's
    exchange takes the slowest neighbour link of the ring."""
    cp = config.cp
    steps, xch = ring_steps(cp)
    if xch == 0 or kv_bytes <= 0:
        return RingPass(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    # Memoised (a planner prices the same stages for many tables): on the values of
    # the layout (degrees and order), the figures and the identity of ``comm`` and
    # ``cluster``; plain values only, so a layout they break still raises, warm or cold.
    key = layout_key(config)
    if key is None or type(pp_rank) is not int:
        return _ring_pass(comm, cluster, config, pp_rank, kv_bytes, attn_fwd_s, attn_bwd_s)
    return _PASSES.get((comm, cluster), (*key, pp_rank, kv_bytes, attn_fwd_s, attn_bwd_s),
                       _ring_pass, comm, cluster, config, pp_rank, kv_bytes, attn_fwd_s,
                       attn_bwd_s)


# Bounded: it lives as long as the process, across searches and cost models.
_PASSES = IdentityMemo(max_entries=PROCESS_MEMO_ENTRIES)


def clear_ring_cache() -> None:
    """Empty the memoised ring passes (with :func:`merak_sim.costs.comm.clear_caches`,
    for timing a cold cost model)."""
    _PASSES.clear()


def _ring_pass(comm: Comm, cluster: Any, config: Any, pp_rank: int, kv_bytes: float,
               attn_fwd_s: float, attn_bwd_s: float) -> RingPass:
    cp = config.cp
    steps, xch = ring_steps(cp)
    lay = RankLayout.of(config)
    ring = lay.group("cp", lay.rank(pp_rank))
    pairs = {(ring[i], ring[(i + 1) % cp]) for i in range(cp)}

    def one(nbytes: float) -> float:
        return max(comm("p2p", nbytes, pr, cluster) for pr in pairs)

    tf, tb = one(kv_bytes), one(2 * kv_bytes)
    ef = xch * max(0.0, tf - attn_fwd_s / steps)
    eb = xch * max(0.0, tb - attn_bwd_s / steps)
    return RingPass(xch * tf, ef, xch * tb, eb, xch * kv_bytes, 2 * xch * kv_bytes)
