"""ScheduleSpec: what a schedule generator declares about itself.

Every fact a consumer needs about a schedule without building it (which degrees it
accepts, which ranks never recompute, which recompute policies the planner pairs it
with, how Merak's stage-aware fractions map onto its stages) is a field or method of
its spec, so the configuration check, the recompute resolution and the planner read
the registry instead of naming schedules. Facts that depend on the generated actions
(live micro-batches, dependencies) come from the IR itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .ir import Action, Kind, Schedule, ScheduleError, Step
from .replay import stage_aware_fractions

__all__ = ["ScheduleSpec", "Period"]

#: Per-rank compute order of a generator: (pp, microbatches[, virtual stages]) -> steps.
Order = Callable[..., Sequence[Sequence[Step]]]


def _tail(s: int) -> tuple[Step, ...]:
    return (Action(Kind.ALL_REDUCE, s), Action(Kind.OPTIMIZER, s))


def _positive_ints(pp: int, microbatches: int, virtual_stages: int) -> str:
    for name, val in (("pp", pp), ("microbatches", microbatches),
                      ("virtual stages", virtual_stages)):
        if not isinstance(val, int) or isinstance(val, bool):
            return f"{name} must be an integer, got {val!r}"
        if val < 1:
            return f"{name} must be >= 1, got {val}"
    return ""


@dataclass(frozen=True)
class Period:
    """How a generator's programs repeat in steady state, in compute steps (the
    lowered program's compute actions, AR and OPT included; sends and receives not
    counted).

    For every M >= ``first_microbatches`` with M - ``first_microbatches`` a multiple
    of ``microbatches``, rank r's compute steps are ``prefix[r]`` steps, then whole
    blocks of ``block[r]`` steps, then ``suffix[r]`` steps; M + ``microbatches``
    inserts one more block on every rank right before its suffix (the micro-batch
    numbers after it move up by ``microbatches``) and changes nothing else. Block j
    of one rank is the same period as block j of every other rank (counted from the
    prefix). :mod:`merak_sim.sim.periodic` checks the dependencies and times this
    implies before it relies on them.
    """

    first_microbatches: int
    microbatches: int
    prefix: tuple[int, ...]
    block: tuple[int, ...]
    suffix: tuple[int, ...]


@dataclass(frozen=True)
class ScheduleSpec:
    """A registered schedule generator and the facts it declares.

    Attributes:
        name: registry key (``ParallelConfig.schedule``, ``--schedule``).
        order: the generator proper, a pure function (pp, M[, v]) -> per-rank compute
            order without the trailing AR and OPT; :meth:`build` checks the
            requirements first, so ``order`` only sees valid arguments.
        interleaved: runs ``virtual_stages`` model chunks per rank (``order`` takes v);
            every other schedule needs virtual stages 1. Interleaving with v > 1
            needs pp >= 2 (one rank cannot interleave with itself).
        microbatch_floor: fewest micro-batches it accepts.
        microbatches_at_least_pp: also needs at least pp micro-batches.
        microbatches_multiple_of_pp: needs the micro-batches to be a multiple of pp.
        microbatches_per_rank: needs at least this many micro-batches per rank
            (M >= k * pp; 0: no such requirement).
        explicit_recompute: places its re-forwards itself (F* forwards keeping only
            their input, R re-forwards before B), so a re-forward may fill a wait
            instead of lengthening the backward (Merak's family).
        last_stage_never_recomputes: the last rank keeps every activation whatever the
            recompute policy (its backward follows its forward at once).
        recompute_policies: the recompute policies the planner pairs it with (None:
            every policy); explicit re-forwards only make sense with a policy that
            checkpoints.
        stage_fractions: Merak T2's checkpointed fraction per rank from (pp, c0) under
            this schedule.
        placement: where its model stages live (:data:`~merak_sim.schedule.placement.
            PLACEMENTS`); ``"v"`` needs ``interleaved`` and exactly two virtual stages.
        cost_aware: ``order`` also takes per-rank costs (a
            :class:`~merak_sim.schedule.zero_bubble.ZeroBubbleCosts`, or None for unit
            costs) and adapts the order to them; :meth:`build` passes ``costs``.
        min_virtual_stages: fewest virtual stages it accepts (an interleaved schedule
            that cannot run one chunk per rank declares 2).
        period: (pp, virtual stages) -> the :class:`Period` its programs repeat with,
            or None where they do not (or the generator does not declare it).
    """

    name: str
    order: Order
    interleaved: bool = False
    microbatch_floor: int = 1
    microbatches_at_least_pp: bool = False
    microbatches_multiple_of_pp: bool = False
    microbatches_per_rank: int = 0
    explicit_recompute: bool = False
    last_stage_never_recomputes: bool = False
    recompute_policies: tuple[str, ...] | None = None
    stage_fractions: Callable[[int, float], tuple[float, ...]] = stage_aware_fractions
    placement: str = "loop"
    cost_aware: bool = False
    min_virtual_stages: int = 1
    period: Callable[[int, int], Period | None] | None = None

    def steady_period(self, pp: int, virtual_stages: int = 1) -> Period | None:
        """The declared :class:`Period` for ``pp`` ranks and ``virtual_stages``, or
        None (no declaration, or a cost-aware order, which may change with costs)."""
        if self.period is None or self.cost_aware:
            return None
        return self.period(pp, virtual_stages)

    def min_microbatches(self, pp: int) -> int:
        """Fewest micro-batches the schedule accepts with ``pp`` stages."""
        return max(self.microbatch_floor, pp if self.microbatches_at_least_pp else 1,
                   self.microbatches_per_rank * pp)

    def violation(self, pp: int, microbatches: int, virtual_stages: int = 1) -> str:
        """The first requirement (pp, M, v) breaks, as a sentence; "" if none."""
        bad = _positive_ints(pp, microbatches, virtual_stages)
        if bad:
            return bad
        M = microbatches
        if not self.interleaved and virtual_stages != 1:
            return (f"schedule {self.name!r} has no virtual stages (got {virtual_stages}); "
                    "use an interleaved schedule or virtual stages 1")
        if self.placement == "v" and virtual_stages != 2:
            return (f"schedule {self.name!r} runs two model chunks per rank in a V: it "
                    f"needs virtual stages 2, got {virtual_stages}; set virtual stages to 2")
        if virtual_stages < self.min_virtual_stages:
            return (f"schedule {self.name!r} needs virtual stages >= "
                    f"{self.min_virtual_stages}, got {virtual_stages}; set virtual stages "
                    f"to {self.min_virtual_stages} or more")
        if self.interleaved and virtual_stages > 1 and pp < 2:
            return f"{self.name} with virtual stages > 1 needs pp >= 2"
        if self.microbatches_multiple_of_pp and M % pp:
            return f"{self.name} needs microbatches to be a multiple of pp: M={M}, pp={pp}"
        least = self.min_microbatches(pp)
        if M < least:
            need = str(least)
            if self.microbatches_per_rank * pp == least > self.microbatch_floor:
                need = f"{self.microbatches_per_rank} * pp = {least}"
            elif self.microbatches_at_least_pp:
                pp_term = f"max(pp, {self.microbatch_floor})" if self.microbatch_floor > 1 \
                    else "pp"
                need = f"{pp_term} = {least}"
            return f"{self.name} needs microbatches >= {need}, got {M}"
        return ""

    def check(self, pp: int, microbatches: int, virtual_stages: int = 1) -> None:
        """Raise :class:`ScheduleError` naming the first broken requirement."""
        bad = self.violation(pp, microbatches, virtual_stages)
        if bad:
            raise ScheduleError(bad)

    def pairs_with(self, recompute: str) -> bool:
        """Whether the planner pairs this schedule with recompute policy ``recompute``."""
        return self.recompute_policies is None or recompute in self.recompute_policies

    def never_recompute(self, pp: int) -> frozenset[int]:
        """Ranks that keep every activation under any recompute policy."""
        return frozenset({pp - 1}) if self.last_stage_never_recomputes else frozenset()

    def build(self, pp: int, microbatches: int, virtual_stages: int = 1,
              costs: Any = None) -> Schedule:
        """The compute-only (unlowered) schedule; ScheduleError if a requirement
        fails. :func:`merak_sim.schedule.generate` lowers it. ``costs`` reaches a
        cost-aware generator only (others are pure in their degrees)."""
        self.check(pp, microbatches, virtual_stages)
        args: tuple = (pp, microbatches, virtual_stages) if self.interleaved \
            else (pp, microbatches)
        if self.cost_aware:
            args += (costs,)
        programs = self.order(*args)
        return Schedule(
            name=self.name,
            num_stages=pp,
            num_microbatches=microbatches,
            virtual_stages=virtual_stages,
            programs=tuple(tuple(p) + _tail(s) for s, p in enumerate(programs)),
            no_recompute_stages=self.never_recompute(pp),
            lowered=False,
            placement=self.placement,
        )
