"""ZeRO stage 1: the optimizer state sharded over the data-parallel group.

Every dp replica keeps its full parameters and gradients; the optimizer's own state
(AdamW's two moments, ...) exists for 1/dp of the elements only (Rajbhandari et al.,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020,
stage P_os; the same split as Megatron-LM's distributed optimizer).

The local parameters are laid end to end in one flat index space of N elements,
padded to a multiple of dp; dp rank r owns the contiguous range
``[r * N/dp, (r+1) * N/dp)``. Its *pieces* are the parts of each parameter inside that
range, as views of the parameter's own storage, so the wrapped optimizer updates the
owned elements in place. An iteration:

1. :meth:`ZeroOptimizer.reduce_gradients` (the runtime's AR): the flat gradient is
   reduce-scattered over dp, each rank receiving the mean of its own range, which
   becomes its pieces' gradients;
2. :meth:`ZeroOptimizer.step` (OPT): the wrapped optimizer steps the pieces; the
   owned ranges are all-gathered so every replica holds every updated parameter.

This is what the simulator prices for ``zero=1``: a reduce-scatter of the gradients
and an all-gather of the weights over dp instead of one all-reduce, and the
optimizer state divided by dp.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from merak_exec.mesh import ExecError, timed_collective

__all__ = ["ZeroOptimizer", "optimizer_state_bytes"]


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes held by the tensors of ``opt.state`` (for a :class:`ZeroOptimizer`, this
    rank's shard of the state)."""
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))


