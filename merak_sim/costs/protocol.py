"""What a cost model is: anything that turns (model, cluster, ParallelConfig,
partition) into a :class:`~merak_sim.costs.base.CostTable` and prices collectives.

Kept apart from the table it produces, so the table (which the schedule layer reads)
does not depend on the configuration types.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig
    from merak_sim.costs.base import CostTable
    from merak_sim.hardware import Cluster
    from merak_sim.model import ModelSpec
    from merak_sim.partition import PartitionLike

__all__ = ["CostModel"]


@runtime_checkable
class CostModel(Protocol):
    """Anything that can price a configuration (AnalyticCostModel, TraceCostModel,
    CalibratedCostModel)."""

    def cost_table(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
                   partition: PartitionLike | None = None) -> CostTable:
        """Costs of every model stage for ``config`` (partition: layer ranges per
        model stage; None means the model's default partitioner)."""
        ...

    def comm_time(self, collective: str, nbytes: float, ranks: tuple[int, ...],
                  cluster: Cluster) -> float:
        """Seconds for ``collective`` ("all-reduce", "reduce-scatter", "all-gather",
        "p2p") of ``nbytes`` among global GPU ``ranks`` placed on ``cluster``."""
        ...
