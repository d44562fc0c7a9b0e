"""Fitted efficiency per software stack of Hopper GPUs (H100, H200, GH200), and of A100
under PyTorch: the one place these values live.

Two software stacks reach very different fractions of the same tensor cores, so the fit
keeps one profile per stack (:data:`HOPPER_PROFILES`):
- ``pytorch``: PyTorch training loops (eager or compiled; FSDP, DTensor TP) with
  FlashAttention-2 or Triton attention: llm-foundry, torchtitan, Sailor's
  Megatron-DeepSpeed.
- ``megatron-te``: Megatron-Core with Transformer Engine (fused kernels, cuDNN
  attention, FP8 GEMMs from cuBLASLt): NeMo / Megatron-Bridge. The default for every
  Hopper GPU preset (:data:`DEFAULT_PROFILE`): the planner's space (tp, pp, cp,
  interleaving, the distributed optimizer) is Megatron's.

Provenance: the study research/hopper_fit.py (in the repository, not installed) fits
each profile to its declared subset of the public runs in data/public-runs
(:data:`merak_sim.validation.fidelity.FIT_SPLIT`; every other row is held out)
within physical bounds, by ``python -m research.studies.hopper_fit --fit``; the values
are copied here by hand so a reviewer sees them change. :class:`merak_sim.costs.calibrated.CalibratedCostModel` serves the
default profile for every Hopper GPU preset (same tensor cores, different memory);
:func:`hopper_cost_model` gives either profile.

Fit of 2026-12-01, ``pytorch`` (llm-foundry H100 MPT-1b / 7b / 30b, 32 rows, 12 rounds
from the published H100 defaults): mean absolute log error 0.078. The flash ceilings end
at their floor (llm-foundry's default Triton attention kernel is slow), the per-kernel
overhead and the memory efficiency at their ceilings; the GEMM ceiling settles at 0.52
(514 of 989 TFLOP/s end to end under eager PyTorch and FSDP). ``megatron-te`` (NeMo H100
GPT-3 / LLaMA-2 / Nemotron, 10 FP8 rows): only the GEMM ceiling and the per-kernel
overhead move, every other parameter keeps its published H100 default: the variant that
leave-one-family-out cross-validation inside the fit rows chose
(research/hopper_fit.py's ``VARIANTS``; scores, the mean absolute log
error of the left-out family: published defaults 0.094, ceiling + overhead 0.071,
with the flash ceilings 0.082, all eight parameters 0.077). Refitted on the 10 rows,
12 rounds from the published defaults: mean absolute log error 0.069; the ceiling
stays at its published 0.78 and the overhead settles at 26 us per kernel (the eight-
parameter fit reached 0.054 on its own rows but extrapolated worse).

A100 under PyTorch (:data:`A100_PROFILES`, ``a100-pytorch``): the A100 fit of
:mod:`merak_sim.costs.calibrated` is vTrain's Megatron-LM runs; eager PyTorch training
(llm-foundry / Composer FSDP, torchtitan) reaches a lower fraction of the same GPU, so
A100 rows of a PyTorch stack are priced by this profile, fitted like the Hopper ones
(:data:`merak_sim.validation.fidelity.FIT_MODELS`) with the measured A100 NCCL table
for the links; every other A100 use keeps the vTrain fit. Fit of 2026-12-01
(llm-foundry A100 40 / 80 GB MPT-1b / 7b, 36 rows, 10 rounds from vTrain's A100 values
and the published FlashAttention-2 ceilings): mean absolute log error 0.032. The GEMM
ceiling stays at its bound 0.80; flash forward / backward settle at 0.32 / 0.42
(llm-foundry's default Triton kernel is slower than FlashAttention-2's 0.73 / 0.63), the
memory efficiency at 0.61 and the per-kernel overhead at 15 us (eager dispatch).
"""

from __future__ import annotations

from dataclasses import replace

from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.comm import measured_collectives
from merak_sim.costs.efficiency import Efficiency, default_efficiency
from merak_sim.costs.kernels import KernelEfficiency, default_kernels
from merak_sim.costs.nccl import A100_NVSWITCH

__all__ = ["HOPPER_PROFILES", "DEFAULT_PROFILE", "EFFICIENCY_KEYS", "is_hopper",
           "hopper_calibration", "hopper_cost_model", "A100_PROFILES", "a100_cost_model"]

