"""Extension points of the runtime: what a profiler or tracer may observe.

A :class:`RuntimeHooks` object registered with
:meth:`merak_exec.runtime.PipelineRuntime.add_hooks` is called around every step of a
rank's program and inside every stage's layers, so measuring code observes the
runtime through these calls instead of replacing its methods. Every method is a no-op
here; override the ones needed. The calls are made in registration order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

from merak_sim.schedule.ir import Action

__all__ = ["RuntimeHooks", "HookHandle", "register"]


class RuntimeHooks:
    """Callbacks of :class:`~merak_exec.runtime.PipelineRuntime` and
    :class:`~merak_exec.stages.StageModule` (all no-ops by default)."""

    def on_action_start(self, action: Action) -> None:
        """A compute or collective action (F, F*, R, B, I, W, AR, OPT) of
        :meth:`~merak_exec.runtime.PipelineRuntime.step` is about to run (before its
        recorded start)."""

    def on_action_end(self, action: Action) -> None:
        """That action finished (after its recorded end)."""

    def on_post_start(self, parts: tuple[Action, ...]) -> None:
        """The sends and receives ``parts`` (one fused group, or a single operation)
        are about to be posted."""

    def on_post_end(self, parts: tuple[Action, ...]) -> None:
        """Their posting returned (posting never waits for the transfer)."""

    def saved_tensors_scope(self) -> AbstractContextManager:
        """A context entered around every application of a stage's layers (each
        sub-pipelined TP part included), e.g. saved-tensor hooks or autocast."""
        return contextlib.nullcontext()

    def on_checkpoint_inputs(self, tensors: tuple) -> None:
        """A checkpointed layer is about to run: it keeps ``tensors`` (its inputs) for
        the re-forward during backward."""

    def on_nograd_input(self, action: Action, tensors: tuple) -> None:
        """F* ``action`` ran without a graph and keeps its stage input ``tensors`` for
        the re-forward R."""


class HookHandle:
    """Returned by ``add_hooks``; :meth:`remove` unregisters the hooks again."""

    def __init__(self, remove: Callable[[], None]) -> None:
        self._remove = remove

    def remove(self) -> None:
        """Unregister (idempotent)."""
        if self._remove is not None:
            self._remove()
            self._remove = None


def register(hooks_list: list[RuntimeHooks], hooks: RuntimeHooks) -> HookHandle:
    """Append ``hooks`` to ``hooks_list``; the handle removes that entry."""
    hooks_list.append(hooks)

    def remove() -> None:
        if hooks in hooks_list:
            hooks_list.remove(hooks)
    return HookHandle(remove)
