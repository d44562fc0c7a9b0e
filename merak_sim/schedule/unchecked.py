"""Actions and fused groups built without the checks of
:func:`~merak_sim.schedule.ir.make_action` and :func:`~merak_sim.schedule.ir.make_fused`,
for passes whose every field comes from values those checks already passed: the
lowering's sends and receives copy a checked compute action's rank, micro-batch and
chunk, and 1F1B takes its ranks and micro-batches from ``range``.

A frozen dataclass refuses assignment, so an instance starts as a twin class with the
same slots (plain slot stores, the cheapest there are) and then becomes the real class
by assigning ``__class__``, as make_action does.
"""

from __future__ import annotations

from .ir import Action, ActionTwin, Fused, FusedTwin, Kind

# The twins are ir's (make_action's and make_fused's own), re-exported for the passes.
__all__ = ["ActionTwin", "FusedTwin", "new_twin", "action", "fused"]

#: ``new_twin(ActionTwin)``: an empty twin, to fill and turn into its class.
new_twin = object.__new__


def action(kind: Kind, stage: int, microbatch: int, chunk: int) -> Action:
    """``make_action(kind, stage, microbatch, chunk)`` less its checks."""
    a = new_twin(ActionTwin)
    a.kind = kind
    a.stage = stage
    a.microbatch = microbatch
    a.chunk = chunk
    a.__class__ = Action
    return a


def fused(parts: tuple[Action, ...]) -> Fused:
    """``make_fused(parts)`` less its checks."""
    f = new_twin(FusedTwin)
    f.parts = parts
    f.__class__ = Fused
    return f
