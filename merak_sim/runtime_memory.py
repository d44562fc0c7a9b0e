"""Device memory a training process holds outside its framework's caching allocator.

What it is: the CUDA context (driver state and the kernel modules loaded into it), the
NCCL communicators' staging buffers (``NCCL_BUFFSIZE``, 4 MiB by default per channel
and peer for the simple protocol, plus the low-latency protocols' buffers, for every
communicator the process initialises: NCCL's environment-variable documentation) and
library handles and workspaces allocated directly with the driver. PyTorch's
allocator statistics (``torch.cuda.max_memory_reserved``, what torchtitan logs) do
not include it; a device-level reading (``nvidia-smi --query-gpu=memory.used``, what
Sailor's pipeline engine logs) does, and the planner must leave room for it.

One figure per GPU type, measured where a public measurement exists
(:data:`RUNTIME_MEMORY`); a GPU type without one gets 0 bytes (the allocator may use
the whole device), which is what the simulator assumed before this figure existed.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RuntimeMemory", "RUNTIME_MEMORY", "runtime_memory_bytes", "usable_memory_bytes"]

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


def runtime_memory_bytes(gpu_name: str) -> float:
    """Bytes outside the allocator on ``gpu_name`` (0 where none is measured)."""
    rm = RUNTIME_MEMORY.get(gpu_name)
    return 0.0 if rm is None else float(rm.outside_allocator_bytes)


def usable_memory_bytes(gpu) -> float:
    """Bytes the framework's allocator can use on ``gpu`` (a
    :class:`~merak_sim.hardware.GPU`): its memory less the runtime's share."""
    return float(gpu.memory_bytes) - runtime_memory_bytes(gpu.name)
