"""Communication cost: alpha-beta collectives on a cluster, Megatron rank placement.

Communication (alpha-beta, :meth:`AnalyticCostModel.comm_time`)
----------------------------------------------------------------
Ring algorithms inside a node: all-reduce 2(p-1) steps moving 2(p-1)/p of the bytes,
reduce-scatter and all-gather (p-1) steps moving (p-1)/p. Across nodes the better of a
flat ring and the hierarchical algorithm (intra-node reduce-scatter, inter-node
all-reduce of 1/l of the data among the nodes, intra-node all-gather), with each GPU
getting 1/gpus_per_node of its node's network bandwidth (every data-parallel group
communicates at once in training). All-reduce across nodes may also take NCCL's
double binary tree between the nodes (in the hierarchical algorithm's place of the
inter-node ring): 2 ceil(log2 k) latency steps among k nodes instead of the ring's
2 (k - 1), each node sending and receiving 2 x the bytes instead of 2 (k - 1) / k x
(Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA
Developer Blog 2019: trees since NCCL 2.4, for all-reduce; full bandwidth, logarithmic
latency). NCCL's tuner picks the algorithm from its own time model by node count,
GPUs per node, message size and bandwidths (NVIDIA/nccl issue #754); here, likewise,
the fastest of the three is the price (:func:`collective_algorithm` names it): the
tree wins at small and medium messages over many nodes, the ring at large ones.
"Node" in this module means an NVLink domain (:attr:`Cluster.domain_size
<merak_sim.hardware.Cluster.domain_size>`): one HGX node, or the 72 GPUs of an NVL72 rack
over 18 trays; a group inside one domain is priced on NVLink whatever trays its ranks
are on, and off-domain traffic shares the adapters of each tray's GPUs as above.

NVLink SHARP (NVLS, where the preset has it: ``Cluster.nvls``): the NVLink switches
reduce in the fabric, so an all-reduce inside a domain sends each GPU's n bytes up to
the switch once and receives the n reduced bytes once: n / (eta x raw NVLink
bandwidth) plus one latency, against the ring's 2 (p-1)/p n / achievable bandwidth.
eta = :data:`NVLS_EFFICIENCY` = 0.61 from NCCL's published NVLS bus bandwidth on
DGX H100, about 480 GB/s (NCCL 2.17 release notes and NVIDIA's "NVLink SHARP" NCCL blog,
2023; bus bandwidth 2 (p-1)/p n / t = 480 GB/s at p = 8 gives n / t = 274 GB/s = 0.61
of NVLink4's 450 GB/s per direction; the same fraction is assumed for NVLink5). Across
domains the hierarchical all-reduce uses it for its two intra-domain halves
(NCCL's NVLS-tree), whichever is faster.
Ranks are placed by :class:`merak_sim.layout.RankLayout`
(Megatron's order by default: tp fastest, then cp, then dp, then pp, so TP groups stay
in a node when tp <= gpus_per_node; ``ParallelConfig.order`` gives another).

Measured collectives (``intra_table``, :func:`measured_collectives`): where a cluster has
a measured NCCL table (:mod:`merak_sim.costs.nccl`), every collective inside one node,
and the intra-node halves of the hierarchical algorithm, take the measured time of that
group size and message size instead of one bandwidth and latency for every group.
A table that also carries a measured bus bandwidth between nodes
(``NcclTable.inter``) caps every off-node transfer priced with it, the flat ring's and
the hierarchical algorithm's inter-node steps and point-to-point sends alike, at that
figure shared by the node's GPUs (:func:`inter_bandwidth_per_gpu`).

Pipeline sends (:func:`pipeline_send_time`): "full" sends the whole activation from each
GPU of a stage's TP group to its peer; "scatter-gather" (Megatron-LM's default without
sequence parallelism) sends 1/tp of it per GPU and rebuilds it with an all-gather over
the receiving TP group (NVLink when the group is in a node).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any

from merak_sim.costs.nccl import NcclTable
from merak_sim.costs.ring import clear_ring_cache
from merak_sim.hardware import Cluster
from merak_sim.layout import RankLayout, domain_of, layout_key
from merak_sim.memo import PROCESS_MEMO_ENTRIES, IdentityMemo

__all__ = ["COLLECTIVES", "NVLS_EFFICIENCY", "PIPELINE_SENDS", "CostModelError",
           "check_pipeline_send",
           "clear_caches",
           "collective_algorithm", "collective_time",
           "group_ranks", "group_shape", "inter_bandwidth_per_gpu", "measured_collectives",
           "nvls_allreduce_time",
           "pipeline_send_time", "stage_placement"]

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "p2p")
#: How activations cross a pipeline boundary (module docstring).
PIPELINE_SENDS = ("full", "scatter-gather")
#: NVLS all-reduce: fraction of the raw NVLink bandwidth per direction at which each
#: GPU's bytes go up to the switch and come back reduced (module docstring).
NVLS_EFFICIENCY = 0.61


class CostModelError(ValueError):
    """Bad input to a cost model (message names field and value)."""


def group_ranks(kind: str, config: Any, pp_rank: int = 0, dp_rank: int = 0,
                tp_rank: int = 0) -> tuple[int, ...]:
    """Global ranks of the ``kind`` group ("tp", "dp", "pp", "tied") of ``config``'s
    :class:`~merak_sim.layout.RankLayout` containing the given coordinates."""
    key = layout_key(config)
    if key is not None and all(type(x) is int for x in (pp_rank, dp_rank, tp_rank)):
        # Memoised on the values (a cost table asks for the same groups per stage);
        # only plain values, so one the layout rejects is never answered from it.
        return _group_ranks(kind, *key, pp_rank, dp_rank, tp_rank)
    return _group_in(kind, RankLayout.of(config), pp_rank, dp_rank, tp_rank)


@lru_cache(maxsize=65536)
def _group_ranks(kind: str, dp: int, tp: int, pp: int, cp: int, order: str, pp_rank: int,
                 dp_rank: int, tp_rank: int) -> tuple[int, ...]:
    return _group_in(kind, RankLayout(dp, tp, pp, cp, order), pp_rank, dp_rank, tp_rank)


def _group_in(kind: str, layout: RankLayout, pp_rank: int, dp_rank: int,
              tp_rank: int) -> tuple[int, ...]:
    try:
        return layout.group(kind, layout.rank(pp_rank, dp_rank, tp_rank))
    except ValueError as e:
        raise CostModelError(str(e)) from None


def inter_bandwidth_per_gpu(cluster: Cluster, table: NcclTable | None = None) -> float:
    """Off-node bandwidth of one GPU while every GPU of its node sends: the link's
    share, capped by the table's measured inter-node bus bandwidth where it has one
    (module docstring)."""
    link = cluster.inter_bandwidth_per_gpu_Bps
    if table is None or table.inter is None:
        return link
    return table.inter.per_gpu_Bps(link, cluster.gpus_per_node)


def _ring(kind: str, nbytes: float, p: int, bw: float, lat: float) -> float:
    if p <= 1 or nbytes <= 0:
        return 0.0
    if kind == "all-reduce":
        return 2 * (p - 1) * lat + 2 * (p - 1) / p * nbytes / bw
    return (p - 1) * lat + (p - 1) / p * nbytes / bw


def collective_time(kind: str, nbytes: float, ranks: tuple[int, ...], cluster: Cluster,
                    intra_table: NcclTable | None = None) -> float:
    """Time of a collective among global ``ranks`` on ``cluster``: alpha-beta, with the
    intra-node parts measured where ``intra_table`` covers the group (module
    docstring)."""
    if kind == "p2p":
        if nbytes < 0:
            _check(kind, nbytes)  # raises, naming the bytes
        if len(ranks) != 2:
            raise CostModelError(f"p2p needs exactly 2 ranks, got {len(ranks)}")
        a, b = ranks
        if a == b or nbytes == 0:
            return 0.0
        # Memoised on the rank values (a ring's pairs are new tuples on every call),
        # the identity of the rest, as below.
        return _P2P.get((cluster, intra_table), (nbytes, a, b), _p2p, nbytes, a, b,
                        cluster, intra_table)
    # Identity memo in front of the value caches: a cost table prices the same group
    # objects many times, and hashing a data-parallel group of thousands of ranks (and
    # the cluster, and the measured table) costs more than the collective's formula.
    # All three are immutable, so the same objects mean the same value. The arguments
    # are checked on a miss only: a hit's were checked when it was stored.
    return _BY_IDENTITY.get((ranks, cluster, intra_table), (kind, nbytes), _collective,
                            kind, nbytes, ranks, cluster, intra_table)


def _p2p(nbytes: float, a: int, b: int, cluster: Cluster,
         intra_table: NcclTable | None) -> float:
    if cluster.same_domain(a, b):
        return cluster.intra.time(nbytes)
    return cluster.inter.latency_s + nbytes / inter_bandwidth_per_gpu(cluster, intra_table)


def _check(kind: str, nbytes: float) -> None:
    if kind not in COLLECTIVES:
        raise CostModelError(f"unknown collective {kind!r}; choose one of: "
                             f"{', '.join(COLLECTIVES)}")
    if nbytes < 0:
        raise CostModelError(f"collective bytes must be >= 0, got {nbytes}")


def _collective(kind: str, nbytes: float, ranks: tuple[int, ...], cluster: Cluster,
                intra_table: NcclTable | None) -> float:
    _check(kind, nbytes)
    return _collective_cached(kind, float(nbytes), group_shape(ranks, cluster), cluster,
                              intra_table)


# Bounded: they live as long as the process, across searches and cost models.
_BY_IDENTITY = IdentityMemo(max_entries=PROCESS_MEMO_ENTRIES)
_P2P = IdentityMemo(max_entries=PROCESS_MEMO_ENTRIES)


def measured_collectives(table: NcclTable) -> Callable[..., float]:
    """:func:`collective_time` with ``table`` pricing the intra-node parts (the
    ``collectives`` argument of :class:`~merak_sim.costs.analytic.AnalyticCostModel`)."""
    return partial(collective_time, intra_table=table)


def check_pipeline_send(mode: str) -> None:
    """Raise CostModelError, naming the choices, unless ``mode`` is one of
    :data:`PIPELINE_SENDS`."""
    if mode not in PIPELINE_SENDS:
        raise CostModelError(f"unknown pipeline send {mode!r}; choose one of: "
                             f"{', '.join(PIPELINE_SENDS)}")


def pipeline_send_time(mode: str, nbytes: float, src_tp: tuple[int, ...],
                       dst_tp: tuple[int, ...], cluster: Cluster,
                       comm: Callable[..., float] = collective_time) -> float:
    """Seconds to move one stage's activation of ``nbytes`` from TP group ``src_tp`` to
    TP group ``dst_tp`` (module docstring; ``comm`` prices the pieces)."""
    check_pipeline_send(mode)
    a, b = src_tp[0], dst_tp[0]
    if a == b:
        return 0.0
    tp = len(dst_tp)
    if mode == "full" or tp == 1:
        return comm("p2p", nbytes, (a, b), cluster)
    return comm("p2p", nbytes / tp, (a, b), cluster) + comm("all-gather", nbytes, dst_tp,
                                                            cluster)


@lru_cache(maxsize=8192)
def group_shape(ranks: tuple[int, ...], cluster: Cluster) -> tuple[int, int]:
    """(NVLink domains the group spans, most of its GPUs in one domain); memoised,
    since a planner prices the same data-parallel and shard groups for many tables
    (a domain is a node on HGX presets, a rack on NVL72: module docstring)."""
    world, gpn = cluster.world_size, cluster.domain_size
    for r in ranks:
        if not 0 <= r < world:
            cluster.node_of(r)  # raises, naming the first rank outside the cluster
    per_node: dict[int, int] = {}
    for r in ranks:
        n = domain_of(r, gpn)
        per_node[n] = per_node.get(n, 0) + 1
    return len(per_node), max(per_node.values())


def _intra(kind: str, nbytes: float, p: int, cluster: Cluster,
           table: NcclTable | None) -> float:
    if table is not None and table.covers(p):
        return table.time(kind, nbytes, p)
    return _ring(kind, nbytes, p, cluster.intra.bandwidth_Bps, cluster.intra.latency_s)


def nvls_allreduce_time(nbytes: float, cluster: Cluster) -> float:
    """All-reduce of ``nbytes`` inside one NVLink domain reduced by the switches
    (NVLS): up once and down once at :data:`NVLS_EFFICIENCY` of the raw NVLink
    bandwidth, plus one latency (module docstring); inf where the preset has none."""
    if not cluster.nvls:
        return math.inf
    if nbytes <= 0:
        return 0.0
    return (2 * cluster.intra.latency_s
            + nbytes / (NVLS_EFFICIENCY * cluster.intra.raw_bandwidth_Bps))


def _tree_allreduce(nbytes: float, n_nodes: int, bw: float, lat: float) -> float:
    # Double binary tree over the nodes: 2 ceil(log2 k) latency steps, 2 x bytes per
    # node each way (module docstring).
    return 2 * math.ceil(math.log2(n_nodes)) * lat + 2 * nbytes / bw


def collective_algorithm(kind: str, nbytes: float, ranks: tuple[int, ...], cluster: Cluster,
                         intra_table: NcclTable | None = None) -> str:
    """Which algorithm :func:`collective_time` priced the collective with: "intra-node",
    "nvls", "ring", "hierarchical ring", "hierarchical tree" or "hierarchical
    nvls-tree" (module docstring)."""
    _check(kind, nbytes)
    if kind == "p2p":
        raise CostModelError("p2p is a single transfer, not a collective algorithm")
    return _priced(kind, float(nbytes), group_shape(ranks, cluster), cluster, intra_table)[1]


