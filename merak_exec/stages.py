"""A model as a chain of layers, and the pipeline stages cut from it.

A :class:`LayerChain` is the runtime's view of a model: ``layers[0]`` takes the
model input (token ids), every later layer takes the residual stream, the last layer
produces logits and ``loss_fn(logits, labels)`` the loss. Only the residual stream
crosses a boundary between two layers, so any contiguous run of layers is a valid
stage. Parameters shared between layers far apart (tied input/output embeddings)
are listed in ``tied`` so the runtime can sum their gradients across the stages
holding copies (Merak's system design, item 2).

:func:`uniform_split` assigns layers to model stages (embedding with the first,
head with the last, blocks spread evenly, remainders to the earliest stages); an
explicit list of split points overrides it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

from merak_exec.hooks import HookHandle, RuntimeHooks, register
from merak_exec.mesh import ExecError

__all__ = ["LayerChain", "StageModule", "uniform_split", "split_from_points", "build_stage",
           "AttentionRecompute", "trainable_parameters"]


@dataclass
class LayerChain:
    """A model as ``layers`` applied in sequence plus a loss.

    Attributes:
        layers: first takes the model input, last returns logits.
        loss_fn: ``loss_fn(logits, labels) -> scalar``.
        tied: pairs ``((i, name), (j, name))``: parameter ``name`` of layer i is the
            same tensor as parameter ``name`` of layer j (i < j).
        hidden_size: width of the residual stream crossing a cut.
        heavy: indices of the layers that count for balancing (the blocks).
        boundary_dtype: dtype of the residual stream.
        boundaries: for captured models, the (shape, dtype) of each tensor leaving layer
            i (shape entries "batch" stand for the micro-batch size); None means a
            single residual-stream tensor ``(mbs, seq, hidden_size)``.
        materialize: gives a stage of a meta-device model real, initialised storage
            (replaces the default ``to_empty`` + ``init_fn``).
        init_fn: initialises one module in place (applied to every submodule of the
            local layers when the model was built on the meta device).
    """

    layers: list[nn.Module]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    tied: list[tuple[tuple[int, str], tuple[int, str]]] = field(default_factory=list)
    hidden_size: int = 0
    heavy: list[int] = field(default_factory=list)
    boundary_dtype: torch.dtype = torch.float32
    init_fn: Callable[[nn.Module], None] | None = None
    boundaries: list[list[tuple[tuple, torch.dtype]]] | None = None
    materialize: Callable[[nn.Module, torch.device, torch.dtype], None] | None = None


def uniform_split(chain: LayerChain, num_stages: int) -> list[range]:
    """Contiguous layer ranges, one per model stage, with equal block counts: the
    simulator's :func:`merak_sim.partition.uniform` (remainder to the middle stages)."""
    return partition_split(chain, num_stages, "uniform")


def partition_split(chain: LayerChain, num_stages: int, method: str = "uniform",
                    layer_times_s: tuple[float, float, float] | None = None) -> list[range]:
    """Stage ranges from the cost-model partitioner (:mod:`merak_sim.partition`).

    ``method``: "uniform"; "parameters" (balance the chain's measured parameter
    counts, the layers before the first block counted on stage 0 and those after the
    last on the last stage); "time" (balance seconds, ``layer_times_s`` = (embedding,
    block, head) forward+backward seconds, e.g. from :mod:`merak_exec.profiling.layer_trace`).
    The first stage also holds every light layer before the first block, the last
    every light layer after the last block.
    """
    from merak_sim import partition as P

    n = len(chain.layers)
    heavy = chain.heavy or list(range(n))
    if num_stages > len(heavy):
        raise ExecError(
            f"cannot cut {len(heavy)} blocks into {num_stages} pipeline stages; use fewer "
            "stages (pp * virtual stages) or a deeper model"
        )

    def numel(idx) -> float:
        seen, total = set(), 0
        for i in idx:
            for p in chain.layers[i].parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
        return float(total)

    if method == "uniform":
        part = P.uniform(len(heavy), num_stages)
    elif method == "parameters":
        part = P.balanced([numel([i]) for i in heavy], num_stages,
                          numel(range(0, heavy[0])), numel(range(heavy[-1] + 1, n)),
                          "parameters")
    elif method == "time":
        if layer_times_s is None:
            raise ExecError("partition 'time' needs layer_times_s=(embedding, block, head) "
                            "seconds; profile the model first (merak-exec profile)")
        emb, blk, head = layer_times_s
        part = P.time_balanced([blk] * len(heavy), num_stages, emb, head)
    else:
        raise ExecError(f"unknown partition method {method!r}; choose uniform, parameters "
                        "or time")
    out = []
    for s, (a, b) in enumerate(part.ranges):
        start = 0 if s == 0 else heavy[a]
        stop = n if s == num_stages - 1 else heavy[b]
        out.append(range(start, stop))
    return out