_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class ZeroOptimizer(torch.optim.Optimizer):
    """An optimizer whose state is sharded over the data-parallel group (ZeRO-1).

    Args:
        optimizer: the optimizer the user built over the full local parameters (its
            class and parameter groups are reused; it must not have stepped yet).
        group: the dp process group (None: dp = 1, nothing is sharded).
        dp, dp_rank: degree and this rank's index in the group.
        timeout_s: bound on every collective wait.

    ``param_groups`` and ``state`` are those of the wrapped optimizer over this rank's
    pieces, so learning-rate schedulers and ``state_dict`` (this rank's shard) work
    as usual.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, group, dp: int, dp_rank: int,
                 timeout_s: float = 60.0) -> None:
        if optimizer.state:
            raise ExecError("ZeRO-1 wraps an optimizer that has not stepped yet; build it "
                            "afresh for the sharded run")
        self.group, self.dp, self.dp_rank, self.timeout_s = group, dp, dp_rank, timeout_s
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        for p in self.params:
            if not p.is_contiguous():
                raise ExecError("ZeRO-1 shards contiguous parameters only; make the "
                                "model's parameters contiguous")
        if len({p.dtype for p in self.params}) > 1:
            raise ExecError("ZeRO-1 needs every local parameter in one dtype")
        total = sum(p.numel() for p in self.params)
        self.shard_numel = -(-total // dp)
        start, stop = dp_rank * self.shard_numel, (dp_rank + 1) * self.shard_numel
        # (parameter, offset in the parameter, offset in the shard, length) per piece
        self.segments: list[tuple[nn.Parameter, int, int, int]] = []
        groups, off = [], 0
        for g in optimizer.param_groups:
            pieces = []
            for p in g["params"]:
                a, b = max(off, start), min(off + p.numel(), stop)
                if a < b:
                    piece = nn.Parameter(p.data.view(-1)[a - off:b - off])
                    self.segments.append((piece, a - off, a - start, b - a))
                    pieces.append(piece)
                off += p.numel()
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": pieces})
        try:
            self.inner = type(optimizer)([g for g in groups if g["params"]])
        except (TypeError, ValueError) as e:
            raise ExecError(f"ZeRO-1 could not rebuild {type(optimizer).__name__} over the "
                            f"shard: {e}") from None
        super().__init__([{"params": [s[0] for s in self.segments]}], {})
        self.param_groups = self.inner.param_groups
        self.state = self.inner.state
        self.defaults = self.inner.defaults
        self._reduced = False

    def reduce_gradients(self) -> None:
        """Reduce-scatter the flat gradient over dp: this rank's pieces get the dp mean
        of their elements (missing gradients count as zeros)."""
        ref = self.params[0]
        flat = torch.zeros(self.shard_numel * self.dp, dtype=ref.dtype, device=ref.device)
        off = 0
        for p in self.params:
            if p.grad is not None:
                flat[off:off + p.numel()].copy_(p.grad.reshape(-1))
            off += p.numel()
        mine = torch.empty(self.shard_numel, dtype=ref.dtype, device=ref.device)
        if self.group is None:
            mine.copy_(flat)
        else:
            timed_collective(_reduce_scatter, mine, flat, group=self.group,
                        timeout_s=self.timeout_s,
                        what="the ZeRO-1 gradient reduce-scatter over data parallel")
            mine.div_(self.dp)
        for piece, _, s_off, n in self.segments:
            piece.grad = mine[s_off:s_off + n]
        self._reduced = True

    @torch.no_grad()
    def step(self, closure=None):
        """Step the wrapped optimizer on this rank's pieces, then all-gather the owned
        ranges into every replica's parameters."""
        if closure is not None:
            raise ExecError("ZeRO-1 does not take a closure")
        if not self._reduced:
            self.reduce_gradients()
        self.inner.step()
        ref = self.params[0]
        mine = torch.zeros(self.shard_numel, dtype=ref.dtype, device=ref.device)
        for piece, _, s_off, n in self.segments:
            mine[s_off:s_off + n].copy_(piece.data)
        if self.group is None:
            full = mine
        else:
            full = torch.empty(self.shard_numel * self.dp, dtype=ref.dtype, device=ref.device)
            timed_collective(_all_gather, full, mine, group=self.group, timeout_s=self.timeout_s,
                        what="the ZeRO-1 parameter all-gather over data parallel")
        off = 0
        for p in self.params:
            p.data.view(-1).copy_(full[off:off + p.numel()])
            off += p.numel()
        self._reduced = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the full parameters' gradients and the pieces' reduced ones."""
        for p in self.params:
            p.grad = None
        for piece, *_ in self.segments:
            piece.grad = None
        self._reduced = False

    def state_dict(self) -> dict:
        """This rank's shard of the optimizer state (the wrapped optimizer's form)."""
        return self.inner.state_dict()

    def state_by_name(self, named_params) -> dict[str, torch.Tensor]:
        """This rank's state tensors keyed ``"<name>[a:b].<key>"``: ``name`` from
        ``named_params`` ((name, full parameter) pairs), ``[a:b]`` the piece's flat
        element range in that parameter. The keys differ between dp ranks, so a
        checkpoint holds every shard once; loading copies into these same tensors."""
        names = {id(p): n for n, p in named_params}
        out = {}
        for (piece, p_off, _, n), p in zip(self.segments, self._owners(), strict=True):
            for sk, sv in self.state.get(piece, {}).items():
                if isinstance(sv, torch.Tensor):
                    out[f"{names[id(p)]}[{p_off}:{p_off + n}].{sk}"] = sv
        return out

    def shard_counts(self, counts: dict[int, int]) -> dict[int, int]:
        """Replica counts of the pieces (keyed by ``id``) from those of the full
        parameters (:func:`merak_exec.optim.replica_counts`): dp ranks own disjoint
        pieces, so a piece is held by ``count / dp`` ranks (its tp copies and tied
        twin), which is what the global gradient norm divides by."""
        return {id(piece): max(1, counts.get(id(p), 1) // self.dp)
                for (piece, *_), p in zip(self.segments, self._owners(), strict=True)}

    def _owners(self) -> list[nn.Parameter]:
        """The full parameter each piece of :attr:`segments` belongs to."""
        start = self.dp_rank * self.shard_numel
        out, off = [], 0
        for p in self.params:
            if off < start + self.shard_numel and off + p.numel() > start:
                out.append(p)
            off += p.numel()
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a shard saved by :meth:`state_dict` on the same dp rank and layout."""
        self.inner.load_state_dict(state_dict)