@lru_cache(maxsize=65536)
def _collective_cached(kind: str, nbytes: float, shape: tuple[int, int],
                       cluster: Cluster, table: NcclTable | None) -> float:
    return _priced(kind, nbytes, shape, cluster, table)[0]


def _priced(kind: str, nbytes: float, shape: tuple[int, int], cluster: Cluster,
            table: NcclTable | None) -> tuple[float, str]:
    n_nodes, local = shape
    intra, inter = cluster.intra, cluster.inter
    p = n_nodes * local
    if n_nodes == 1:
        own = _intra(kind, nbytes, local, cluster, table), "intra-node"
        if kind == "all-reduce" and local > 1:
            return min(own, (nvls_allreduce_time(nbytes, cluster), "nvls"))
        return own
    bw_g = inter_bandwidth_per_gpu(cluster, table)
    # Flat ring over all p ranks: the node-crossing edges are the bottleneck; NCCL's
    # parallel rings let the group's l GPUs per node use l shares of the network.
    flat = _ring(kind, nbytes, p, min(intra.bandwidth_Bps, bw_g * local),
                 max(intra.latency_s, inter.latency_s))
    half = "reduce-scatter" if kind in ("all-reduce", "reduce-scatter") else "all-gather"
    nvls_tree = math.inf
    if kind == "all-reduce":
        inside = 2 * _intra(half, nbytes, local, cluster, table)
        across = _tree_allreduce(nbytes / local, n_nodes, bw_g, inter.latency_s)
        tree = inside + across
        if local > 1:
            nvls_tree = nvls_allreduce_time(nbytes, cluster) + across
    else:
        inside = _intra(half, nbytes, local, cluster, table)
        tree = math.inf  # NCCL's trees serve all-reduce only
    hier = inside + _ring(kind, nbytes / local, n_nodes, bw_g, inter.latency_s)
    return min((flat, "ring"), (hier, "hierarchical ring"), (tree, "hierarchical tree"),
               (nvls_tree, "hierarchical nvls-tree"))


@lru_cache(maxsize=65536)
def stage_placement(cluster: Cluster, layout: RankLayout, pp_rank: int,
                    last: bool) -> tuple:
    """What a stage's communication depends on: node shape of its TP and DP groups
    and whether its send to the next stage stays in a node."""
    base = layout.rank(pp_rank)
    tp_shape = group_shape(layout.group("tp", base), cluster)
    dp_shape = group_shape(layout.group("dp", base), cluster)
    if last:
        send = None
    else:
        nxt = layout.rank((pp_rank + 1) % layout.pp)
        send = None if nxt == base else cluster.same_domain(base, nxt)
    return tp_shape, dp_shape, send


def clear_caches() -> None:
    """Empty the memoised collective times, ring passes and stage placements
    (benchmarks time a cold cost model with it)."""
    clear_ring_cache()
    _BY_IDENTITY.clear()
    _P2P.clear()
    _group_ranks.cache_clear()
    _collective_cached.cache_clear()
    stage_placement.cache_clear()
    group_shape.cache_clear()
