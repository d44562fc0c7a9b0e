"""Fitted efficiency of Hopper GPUs (H100, H200, GH200): the one place its values live.

Provenance: :mod:`merak_sim.experiments.hopper_fit` fits these to a declared subset of
the public runs in data/public-runs (:data:`merak_sim.experiments.hopper_fit.FIT_SPLIT`:
llm-foundry's H100 rows of MPT-1b, MPT-7b and MPT-30b; every other public-runs row is
held out) within physical bounds (:data:`merak_sim.experiments.hopper_fit.BOUNDS`), by
``benchmarks/fidelity.py --fit``; the values are copied here by hand so a reviewer sees
them change. Fit of 2026-12-01 (12 rounds from the published H100 defaults, 32 rows):
mean absolute log error 0.078. The flash ceilings end at their floor (llm-foundry's
default Triton attention kernel is slow), the per-kernel overhead at its ceiling and
the memory efficiency at its ceiling; the GEMM ceiling settles at 0.52 (514 of 989
TFLOP/s end to end under eager PyTorch and FSDP). :class:`merak_sim.costs.calibrated.CalibratedCostModel` serves them for every
Hopper GPU preset (one fit for the family: same tensor cores, different memory).
"""

from __future__ import annotations

from dataclasses import replace

from merak_sim.costs.efficiency import Efficiency, default_efficiency
from merak_sim.costs.kernels import KernelEfficiency, default_kernels

__all__ = ["HOPPER_EFFICIENCY", "HOPPER_KERNELS", "is_hopper", "hopper_calibration"]

#: Fitted :class:`~merak_sim.costs.efficiency.Efficiency` parameters.
HOPPER_EFFICIENCY: dict[str, float] = {
    "gemm_max": 0.52,
    "gemm_dim_half": 2.4971803078798955,
    "gemm_flops_half": 17085937500.0,
    "mem_bw_eff": 0.92,
    "kernel_overhead_s": 3e-05,
}
#: Fitted :class:`~merak_sim.costs.kernels.KernelEfficiency` parameters (the FP8 factor
#: keeps its published default: the fit rows are bf16).
HOPPER_KERNELS: dict[str, float] = {
    "flash_max_fwd": 0.25,
    "flash_max_bwd": 0.25,
}


def is_hopper(gpu_name: str) -> bool:
    """Whether a GPU preset is a Hopper GPU (H100, H200, GH200)."""
    return gpu_name.startswith(("H100", "H200", "GH200"))


def hopper_calibration(gpu_name: str, efficiency: Efficiency | None
                       ) -> tuple[Efficiency | None, KernelEfficiency | None]:
    """(efficiency, kernel efficiency) for ``gpu_name``: the fitted Hopper values for a
    Hopper GPU (over ``efficiency`` or the defaults), else ``efficiency`` and None."""
    if not is_hopper(gpu_name):
        return efficiency, None
    base = efficiency or default_efficiency(gpu_name)
    return (base.with_(**HOPPER_EFFICIENCY),
            replace(default_kernels("H100-80GB"), **HOPPER_KERNELS))
