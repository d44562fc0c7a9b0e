"""Hardware: GPUs, links and clusters, with presets from vendor spec sheets.

Conventions
-----------
- ``GPU.peak_flops[dtype]``: dense vendor peak (bf16/fp16 on tensor cores with fp32
  accumulate; fp32 without tensor cores; fp8 only where the GPU has FP8 tensor cores:
  Hopper's datasheets quote 3,958 TFLOP/s "with sparsity", i.e. 1,979 dense). Real
  kernels reach a shape-dependent fraction; that lives in
  :mod:`merak_sim.costs.efficiency`, not here.
- ``Link.bandwidth_Bps``: *achievable* bandwidth per direction (what a cost model
  divides bytes by, comparable with NCCL's bus bandwidth); ``Link.raw_bandwidth_Bps``
  is the spec-sheet figure it was derived from, ``Link.efficiency`` the ratio (an
  assumption, stated in each preset).
- Intra-node: ``Cluster.intra`` is the link of one GPU into the node fabric (NVSwitch
  or PCIe). Inter-node: ``Cluster.inter`` is the bandwidth of one *node's* network
  adapters together; when every GPU of a node talks off-node at once (the normal case
  in training: all data-parallel groups reduce together) one GPU gets
  ``inter.bandwidth_Bps / gpus_per_node``.
- Global rank r lives on node ``r // gpus_per_node`` (ranks fill a node first).
- NVLink domain (``Cluster.nvlink_domain``): the GPUs one NVLink fabric joins, a whole
  number of nodes. An HGX/DGX node is its own domain (8 GPUs); a GB200 / GB300 NVL72
  rack joins 18 compute trays of 4 GPUs (one Slurm node each) through its NVLink
  switch trays into one domain of 72. Everything that decides "NVLink or network"
  (``link_between``, the collective prices of :mod:`merak_sim.costs.comm`) asks
  :meth:`Cluster.same_domain`, never the node: rank r lives in domain
  ``r // nvlink_domain`` (:func:`merak_sim.layout.domain_of`). The network beyond the
  domain is ``inter``, a node's adapters, shared by that node's GPUs as above.
- ``Cluster.nvls``: the NVLink switches reduce in the network (NVLink SHARP, "NVLS":
  NVSwitch 3 and later, HGX H100 onwards and NVL72); the collective model may price an
  all-reduce inside the domain with it (:mod:`merak_sim.costs.comm`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from merak_sim.layout import domain_of, node_of
from merak_sim.precision import PRECISIONS, gemm_peak_key, get_precision, is_low_precision

__all__ = ["GPU", "Link", "Cluster", "HardwareError", "GPU_PRESETS", "CLUSTER_PRESETS",
           "get_gpu", "get_cluster", "list_clusters"]

GB = 1e9
TFLOPS = 1e12


class HardwareError(ValueError):
    """A hardware description is invalid or unknown (message names field and value)."""


def _pos(name: str, v: Any, allow_zero: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (
        v >= 0 if allow_zero else v > 0)
    if not ok:
        raise HardwareError(f"{name} must be {'>= 0' if allow_zero else 'positive'}, got {v!r}")


@dataclass(frozen=True, slots=True)
class GPU:
    """One accelerator.

    Attributes:
        name: e.g. "A100-80GB".
        memory_bytes: device memory.
        mem_bandwidth_Bps: device memory bandwidth (bytes/s, spec sheet).
        peak_flops: dense peak FLOP/s per dtype ("bf16", "fp16", "fp32", "fp8").
        source: spec sheet the numbers come from.
    """

    name: str
    memory_bytes: float
    mem_bandwidth_Bps: float
    peak_flops: dict[str, float] = field(hash=False)
    source: str = ""

    def __post_init__(self) -> None:
        _pos(f"gpu {self.name} memory_bytes", self.memory_bytes)
        _pos(f"gpu {self.name} mem_bandwidth_Bps", self.mem_bandwidth_Bps)
        for k, v in self.peak_flops.items():
            _pos(f"gpu {self.name} peak_flops[{k}]", v)

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s at ``dtype`` (fp16 falls back to bf16 and vice versa; a
        low-precision training dtype gives its GEMMs' peak,
        :func:`merak_sim.precision.gemm_peak_key`)."""
        if dtype in PRECISIONS:
            key = gemm_peak_key(dtype)
            if key in self.peak_flops:
                return self.peak_flops[key]
            if is_low_precision(dtype):
                p = get_precision(dtype)
                raise HardwareError(
                    f"gpu {self.name} has no {p.feature}, so --dtype {dtype} cannot run "
                    f"on it; use --dtype bf16, or a GPU with them ({p.gpus})")
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        alt = {"fp16": "bf16", "bf16": "fp16"}.get(dtype)
        if alt in self.peak_flops:
            return self.peak_flops[alt]
        raise HardwareError(f"gpu {self.name} has no peak for dtype {dtype!r}; known: "
                            f"{', '.join(self.peak_flops)}")


