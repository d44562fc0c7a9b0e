"""Calibration of the Hopper (H100 / H200 / GH200) efficiency on a declared subset of
the public runs, with the rest held out.

Split (:data:`FIT_SPLIT`, :func:`role_of`): the fit sees only llm-foundry's H100 rows
of MPT-1b, MPT-7b and MPT-30b (bf16, FSDP, 8-512 GPUs, sequences 512-64k). Held out:
llm-foundry's H100 rows of MPT-3b, MPT-13b and MPT-70b (other models, same source), every
torchtitan and NeMo row (other frameworks, LLaMA / GPT-3 shapes, tensor / pipeline /
context parallelism, FP8) and every A100 row (the A100 fit is vTrain's,
:mod:`merak_sim.experiments.vtrain`). The split is by model, so a held-out row never
shares a model and source with a fitted one.

What moves: the efficiency curve's GEMM ceiling, its shape half-points, the memory
efficiency, the per-kernel overhead, and the flash-attention ceilings forward and
backward. The FP8 factor keeps its published default (the fit rows are bf16), links keep
their spec-sheet figures. Bounds (:data:`BOUNDS`) come from physics, fixed before any
result was seen:
- gemm_max <= 0.80: large bf16 GEMMs on H100 / H200 reach 700-800 of 989 TFLOP/s (this
  workplace measured 769-798 on an H200, 8192^3).
- flash_max_fwd / flash_max_bwd <= 0.75: FlashAttention-3 reaches about 75 % of the
  H100's bf16 peak forward (Shah et al. 2024), the best published attention kernel;
  >= 0.25: FlashAttention-2 (PyTorch's SDPA, llm-foundry's flash option) reaches about
  35-50 % forward and 30-40 % backward; the floor leaves room for llm-foundry's default
  Triton kernel, which is slower.
- mem_bw_eff <= 0.92 (STREAM-like copies), kernel_overhead_s in [1, 30] us (a launch
  costs a few microseconds; eager per-op dispatch 10-20 us), gemm half-points as the
  A100 fit's (tile and wave quantisation; H100 has 132 SMs).

Method: the minimum of the mean absolute log error (symmetric relative error) by a
derivative-free coordinate search in log space (:func:`coordinate_search`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.calibrated_hopper import HOPPER_EFFICIENCY, HOPPER_KERNELS
from merak_sim.costs.efficiency import default_efficiency
from merak_sim.costs.kernels import default_kernels
from merak_sim.experiments.public_runs import measured_step_s, row_setup, skip_reason
from merak_sim.sim.api import simulate

__all__ = ["FIT_SPLIT", "FIT_MODELS", "BOUNDS", "role_of", "fit_rows", "HopperParams",
           "predict", "coordinate_search", "fit"]

#: Models whose llm-foundry H100 rows the fit sees.
FIT_MODELS = ("MPT-1b", "MPT-7b", "MPT-30b")
#: The split in words (printed with the fidelity table).
FIT_SPLIT = ("Hopper fit: llm-foundry H100 rows of " + ", ".join(FIT_MODELS)
             + "; every other public-runs row is held out")

#: Physical bounds of the fitted parameters (module docstring).
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_max": (0.3, 0.80), "gemm_dim_half": (1.0, 256.0),
    "gemm_flops_half": (1e6, 1e11), "mem_bw_eff": (0.2, 0.92),
    "kernel_overhead_s": (1e-6, 3e-5),
    "flash_max_fwd": (0.25, 0.75), "flash_max_bwd": (0.25, 0.75)}


def role_of(dataset: str, row: dict) -> str:
    """"fit" for a row of the Hopper fit set (module docstring), else "held out"."""
    if (dataset.endswith("llmfoundry") and row.get("gpu_type", "").startswith("H100")
            and row.get("model") in FIT_MODELS):
        return "fit"
    return "held out"


def fit_rows(rows_by_dataset: dict[str, Sequence[dict]]) -> list[dict]:
    """The expressible rows of the fit set."""
    return [r for ds, rows in rows_by_dataset.items() for r in rows
            if role_of(ds, r) == "fit" and skip_reason(r) is None]


@dataclass(frozen=True)
class HopperParams:
    """A point of the fit: efficiency and kernel parameters by name."""

    values: dict[str, float]

    @classmethod
    def committed(cls) -> HopperParams:
        """The values in :mod:`merak_sim.costs.calibrated_hopper`."""
        return cls({**HOPPER_EFFICIENCY, **HOPPER_KERNELS})

    def cost_model(self) -> AnalyticCostModel:
        """The analytic model with these values (as the calibrated model prices H100)."""
        eff = default_efficiency("H100-80GB").with_(
            **{k: v for k, v in self.values.items() if k in HOPPER_EFFICIENCY})
        kern = replace(default_kernels("H100-80GB"),
                       **{k: v for k, v in self.values.items() if k in HOPPER_KERNELS})
        return AnalyticCostModel(efficiency=eff, kernels=kern)


def predict(row: dict, params: HopperParams) -> float:
    """Predicted iteration seconds of an expressible H100 row under ``params``."""
    model, cluster, cfg = row_setup(row)
    return simulate(model, cluster, cfg, cost_model=params.cost_model(), engine="evaluator",
                    sub_cluster=True, keep_trace=False).iteration_time_s


def coordinate_search(loss: Callable[[dict[str, float]], float], start: dict[str, float],
                      bounds: dict[str, tuple[float, float]], *, rounds: int = 10,
                      step: float = 1.5, log: Callable[[str], None] | None = None
                      ) -> tuple[dict[str, float], float]:
    """Minimise ``loss`` over the parameters of ``start`` inside ``bounds``: each round
    multiplies every parameter by ``step`` and ``1 / step`` and keeps improvements; the
    step shrinks (square root) after a round without one."""
    x = {k: min(max(v, bounds[k][0]), bounds[k][1]) for k, v in start.items()}
    best = loss(x)
    for rnd in range(rounds):
        improved = False
        for name in x:
            for mult in (step, 1.0 / step):
                v = min(max(x[name] * mult, bounds[name][0]), bounds[name][1])
                if v == x[name]:
                    continue
                cand = {**x, name: v}
                c = loss(cand)
                if c < best:
                    x, best, improved = cand, c, True
                    break
        if log:
            log(f"round {rnd}: step x{step:.3f} loss {best:.4f} {x}")
        if not improved:
            step = math.sqrt(step)
    return x, best


def fit(rows: Sequence[dict], start: HopperParams | None = None, *, rounds: int = 10,
        log: Callable[[str], None] | None = None) -> tuple[HopperParams, float]:
    """Fit the Hopper parameters to ``rows`` within :data:`BOUNDS`; returns the values
    and the mean absolute log error."""
    meas = [measured_step_s(r) for r in rows]

    def loss(x: dict[str, float]) -> float:
        p = HopperParams(x)
        return sum(abs(math.log(predict(r, p) / m)) for r, m in zip(rows, meas)) / len(rows)

    x, best = coordinate_search(loss, dict((start or HopperParams.committed()).values),
                                BOUNDS, rounds=rounds, log=log)
    return HopperParams(x), best
