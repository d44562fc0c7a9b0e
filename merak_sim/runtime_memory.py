"""Device memory a training process holds outside its framework's caching allocator,
and the reserve the simulator and the planner keep for it.

What it is: the CUDA context (driver state and the kernel modules loaded into it), the
NCCL communicators' staging buffers (``NCCL_BUFFSIZE``, 4 MiB by default per channel
and peer for the simple protocol, plus the low-latency protocols' buffers, for every
communicator the process initialises: NCCL's environment-variable documentation) and
library handles and workspaces allocated directly with the driver. PyTorch's
allocator statistics (``torch.cuda.max_memory_reserved``, what torchtitan logs) do
not include it; a device-level reading (``nvidia-smi --query-gpu=memory.used``, what
Sailor's pipeline engine logs) does, and the planner must leave room for it.

Two figures:

- :func:`runtime_memory_bytes`: measured, per GPU type where a public measurement
  exists (:data:`RUNTIME_MEMORY`), else 0; what the public-runs comparison adds to a
  device-level reading.
- :func:`reserve_bytes`: the reserve every capacity is taken after
  (:func:`usable_memory_bytes`, the cost tables' ``memory_capacity_bytes``, so the
  simulator and the planner agree): the measurement where there is one, else
  :data:`DEFAULT_RESERVE` on every GPU (none on a CPU):

  - the CUDA context: 287,047,680 bytes with lazy module loading, which PyTorch
    turns on by default since 1.13 (666,632,192 without; pytorch/pytorch PR #86509);
  - NCCL's buffers: 688 MiB for each process group of more than two GPUs (544 MiB
    for two), measured through PyTorch on four NVLink A100s (NVIDIA/nccl issue #964;
    the size grows with the channels NCCL opens, NVIDIA/nccl issue #986), for the
    three groups a 3D-parallel rank communicates in (tensor, data and pipeline);
  - allocator fragmentation: the caching allocator's own reservations are priced
    term by term (:mod:`merak_sim.allocator_memory`, the cost tables'
    ``reserved_bytes``) for PyTorch with ``expandable_segments:True``, which the
    scripts ``merak-sim dispatch`` writes set (as torchtitan's launcher does): its
    segments grow in 2 MiB pages, so blocks are not stranded between segments. With
    PyTorch's default allocator instead, GMLake (Guo et al., ASPLOS 2024) measured
    15 % of the memory lost to fragmentation on average (up to 33 %) over eight LLM
    trainings on A100-80GB: plan such a run with ``--memory-margin 0.15``.

  ``--memory-margin`` keeps a further fraction of what is left free.

2.28 GiB on an 80 GB H100 is 2.9 % of it; the GH200 measurement (3.28 GiB, a
Megatron run with more process groups) bounds it from above.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RuntimeMemory", "RUNTIME_MEMORY", "DEFAULT_RESERVE", "CUDA_CONTEXT_BYTES",
           "NCCL_GROUP_BYTES", "NCCL_GROUPS", "runtime_memory_bytes", "reserve_bytes",
           "usable_memory_bytes", "reserve_note"]

GiB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class RuntimeMemory:
    """Device bytes held outside the caching allocator on one GPU type.

    Attributes:
        gpu: GPU preset name (:data:`merak_sim.hardware.GPU_PRESETS`).
        outside_allocator_bytes: device-used minus allocator-reserved bytes of a
            training process (CUDA context, NCCL buffers, library workspaces).
        source: where the figure was measured.
    """

    gpu: str
    outside_allocator_bytes: float
    source: str


#: Measured figures per GPU preset.
RUNTIME_MEMORY: dict[str, RuntimeMemory] = {
    "GH200-96GB": RuntimeMemory(
        "GH200-96GB", 3.28 * GiB,
        "Sailor project (eth-easl/sailor), Aceso baseline runs of OPT-350M with Megatron "
        "on CSCS Clariden GH200 nodes: nvidia-smi memory.used minus "
        "torch.cuda.max_memory_reserved per rank, 3,883 / 3,892 MiB (1 node, 2 ranks) "
        "and 2,922 / 3,156 / 2,938 MiB (16 nodes, 3 ranks); the mean, 3.28 GiB"),
}


#: CUDA context with lazy module loading (pytorch/pytorch PR #86509).
CUDA_CONTEXT_BYTES = 287_047_680
#: NCCL buffers of one process group of more than two GPUs (NVIDIA/nccl issue #964).
NCCL_GROUP_BYTES = 688 * 2**20
#: Process groups a 3D-parallel rank communicates in: tensor, data and pipeline.
NCCL_GROUPS = 3
#: The reserve of a GPU type without a measurement (module docstring).
DEFAULT_RESERVE = RuntimeMemory(
    "default", float(CUDA_CONTEXT_BYTES + NCCL_GROUPS * NCCL_GROUP_BYTES),
    "CUDA context with lazy loading, 287,047,680 B (pytorch/pytorch PR #86509), plus "
    "NCCL buffers of 688 MiB per process group of more than two GPUs (NVIDIA/nccl issue "
    "#964) for a rank's tensor, data and pipeline groups; fragmentation priced by the "
    "allocator model under expandable segments (merak_sim.allocator_memory)")


def reserve_bytes(gpu_name: str) -> float:
    """Bytes kept free on ``gpu_name`` before any allocation (module docstring): its
    measurement, else :data:`DEFAULT_RESERVE`; 0 on a CPU (no context, gloo)."""
    if gpu_name.startswith("CPU"):
        return 0.0
    rm = RUNTIME_MEMORY.get(gpu_name, DEFAULT_RESERVE)
    return float(rm.outside_allocator_bytes)


def runtime_memory_bytes(gpu_name: str) -> float:
    """Bytes outside the allocator on ``gpu_name`` (0 where none is measured)."""
    rm = RUNTIME_MEMORY.get(gpu_name)
    return 0.0 if rm is None else float(rm.outside_allocator_bytes)


def usable_memory_bytes(gpu) -> float:
    """Bytes the framework's allocator can use on ``gpu`` (a
    :class:`~merak_sim.hardware.GPU`): its memory less :func:`reserve_bytes`."""
    return float(gpu.memory_bytes) - reserve_bytes(gpu.name)


def reserve_note(gpu, margin: float = 0.0) -> str:
    """One line stating the memory a plan or simulation of ``gpu`` keeps free: the
    reserve (:func:`reserve_bytes`) and ``margin`` of the rest (``--memory-margin``)."""
    res = reserve_bytes(gpu.name)
    usable = (float(gpu.memory_bytes) - res) * (1.0 - margin)
    what = ("measured outside the allocator" if gpu.name in RUNTIME_MEMORY
            else "CUDA context and NCCL buffers")
    kept = f" and --memory-margin {margin:g} of the rest" if margin else ""
    return (f"memory: each {gpu.name} keeps {res / GiB:.2f} GiB free ({what}; "
            f"merak_sim.runtime_memory){kept}: {usable / GiB:.1f} of "
            f"{gpu.memory_bytes / GiB:.1f} GiB usable")
