"""Which attention kernel a configuration runs, and the activation storage that goes
with it: the one place that reads ``ParallelConfig.attention``.

:func:`resolve_attention` turns "auto" into a kernel ("flash" or "unfused"); the cost
model times that kernel (:mod:`merak_sim.costs.layers`) and :func:`attention_profile`
gives the activation profile that stores what that kernel keeps, so the time and the
memory of a configuration always describe the same kernel. "auto" is the unfused
kernel; on the CPU cluster "auto" keeps the measured PyTorch profile
(:data:`~merak_sim.memory.CPU_EAGER`, whose ``sdpa-cpu`` storage is PyTorch's math
kernel, timed as the unfused one).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from merak_sim.allocator_memory import on_cuda
from merak_sim.memory import CPU_EAGER, KORTHIKANTI, ActivationProfile

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig

__all__ = ["resolve_attention", "default_profile", "attention_profile"]


def resolve_attention(config: ParallelConfig | None, gpu_name: str) -> str:
    """The attention kernel ("flash" or "unfused") ``config`` runs on a ``gpu_name``
    preset: a forced one as it is, "auto" (or no config) the unfused one."""
    att = getattr(config, "attention", "auto")
    return att if att != "auto" else "unfused"


def default_profile(gpu_name: str) -> ActivationProfile:
    """The activation profile of a cost model that names none: Korthikanti et al.'s on
    CUDA presets, the measured PyTorch eager one on the CPU cluster."""
    return KORTHIKANTI if on_cuda(gpu_name) else CPU_EAGER


def attention_profile(profile: ActivationProfile | None, config: ParallelConfig | None,
                      gpu_name: str) -> ActivationProfile:
    """``profile`` (None: :func:`default_profile`) storing what the kernel
    :func:`resolve_attention` picks keeps (module docstring)."""
    prof = profile if profile is not None else default_profile(gpu_name)
    if getattr(config, "attention", "auto") == "auto":
        return prof
    att = resolve_attention(config, gpu_name)
    return prof if prof.attention == att else replace(prof, name=f"{prof.name}+{att}",
                                                      attention=att)
