"""Gradient buckets of the overlapped data-parallel reduction: the one definition the
exact evaluator and the SimPy engine share.

Each chunk's gradients are split into ``buckets`` equal buckets that become ready
evenly through that chunk's last backward (layers finish one after another, as in
PyTorch DDP and Megatron's bucketed overlap). Under ZeRO-1 only the reduce-scatter
half of the reduction overlaps; the all-gather half runs after the optimizer step.
"""

from __future__ import annotations

__all__ = ["chunk_buckets", "overlapped_share"]


def overlapped_share(zero: int) -> float:
    """Fraction of a chunk's reduction that overlaps the backwards (ZeRO-1: the
    reduce-scatter half)."""
    return 0.5 if zero == 1 else 1.0


def chunk_buckets(start_s: float, duration_s: float, reduce_s: float, buckets: int,
                  zero: int) -> list[tuple[float, float]]:
    """(ready time, reduction time) of each bucket of one chunk whose last backward
    runs from ``start_s`` for ``duration_s`` and whose whole reduction takes
    ``reduce_s``."""
    share = overlapped_share(zero)
    return [(start_s + duration_s * (j + 1) / buckets, reduce_s * share / buckets)
            for j in range(buckets)]
