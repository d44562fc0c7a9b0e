"""ZeRO stages 2 and 3 through torch FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each local chunk is sharded over the data-parallel group: every layer whose
parameters it does not share with another layer of the chunk becomes its own FSDP
unit, and the chunk is the root unit (it holds what is left, e.g. an embedding tied
to the LM head on the same rank). ``zero=3`` reshards the parameters after every
forward (all-gathered again for the backward: ZeRO-3, Rajbhandari et al. 2020,
stage P_os+g+p); ``zero=2`` keeps them gathered from the forward to the backward
(``reshard_after_forward=False``), so only optimizer state and gradients stay
sharded between iterations, as in torch's FSDP2 "ZeRO-2-like" mode.

The pipeline runtime runs many micro-batch backwards per iteration; only the chunk's
*last* backward synchronises gradients (:class:`FsdpSync` sets FSDP's
``requires_gradient_sync`` / ``is_last_backward`` / ``reshard_after_backward`` before
each backward, the same flags torch.distributed.pipelining sets), so one
reduce-scatter per parameter averages the accumulated gradient over dp. Schedules
that split the backward into input and weight parts (zero-bubble) or run no-grad
forwards are refused before any work (:func:`merak_sim.executable.unsupported`):
FSDP's backward hooks follow one whole backward per forward.
"""

from __future__ import annotations

from collections import Counter

import torch

from merak_exec.hooks import RuntimeHooks
from merak_exec.mesh import ExecError, Mesh
from merak_sim.schedule.ir import Action, Kind, iter_actions

__all__ = ["shard_chunks", "FsdpSync", "local_tensor"]


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: the local shard of an FSDP DTensor (sharing its
    storage, so in-place collectives on it update the DTensor), ``t`` itself
    otherwise."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def shard_chunks(chunks, mesh: Mesh, zero: int) -> None:
    """Apply ``fully_shard`` over ``mesh.dp_group`` to every chunk (see the module
    docstring); no-op without data parallelism."""
    if zero not in (2, 3):
        raise ExecError(f"FSDP shards for zero=2 or 3, got zero={zero}")
    if mesh.dp_group is None:
        return
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    dm = DeviceMesh.from_group(mesh.dp_group, mesh.device.type)
    reshard = zero == 3
    for c in chunks:
        owners = Counter(id(p) for layer in c.layers for p in set(layer.parameters()))
        for layer in c.layers:
            params = list(layer.parameters())
            if params and all(owners[id(p)] == 1 for p in params):
                fully_shard(layer, mesh=dm, reshard_after_forward=reshard)
        fully_shard(c, mesh=dm, reshard_after_forward=reshard)


class FsdpSync(RuntimeHooks):
    """Runtime hooks that let FSDP reduce-scatter gradients at each chunk's last
    backward of the iteration only (earlier backwards accumulate unsharded)."""

    def __init__(self, chunks, program) -> None:
        self.chunks = chunks
        self.last: dict[int, Action] = {}
        for a in iter_actions(program):
            if a.kind == Kind.BACKWARD:
                self.last[a.chunk] = a

    def on_action_start(self, action: Action) -> None:
        """Set the chunk's FSDP flags before one of its backwards."""
        if action.kind != Kind.BACKWARD:
            return
        last = self.last.get(action.chunk) == action
        c = self.chunks[action.chunk]
        c.set_requires_gradient_sync(last)
        c.set_is_last_backward(last)
        c.set_reshard_after_backward(last)

    def __call__(self, params) -> bool:
        """The runtime's ``grad_sync``: FSDP has averaged over dp already."""
        return True