@dataclass(frozen=True, slots=True)
class Link:
    """A link class (alpha-beta model: time = latency_s + bytes / bandwidth_Bps).

    Attributes:
        name: e.g. "NVSwitch (NVLink3)".
        bandwidth_Bps: achievable bytes/s per direction (used by cost models).
        latency_s: per-message latency (alpha).
        raw_bandwidth_Bps: spec-sheet bytes/s per direction.
        source: where the figures and the efficiency assumption come from.
    """

    name: str
    bandwidth_Bps: float
    latency_s: float
    raw_bandwidth_Bps: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        _pos(f"link {self.name} bandwidth_Bps", self.bandwidth_Bps)
        _pos(f"link {self.name} latency_s", self.latency_s, allow_zero=True)
        if self.raw_bandwidth_Bps == 0.0:
            object.__setattr__(self, "raw_bandwidth_Bps", self.bandwidth_Bps)

    @property
    def efficiency(self) -> float:
        """Achievable / raw bandwidth."""
        return self.bandwidth_Bps / self.raw_bandwidth_Bps

    def time(self, nbytes: float) -> float:
        """Seconds for one message of ``nbytes``."""
        return self.latency_s + nbytes / self.bandwidth_Bps


@dataclass(frozen=True, slots=True)
class Cluster:
    """``nodes`` x ``gpus_per_node`` GPUs of one type.

    Attributes:
        name: preset name or user label.
        gpu: the GPU type.
        nodes, gpus_per_node: shape.
        intra: link from one GPU into the node fabric (per GPU, per direction).
        inter: the network of one node (all its adapters together, per direction).
        notes: assumptions worth showing the user.
        nvlink_domain: GPUs one NVLink fabric joins (a multiple of ``gpus_per_node``;
            0: one node), module docstring.
        nvls: whether the NVLink switches reduce in-network (NVLink SHARP).
        gpu_jitter_cv: per-GPU step-time jitter (coefficient of variation); None (the
            presets): the fixed costs at scale are told, not charged; a number charges
            the gradient-norm all-reduce and the slowest-of-N term
            (:mod:`merak_sim.costs.fixed`).
    """

    name: str
    gpu: GPU
    nodes: int
    gpus_per_node: int
    intra: Link
    inter: Link
    notes: tuple[str, ...] = ()
    nvlink_domain: int = 0
    nvls: bool = False
    gpu_jitter_cv: float | None = None

    def __post_init__(self) -> None:
        for f in ("nodes", "gpus_per_node"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise HardwareError(f"cluster {self.name} {f} must be a positive integer, "
                                    f"got {v!r}")
        d = self.nvlink_domain
        if (not isinstance(d, int) or isinstance(d, bool) or d < 0
                or (d and d % self.gpus_per_node)):
            raise HardwareError(f"cluster {self.name} nvlink_domain {d!r} must be 0 (one "
                                f"node) or a multiple of gpus_per_node {self.gpus_per_node}")
        if not isinstance(self.nvls, bool):
            raise HardwareError(f"cluster {self.name} nvls must be true or false, got "
                                f"{self.nvls!r}")
        cv = self.gpu_jitter_cv
        if cv is not None and (isinstance(cv, bool) or not isinstance(cv, (int, float))
                               or not 0 <= cv < 1):
            raise HardwareError(f"cluster {self.name} gpu_jitter_cv must be a number in "
                                f"[0, 1) or null, got {cv!r}")

    @property
    def world_size(self) -> int:
        """Total GPUs."""
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        """Node index of global rank ``rank``."""
        if not 0 <= rank < self.world_size:
            raise HardwareError(f"rank {rank} outside cluster {self.name} of "
                                f"{self.world_size} GPUs")
        return node_of(rank, self.gpus_per_node)

    def same_node(self, a: int, b: int) -> bool:
        """Whether global ranks ``a`` and ``b`` share a node."""
        return self.node_of(a) == self.node_of(b)

    @property
    def domain_size(self) -> int:
        """GPUs per NVLink domain (``gpus_per_node`` unless ``nvlink_domain`` is set)."""
        return self.nvlink_domain or self.gpus_per_node

    def domain_of(self, rank: int) -> int:
        """NVLink domain index of global rank ``rank``."""
        self.node_of(rank)  # raises, naming a rank outside the cluster
        return domain_of(rank, self.domain_size)

    def same_domain(self, a: int, b: int) -> bool:
        """Whether global ranks ``a`` and ``b`` share an NVLink domain."""
        return self.domain_of(a) == self.domain_of(b)

    def link_between(self, a: int, b: int) -> Link:
        """The link class joining ranks ``a`` and ``b``: ``intra`` (NVLink) inside one
        NVLink domain, else ``inter``."""
        return self.intra if self.same_domain(a, b) else self.inter

    @property
    def inter_bandwidth_per_gpu_Bps(self) -> float:
        """Network bandwidth one GPU gets when all GPUs of its node send off-node."""
        return self.inter.bandwidth_Bps / self.gpus_per_node

    def with_nodes(self, nodes: int) -> Cluster:
        """The same cluster with ``nodes`` nodes."""
        return replace(self, nodes=nodes)

    def to_dict(self) -> dict:
        """JSON-ready dict (accepted by :meth:`from_json`)."""
        d = asdict(self)
        d["notes"] = list(self.notes)
        if d["gpu_jitter_cv"] is None:
            del d["gpu_jitter_cv"]  # unset: the form files had before the field
        return d

    @staticmethod
    def from_json(src: str | Path | dict) -> Cluster:
        """Build from a dict, JSON text or a JSON file.

        Keys: name, nodes, gpus_per_node, gpu (a preset name such as "A100-80GB" or an
        object with name, memory_bytes, mem_bandwidth_Bps, peak_flops), intra and inter
        (objects with name, bandwidth_Bps, latency_s, optional raw_bandwidth_Bps),
        optional notes. A key "preset" starts from a cluster preset and overrides it.
        """
        if isinstance(src, dict):
            d = dict(src)
        else:
            text = str(src)
            if not text.lstrip().startswith("{"):
                try:
                    text = Path(text).read_text(encoding="utf-8")
                except OSError as e:
                    raise HardwareError(f"cannot read cluster file {src}: {e.strerror}") \
                        from None
            try:
                d = json.loads(text)
            except json.JSONDecodeError as e:
                raise HardwareError(f"cluster JSON is malformed: {e}") from None
            if not isinstance(d, dict):
                raise HardwareError("cluster JSON must be an object")
        base: dict[str, Any] = {}
        if "preset" in d:
            pre = get_cluster(d.pop("preset"), nodes=d.get("nodes"))
            base = {"name": pre.name, "gpu": pre.gpu, "nodes": pre.nodes,
                    "gpus_per_node": pre.gpus_per_node, "intra": pre.intra,
                    "inter": pre.inter, "notes": pre.notes,
                    "nvlink_domain": pre.nvlink_domain, "nvls": pre.nvls,
                    "gpu_jitter_cv": pre.gpu_jitter_cv}
        known = {"name", "gpu", "nodes", "gpus_per_node", "intra", "inter", "notes",
                 "nvlink_domain", "nvls", "gpu_jitter_cv"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise HardwareError(f"cluster JSON has unknown field(s): {', '.join(unknown)}")
        base.update(d)
        missing = [k for k in ("gpu", "nodes", "gpus_per_node", "intra", "inter")
                   if k not in base]
        if missing:
            raise HardwareError(f"cluster JSON lacks required field(s): {', '.join(missing)}")
        gpu = base["gpu"]
        if isinstance(gpu, str):
            gpu = get_gpu(gpu)
        elif isinstance(gpu, dict):
            gpu = _build(GPU, gpu, "gpu")
        links = {}
        for k in ("intra", "inter"):
            v = base[k]
            links[k] = _build(Link, v, k) if isinstance(v, dict) else v
        return Cluster(name=base.get("name", "custom"), gpu=gpu, nodes=base["nodes"],
                       gpus_per_node=base["gpus_per_node"], intra=links["intra"],
                       inter=links["inter"], notes=tuple(base.get("notes", ())),
                       nvlink_domain=base.get("nvlink_domain", 0),
                       nvls=base.get("nvls", False),
                       gpu_jitter_cv=base.get("gpu_jitter_cv"))


def _build(cls: type, d: dict, what: str) -> Any:
    fields = set(cls.__dataclass_fields__)
    unknown = sorted(set(d) - fields)
    if unknown:
        raise HardwareError(f"cluster JSON {what} has unknown field(s): {', '.join(unknown)}")
    try:
        return cls(**d)
    except TypeError as e:
        raise HardwareError(f"cluster JSON {what}: {e}") from None


# ---------------------------------------------------------------------------- presets
_HW = "vendor spec sheet (NVIDIA datasheet, dense peak)"

GPU_PRESETS: dict[str, GPU] = {g.name: g for g in [
    GPU("V100-32GB", 32 * GB, 900 * GB, {"bf16": 125 * TFLOPS, "fp16": 125 * TFLOPS,
                                         "fp32": 15.7 * TFLOPS},
        "NVIDIA V100 SXM2 datasheet via " + _HW + "; V100 has no bf16: fp16 figure"),
    GPU("RTX3090", 24 * GB, 936 * GB, {"bf16": 71 * TFLOPS, "fp16": 71 * TFLOPS,
                                       "fp32": 35.6 * TFLOPS},
        "NVIDIA Ampere GA102 whitepaper via " + _HW + "; tensor fp32-accumulate rate"),
    GPU("A100-40GB", 40 * GB, 1555 * GB, {"bf16": 312 * TFLOPS, "fp16": 312 * TFLOPS,
                                          "fp32": 19.5 * TFLOPS},
        "NVIDIA A100 datasheet via " + _HW),
    GPU("A100-80GB", 80 * GB, 2039 * GB, {"bf16": 312 * TFLOPS, "fp16": 312 * TFLOPS,
                                          "fp32": 19.5 * TFLOPS},
        "NVIDIA A100 datasheet via " + _HW),
    GPU("H100-80GB", 80 * GB, 3350 * GB, {"bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS,
                                          "fp32": 67 * TFLOPS, "fp8": 1979 * TFLOPS},
        "NVIDIA H100 SXM5 datasheet via " + _HW + "; FP8 3,958 TFLOP/s with sparsity "
        "= 1,979 dense"),
    GPU("H200-141GB", 141 * GB, 4800 * GB, {"bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS,
                                            "fp32": 67 * TFLOPS, "fp8": 1979 * TFLOPS},
        "NVIDIA H200 SXM datasheet via " + _HW + "; FP8 3,958 TFLOP/s with sparsity "
        "= 1,979 dense"),
    GPU("GH200-96GB", 96 * GB, 4000 * GB, {"bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS,
                                           "fp32": 67 * TFLOPS, "fp8": 1979 * TFLOPS},
        "NVIDIA GH200 Grace Hopper Superchip datasheet via " + _HW + ": 96 GB HBM3 at "
        "4 TB/s; the Hopper GPU's tensor rates (FP16/BF16 1,979, FP8 3,958 TFLOP/s with "
        "sparsity = 989 / 1,979 dense)"),
    # Blackwell (module docstring of each figure's source below). NVIDIA quotes tensor
    # rates "with sparsity" on its datasheets: dense = half. fp32 is the non-tensor rate.
    GPU("B200-180GB", 180 * GB, 8000 * GB,
        {"bf16": 2250 * TFLOPS, "fp16": 2250 * TFLOPS, "fp32": 75 * TFLOPS,
         "fp8": 4500 * TFLOPS, "mxfp8": 4500 * TFLOPS, "nvfp4": 9000 * TFLOPS},
        "NVIDIA DGX B200 datasheet (2024) / HGX B200 spec table (2024-25): 8 GPUs with "
        "1,440 GB HBM3e and 64 TB/s (180 GB, 8 TB/s per GPU; the HGX table says 7.7), "
        "FP4 144 / FP8 72 / BF16 36 PFLOP/s with sparsity per 8 GPUs = 9,000 / 4,500 / "
        "2,250 TFLOP/s dense per GPU; MXFP8 runs at the FP8 rate, NVFP4 at the FP4 rate; "
        "fp32 75 TFLOP/s is an ESTIMATE (not on the datasheet: 2x its FP64 37)"),
    GPU("B300-288GB", 288 * GB, 8000 * GB,
        {"bf16": 2250 * TFLOPS, "fp16": 2250 * TFLOPS, "fp32": 75 * TFLOPS,
         "fp8": 4500 * TFLOPS, "mxfp8": 4500 * TFLOPS, "nvfp4": 13500 * TFLOPS},
        "NVIDIA HGX B300 spec table (Blackwell Ultra, 2025): 8 GPUs with 2.3 TB HBM3e "
        "(288 GB per GPU) at 8 TB/s per GPU; FP4 108 PFLOP/s dense per 8 GPUs = 13,500 "
        "TFLOP/s per GPU; FP8 72 and BF16 36 PFLOP/s with sparsity = 4,500 / 2,250 dense "
        "per GPU (Blackwell Ultra raised FP4 only); fp32 75 TFLOP/s is an ESTIMATE"),
    GPU("GB200-186GB", 186 * GB, 8000 * GB,
        {"bf16": 2500 * TFLOPS, "fp16": 2500 * TFLOPS, "fp32": 80 * TFLOPS,
         "fp8": 5000 * TFLOPS, "mxfp8": 5000 * TFLOPS, "nvfp4": 10000 * TFLOPS},
        "NVIDIA GB200 NVL72 datasheet (2024): 72 GPUs with 13.4 TB HBM3e (186 GB each) "
        "and 576 TB/s (8 TB/s each); FP4 1,440 / FP8 720 / BF16 360 PFLOP/s with sparsity "
        "per rack = 10,000 / 5,000 / 2,500 TFLOP/s dense per GPU (a higher clock than "
        "HGX B200); fp32 80 TFLOP/s is an ESTIMATE"),
    GPU("GB300-288GB", 288 * GB, 8000 * GB,
        {"bf16": 2500 * TFLOPS, "fp16": 2500 * TFLOPS, "fp32": 80 * TFLOPS,
         "fp8": 5000 * TFLOPS, "mxfp8": 5000 * TFLOPS, "nvfp4": 15000 * TFLOPS},
        "NVIDIA GB300 NVL72 datasheet (Blackwell Ultra, 2025): up to 21 TB HBM3e per rack "
        "(288 GB per GPU nominal) at 576 TB/s (8 TB/s each); FP4 1,080 PFLOP/s dense per "
        "rack = 15,000 TFLOP/s per GPU; FP8 720 and BF16 360 PFLOP/s with sparsity = "
        "5,000 / 2,500 dense per GPU; fp32 80 TFLOP/s is an ESTIMATE"),
    # Measured on this project's CPU machine (2 cores, torch 2.13, fp32 2048^3 and
    # 512^3 matmuls: 84-124 GFLOP/s, noisy; copies ~3-10 GB/s). bf16 on CPU is
    # emulated and not used for training here.
    GPU("CPU-2core", 22 * GB, 10 * GB, {"fp32": 0.125 * TFLOPS, "bf16": 0.03 * TFLOPS},
        "measured on the project's 2-core CPU machine (see traces/README.md)"),
]}


def get_gpu(name: str) -> GPU:
    """A GPU preset by name."""
    if name not in GPU_PRESETS:
        raise HardwareError(f"unknown GPU preset {name!r}; choose one of: "
                            f"{', '.join(GPU_PRESETS)}")
    return GPU_PRESETS[name]


_us = 1e-6
_PCIE4 = Link("PCIe 4.0 x16 (no P2P, via host)", 16 * GB, 10 * _us, 32 * GB,
              "PCIe 4.0 x16 = 32 GB/s per direction (hardware.md); GeForce cards have "
              "P2P disabled so NCCL stages through host memory: 50 % assumed")
_NVSWITCH_A100 = Link("NVSwitch (NVLink3)", 240 * GB, 5 * _us, 300 * GB,
                      "600 GB/s total = 300 per direction (hardware.md); 80 % achievable "
                      "(NCCL bus bandwidth on DGX A100 is about 230-240 GB/s)")
_NVSWITCH_H100 = Link("NVSwitch (NVLink4)", 360 * GB, 5 * _us, 450 * GB,
                      "900 GB/s total = 450 per direction (hardware.md); 80 % achievable")

_NVLINK5 = Link("NVLink5 switch", 720 * GB, 5 * _us, 900 * GB,
                 "1.8 TB/s total = 900 GB/s per direction per GPU (NVIDIA DGX B200 / GB200 "
                 "NVL72 datasheets, fifth-generation NVLink); 80 % achievable assumed, as "
                 "NVLink4")


def _ib(name: str, adapters: int, gbit: float, eff: float = 0.9) -> Link:
    raw = adapters * gbit / 8 * GB
    return Link(f"{adapters}x {name} {gbit:g} Gb/s", eff * raw, 5 * _us, raw,
                f"{adapters} adapters x {gbit:g} Gb/s per node (hardware.md); "
                f"{eff:.0%} achievable assumed")


def _paper_3090(nodes: int) -> Cluster:
    return Cluster("paper-3090", GPU_PRESETS["RTX3090"], nodes, 4, _PCIE4,
                   _ib("InfiniBand EDR", 1, 100, 0.8),
                   ("ASSUMPTION: Merak's 64-GPU cluster is taken as 16 nodes x 4 RTX 3090 "
                    "(PCIe 4.0 in a node, one 100 Gb/s InfiniBand adapter per node); the "
                    "paper does not state it",))


def _dgx_a100(nodes: int, mem: int) -> Cluster:
    return Cluster(f"dgx-a100-{mem}g", GPU_PRESETS[f"A100-{mem}GB"], nodes, 8,
                   _NVSWITCH_A100, _ib("InfiniBand HDR", 8, 200),
                   ("DGX A100: 8 GPUs on NVSwitch, 8x HDR 200 Gb/s per node",))


def _vtrain(nodes: int) -> Cluster:
    # vTrain's validation configs: intra_node_bandwidth 150 (GB/s effective NVLink),
    # inter_node_bandwidth 800 (Gb/s per node = 4x HDR); data/vtrain/README.md.
    return Cluster("vtrain-a100", GPU_PRESETS["A100-80GB"], nodes, 8,
                   Link("NVSwitch (vTrain effective)", 150 * GB, 5 * _us, 300 * GB,
                        "vTrain config intra_node_bandwidth = 150 GB/s (effective)"),
                   Link("4x InfiniBand HDR (vTrain)", 100 * GB, 5 * _us, 100 * GB,
                        "vTrain config inter_node_bandwidth = 800 Gb/s per node"),
                   ("vTrain runs (data/vtrain): A100 with 8 GPUs per node, link "
                    "figures from vTrain's validation config; 80 GB memory is an "
                    "assumption (the files do not say 40 or 80 GB)",))


def _dgx_b200(nodes: int) -> Cluster:
    return Cluster("dgx-b200", GPU_PRESETS["B200-180GB"], nodes, 8, _NVLINK5,
                   _ib("ConnectX-7 InfiniBand", 8, 400),
                   ("DGX/HGX B200: 8 GPUs on NVLink5 switches (NVLS in-network "
                    "reduction), 8x ConnectX-7 400 Gb/s per node (DGX B200 datasheet)",),
                   nvls=True)


def _dgx_b300(nodes: int) -> Cluster:
    return Cluster("dgx-b300", GPU_PRESETS["B300-288GB"], nodes, 8, _NVLINK5,
                   _ib("ConnectX-8 SuperNIC", 8, 800),
                   ("DGX/HGX B300: 8 GPUs on NVLink5 switches (NVLS), 8x ConnectX-8 "
                    "800 Gb/s per node (HGX B300 spec table)",), nvls=True)


def _nvl72(gpu: str, nic: str, gbit: float) -> Callable[[int], Cluster]:
    def build(nodes: int) -> Cluster:
        return Cluster(f"{gpu.lower()}-nvl72", GPU_PRESETS[_NVL72_GPU[gpu]], nodes, 4,
                       _NVLINK5, _ib(nic, 4, gbit),
                       (f"{gpu} NVL72: compute trays of 4 GPUs (one node each), 18 trays "
                        f"per rack joined by the NVLink switch trays into one NVLink "
                        f"domain of 72 GPUs (NVLS); one {nic} {gbit:g} Gb/s per GPU "
                        f"beyond the rack ({gpu} NVL72 datasheet); nodes = trays",),
                       nvlink_domain=72, nvls=True)
    return build


_NVL72_GPU = {"GB200": "GB200-186GB", "GB300": "GB300-288GB"}


def _dgx_h100(nodes: int) -> Cluster:
    return Cluster("dgx-h100", GPU_PRESETS["H100-80GB"], nodes, 8, _NVSWITCH_H100,
                   _ib("InfiniBand NDR", 8, 400),
                   ("DGX H100: 8 GPUs on NVSwitch (NVLink4), 8x NDR 400 Gb/s per node",))


def _dgx_h200(nodes: int) -> Cluster:
    return Cluster("dgx-h200", GPU_PRESETS["H200-141GB"], nodes, 8, _NVSWITCH_H100,
                   _ib("InfiniBand NDR", 8, 400),
                   ("8x H200 SXM per node on NVSwitch (NVLink4, as DGX/HGX H200), one "
                    "400 Gb/s ConnectX-7 adapter per GPU",))


def _alps_gh200(nodes: int) -> Cluster:
    # CSCS Alps (HPE Cray EX254n blades): 4 GH200 per node joined all-to-all by NVLink4
    # (18 links per GPU, 6 to each peer); one 200 Gb/s Slingshot-11 NIC per GPU.
    return Cluster("alps-gh200", GPU_PRESETS["GH200-96GB"], nodes, 4,
                   Link("NVLink4 all-to-all (4 GPUs)", 360 * GB, 5 * _us, 450 * GB,
                        "18 NVLink4 links = 450 GB/s per direction per GPU (NVIDIA GH200 "
                        "datasheet); 80 % achievable assumed, as NVSwitch"),
                   _ib("Slingshot-11", 4, 200),
                   ("CSCS Alps node: 4 GH200 on NVLink, 4x Slingshot-11 200 Gb/s "
                    "(CSCS Alps documentation); link efficiencies are assumptions",))


def _h200(nodes: int) -> Cluster:
    if nodes != 1:
        raise HardwareError(f"cluster h200 is one GPU (our lent machine); nodes must be 1, "
                            f"got {nodes}")
    return Cluster("h200", GPU_PRESETS["H200-141GB"], 1, 1, _NVSWITCH_H100,
                   _ib("(none)", 1, 400),
                   ("one H200 (the lent machine): no peers, links unused",))


def _local_cpu(nodes: int) -> Cluster:
    if nodes != 1:
        raise HardwareError(f"cluster local-cpu is this machine; nodes must be 1, got {nodes}")
    # gloo over loopback on this machine (hardware.md, measured): 4 MB send/recv ~1 ms
    # -> ~4 GB/s; ping-pong round trip 70-100 us -> ~40 us one way.
    loop = Link("gloo loopback", 4 * GB, 40 * _us, 4 * GB,
                "measured on this machine: 4 MB send/recv ~1 ms, ping-pong 70-100 us; noisy")
    return Cluster("local-cpu", GPU_PRESETS["CPU-2core"], 1, 4, loop, loop,
                   ("this 2-core CPU machine running gloo processes (up to 4); compute "
                    "peak measured, noisy: prefer the shipped CPU trace",))


_BUILDERS = {
    "paper-3090": (_paper_3090, 16),
    "dgx-a100-80g": (lambda n: _dgx_a100(n, 80), 1),
    "dgx-a100-40g": (lambda n: _dgx_a100(n, 40), 1),
    "vtrain-a100": (_vtrain, 8),
    "dgx-h100": (_dgx_h100, 1),
    "dgx-h200": (_dgx_h200, 1),
    "alps-gh200": (_alps_gh200, 1),
    "dgx-b200": (_dgx_b200, 1),
    "dgx-b300": (_dgx_b300, 1),
    "gb200-nvl72": (_nvl72("GB200", "ConnectX-7 InfiniBand", 400), 18),
    "gb300-nvl72": (_nvl72("GB300", "ConnectX-8 SuperNIC", 800), 18),
    "h200": (_h200, 1),
    "local-cpu": (_local_cpu, 1),
}
#: Cluster preset names (stable: scripts rely on them).
CLUSTER_PRESETS: tuple[str, ...] = tuple(_BUILDERS)


def list_clusters() -> list[str]:
    """Names of the cluster presets."""
    return list(CLUSTER_PRESETS)


def get_cluster(name: str | Path | dict, nodes: int | None = None) -> Cluster:
    """A cluster preset (with ``nodes`` nodes, default the preset's) or a cluster from
    a JSON file / dict (see :meth:`Cluster.from_json`)."""
    if isinstance(name, dict):
        c = Cluster.from_json(name)
        return c if nodes is None else c.with_nodes(nodes)
    key = str(name)
    if key in _BUILDERS:
        build, default = _BUILDERS[key]
        n = default if nodes is None else nodes
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise HardwareError(f"nodes must be a positive integer, got {n!r}")
        return build(n)
    if key.endswith(".json") or key.lstrip().startswith("{") or Path(key).is_file():
        c = Cluster.from_json(key)
        return c if nodes is None else c.with_nodes(nodes)
    raise HardwareError(f"unknown cluster preset {key!r}; choose one of: "
                        f"{', '.join(CLUSTER_PRESETS)} or give a JSON file")
