"""The parameter-balanced pipeline partition (the analytic cost model's
``partition_method="parameters"``; re-exported by :mod:`merak_sim.costs.analytic`)."""

from __future__ import annotations

from merak_sim.memory import stage_params
from merak_sim.model import ModelSpec
from merak_sim.partition import Partition, balanced

__all__ = ["parameter_balanced"]


def parameter_balanced(model: ModelSpec, num_stages: int, tp: int = 1) -> Partition:
    """Balance parameters per GPU (embedding on the first stage, head on the last)."""
    lay = model.layer_params_sharded() / tp + model.layer_params_replicated()
    first = stage_params(model, 0, True, False, tp)
    last = stage_params(model, 0, False, True, tp) if num_stages > 1 else \
        stage_params(model, 0, True, True, tp) - first
    return balanced([lay] * model.layers, num_stages, first, last, "parameters")
