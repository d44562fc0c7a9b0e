"""Replicated parameters of tensor-parallel ranks: made equal before training.

Tensor-parallel ranks compute the unsharded parts of a layer (embeddings' position
tables, norms, the bias added after a row-parallel sum) redundantly, so those
parameters must hold the same values on every tp rank; a model built under different
per-rank seeds would otherwise train silently wrong. :func:`sync_tp_replicas` gives
every tp rank tp rank 0's copy (bounded by the mesh's timeout; an FSDP-sharded
parameter broadcasts its dp shard, sliced alike on every tp rank).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from merak_exec.fsdp import local_tensor
from merak_exec.mesh import Mesh, timed_collective
from merak_exec.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)

__all__ = ["sharded_parameters", "sync_tp_replicas"]


def sharded_parameters(chunks) -> set[int]:
    """ids of the parameters a tensor-parallel layer splits across tp ranks."""
    out: set[int] = set()
    for c in chunks:
        for mod in c.modules():
            if isinstance(mod, (ColumnParallelLinear, VocabParallelEmbedding)):
                out.update(id(p) for p in mod.parameters(recurse=False))
            elif isinstance(mod, RowParallelLinear):
                out.add(id(mod.weight))
    return out


def sync_tp_replicas(mesh: Mesh, chunks) -> None:
    """Broadcast every replicated parameter of ``chunks`` from tp rank 0 over the tp
    group (no-op without tensor parallelism)."""
    if mesh.tp_group is None:
        return
    sharded = sharded_parameters(chunks)
    src = mesh.global_rank(mesh.pp_rank, tp_rank=0)
    seen: set[int] = set()
    with torch.no_grad():
        for c in chunks:
            for p in c.parameters():
                if id(p) in sharded or id(p) in seen:
                    continue
                seen.add(id(p))
                timed_collective(dist.broadcast, local_tensor(p.data), group=mesh.tp_group, src=src,
                                 what="the start-up broadcast of replicated parameters",
                                 timeout_s=mesh.timeout_s)
