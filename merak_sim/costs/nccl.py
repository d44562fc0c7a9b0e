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

Across nodes (:class:`InterNodeBusBandwidth`): NCCL does not reach an InfiniBand
adapter's line rate. Its ring all-reduce across nodes is bounded by the node's
adapters, so its measured bus bandwidth is the node's achievable network bandwidth;
a table that carries one (``NcclTable.inter``) caps every off-node transfer of the
collectives and point-to-point sends priced with it at that figure shared by the
node's GPUs (:func:`merak_sim.costs.comm.inter_bandwidth_per_gpu`).
:data:`HDR4_A100_NODES`: nodes of 8 A100 SXM with 4 HDR 200 Gb/s adapters (100 GB/s
line rate per node, vTrain's cluster) measure 85-96 GB/s of all-reduce bus bandwidth
between nodes in public nccl-tests reports on that node design (NVIDIA/nccl-tests
issues #100: 91 GB/s with 1-8 GB messages on HGX A100 80GB with four ConnectX-6 HDR;
#119: 84.8 GB/s mean and 96 peak on three such servers; #175: 86 GB/s on two), i.e.
85-96 % of line rate; the large-message figure, 91 GB/s, is used.
:data:`VTRAIN_A100` is the intra-node table with that inter-node figure (the
``vtrain-a100`` preset); the DGX presets (8 adapters per node) keep the link model.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

__all__ = ["InterNodeBusBandwidth", "NcclTable", "A100_NVSWITCH", "HDR4_A100_NODES",
           "VTRAIN_A100", "NCCL_TABLES", "nccl_table_for"]


@dataclass(frozen=True, slots=True)
class InterNodeBusBandwidth:
    """Measured NCCL all-reduce bus bandwidth between nodes (module docstring).

    Attributes:
        name: what was measured.
        node_Bps: bus bandwidth per node at large messages (bytes/s): what the node's
            adapters deliver to NCCL, shared by the node's GPUs when all send.
        low_Bps / high_Bps: the spread of the measurements (bounds of ``node_Bps``).
        source: provenance.
    """

    name: str
    node_Bps: float
    low_Bps: float
    high_Bps: float
    source: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.low_Bps <= self.node_Bps <= self.high_Bps:
            raise ValueError(f"inter-node bus bandwidth {self.node_Bps} must lie in its "
                             f"measured range [{self.low_Bps}, {self.high_Bps}]")

    def per_gpu_Bps(self, link_per_gpu_Bps: float, gpus_per_node: int) -> float:
        """Bandwidth one GPU gets off-node when all GPUs of its node send: the node's
        measured figure shared by its GPUs, never above the link's own share."""
        return min(link_per_gpu_Bps, self.node_Bps / gpus_per_node)


@dataclass(frozen=True, eq=False)
class NcclTable:
    """Measured all-reduce seconds per group size (module docstring).

    Attributes:
        name: what was measured.
        sizes_bytes: message sizes, increasing.
        allreduce_s: ``((group size, seconds per size), ...)``.
        source: provenance.
        inter: measured bus bandwidth between nodes of this node design (None: the
            link model prices off-node transfers).
    """

    name: str
    sizes_bytes: tuple[int, ...]
    allreduce_s: tuple[tuple[int, tuple[float, ...]], ...]
    source: str = ""
    inter: InterNodeBusBandwidth | None = None

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

_GB = 1e9
HDR4_A100_NODES = InterNodeBusBandwidth(
    name="NCCL all-reduce between nodes of 8 A100 SXM + 4x HDR 200 Gb/s",
    node_Bps=91 * _GB, low_Bps=84.8 * _GB, high_Bps=96 * _GB,
    source="NVIDIA/nccl-tests issues #100, #119, #175 (public nccl-tests reports)",
)

VTRAIN_A100 = NcclTable(
    name="NCCL, 8-GPU A100 nodes with 4 HDR adapters (vTrain's cluster)",
    sizes_bytes=A100_NVSWITCH.sizes_bytes, allreduce_s=A100_NVSWITCH.allreduce_s,
    source=A100_NVSWITCH.source, inter=HDR4_A100_NODES,
)

#: Cluster preset name -> measured table of its collectives.
NCCL_TABLES: dict[str, NcclTable] = {
    "vtrain-a100": VTRAIN_A100,
    "dgx-a100-80g": A100_NVSWITCH,
    "dgx-a100-40g": A100_NVSWITCH,
}


def nccl_table_for(cluster_name: str) -> NcclTable | None:
    """The measured intra-node table of a cluster preset, or None."""
    return NCCL_TABLES.get(cluster_name)
