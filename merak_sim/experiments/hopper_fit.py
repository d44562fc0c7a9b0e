"""Calibration of the Hopper (H100 / H200 / GH200) efficiency on declared subsets of
the public runs, with the rest held out.

One profile per software stack (:data:`merak_sim.costs.calibrated_hopper.HOPPER_PROFILES`;
:func:`profile_of` picks a row's), each fitted on its own declared subset
(:data:`FIT_SPLIT`, :func:`role_of`), split by model so that no held-out row shares a
model and source with a fitted one:
- ``pytorch``: llm-foundry's H100 rows of MPT-1b, MPT-7b and MPT-30b (bf16, FSDP, 8-512
  GPUs, sequences 512-64k). Held out: llm-foundry's H100 rows of MPT-3b / 13b / 70b,
  every torchtitan row (LLaMA 3 shapes, TP, PP, CP, FP8) and Sailor's GH200 rows.
- ``megatron-te``: NeMo's H100 rows of GPT-3, LLaMA-2 and Nemotron models (FP8,
  Megatron-Core with Transformer Engine). Held out: every LLaMA-3 row of NeMo and
  Megatron-Bridge (8B, 70B, 405B; FSDP, CP, FP8 current scaling).
Every A100 row is held out from both (the A100 fit is vTrain's,
:mod:`merak_sim.experiments.vtrain`).

What moves: the efficiency curve's GEMM ceiling, its shape half-points, the memory
efficiency, the per-kernel overhead, the flash-attention ceilings forward and backward,
and (``megatron-te``, whose rows are FP8) the FP8 factor. Links keep their spec-sheet
figures. Bounds (:data:`BOUNDS`) come from physics, fixed before any result was seen:
- gemm_max <= 0.80: large bf16 GEMMs on H100 / H200 reach 700-800 of 989 TFLOP/s (this
  workplace measured 769-798 on an H200, 8192^3).
- flash_max_fwd / flash_max_bwd <= 0.75: FlashAttention-3 reaches about 75 % of the
  H100's bf16 peak forward (Shah et al. 2024), the best published attention kernel;
  >= 0.25: FlashAttention-2 (PyTorch's SDPA, llm-foundry's flash option) reaches about
  35-50 % forward and 30-40 % backward; the floor leaves room for llm-foundry's default
  Triton kernel, which is slower.
- fp8_factor in [0.5, 1]: an FP8 GEMM reaches at most the same fraction of its doubled
  peak as a bf16 one.
- mem_bw_eff <= 0.92 (STREAM-like copies), kernel_overhead_s in [1, 30] us (a launch
  costs a few microseconds; eager per-op dispatch 10-20 us), gemm half-points as the
  A100 fit's (tile and wave quantisation; H100 has 132 SMs).

Method: the minimum of the mean absolute log error (symmetric relative error) by a
derivative-free coordinate search in log space
(:func:`merak_sim.experiments.fitting.coordinate_search`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.calibrated_hopper import DEFAULT_PROFILE, HOPPER_PROFILES, hopper_cost_model
from merak_sim.experiments.fitting import coordinate_search
from merak_sim.experiments.public_runs import measured_step_s, row_setup, skip_reason
from merak_sim.sim.api import simulate

__all__ = ["FIT_SPLIT", "FIT_MODELS", "BOUNDS", "profile_of", "role_of", "fit_rows",
           "HopperParams", "predict", "fit"]

#: Per profile: (dataset, model-name prefixes) of the H100 rows the fit sees.
FIT_MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "pytorch": ("public-runs/llmfoundry", ("MPT-1b", "MPT-7b", "MPT-30b")),
    "megatron-te": ("public-runs/nemo_perf", ("GPT3-", "LLAMA2-", "Nemotron-")),
}
#: The split in words (printed with the fidelity table).
FIT_SPLIT = ("Hopper fits: pytorch on llm-foundry H100 MPT-1b / 7b / 30b, megatron-te on "
             "NeMo H100 GPT-3 / LLaMA-2 / Nemotron; every other public-runs row is held "
             "out")

#: Physical bounds of the fitted parameters (module docstring).
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_max": (0.3, 0.80), "gemm_dim_half": (1.0, 256.0),
    "gemm_flops_half": (1e6, 1e11), "mem_bw_eff": (0.2, 0.92),
    "kernel_overhead_s": (1e-6, 3e-5),
    "flash_max_fwd": (0.25, 0.75), "flash_max_bwd": (0.25, 0.75), "fp8_factor": (0.5, 1.0)}


def profile_of(row: dict) -> str:
    """The Hopper profile of a row's software stack (NeMo / Megatron-Bridge:
    ``megatron-te``; everything else: ``pytorch``)."""
    fw = row.get("framework", "").lower()
    return "megatron-te" if ("nemo" in fw or "megatron-bridge" in fw) else "pytorch"


def role_of(dataset: str, row: dict) -> str:
    """"fit" for a row of its profile's fit set (module docstring), else "held out"."""
    ds, prefixes = FIT_MODELS[profile_of(row)]
    if (dataset == ds and row.get("gpu_type", "").startswith("H100")
            and row.get("model", "").startswith(prefixes)):
        return "fit"
    return "held out"


def fit_rows(rows_by_dataset: dict[str, Sequence[dict]], profile: str = DEFAULT_PROFILE
             ) -> list[dict]:
    """The expressible rows of ``profile``'s fit set."""
    return [r for ds, rows in rows_by_dataset.items() for r in rows
            if role_of(ds, r) == "fit" and profile_of(r) == profile
            and skip_reason(r) is None]


@dataclass(frozen=True)
class HopperParams:
    """A point of the fit: a profile's parameters by name."""

    values: dict[str, float]
    profile: str = DEFAULT_PROFILE

    @classmethod
    def committed(cls, profile: str = DEFAULT_PROFILE) -> HopperParams:
        """The values in :mod:`merak_sim.costs.calibrated_hopper`."""
        return cls(dict(HOPPER_PROFILES[profile]), profile)

    def cost_model(self) -> AnalyticCostModel:
        """The analytic model with these values (as the calibrated model prices H100)."""
        return hopper_cost_model(self.profile, self.values)


def predict(row: dict, params: HopperParams) -> float:
    """Predicted iteration seconds of an expressible H100 row under ``params``."""
    model, cluster, cfg = row_setup(row)
    return simulate(model, cluster, cfg, cost_model=params.cost_model(), engine="evaluator",
                    sub_cluster=True, keep_trace=False).iteration_time_s


def fit(rows: Sequence[dict], start: HopperParams | None = None, *, rounds: int = 10,
        log: Callable[[str], None] | None = None) -> tuple[HopperParams, float]:
    """Fit a profile's parameters (those of ``start``, default the committed values of
    the default profile) to ``rows`` within :data:`BOUNDS`; returns the values and the
    mean absolute log error."""
    start = start or HopperParams.committed()
    meas = [measured_step_s(r) for r in rows]

    def loss(x: dict[str, float]) -> float:
        p = HopperParams(x, start.profile)
        errs = [abs(math.log(predict(r, p) / m)) for r, m in zip(rows, meas, strict=True)]
        return sum(errs) / len(errs)

    x, best = coordinate_search(loss, dict(start.values), BOUNDS, rounds=rounds, log=log)
    return HopperParams(x, start.profile), best
