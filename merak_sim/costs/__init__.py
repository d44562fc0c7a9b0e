"""Cost models: what each action costs in time and memory (see :mod:`.base`).

:class:`AnalyticCostModel` (roofline with a named efficiency curve) and
:class:`TraceCostModel` (profiled ``merak-trace/1`` files, analytic fallback) both
implement the :class:`CostModel` protocol.
"""

from .analytic import AnalyticCostModel
from .base import CostTable, StageCost
from .efficiency import DEFAULT_EFFICIENCY, Efficiency, default_efficiency
from .protocol import CostModel
from .trace_model import TraceCostModel

__all__ = ["AnalyticCostModel", "CostModel", "CostTable", "DEFAULT_EFFICIENCY", "Efficiency",
           "StageCost", "TraceCostModel", "default_efficiency"]
