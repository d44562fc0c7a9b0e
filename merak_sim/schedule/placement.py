"""Where model stages sit on pipeline ranks: the placements a
:class:`~merak_sim.schedule.ir.Schedule` may use and the maps between a model stage and
its (rank, chunk).

Kept apart from the IR so consumers that hold only a configuration (the planner's stage
grids, ``ParallelConfig``, the torch order bridge) read the same rule without a schedule.
"""

from __future__ import annotations

__all__ = ["PLACEMENTS", "placed_stage", "placed_rank", "stage_grid"]

#: Placements of model stages on (rank, chunk): ``"loop"`` puts model stage g on rank
#: g mod S, chunk g // S (interleaved 1F1B); ``"v"`` folds the second chunk back, so
#: rank r holds stages r and 2S-1-r (V-shaped zero-bubble schedules).
PLACEMENTS = ("loop", "v")


def placed_stage(placement: str, num_stages: int, rank: int, chunk: int) -> int:
    """Model stage of (``rank``, ``chunk``) with ``num_stages`` ranks under
    ``placement`` (:data:`PLACEMENTS`)."""
    if placement == "v":
        return rank if chunk == 0 else 2 * num_stages - 1 - rank
    return chunk * num_stages + rank


def placed_rank(placement: str, num_stages: int, model_stage: int) -> tuple[int, int]:
    """(rank, chunk) holding ``model_stage`` (inverse of :func:`placed_stage`)."""
    if placement == "v":
        if model_stage < num_stages:
            return model_stage, 0
        return 2 * num_stages - 1 - model_stage, 1
    return model_stage % num_stages, model_stage // num_stages


def stage_grid(placement: str, num_stages: int, virtual_stages: int
               ) -> tuple[tuple[int, ...], ...]:
    """Model stage of every (chunk, rank): row c, column r (``x[grid].sum(axis=0)``
    sums an array over model stages into one value per rank)."""
    return tuple(tuple(placed_stage(placement, num_stages, r, c) for r in range(num_stages))
                 for c in range(virtual_stages))
