"""Automated 3D parallelism: search dp x tp x pp, schedule, recompute, sequence
parallelism, TP overlap and ZeRO for the fastest configuration that fits
(:func:`search`), with restricted :class:`SearchSpace` values for the systems of the
paper reproduction (:data:`SYSTEMS`)."""

from .report import GiB, NoFeasiblePlanError, PlannerError, PlanResult
from .search import search
from .space import SYSTEMS, Candidate, SearchSpace, enumerate_candidates

__all__ = ["search", "PlanResult", "NoFeasiblePlanError", "PlannerError", "SearchSpace",
           "SYSTEMS", "Candidate", "enumerate_candidates", "GiB"]
