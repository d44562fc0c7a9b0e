"""Partitions priced by a cost model: :func:`make_partition` cuts a model's layers
into stages by one of Merak's three methods (Lai et al. TPDS 2023) and reports what
every stage then costs.

The cutting itself is pure arithmetic in :mod:`merak_sim.partition`; this module
supplies the weights: layer counts (uniform), parameters per GPU
(:func:`~merak_sim.costs.analytic.parameter_balanced`) or the analytic cost model's
forward+backward seconds (time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from merak_sim.costs.analytic import AnalyticCostModel, parameter_balanced
from merak_sim.partition import Partition, PartitionError, uniform

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig
    from merak_sim.costs.protocol import CostModel
    from merak_sim.hardware import Cluster
    from merak_sim.model import ModelSpec

__all__ = ["METHODS", "make_partition"]

#: The partition methods :func:`make_partition` accepts.
METHODS = ("uniform", "parameters", "time")


def make_partition(method: str, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
                   cost_model: CostModel | None = None) -> Partition:
    """Partition ``model`` into ``config.pp * config.virtual_stages`` stages by
    ``method`` ("uniform", "parameters" or "time") and report, for every method, the
    per-stage forward + backward seconds of one micro-batch (embedding and LM head
    included, TP communication as exposed) in ``stage_costs``; ``cost_model``
    defaults to :class:`~merak_sim.costs.analytic.AnalyticCostModel`."""
    if method not in METHODS:
        raise PartitionError(f"unknown partition method {method!r}; choose one of: "
                             f"{', '.join(METHODS)}")
    cm = cost_model or AnalyticCostModel()
    n = config.pp * config.virtual_stages
    if method == "uniform":
        p = uniform(model.layers, n)
    elif method == "parameters":
        p = parameter_balanced(model, n, config.tp)
    else:
        # An analytic model (or one wrapping it as ``base``) balances by its own layer
        # times (its kernels, framework and efficiency); another (a trace) by the
        # analytic ones at its efficiency.
        base = cm if isinstance(cm, AnalyticCostModel) else getattr(cm, "base", None)
        timer = (base if isinstance(base, AnalyticCostModel)
                 else AnalyticCostModel(efficiency=getattr(cm, "efficiency", None)))
        p = timer.time_partition(model, cluster, config)
    table = cm.cost_table(model, cluster, config, p)
    return Partition(p.ranges, method,
                     tuple(s.forward_s + s.backward_s for s in table.stages))