#: Fitted parameters per software stack (module docstring): the
#: :class:`~merak_sim.costs.efficiency.Efficiency` fields in :data:`EFFICIENCY_KEYS`, the
#: rest :class:`~merak_sim.costs.kernels.KernelEfficiency` fields (a field a profile
#: lacks keeps its published H100 default).
HOPPER_PROFILES: dict[str, dict[str, float]] = {
    "pytorch": {
        "gemm_max": 0.52,
        "gemm_dim_half": 2.4971803078798955,
        "gemm_flops_half": 17085937500.0,
        "mem_bw_eff": 0.92,
        "kernel_overhead_s": 3e-05,
        "flash_max_fwd": 0.25,
        "flash_max_bwd": 0.25,
    },
    "megatron-te": {
        "gemm_max": 0.78,
        "kernel_overhead_s": 2.6429730594096855e-05,
    },
}
#: Fitted A100 parameters per software stack (module docstring); fields as in
#: :data:`HOPPER_PROFILES`, a field a profile lacks keeps its published A100 default.
A100_PROFILES: dict[str, dict[str, float]] = {
    "a100-pytorch": {
        "gemm_max": 0.8,
        "gemm_dim_half": 137.30394459159083,
        "gemm_flops_half": 20799567923.617683,
        "mem_bw_eff": 0.6133333333333333,
        "kernel_overhead_s": 1.5e-05,
        "host_op_s": 7e-05,
        "flash_max_fwd": 0.3244444444444444,
        "flash_max_bwd": 0.42,
    },
}
#: The profile served by default.
DEFAULT_PROFILE = "megatron-te"
#: Profile keys that belong to the GEMM / memory efficiency curve.
EFFICIENCY_KEYS = ("gemm_max", "gemm_dim_half", "gemm_flops_half", "attn_factor",
                   "mem_bw_eff", "kernel_overhead_s", "host_op_s")


def is_hopper(gpu_name: str) -> bool:
    """Whether a GPU preset is a Hopper GPU (H100, H200, GH200)."""
    return gpu_name.startswith(("H100", "H200", "GH200"))


def _split(values: dict[str, float], gpu: str = "H100-80GB"
           ) -> tuple[Efficiency, KernelEfficiency]:
    eff = default_efficiency(gpu).with_(
        **{k: v for k, v in values.items() if k in EFFICIENCY_KEYS})
    kern = replace(default_kernels(gpu),
                   **{k: v for k, v in values.items() if k not in EFFICIENCY_KEYS})
    return eff, kern


def hopper_calibration(gpu_name: str, efficiency: Efficiency | None,
                       profile: str = DEFAULT_PROFILE
                       ) -> tuple[Efficiency | None, KernelEfficiency | None]:
    """(efficiency, kernel efficiency) for ``gpu_name``: the fitted ``profile`` for a
    Hopper GPU, else ``efficiency`` and None."""
    if not is_hopper(gpu_name):
        return efficiency, None
    if profile not in HOPPER_PROFILES:
        raise ValueError(f"unknown Hopper profile {profile!r}; choose one of: "
                         f"{', '.join(HOPPER_PROFILES)}")
    return _split(HOPPER_PROFILES[profile])


def hopper_cost_model(profile: str = DEFAULT_PROFILE,
                      values: dict[str, float] | None = None) -> AnalyticCostModel:
    """The analytic model for Hopper clusters with ``profile``'s fitted values (or
    ``values``, a point of the fit); the calibrated model serves the default profile
    exactly so on clusters without a measured NCCL table."""
    if values is None:
        hopper_calibration("H100-80GB", None, profile)  # validates the name
        values = HOPPER_PROFILES[profile]
    eff, kern = _split(values)
    return AnalyticCostModel(efficiency=eff, kernels=kern)


def a100_cost_model(profile: str = "a100-pytorch", values: dict[str, float] | None = None
                    ) -> AnalyticCostModel:
    """The analytic model for A100 clusters with ``profile``'s fitted values (or
    ``values``, a point of the fit), intra-node collectives from the measured A100 NCCL
    table and full-activation pipeline sends (PyTorch's)."""
    if values is None:
        if profile not in A100_PROFILES:
            raise ValueError(f"unknown A100 profile {profile!r}; choose one of: "
                             f"{', '.join(A100_PROFILES)}")
        values = A100_PROFILES[profile]
    eff, kern = _split(values, "A100-80GB")
    return AnalyticCostModel(efficiency=eff, kernels=kern,
                             collectives=measured_collectives(A100_NVSWITCH))
