"""Measured NCCL collective times inside one node, as bus-bandwidth curves.

:class:`NcclTable` holds measured all-reduce times per group size over message sizes;
:meth:`NcclTable.time` interpolates them (piecewise linear in bytes between measured
sizes, the last segment's bandwidth beyond the largest, the smallest size's time below
it: NCCL is latency bound there). Reduce-scatter and all-gather of ``n`` bytes cost half
an all-reduce of ``n`` bytes (a ring all-reduce is one of each; NCCL's bus bandwidth is
the same for the three). Group sizes missing from the table fall back to the link's
alpha-beta model (:func:`merak_sim.costs.comm.collective_time`).

:data:`A100_NVSWITCH`: vTrain's measured NCCL all-reduce on one 8-GPU A100 node (Bang
et al., MICRO 2024; the repository's data/vtrain/nccl-a100/AR_GPU{2..8}.csv, MIT), mean
of the out-of-place and in-place runs at every power of two from 1 MiB to 1 GiB (a test
rebuilds these numbers from the CSV files). Bus bandwidth grows with the group size
(about 166 / 185 / 202 GB/s at 64 MiB for 2 / 4 / 8 GPUs) and the 1 MiB floor is 45 us
(2 GPUs) to 92 us (8 GPUs): not one bandwidth and one latency for every group.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

__all__ = ["NcclTable", "A100_NVSWITCH", "NCCL_TABLES", "nccl_table_for"]


@dataclass(frozen=True, eq=False)
class NcclTable:
    """Measured all-reduce seconds per group size (module docstring).

    Attributes:
        name: what was measured.
        sizes_bytes: message sizes, increasing.
        allreduce_s: ``((group size, seconds per size), ...)``.
        source: provenance.
    """

    name: str
    sizes_bytes: tuple[int, ...]
    allreduce_s: tuple[tuple[int, tuple[float, ...]], ...]
    source: str = ""

    def group_sizes(self) -> tuple[int, ...]:
        """Group sizes the table measured."""
        return tuple(p for p, _ in self.allreduce_s)

    def covers(self, p: int) -> bool:
        """Whether a group of ``p`` GPUs was measured."""
        return p in self.group_sizes()

    def allreduce_time(self, nbytes: float, p: int) -> float:
        """Interpolated all-reduce seconds of ``nbytes`` among ``p`` GPUs of a node."""
        times = dict(self.allreduce_s)[p]
        xs = self.sizes_bytes
        if nbytes <= xs[0]:
            return times[0]
        i = min(bisect_right(xs, nbytes), len(xs) - 1)
        x0, x1, t0, t1 = xs[i - 1], xs[i], times[i - 1], times[i]
        return t0 + (nbytes - x0) * (t1 - t0) / (x1 - x0)

    def time(self, kind: str, nbytes: float, p: int) -> float:
        """Seconds of ``kind`` ("all-reduce", "reduce-scatter", "all-gather") of
        ``nbytes`` among ``p`` GPUs of a node."""
        if p <= 1 or nbytes <= 0:
            return 0.0
        t = self.allreduce_time(nbytes, p)
        return t if kind == "all-reduce" else 0.5 * t

    def bus_bandwidth_Bps(self, nbytes: float, p: int) -> float:
        """NCCL's bus bandwidth of an all-reduce: 2 (p-1)/p x bytes / time."""
        return 2 * (p - 1) / p * nbytes / self.allreduce_time(nbytes, p)


_MIB = 1 << 20
_us = 1e-6
#: Microseconds at 1, 2, 4, ..., 1024 MiB per group size (module docstring).
_A100_US = {
    2: (44.66, 52.28, 60.72, 87.13, 130.65, 229.50, 404.35, 764.65, 1455.10, 2835.90, 5448.10),
    3: (63.70, 70.69, 78.72, 103.05, 153.10, 265.20, 499.65, 929.00, 1786.20, 3466.50, 6759.20),
    4: (52.07, 55.84, 76.56, 115.20, 178.70, 282.95, 542.20, 999.65, 1928.35, 3720.25, 7267.45),
    5: (62.46, 62.09, 77.92, 122.00, 197.50, 322.55, 567.30, 1065.15, 2036.55, 3934.05, 7650.10),
    6: (73.33, 74.25, 81.33, 125.15, 201.05, 303.55, 563.00, 1120.80, 2116.35, 4020.35, 7885.40),
    7: (77.85, 78.39, 83.72, 132.10, 227.75, 333.25, 598.70, 1146.35, 2190.35, 4109.85, 8116.55),
    8: (92.47, 93.11, 94.92, 132.05, 231.70, 356.90, 579.75, 1164.00, 2160.15, 4189.55, 8194.70),
}

A100_NVSWITCH = NcclTable(
    name="NCCL all-reduce, one 8-GPU A100 node (vTrain measurement)",
    sizes_bytes=tuple(_MIB << k for k in range(11)),
    allreduce_s=tuple((p, tuple(t * _us for t in ts)) for p, ts in _A100_US.items()),
    source="vTrain (Bang et al., MICRO 2024), data/vtrain/nccl-a100, MIT",
)

#: Cluster preset name -> measured table of its intra-node collectives.
NCCL_TABLES: dict[str, NcclTable] = {
    "vtrain-a100": A100_NVSWITCH,
    "dgx-a100-80g": A100_NVSWITCH,
    "dgx-a100-40g": A100_NVSWITCH,
}


def nccl_table_for(cluster_name: str) -> NcclTable | None:
    """The measured intra-node table of a cluster preset, or None."""
    return NCCL_TABLES.get(cluster_name)
