"""Efficiency of the fused attention kernel and of FP8 GEMMs, per GPU type.

Flash attention (Dao et al., FlashAttention, NeurIPS 2022; FlashAttention-2, 2023)
---------------------------------------------------------------------------------
One kernel computes softmax(QK^T)V tile by tile in on-chip memory: no s x s tensor
reaches HBM, so the memory-bound softmax / dropout kernels of the unfused path vanish
and only the log-sum-exp per row is kept for backward. Its time is
``executed FLOPs / (peak * efficiency)`` plus one kernel overhead, with

    efficiency = max_fwd (or max_bwd) * s_kv / (s_kv + seq_half) * d / (d + dim_half)

(short key blocks and small head dims run below the asymptote). Executed FLOPs: the
forward's two GEMMs (4 b a s^2 d per layer, model FLOPs count them whole) halved under
causal masking, since the kernel skips tiles above the diagonal; the backward
recomputes QK^T inside the kernel and runs dV, dP, dQ, dK: 5/2 of the forward's work.

Defaults: FlashAttention-2 reaches up to 73 % of A100 peak in forward and 63 % in
backward on long sequences with head dim 128 (Dao 2023, Sec. 4.1); FlashAttention-3
reaches about 75 % of H100's bf16 peak in forward (Shah et al. 2024); backward on
H100 is taken as 0.55 (an assumption, same ratio to forward as on A100). Volta and
consumer GPUs use the A100 figures scaled down (assumption).

FP8 GEMMs (Micikevicius et al., "FP8 formats for deep learning", 2022)
--------------------------------------------------------------------
GEMMs run at the FP8 dense peak times the shape-dependent GEMM efficiency times
``fp8_factor`` (FP8 kernels reach a lower fraction of their doubled peak than 16-bit
ones: cuBLAS FP8 GEMMs of 8k sizes reach about 65-70 % of 1,979 TFLOP/s on H100 where
bf16 reaches about 78 % of 989, NVIDIA Transformer Engine / cuBLASLt performance
notes -> about 0.87). Scaling: every GEMM input is cast to FP8 with a per-tensor scale
(read 2 bytes, write 1 per element, plus the amax reduction), in forward and again for
the transposed operand in backward; weights are cast once per iteration and cached
(Transformer Engine's behaviour across micro-batches). Attention, norms and the
residual stream stay 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KernelEfficiency", "DEFAULT_KERNELS", "default_kernels"]


@dataclass(frozen=True, slots=True)
class KernelEfficiency:
    """Named parameters of the fused-attention and FP8 efficiency (module docstring).

    Attributes:
        flash_max_fwd / flash_max_bwd: asymptotic fraction of the 16-bit peak of the
            flash forward / backward kernel.
        flash_seq_half: a key length of this many tokens halves the sequence factor.
        flash_dim_half: a head dim of this size halves the head-dim factor.
        fp8_factor: FP8 GEMM efficiency relative to the 16-bit curve.
        fp8_cast_kernels: extra kernels per GEMM for the scaling (cast + amax).
    """

    flash_max_fwd: float = 0.73
    flash_max_bwd: float = 0.63
    flash_seq_half: float = 256.0
    flash_dim_half: float = 16.0
    fp8_factor: float = 0.87
    fp8_cast_kernels: int = 1

    def __post_init__(self) -> None:
        for name in ("flash_max_fwd", "flash_max_bwd", "fp8_factor"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"kernel efficiency {name} must lie in (0, 1], got {v!r}")
        for name in ("flash_seq_half", "flash_dim_half"):
            if getattr(self, name) < 0:
                raise ValueError(f"kernel efficiency {name} must be >= 0")

    def flash(self, s_kv: float, head_dim: float, backward: bool = False) -> float:
        """Fraction of the 16-bit peak a flash kernel reaches on key blocks of
        ``s_kv`` tokens and heads of ``head_dim``."""
        top = self.flash_max_bwd if backward else self.flash_max_fwd
        return (top * s_kv / (s_kv + self.flash_seq_half)
                * head_dim / (head_dim + self.flash_dim_half))


#: Defaults per GPU preset name (module docstring gives the sources).
DEFAULT_KERNELS: dict[str, KernelEfficiency] = {
    "A100-40GB": KernelEfficiency(),
    "A100-80GB": KernelEfficiency(),
    "H100-80GB": KernelEfficiency(flash_max_fwd=0.75, flash_max_bwd=0.55),
    "H200-141GB": KernelEfficiency(flash_max_fwd=0.75, flash_max_bwd=0.55),
    "V100-32GB": KernelEfficiency(flash_max_fwd=0.6, flash_max_bwd=0.5),
    "RTX3090": KernelEfficiency(flash_max_fwd=0.6, flash_max_bwd=0.5),
    "CPU-2core": KernelEfficiency(flash_max_fwd=0.5, flash_max_bwd=0.4),
}


def default_kernels(gpu_name: str) -> KernelEfficiency:
    """The kernel efficiency of a GPU preset (A100's for unknown GPUs)."""
    return DEFAULT_KERNELS.get(gpu_name, DEFAULT_KERNELS["A100-80GB"])
