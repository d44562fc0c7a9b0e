"""What the simulator derives from a :class:`~merak_sim.config.ParallelConfig`.

The config is a plain value (fields, validation, serialisation); the functions here
turn it into what the back ends run and price: the lowered schedule (a cost-aware one
adapted to a cost table), each pipeline rank's checkpointed fraction, the rank holding
a model stage, and how the engine splits the data-parallel gradient sync. merak_exec
builds its runtime from the same functions, so both back ends run one schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from merak_sim.schedule import SCHEDULES, generate
from merak_sim.schedule.ir import Schedule
from merak_sim.schedule.placement import placed_rank
from merak_sim.schedule.zero_bubble import StageTimes, ZeroBubbleCosts

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig
    from merak_sim.costs.base import CostTable

__all__ = ["schedule_for", "recompute_fractions", "stage_rank", "split_grad_sync",
           "zero_bubble_costs"]


def schedule_for(config: ParallelConfig, table: CostTable | None = None) -> Schedule:
    """The lowered pipeline schedule of ``config`` (ScheduleError, a ValueError, if the
    schedule's requirements are violated). A cost-aware schedule
    (:attr:`~merak_sim.schedule.ScheduleSpec.cost_aware`) adapts its order to
    ``table``'s per-rank times and memory (unit costs without one); the others ignore
    it."""
    costs = None
    if table is not None and SCHEDULES[config.schedule].cost_aware:
        costs = zero_bubble_costs(table, recompute_fractions(config))
    return generate(config.schedule, config.pp, config.num_microbatches,
                    config.virtual_stages, costs)


def recompute_fractions(config: ParallelConfig, schedule: Schedule | None = None
                        ) -> tuple[float, ...]:
    """Checkpointed fraction c_s of each pipeline rank's layers.

    "none" -> 0, "full" -> 1, "selective" -> 0 (its cheaper recompute is charged by
    the cost model), "stage-aware" -> explicit fractions or Merak's formula from c0 as
    the schedule's spec maps it onto its stages
    (:attr:`~merak_sim.schedule.ScheduleSpec.stage_fractions`). Ranks that never
    recompute (``schedule.no_recompute_stages``, or the spec's
    :meth:`~merak_sim.schedule.ScheduleSpec.never_recompute` without a schedule) get 0.
    """
    S = config.pp
    spec = SCHEDULES[config.schedule]
    if config.recompute == "full":
        c = [1.0] * S
    elif config.recompute == "stage-aware":
        c = list(config.recompute_fractions if config.recompute_fractions is not None
                 else spec.stage_fractions(S, config.recompute_c0))
    else:
        c = [0.0] * S
    never = (schedule.no_recompute_stages if schedule is not None
             else spec.never_recompute(S))
    return tuple(0.0 if s in never else x for s, x in enumerate(c))


def stage_rank(config: ParallelConfig, model_stage: int) -> int:
    """Pipeline rank holding ``model_stage`` under the config's schedule placement."""
    return placed_rank(config.placement, config.pp, model_stage)[0]


def split_grad_sync(config: ParallelConfig) -> int:
    """How the engine splits the data-parallel gradient sync when it overlaps it:
    1 = the reduce-scatter overlaps the backwards and the all-gather follows the
    optimizer step (ZeRO 1/2 without parameter-gather overlap); 0 = all of it
    overlaps."""
    return 1 if config.zero in (1, 2) and not config.overlap_param_gather else 0


def zero_bubble_costs(table: CostTable, fractions: Sequence[float]) -> ZeroBubbleCosts:
    """Costs of a one-chunk pipeline from a cost table (one stage per rank): the
    simulator's F, I (with the checkpointed fraction's recompute) and W times, and as
    memory limit the micro-batches of ``kept_bytes`` that fit beside each rank's
    weights, gradients and optimizer state and the bytes the allocator reserves on that
    rank (:meth:`~merak_sim.costs.base.CostTable.reserved`), as the simulator's peak
    counts them."""
    times, limit = [], []
    for r, (sc, c) in enumerate(zip(table.stages, fractions, strict=True)):
        times.append(StageTimes(sc.forward_s, sc.backward_input_s + c * sc.recompute_s,
                                sc.backward_weight_s, sc.forward_s, sc.send_activation_s))
        per = sc.kept_bytes(c)
        free = table.memory_capacity_bytes - sc.state_bytes - table.reserved(r)
        limit.append(int(free // per) if per > 0 and free > 0 else 1)
    return ZeroBubbleCosts(tuple(times), tuple(limit))
