"""Cost models: what each action costs in time and memory (see :mod:`.base`)."""

from .base import CostModel, CostTable, StageCost

__all__ = ["CostModel", "CostTable", "StageCost"]
