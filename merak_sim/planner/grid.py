"""The (chunk, rank) -> model stage grid as a cached numpy array.

Bounds, memory screens and templates index stage arrays with the grid of every
candidate; building it is pure in (placement, pp, virtual stages), so the planner
keeps one read-only array per shape instead of rebuilding the nested tuples.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from merak_sim.schedule.placement import stage_grid

__all__ = ["rank_grid"]


@lru_cache(maxsize=1024)
def rank_grid(placement: str, num_stages: int, virtual_stages: int) -> np.ndarray:
    """:func:`~merak_sim.schedule.placement.stage_grid` as a read-only int array (virtual
    stages x ranks)."""
    g = np.asarray(stage_grid(placement, num_stages, virtual_stages), dtype=int)
    g.setflags(write=False)
    return g
