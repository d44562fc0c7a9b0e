"""Chunked tensor-parallel overlap: Megatron/Transformer Engine userbuffers and torch's
async TP, priced chunk by chunk.

Both need sequence parallelism: every column-parallel GEMM (QKV, FC1) is preceded by
an all-gather of the sequence-sharded input and every row-parallel GEMM (projection,
FC2) followed by a reduce-scatter of its output, in forward and (mirrored) in backward.
Both split each such collective and its GEMM into ``n`` chunks along the sequence, so
chunk i's communication runs while chunk i-1's (all-gather) or i+1's (reduce-scatter)
GEMM computes:

- "te-chunked": Transformer Engine's userbuffers (Megatron-core ``--tp-comm-overlap``):
  the all-gather as ``tp`` ring-exchange steps and the reduce-scatter pipelined the
  same way, ``n = tp`` chunks (TE ``UserbufferCommOverlap`` ring exchange; NVIDIA
  Megatron-core docs "Communication overlap"); its p2p kernels hold a few SMs, which
  slows the overlapped GEMMs (``gemm_slowdown`` 0.05, an ESTIMATE).
- "async-tp": PyTorch's asynchronous TP (torch._micro_pipeline_tp, symmetric-memory
  collective matmuls; torchtitan ``--parallelism.enable_async_tensor_parallel``,
  Wang et al., "Overlap communication with dependent computation via decomposition",
  ASPLOS 2023): ``n = tp`` chunks moved by copy engines, no SMs taken, but the decomposed
  GEMMs are smaller and run less efficiently (``gemm_slowdown`` 0.08, an ESTIMATE).

Price of one collective of ``C`` seconds beside its GEMM of ``G`` seconds in ``n``
chunks (communication chunk a = C/n, GEMM chunk g = G/n): the pipeline runs
a + (n-1) max(a, g) + g, so the exposed time beyond the GEMM is

    exposed = C/n + (n - 1) max(0, C - G)/n + slowdown x G

(one chunk's communication never hides, the rest hide as far as the GEMM is longer).
It works at any micro-batch, 1 included: the chunks split the sequence, not the batch,
unlike Merak's sub-pipelined TP (:mod:`merak_sim.costs.tp_comm`), which splits the
micro-batch and is unchanged. A pass's GEMM time is its compute less its attention
kernels, shared equally by its collectives (each collective overlaps its own GEMM).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ChunkedOverlap", "CHUNKED_OVERLAPS", "chunked_exposed_s", "chunked_pass"]


@dataclass(frozen=True, slots=True)
class ChunkedOverlap:
    """A chunked TP overlap mode (module docstring).

    Attributes:
        name: the ``ParallelConfig.tp_overlap`` value.
        gemm_slowdown: extra fraction of an overlapped GEMM's time (SMs held by the
            communication kernels, or smaller decomposed GEMMs).
        source: where the mechanism is described.
    """

    name: str
    gemm_slowdown: float
    source: str

    def chunks(self, tp: int) -> int:
        """Chunks each collective is split into: one per TP rank."""
        return tp


CHUNKED_OVERLAPS: dict[str, ChunkedOverlap] = {m.name: m for m in (
    ChunkedOverlap("te-chunked", 0.05,
                   "Transformer Engine userbuffers ring exchange (Megatron-core "
                   "--tp-comm-overlap)"),
    ChunkedOverlap("async-tp", 0.08,
                   "PyTorch async TP (symmetric memory, torchtitan "
                   "enable_async_tensor_parallel)"),
)}


def chunked_exposed_s(comm_s: float, gemm_s: float, chunks: int,
                      gemm_slowdown: float = 0.0) -> float:
    """Exposed seconds of one collective of ``comm_s`` pipelined in ``chunks`` chunks
    with its GEMM of ``gemm_s`` (module docstring)."""
    if chunks < 1:
        raise ValueError(f"chunks must be a positive integer, got {chunks}")
    if comm_s <= 0:
        return 0.0
    return (comm_s / chunks + (chunks - 1) * max(0.0, comm_s - gemm_s) / chunks
            + gemm_slowdown * gemm_s)


def chunked_pass(mode: str, ag_s: float, rs_s: float, count: int, tp: int,
                 gemm_s: float) -> float:
    """Exposed seconds of a pass's ``count`` all-gather + reduce-scatter pairs (of
    ``ag_s`` and ``rs_s`` each) under ``mode``, beside ``gemm_s`` of GEMMs shared
    equally by its 2 ``count`` collectives."""
    if mode not in CHUNKED_OVERLAPS:
        raise ValueError(f"unknown chunked TP overlap {mode!r}; choose one of: "
                         f"{', '.join(CHUNKED_OVERLAPS)}")
    if count == 0:
        return 0.0
    m = CHUNKED_OVERLAPS[mode]
    n = m.chunks(tp)
    g = gemm_s / (2 * count)
    return count * (chunked_exposed_s(ag_s, g, n, m.gemm_slowdown)
                    + chunked_exposed_s(rs_s, g, n, m.gemm_slowdown))
