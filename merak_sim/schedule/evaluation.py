"""Evaluation schedules: a training schedule's forwards alone, without gradients.

:func:`forward_only` keeps every rank's forwards in their training order as F*
(forward without autograd, the last stage computing the loss), drops recomputes,
backwards, the all-reduce and the optimizer step, and lowers the result: only
activations travel. It is deadlock-free whenever the training schedule is (a forward
waits only for forwards of earlier model stages, which keep their relative order on
every rank), and :func:`~merak_sim.schedule.validate.validate` proves it like any
schedule: a schedule with no backward anywhere is complete when every (model stage,
micro-batch) had its one forward. Both back ends run it as they run training: the
runtime's evaluation (:meth:`merak_exec.parallel.ParallelModel.evaluate`) interprets it.
"""

from __future__ import annotations

from dataclasses import replace

from .ir import Action, Kind, Schedule, iter_actions
from .lowering import lower

__all__ = ["forward_only", "is_forward_only"]


def forward_only(sched: Schedule) -> Schedule:
    """The evaluation schedule of ``sched`` (see the module docstring), lowered."""
    programs = tuple(
        tuple(Action(Kind.FORWARD_NOGRAD, a.stage, a.microbatch, a.chunk)
              for a in iter_actions(prog) if a.kind in (Kind.FORWARD, Kind.FORWARD_NOGRAD))
        for prog in sched.programs)
    return lower(replace(sched, name=f"{sched.name}-eval", programs=programs, lowered=False,
                         no_recompute_stages=frozenset()))


def is_forward_only(sched: Schedule) -> bool:
    """Whether no rank of ``sched`` runs a backward (an evaluation schedule)."""
    return not any(a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT,
                              Kind.RECOMPUTE)
                   for prog in sched.programs for a in iter_actions(prog))