def split_from_points(chain: LayerChain, points: list[int], num_stages: int) -> list[range]:
    """Stages from explicit split points: layer indices where a new stage begins."""
    pts = sorted(points)
    if num_stages == 1 and pts:
        raise ExecError(f"split points {points} cut a model that runs as one stage (pp 1, "
                        "one virtual stage); drop them or raise pp")
    if len(pts) != num_stages - 1 or len(set(pts)) != len(pts) or (
        pts and (pts[0] <= 0 or pts[-1] >= len(chain.layers))
    ):
        raise ExecError(
            f"split points {points} must be {num_stages - 1} distinct layer indices in "
            f"1..{len(chain.layers) - 1}"
        )
    b = [0, *pts, len(chain.layers)]
    return [range(b[s], b[s + 1]) for s in range(num_stages)]


class StageModule(nn.Module):
    """A contiguous run of layers executed as one pipeline (virtual) stage.

    ``recompute_layers`` of the layers (counted from the first heavy one) run under
    activation checkpointing in a normal forward (Merak T2's per-stage fraction);
    a re-forward R runs them all plainly because it exists to rebuild activations.
    With ``selective_recompute`` every other heavy layer run with a graph keeps all
    its activations but the attention core's (Korthikanti et al. 2022, "selective
    activation recomputation"): each scaled-dot-product-attention call runs under
    activation checkpointing, so the backward recomputes it from the kept q, k, v.

    Attributes:
        heavy: per layer, whether it counts for balancing and checkpointing (a block).
        recompute_layers: how many heavy layers a normal forward checkpoints.
        selective_recompute: recompute the attention core of the other heavy layers.
        hooks: registered :class:`~merak_exec.hooks.RuntimeHooks` (see
            :meth:`add_hooks`).
    """

    def __init__(self, layers: list[nn.Module], index: int, num_stages: int,
                 loss_fn, heavy: list[bool]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.index = index
        self.is_first = index == 0
        self.is_last = index == num_stages - 1
        self.loss_fn = loss_fn
        self.heavy = list(heavy)
        self.recompute_layers = 0
        self.selective_recompute = False
        self.subpipe = None  # a sub_pipelined.SubPipelined when Merak T3 is on
        self.hooks: list[RuntimeHooks] = []

    @property
    def num_heavy(self) -> int:
        """Number of heavy layers (blocks) in this stage."""
        return sum(self.heavy)

    def add_hooks(self, hooks: RuntimeHooks) -> HookHandle:
        """Call ``hooks.saved_tensors_scope`` around the layers and
        ``hooks.on_checkpoint_inputs`` before each checkpointed layer."""
        return register(self.hooks, hooks)

    def set_recompute_fraction(self, c: float) -> None:
        """Checkpoint round(c * heavy layers) of this stage's heavy layers."""
        self.recompute_layers = int(round(c * self.num_heavy))

    def forward(self, *xs: torch.Tensor, use_checkpoint: bool = True) -> tuple:
        """Apply the layers to the boundary tensors ``xs``; returns a tuple. The first
        ``recompute_layers`` heavy layers run checkpointed."""
        if self.subpipe is not None:
            if len(xs) != 1:
                raise ExecError("sub-pipelined TP needs stages whose boundary is a single "
                                "tensor (the residual stream)")
            return (self.subpipe.run(lambda t: self._run_layers((t,), use_checkpoint)[0],
                                     xs[0]),)
        return self._run_layers(xs, use_checkpoint)

    def _run_layers(self, xs: tuple, use_checkpoint: bool) -> tuple:
        if not self.hooks:
            return self._apply_layers(xs, use_checkpoint)
        with contextlib.ExitStack() as scopes:
            for h in self.hooks:
                scopes.enter_context(h.saved_tensors_scope())
            return self._apply_layers(xs, use_checkpoint)

    def _apply_layers(self, xs: tuple, use_checkpoint: bool) -> tuple:
        left = self.recompute_layers if (use_checkpoint and torch.is_grad_enabled()) else 0
        for layer, heavy in zip(self.layers, self.heavy, strict=True):
            if heavy and left > 0:
                left -= 1
                for h in self.hooks:
                    h.on_checkpoint_inputs(xs)
                y = checkpoint(layer, *xs, use_reentrant=False)
            elif heavy and self.selective_recompute and torch.is_grad_enabled():
                with AttentionRecompute() as core:
                    y = layer(*xs)
                if not core.calls:
                    raise ExecError("selective recompute recomputes the attention core "
                                    "(scaled_dot_product_attention), but a block of stage "
                                    f"{self.index} calls none; use recompute full")
            else:
                y = layer(*xs)
            xs = y if isinstance(y, tuple) else (y,)
        return xs


class AttentionRecompute(TorchFunctionMode):
    """Within this mode every ``scaled_dot_product_attention`` call that builds a graph
    runs under non-reentrant activation checkpointing: its output is not kept and
    the backward recomputes it (RNG restored, so attention dropout matches).

    Attributes:
        calls: attention cores met.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and torch.is_grad_enabled():
            self.calls += 1
            return checkpoint(func, *args, use_reentrant=False, **kwargs)
        return func(*args, **kwargs)


def build_stage(chain: LayerChain, ranges: list[range], model_stage: int,
                rank_of_stage: Callable[[int], int]) -> StageModule:
    """The :class:`StageModule` for ``model_stage``; tied parameters whose partner lives
    on another pipeline rank (``rank_of_stage(g)``) become private copies with equal
    values (the runtime sums their gradients).
    """
    r = ranges[model_stage]
    layers = [chain.layers[i] for i in r]
    heavy_set = set(chain.heavy) if chain.heavy else set(range(len(chain.layers)))
    my_rank = rank_of_stage(model_stage)
    for (i, _ni), (j, nj) in chain.tied:
        si = next(s for s, rr in enumerate(ranges) if i in rr)
        sj = next(s for s, rr in enumerate(ranges) if j in rr)
        if rank_of_stage(si) == rank_of_stage(sj):
            continue
        if sj == model_stage and my_rank != rank_of_stage(si):
            # Untie: the later holder gets its own Parameter with equal values.
            mod_path, _, pname = nj.rpartition(".")
            owner = chain.layers[j].get_submodule(mod_path) if mod_path else chain.layers[j]
            setattr(owner, pname, nn.Parameter(getattr(owner, pname).detach().clone()))
    return StageModule(layers, model_stage, len(ranges), chain.loss_fn,
                       [i in heavy_set for i in r])


def trainable_parameters(chunks) -> list:
    """The trainable parameters of a rank's ``chunks``, each once: under the V
    placement rank 0 holds the tied embedding (chunk 0) and LM head (chunk 1), one
    tensor that two stage modules share."""
    return list({id(p): p for c in chunks for p in c.parameters() if p.requires_grad}.values())
