"""Sequence parallelism applied to a tensor-parallel model's stages, and the gradient
reduction the parallelism options need at AR.

Under sequence parallelism (Korthikanti et al. 2022; the collectives are in
:mod:`merak_exec.tensor_parallel`) the residual stream is split along the sequence
over tp from the end of the first layer (the embedding, whose position add needs the
whole sequence) to the LM head, whose column-parallel projection gathers it again.
The pipeline boundaries therefore carry ``[mbs, seq/tp, hidden]``, the sharded
stream the simulator prices for point-to-point. Parameters replicated over tp but
applied to a sequence part (norms, row-parallel biases) see only that part's
gradient: :func:`partial_params` lists them and :class:`GradientSync` sums their
gradients over tp once per iteration, before the data-parallel reduction.
"""

from __future__ import annotations

import torch

from merak_exec.mesh import ExecError, Mesh, all_reduce_gradients
from merak_exec.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    gather_from_sequence,
    scatter_to_sequence,
)

__all__ = ["apply_sequence_parallel", "partial_params", "GradientSync"]


def _regions(layer: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose input is gathered: the parent of each column-parallel linear
    (the attention, the MLP), or the linear itself when its parent is the whole layer
    (the LM head after the final norm)."""
    out = []
    for name, m in layer.named_modules():
        if isinstance(m, ColumnParallelLinear):
            parent = name.rpartition(".")[0]
            region = layer.get_submodule(parent) if parent else m
            if region not in out:
                out.append(region)
    return out


def apply_sequence_parallel(chunks, ranges, mesh: Mesh, family: str | None) -> list:
    """Switch this rank's tensor-parallel linears to sequence parallelism, gather the
    input of every tensor-parallel region and split the first layer's output along
    the sequence. Only the built-in GPT's layout (blocks of norm -> attention / MLP
    sandwiches, positions added in the embedding) is known to be right; other
    families are refused with one line. Returns the gathered regions."""
    if family != "gpt":
        raise ExecError("sequence parallelism is executed for the built-in GPT only "
                        f"(model family {family!r}); set sequence_parallel=False")
    group = mesh.tp_group
    regions = []
    for c in chunks:
        for m in c.modules():
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
                m.sequence_parallel = True
        for li, layer in zip(ranges[c.index], c.layers, strict=True):
            if li == 0:
                layer.register_forward_hook(lambda _m, _a, out: scatter_to_sequence(out, group))
                continue
            for r in _regions(layer):
                r.register_forward_pre_hook(
                    lambda _m, args: (gather_from_sequence(args[0], group), *args[1:]))
                regions.append(r)
    return regions


def partial_params(chunks, ranges, regions: list) -> list[torch.nn.Parameter]:
    """Parameters replicated over tp that sequence parallelism applies to one sequence
    part per rank: those of every layer after the first, except the tensor-parallel
    shards and what lies inside a gathered region (it sees the whole sequence), but
    with the row-parallel biases (added after the reduce-scatter, to a part)."""
    sharded = set()
    for r in regions:
        sharded.update(id(p) for p in r.parameters())
    for c in chunks:
        for m in c.modules():
            if isinstance(m, RowParallelLinear) and m.bias is not None:
                sharded.discard(id(m.bias))
        for m in c.modules():
            if isinstance(m, (VocabParallelEmbedding, RowParallelLinear)):
                sharded.add(id(m.weight))
    out, seen = [], set()
    for c in chunks:
        for li, layer in zip(ranges[c.index], c.layers, strict=True):
            if li == 0:
                continue
            for p in layer.parameters():
                if p.requires_grad and id(p) not in sharded and id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
    return out


class GradientSync:
    """The runtime's ``grad_sync`` for the parallelism options: sums the
    sequence-parallel partial gradients over tp, then lets a ZeRO-1 optimizer
    reduce-scatter over dp (returning True: the dp reduction is done).

    Args:
        tp_group: the tp group (None when there are no partial parameters).
        partial: parameters whose gradients are summed over tp.
        zero: a :class:`~merak_exec.zero.ZeroOptimizer`, or None.
    """

    def __init__(self, tp_group, partial: list, zero=None) -> None:
        self.tp_group, self.partial, self.zero = tp_group, partial, zero

    def __call__(self, params) -> bool:
        """Reduce the gradients of ``params``; True when dp was reduced here."""
        if self.partial and self.tp_group is not None:
            all_reduce_gradients(self.partial, self.tp_group,
                                 "the sequence-parallel gradient sum over tp")
        if self.zero is not None:
            self.zero.reduce_gradients()
            return True
        return False
