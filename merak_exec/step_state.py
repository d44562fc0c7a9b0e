"""Per-iteration state of the runtime: what one rank holds between two actions.

:class:`StepState` is made fresh for every iteration by
:meth:`merak_exec.runtime.PipelineRuntime.step`; a profiler makes its own to run
single actions (:meth:`~merak_exec.runtime.PipelineRuntime.run_action`), giving the
receives a stage consumes directly (:meth:`StepState.give_receive`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from merak_sim.schedule.ir import Kind

__all__ = ["MicroBatchState", "StepState"]


@dataclass
class MicroBatchState:
    """Per (chunk, micro-batch) state kept between actions."""

    x: tuple | None = None  # stage inputs (floating ones require grad past stage 0)
    out: tuple | None = None  # outputs with autograd graph ((loss,) on the last stage)
    act: tuple | None = None  # detached outputs to send
    rng: tuple | None = None  # RNG state saved by F*
    gout: tuple | None = None  # gradients of the floating outputs, from downstream
    gx: tuple | None = None  # gradients of the floating inputs, to send upstream
    modouts: list | None = None  # (module, output) of parameter owners (zero-bubble)
    mod_grads: list | None = None  # (module, output, output gradient) after I


class _Completed:
    """The handle of a receive whose tensors were given directly (always done)."""

    def wait(self, timeout=None) -> bool:  # noqa: D102 - mirrors torch's Work.wait
        return True


@dataclass
class StepState:
    """One iteration's state on a rank: per micro-batch tensors, posted operations and
    losses (see the module docstring for who makes one).

    Attributes:
        microbatches: :class:`MicroBatchState` by (chunk, micro-batch).
        sends: posted sends, awaited by AR or at the end of the iteration.
        recvs: posted receives by (chunk, micro-batch, kind).
        losses: this rank's loss per micro-batch (last stage).
    """

    microbatches: dict = field(default_factory=dict)
    sends: list = field(default_factory=list)
    recvs: dict = field(default_factory=dict)
    losses: dict = field(default_factory=dict)

    def microbatch(self, chunk: int, microbatch: int) -> MicroBatchState:
        """The state of (chunk, micro-batch), created empty when new."""
        return self.microbatches.setdefault((chunk, microbatch), MicroBatchState())

    def give_receive(self, kind: Kind, chunk: int, microbatch: int,
                     tensors: tuple[torch.Tensor, ...]) -> None:
        """Make the receive of ``kind`` (RECV_ACT or RECV_GRAD) for (chunk, micro-batch)
        complete with ``tensors``, as if a peer had sent them (profiling one stage)."""
        self.recvs[(chunk, microbatch, kind)] = ([_Completed()], tuple(tensors), None)
