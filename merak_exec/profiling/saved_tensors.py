"""The saved-tensor tracker: live bytes of what autograd and the runtime keep for backward.

:class:`SavedTensorTracker` counts, deduplicated by storage (views of one tensor count
once, at the size of their storage) and with parameters excluded:

- every tensor autograd saves for backward (``saved_tensors_hooks``), freed when the
  graph that holds it is dropped;
- with a runtime, through its hooks (:class:`merak_exec.hooks.RuntimeHooks`): the
  inputs a checkpointed layer keeps and the stage input F* keeps for its re-forward,
  freed when garbage collected.

Its ``peak_bytes`` over a training iteration is the measured activation memory of a
rank; :func:`saved_tensor_bytes` is the same count for one function call (the
per-layer profiler and the memory-model tests use it).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import torch

from merak_exec.hooks import RuntimeHooks

__all__ = ["SavedTensorTracker", "saved_tensor_bytes"]


class _Live:
    """Live bytes of tracked storages, deduplicated by storage pointer."""

    def __init__(self, params: set[int]) -> None:
        self.count: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.bytes = 0
        self.peak = 0
        self.params = params

    def add(self, t: torch.Tensor) -> int | None:
        try:
            s = t.untyped_storage()
            ptr, n = s.data_ptr(), s.nbytes()
        except (RuntimeError, NotImplementedError):
            return None
        if ptr in self.params or n == 0:
            return None
        c = self.count.get(ptr, 0)
        if c == 0:
            self.size[ptr] = n
            self.bytes += n
            self.peak = max(self.peak, self.bytes)
        self.count[ptr] = c + 1
        return ptr

    def drop(self, ptr: int | None) -> None:
        if ptr is None or ptr not in self.count:
            return
        self.count[ptr] -= 1
        if self.count[ptr] == 0:
            del self.count[ptr]
            self.bytes -= self.size.pop(ptr)


class _Held:
    """What the pack hook stores: the tensor, and a ticket released with the graph."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class SavedTensorTracker(RuntimeHooks):
    """Counts saved tensors while entered (a context manager).

    Args:
        params: tensors never counted (the parameters).
        runtime: a :class:`~merak_exec.runtime.PipelineRuntime` whose stages' layers,
            checkpoint inputs and F* inputs are tracked too (registered as its hooks
            while entered); None tracks only the calling thread's saved tensors.
    """

    def __init__(self, params: Iterable[torch.Tensor], runtime=None) -> None:
        self._live = _Live({p.untyped_storage().data_ptr() for p in params})
        self._runtime = runtime
        self._ctx = None
        self._handle = None

    @property
    def live_bytes(self) -> int:
        """Bytes tracked and still alive now."""
        return self._live.bytes

    @property
    def peak_bytes(self) -> int:
        """The largest :attr:`live_bytes` so far."""
        return self._live.peak

    def track(self, t) -> None:
        """Count tensor ``t`` (or each tensor of a tuple or list) until garbage
        collected."""
        if isinstance(t, (tuple, list)):
            for x in t:
                self.track(x)
            return
        if not hasattr(t, "untyped_storage"):
            return
        ptr = self._live.add(t)
        if ptr is not None:
            weakref.finalize(t, self._live.drop, ptr)

    def _pack(self, t: torch.Tensor) -> _Held:
        # Hold a detached alias: a saved *output* packed with its grad_fn would form a
        # cycle through the C++ graph that keeps retained graphs (zero-bubble I/W uses
        # retain_graph) and their tensors alive forever; autograd restores grad_fn on
        # unpack, as torch.autograd.graph.save_on_cpu relies on.
        h = _Held(t.detach())
        ptr = self._live.add(t)
        if ptr is not None:
            weakref.finalize(h, self._live.drop, ptr)
        return h

    @staticmethod
    def _unpack(h: _Held) -> torch.Tensor:
        return h.t

    # -- RuntimeHooks ------------------------------------------------------------------
    def saved_tensors_scope(self):
        """Saved-tensor hooks for the thread that runs a stage's layers."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def on_checkpoint_inputs(self, tensors: tuple) -> None:
        """A checkpointed layer keeps its inputs."""
        self.track(tensors)

    def on_nograd_input(self, action, tensors: tuple) -> None:
        """F* keeps its stage input."""
        self.track(tensors)

    # -- context -------------------------------------------------------------------------
    def __enter__(self) -> SavedTensorTracker:
        self._ctx = self.saved_tensors_scope()
        self._ctx.__enter__()
        if self._runtime is not None:
            self._handle = self._runtime.add_hooks(self)
        return self

    def __exit__(self, *exc) -> bool:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._ctx.__exit__(*exc)
        return False


def saved_tensor_bytes(fn: Callable[[], object], params: Iterable[torch.Tensor]
                       ) -> tuple[object, int]:
    """Run ``fn()`` and return (its result, bytes of the distinct storages autograd saved
    for it and still holds), skipping the storages of ``params``. This is how every
    activation figure in the project is measured."""
    with SavedTensorTracker(params) as tr:
        out = fn()
        kept = tr.live_bytes
    return out, kept
