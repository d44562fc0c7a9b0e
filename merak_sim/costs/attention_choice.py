"""Which attention kernel a configuration runs, and the activation storage that goes
with it: the one place that turns ``ParallelConfig.attention`` into a kernel and a
profile (the planner only passes the field on).

:func:`resolve_attention` turns "auto" into a kernel: flash on CUDA presets (what
current GPU training stacks run: PyTorch's scaled-dot-product attention dispatches
16-bit inputs to its FlashAttention-2 kernel on Ampere and newer, torchtitan and
Megatron-Core with Transformer Engine use fused attention), the unfused one on the CPU
cluster. The cost model times that kernel
(:mod:`merak_sim.costs.layers`: flash at its own efficiency, scores recomputed in the
backward) and :func:`attention_profile` gives the activation profile that stores what
that kernel keeps (flash: the log-sum-exp, no s x s term), so the time and the memory
of a configuration always describe the same kernel. On the CPU cluster "auto" keeps the
measured PyTorch profile (:data:`~merak_sim.memory.CPU_EAGER`, whose ``sdpa-cpu``
storage is what PyTorch's CPU kernels keep, timed as the unfused kernel). Runs of
stacks that did not use flash attention (vTrain's Megatron-DeepSpeed of 2023, the
Merak paper's systems) set ``attention="unfused"`` explicitly.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from merak_sim.allocator_memory import on_cuda
from merak_sim.memory import CPU_EAGER, KORTHIKANTI, ActivationProfile

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig

__all__ = ["resolve_attention", "default_profile", "attention_profile", "attention_label"]


def resolve_attention(config: ParallelConfig | None, gpu_name: str) -> str:
    """The attention kernel ("flash" or "unfused") ``config`` runs on a ``gpu_name``
    preset: a forced one as it is; "auto" (or no config) flash on CUDA presets, the
    unfused kernel on CPU presets."""
    att = getattr(config, "attention", "auto")
    if att != "auto":
        return att
    return "flash" if on_cuda(gpu_name) else "unfused"


def default_profile(gpu_name: str) -> ActivationProfile:
    """The activation profile of a cost model that names none, before the attention
    kernel's storage is applied: Korthikanti et al.'s on CUDA presets, the measured
    PyTorch eager one on the CPU cluster."""
    return KORTHIKANTI if on_cuda(gpu_name) else CPU_EAGER


def attention_profile(profile: ActivationProfile | None, config: ParallelConfig | None,
                      gpu_name: str) -> ActivationProfile:
    """``profile`` (None: :func:`default_profile`) storing what the kernel
    :func:`resolve_attention` picks keeps; "auto" on a CPU preset keeps the profile's
    own storage (module docstring)."""
    prof = profile if profile is not None else default_profile(gpu_name)
    if getattr(config, "attention", "auto") == "auto" and not on_cuda(gpu_name):
        return prof
    att = resolve_attention(config, gpu_name)
    return prof if prof.attention == att else replace(prof, name=f"{prof.name}+{att}",
                                                      attention=att)


def attention_label(config: ParallelConfig, gpu_name: str) -> str:
    """``config.attention`` as printed: "auto" names the kernel it resolves to
    ("auto (flash)"), and the storage where the default profile keeps another (the CPU
    cluster: "auto (unfused timed, sdpa-cpu storage)")."""
    if config.attention != "auto":
        return config.attention
    kernel = resolve_attention(config, gpu_name)
    storage = attention_profile(None, config, gpu_name).attention
    return f"auto ({kernel})" if storage == kernel else f"auto ({kernel} timed, {storage} storage)"
