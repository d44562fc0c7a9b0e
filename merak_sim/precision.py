"""Training precisions: which GEMM rate, which casts and what state each dtype costs.

A ``ParallelConfig.dtype`` names how the GEMMs of a transformer layer run; activations,
norms, attention and the LM head stay 16-bit in every low-precision recipe (Transformer
Engine keeps them in bf16), so the activation memory is the 16-bit one.

=============  ==========================================================================
dtype          GEMMs, scaling, source
=============  ==========================================================================
bf16 / fp16    16-bit tensor cores.
fp32           fp32 (TF32 where a cluster says so).
fp8            FP8 E4M3/E5M2 with one scale per tensor (delayed or current scaling:
               Micikevicius et al., "FP8 formats for deep learning", 2022; Transformer
               Engine ``DelayedScaling`` / ``Float8CurrentScaling``; NeMo's "FP8-CS").
fp8-block      FP8 with one scale per 1x128 activation tile and per 128x128 weight
               block (DeepSeek-V3 technical report, 2024, Sec. 3.3; Transformer Engine
               ``Float8BlockScaling``): Hopper or later.
mxfp8          OCP Microscaling MXFP8: one E8M0 scale per 32 consecutive elements
               (OCP "Microscaling Formats (MX) v1.0 Specification", 2023), scaled in the
               tensor cores of Blackwell (``tcgen05.mma`` block-scaled): Blackwell only.
nvfp4          NVFP4: E2M1 values, one E4M3 scale per 16 elements and an fp32 scale per
               tensor (NVIDIA, "Pretraining Large Language Models with NVFP4", 2025;
               Transformer Engine ``NVFP4BlockScaling``): Blackwell only.
=============  ==========================================================================

GEMM rate: the GPU's ``peak_flops[gemm_peak]`` (:attr:`Precision.gemm_peak`) times the
16-bit GEMM efficiency times ``KernelEfficiency.fp8_factor`` times
:attr:`Precision.gemm_factor`, an ESTIMATE where not 1: fp8-block 0.9 (the per-block
scales are applied outside Hopper's tensor cores, DeepGEMM reports about 1,550 of
1,979 TFLOP/s where per-tensor FP8 reaches about 1,700), nvfp4 0.8 (NVFP4 GEMMs reach
a lower share of their doubled peak than FP8 at LLM shapes: the Megatron-Bridge tables
in data/public-runs show NVFP4 steps 1.3-1.5x, not 2x, faster than MXFP8 ones). A GPU
without the rate refuses the dtype in one line naming GPUs that have it.

Casts (:meth:`Precision.cast_bytes`): every GEMM input is quantized once per use
(the weights once per iteration, cached). Bytes moved per element: read the 16-bit
value (2), write the quantized data and its scales, once for the row-wise operand and,
where a transpose cannot reuse them (block scales run along one axis), once more for
the column-wise operand the backward needs:
fp8 1 copy (the per-tensor FP8 transpose is a byte shuffle folded in the same kernel,
as Transformer Engine's cast-transpose): 2 + 1 = 3 (the value the cost model always
charged); fp8-block and mxfp8 two copies with a scale per 128 / 32 elements (4 / 1
bytes): 2 + 2 (1 + 4/128) and 2 + 2 (1 + 1/32); nvfp4 a first pass for the per-tensor
amax (2) then two copies of 1/2 byte plus a 1-byte scale per 16: 2 + 2 + 2 (1/2 + 1/16).

Memory (:meth:`Precision.cached_weight_bytes`): mixed-precision training keeps 16-bit
weights and gradients and 12 bytes of fp32 master weights and Adam moments per
parameter; the low-precision recipes add the cached quantized weight copies, one per
operand layout: fp8 1 byte, fp8-block and mxfp8 2 (1 + scales), nvfp4 2 (1/2 + 1/16).
The optimizer step writes them (16-bit read, quantized write) after the update.

MFU (:func:`mfu_reference`): model FLOP/s over the 16-bit dense peak whatever the dtype
(the convention of Megatron-LM, torchtitan and NeMo's tables), so numbers compare across
precisions; the report names that peak and the GEMM peak beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Precision", "PRECISIONS", "LOW_PRECISION", "get_precision", "is_low_precision",
           "gemm_peak_key", "mfu_reference", "mfu_label", "mfu_notes", "optimizer_cast_bytes"]


@dataclass(frozen=True, slots=True)
class Precision:
    """One training precision (module docstring).

    Attributes:
        name: the dtype value.
        gemm_peak: key of ``GPU.peak_flops`` the GEMMs run at.
        element_bytes: bytes per element of a quantized GEMM operand (16-bit: 2).
        block: elements per scale (0: one scale per tensor).
        scale_bytes: bytes of one block scale.
        copies: quantized copies of each operand (row-wise, column-wise).
        amax_pass: a separate read of the 16-bit input for a per-tensor amax first.
        gemm_factor: GEMM efficiency relative to per-tensor FP8 (an estimate below 1).
        feature: the tensor-core feature the GEMMs need (for the refusal).
        gpus: GPUs that have it.
        source: where the format comes from.
    """

    name: str
    gemm_peak: str
    element_bytes: float = 2.0
    block: int = 0
    scale_bytes: float = 0.0
    copies: int = 1
    amax_pass: bool = False
    gemm_factor: float = 1.0
    feature: str = ""
    gpus: str = ""
    source: str = ""

    @property
    def low(self) -> bool:
        """Whether the GEMMs run below 16 bits."""
        return self.element_bytes < 2

    def quantized_bytes(self) -> float:
        """Bytes per element of one quantized copy with its scales."""
        return self.element_bytes + (self.scale_bytes / self.block if self.block else 0.0)

    def cast_bytes(self, e: int = 2) -> float:
        """HBM bytes moved per element to quantize one GEMM input of ``e``-byte
        elements (module docstring); 0 for 16-bit GEMMs."""
        if not self.low:
            return 0.0
        return e * (2 if self.amax_pass else 1) + self.copies * self.quantized_bytes()

    def cached_weight_bytes(self) -> float:
        """Bytes per parameter of the cached quantized weight copies (module
        docstring); 0 for 16-bit GEMMs."""
        return self.copies * self.quantized_bytes() if self.low else 0.0


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("bf16", "bf16"),
    Precision("fp16", "fp16"),
    Precision("fp32", "fp32", element_bytes=4.0),
    Precision("fp8", "fp8", 1.0, feature="FP8 tensor cores",
              gpus="H100, H200, GH200, Blackwell",
              source="Micikevicius et al. 2022; Transformer Engine per-tensor scaling"),
    Precision("fp8-block", "fp8", 1.0, block=128, scale_bytes=4.0, copies=2,
              gemm_factor=0.9, feature="FP8 tensor cores",
              gpus="H100, H200, GH200, Blackwell",
              source="DeepSeek-V3 report 2024; Transformer Engine Float8BlockScaling"),
    Precision("mxfp8", "mxfp8", 1.0, block=32, scale_bytes=1.0, copies=2,
              feature="block-scaled tensor cores",
              gpus="Blackwell: B200, B300, GB200, GB300",
              source="OCP Microscaling Formats v1.0, 2023"),
    Precision("nvfp4", "nvfp4", 0.5, block=16, scale_bytes=1.0, copies=2, amax_pass=True,
              gemm_factor=0.8,
              feature="FP4 tensor cores",
              gpus="Blackwell: B200, B300, GB200, GB300",
              source="NVIDIA, Pretraining LLMs with NVFP4, 2025"),
)}
#: dtypes whose GEMMs run below 16 bits.
LOW_PRECISION: tuple[str, ...] = tuple(n for n, p in PRECISIONS.items() if p.low)


def get_precision(dtype: str) -> Precision:
    """The :class:`Precision` of ``dtype`` (ValueError naming the choices)."""
    if dtype not in PRECISIONS:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(PRECISIONS)}")
    return PRECISIONS[dtype]


def is_low_precision(dtype: str) -> bool:
    """Whether ``dtype``'s GEMMs run below 16 bits (their activations stay 16-bit)."""
    return dtype in LOW_PRECISION


def gemm_peak_key(dtype: str) -> str:
    """The ``GPU.peak_flops`` key ``dtype``'s GEMMs run at."""
    return get_precision(dtype).gemm_peak


def mfu_reference(dtype: str) -> str:
    """The peak MFU is quoted against: the 16-bit dense peak for every 16-bit and
    lower dtype, fp32's own for fp32 (module docstring)."""
    return "bf16" if is_low_precision(dtype) else dtype


def mfu_label(dtype: str, reference_flops: float, gemm_flops: float) -> str:
    """One line naming the peak MFU is measured against and, for a low-precision
    dtype, the GEMM peak beside it."""
    ref = mfu_reference(dtype)
    line = f"MFU against the {ref} dense peak {reference_flops / 1e12:,.0f} TFLOP/s"
    if is_low_precision(dtype):
        line += (f" (the {dtype} GEMMs' peak is {gemm_flops / 1e12:,.0f} TFLOP/s: "
                 f"{reference_flops / gemm_flops:.2f} x that MFU against it)")
    return line


def mfu_notes(gpu: Any, dtype: str) -> tuple[str, ...]:
    """The table note naming MFU's reference peak for a low-precision ``dtype`` on
    ``gpu`` (none for 16-bit and fp32 training, whose MFU is against their own)."""
    if not is_low_precision(dtype):
        return ()
    return (mfu_label(dtype, gpu.peak(mfu_reference(dtype)), gpu.peak(dtype)),)


def optimizer_cast_bytes(dtype: str) -> float:
    """Bytes per parameter the optimizer step adds to write the cached quantized
    weights after the update: read the 16-bit weight (2), write the copies; 0 for a
    16-bit or fp32 dtype (fp8: 3, the figure the cost model always charged)."""
    p = get_precision(dtype)
    return 2 + p.cached_weight_bytes() if p.low else 0
