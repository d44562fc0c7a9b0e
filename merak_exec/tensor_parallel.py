"""Tensor parallelism (Megatron style) applied by module name.

A column-parallel linear keeps rows ``[r*out/tp, (r+1)*out/tp)`` of the weight (and
bias): its input is replicated, so its backward all-reduces the input gradient over
the tp group. A row-parallel linear keeps the matching input columns: its output is
a partial sum, all-reduced in the forward; its bias is added once, after the sum.
(Shoeybi et al., "Megatron-LM", 2019, section 3.)

The vocabulary can be split too (Megatron): a vocab-parallel embedding sums the
partial lookups of the ranks, and the LM head stays split by vocabulary with a
vocab-parallel cross entropy (all-reduced max, sum of exponentials and target logit),
so the full logits are never gathered.

A per-family *mapping* names which modules become column- or row-parallel and which
attributes hold per-rank head counts to divide by tp (Merak's "feature dict",
Lai et al., TPDS 2023). Users pass their own mapping for other
models.

Sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", 2022): with ``sequence_parallel`` set on the linears, the
residual stream between tensor-parallel regions is split along the sequence over
tp, so norms, dropout and residual adds work on ``seq/tp`` positions. A
column-parallel linear then all-gathers its input along the sequence (its backward
reduce-scatters the input gradient) and a row-parallel linear reduce-scatters its
partial output instead of all-reducing it (its backward all-gathers): the
all-gather + reduce-scatter pair the simulator prices in place of an all-reduce.
The gather sits at the input of the module holding the column-parallel linears (the
attention, the MLP), so q, k and v share one and the module sees the whole sequence
(:mod:`merak_exec.sequence_parallel` places it).

Sub-pipelined TP (Merak T3) runs a stage's parts with their own tp groups
(:mod:`merak_exec.sub_pipelined`); the collectives here take the running part's
group (:func:`~merak_exec.sub_pipelined.current_tp_group`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from merak_exec.mesh import ExecError, timed_collective
from merak_exec.sub_pipelined import current_tp_group, on_side_stream

__all__ = ["TPMapping", "FAMILY_MAPPINGS", "ShardView", "ColumnParallelLinear",
           "RowParallelLinear", "VocabParallelEmbedding", "vocab_parallel_lm_loss",
           "apply_tensor_parallel", "scatter_to_sequence", "gather_from_sequence"]

def _tp_all_reduce(x: torch.Tensor, group, what: str, on_stream: bool) -> None:
    """Sum ``x`` over ``group`` in place. For a part on a CUDA side stream
    (``on_stream``) the asynchronous work is waited by that stream (the host goes on
    issuing the next part; the group's own timeout bounds it); otherwise a bounded
    host wait."""
    if on_stream and x.is_cuda:
        dist.all_reduce(x, group=group, async_op=True).wait()
    else:
        timed_collective(dist.all_reduce, x, group=group, what=what)


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient over tp in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.on_stream = group, on_side_stream()  # backward runs after the part
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        _tp_all_reduce(g, ctx.group,
                       "the tensor-parallel all-reduce of an input gradient (backward)",
                       ctx.on_stream)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward over tp; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        _tp_all_reduce(x, group, "the tensor-parallel all-reduce of a partial sum (forward)",
                       on_side_stream())
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def _seq_split(x: torch.Tensor, group) -> torch.Tensor:
    """This rank's part of ``x`` along the sequence (dim 1)."""
    t, r = dist.get_world_size(group), dist.get_rank(group)
    if x.shape[1] % t:
        raise ExecError(f"sequence parallelism splits the sequence over tp={t}: length "
                        f"{x.shape[1]} is not divisible")
    return x.chunk(t, dim=1)[r].contiguous()


def _seq_gather(x: torch.Tensor, group) -> torch.Tensor:
    """All-gather along the sequence (dim 1) over ``group``."""
    t = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(t)]
    timed_collective(dist.all_gather, parts, x.contiguous(), group=group,
                     what="the sequence-parallel all-gather over tp")
    return torch.cat(parts, dim=1)


def _seq_reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    """Sum over ``group`` and keep this rank's part along the sequence (dim 1)."""
    t = dist.get_world_size(group)
    if x.shape[1] % t:
        raise ExecError(f"sequence parallelism splits the sequence over tp={t}: length "
                        f"{x.shape[1]} is not divisible")
    parts = [c.contiguous() for c in x.chunk(t, dim=1)]
    out = torch.empty_like(parts[0])
    timed_collective(dist.reduce_scatter, out, parts, group=group,
                     what="the sequence-parallel reduce-scatter over tp")
    return out


def _seq_function(name: str, fwd, bwd, doc: str) -> type:
    """An autograd Function applying ``fwd(x, group)`` forward and ``bwd(g, group)`` to
    the gradient backward (the sequence-parallel collectives come in such pairs)."""

    def forward(ctx, x, group):
        ctx.group = group
        return fwd(x, group)

    def backward(ctx, g):
        return bwd(g, ctx.group), None

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward), "__doc__": doc})


_GatherFromSeq = _seq_function(
    "_GatherFromSeq", _seq_gather, _seq_reduce_scatter,
    "All-gather along the sequence forward; reduce-scatter of the gradient backward.")
_ReduceScatterToSeq = _seq_function(
    "_ReduceScatterToSeq", _seq_reduce_scatter, _seq_gather,
    "Reduce-scatter along the sequence forward; all-gather of the gradient backward.")
_ScatterToSeq = _seq_function(
    "_ScatterToSeq", _seq_split, _seq_gather,
    "Keep this rank's sequence part forward (no communication); all-gather backward.")


def scatter_to_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """A replicated ``[b, s, ...]`` tensor -> this tp rank's ``[b, s/tp, ...]`` part
    (the start of the sequence-parallel region; its gradient is all-gathered)."""
    return _ScatterToSeq.apply(x, current_tp_group(group))


def gather_from_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """This tp rank's ``[b, s/tp, ...]`` part -> the whole ``[b, s, ...]`` (the start of
    a tensor-parallel region; its gradient is reduce-scattered)."""
    return _GatherFromSeq.apply(x, current_tp_group(group))


@dataclass(frozen=True)
class ShardView:
    """Where a tensor-parallel parameter sits in the parameter it was cut from.

    The local tensor is ``full`` (transposed first when ``transpose``: a HuggingFace
    Conv1D stores ``[in, out]`` while the shard is kept as ``[out, in]``) restricted
    along ``dim`` to the concatenation of ``spans`` (half-open index ranges): one span
    for a plain column, row or vocabulary split, one per projection for a fused q/k/v.
    Checkpoints store parameters by this view, so they reshard to any tp degree."""

    full_shape: tuple[int, ...]
    transpose: bool
    dim: int
    spans: tuple[tuple[int, int], ...]

    def take(self, full: torch.Tensor) -> torch.Tensor:
        """This shard of ``full`` (a tensor of ``full_shape``), as a new tensor."""
        t = full.t() if self.transpose else full
        return torch.cat([t.narrow(self.dim, a, b - a) for a, b in self.spans], self.dim)

    def put(self, full: torch.Tensor, shard: torch.Tensor) -> None:
        """Write ``shard`` into its place in ``full`` (in place)."""
        t = full.t() if self.transpose else full
        off = 0
        for a, b in self.spans:
            t.narrow(self.dim, a, b - a).copy_(shard.narrow(self.dim, off, b - a))
            off += b - a

    def to_dict(self) -> dict:
        """A JSON-ready form (:meth:`from_dict` reads it back)."""
        return {"full_shape": list(self.full_shape), "transpose": self.transpose,
                "dim": self.dim, "spans": [list(s) for s in self.spans]}

    @classmethod
    def from_dict(cls, d: dict) -> ShardView:
        """The view :meth:`to_dict` wrote."""
        return cls(tuple(d["full_shape"]), bool(d["transpose"]), int(d["dim"]),
                   tuple((int(a), int(b)) for a, b in d["spans"]))


def _weight_bias(mod: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight [out, in], bias) of an nn.Linear or a HuggingFace Conv1D ([in, out])."""
    w = mod.weight.detach()
    if type(mod).__name__ == "Conv1D":
        w = w.t()
    b = mod.bias.detach() if getattr(mod, "bias", None) is not None else None
    return w, b


def _is_linear(mod: nn.Module) -> bool:
    return isinstance(mod, nn.Linear) or type(mod).__name__ == "Conv1D"


class ColumnParallelLinear(nn.Module):
    """Linear whose output features are split across the tp group.

    ``fused`` > 1 treats the output as that many concatenated projections (GPT-2's
    fused q/k/v) and keeps this rank's slice of each, so the local output is again
    ``fused`` concatenated (narrower) projections.
    """

    def __init__(self, linear: nn.Module, group, tp: int, rank: int, fused: int = 1) -> None:
        super().__init__()
        w, b = _weight_bias(linear)
        out = w.shape[0]
        if out % (tp * fused):
            raise ExecError(f"column-parallel linear with {out} outputs is not divisible by "
                            f"tp={tp}" + (f" x {fused} fused parts" if fused > 1 else ""))
        n = out // (tp * fused)
        spans = tuple((f * out // fused + rank * n, f * out // fused + (rank + 1) * n)
                      for f in range(fused))
        conv = type(linear).__name__ == "Conv1D"
        self.group = group
        self.fused = fused
        self.sequence_parallel = False
        self.shard_views = {"weight": ShardView(tuple(linear.weight.shape), conv, 0, spans)}
        self.weight = nn.Parameter(self.shard_views["weight"].take(linear.weight.detach()))
        self.bias = None
        if b is not None:
            self.shard_views["bias"] = ShardView(tuple(b.shape), False, 0, spans)
            self.bias = nn.Parameter(self.shard_views["bias"].take(b))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Replicated input -> this rank's slice of the output features. Under sequence
        parallelism the input was gathered already, and that gather's backward sums
        the input gradient over tp."""
        if not self.sequence_parallel:
            x = _CopyToTP.apply(x, current_tp_group(self.group))
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Linear whose input features are split across the tp group; output all-reduced."""

    def __init__(self, linear: nn.Module, group, tp: int, rank: int) -> None:
        super().__init__()
        w, b = _weight_bias(linear)
        inp = w.shape[1]
        if inp % tp:
            raise ExecError(f"row-parallel linear with {inp} inputs is not divisible by tp={tp}")
        n = inp // tp
        self.group = group
        self.sequence_parallel = False
        conv = type(linear).__name__ == "Conv1D"
        self.shard_views = {"weight": ShardView(tuple(linear.weight.shape), conv, 1,
                                          ((rank * n, (rank + 1) * n),))}
        self.weight = nn.Parameter(self.shard_views["weight"].take(linear.weight.detach()))
        self.bias = nn.Parameter(b.clone()) if b is not None else None  # replicated

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the input features -> full output (summed over tp;
        under sequence parallelism, this rank's sequence part of it)."""
        group = current_tp_group(self.group)
        if self.sequence_parallel:
            y = _ReduceScatterToSeq.apply(F.linear(x, self.weight), group)
        else:
            y = _ReduceFromTP.apply(F.linear(x, self.weight), group)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Embedding whose vocabulary rows are split across the tp group: each rank looks
    up the ids in its range, zeroes the rest, and the partial results are summed."""

    def __init__(self, emb: nn.Embedding, group, tp: int, rank: int) -> None:
        super().__init__()
        V = emb.num_embeddings
        if V % tp:
            raise ExecError(f"vocabulary {V} is not divisible by tp={tp}; pad the vocabulary "
                            "to a multiple of tp")
        n = V // tp
        self.group, self.start, self.end = group, rank * n, (rank + 1) * n
        self.shard_views = {"weight": ShardView(tuple(emb.weight.shape), False, 0,
                                          ((self.start, self.end),))}
        self.weight = nn.Parameter(self.shard_views["weight"].take(emb.weight.detach()))
        pad = emb.padding_idx  # its row gets no gradient, as in nn.Embedding
        self.padding_idx = pad - self.start if pad is not None and \
            self.start <= pad < self.end else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> embeddings (summed over tp)."""
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill(outside, 0)
        y = F.embedding(local, self.weight, padding_idx=self.padding_idx)
        y = y.masked_fill(outside.unsqueeze(-1), 0.0)
        return _ReduceFromTP.apply(y, current_tp_group(self.group))


class _VocabParallelCE(torch.autograd.Function):
    """Cross entropy over logits split by vocabulary across tp (Megatron's): global max
    and sum of exponentials by all-reduce; never gathers the full logits."""

    @staticmethod
    def forward(ctx, logits, target, start, group, ignore_index):
        logits = logits.float()
        m = logits.max(dim=-1).values
        what = "the vocab-parallel cross-entropy all-reduce"
        timed_collective(dist.all_reduce, m, op=dist.ReduceOp.MAX, group=group, what=what)
        z = logits - m.unsqueeze(-1)
        n = z.shape[-1]
        inside = (target >= start) & (target < start + n)
        idx = (target - start).clamp(0, n - 1)
        tgt = z.gather(-1, idx.unsqueeze(-1)).squeeze(-1) * inside
        e = z.exp()
        se = e.sum(-1)
        timed_collective(dist.all_reduce, tgt, group=group, what=what)
        timed_collective(dist.all_reduce, se, group=group, what=what)
        valid = target != ignore_index
        loss = (se.log() - tgt) * valid
        count = valid.sum().clamp_min(1)
        ctx.save_for_backward(e / se.unsqueeze(-1), idx, inside, valid)
        ctx.count = count
        return loss.sum() / count

    @staticmethod
    def backward(ctx, g):
        p, idx, inside, valid = ctx.saved_tensors
        grad = p.clone()
        grad.scatter_add_(-1, idx.unsqueeze(-1), -inside.unsqueeze(-1).to(grad.dtype))
        grad = grad * (valid.unsqueeze(-1) * (g / ctx.count))
        return grad, None, None, None, None


def vocab_parallel_lm_loss(start: int, group, ignore_index: int = -100):
    """A loss_fn(logits_shard [b, s, V/tp], labels [b, s]) for a vocab-parallel head
    (labels aligned with the input ids, shifted here as :func:`~merak_exec.models.gpt.lm_loss`
    does)."""
    from merak_exec.models.gpt import shift_labels

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return _VocabParallelCE.apply(logits, shift_labels(labels, ignore_index), start,
                                      current_tp_group(group), ignore_index)

    return loss_fn


@dataclass(frozen=True)
class TPMapping:
    """Which modules to shard and which attributes to divide, by name suffix.

    Attributes:
        column: module-name suffixes made column-parallel (e.g. "attn.q_proj"); a
            suffix ``name:k`` marks a fused projection of k parts (GPT-2's c_attn:3).
        row: suffixes made row-parallel.
        divide: attribute names (on any module) holding per-rank counts to divide by tp,
            e.g. "n_head"; each must be divisible.
        vocab_embedding: embeddings split by vocabulary (VocabParallelEmbedding).
        vocab_head: LM-head linears split by vocabulary (their loss becomes the
            vocab-parallel cross entropy).
    """

    column: tuple[str, ...]
    row: tuple[str, ...]
    divide: tuple[str, ...] = field(default_factory=tuple)
    vocab_embedding: tuple[str, ...] = field(default_factory=tuple)
    vocab_head: tuple[str, ...] = field(default_factory=tuple)


FAMILY_MAPPINGS: dict[str, TPMapping] = {
    # the built-in GPT (merak_exec.models.gpt)
    "gpt": TPMapping(column=("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.fc_in"),
                     row=("attn.o_proj", "mlp.fc_out"), divide=("n_head",),
                     vocab_embedding=("wte",), vocab_head=("lm_head",)),
    # HuggingFace GPT2LMHeadModel (Conv1D layers, fused q/k/v; heads inferred via -1)
    "gpt2": TPMapping(column=("attn.c_attn:3", "mlp.c_fc"), row=("attn.c_proj", "mlp.c_proj"),
                      divide=("split_size", "num_heads"), vocab_embedding=("wte",),
                      vocab_head=("lm_head",)),
    # HuggingFace LlamaForCausalLM (heads are inferred from tensor shapes there)
    "llama": TPMapping(column=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                               "mlp.gate_proj", "mlp.up_proj"),
                       row=("self_attn.o_proj", "mlp.down_proj"), divide=(),
                       vocab_embedding=("embed_tokens",), vocab_head=("lm_head",)),
    # HuggingFace BERT
    "bert": TPMapping(column=("attention.self.query", "attention.self.key",
                              "attention.self.value", "intermediate.dense"),
                      row=("attention.output.dense", "output.dense"),
                      divide=("num_attention_heads", "all_head_size")),
}


def apply_tensor_parallel(module: nn.Module, mapping: TPMapping, group, tp: int,
                          rank: int) -> int:
    """Replace mapped ``nn.Linear`` submodules of ``module`` in place; divide the named
    attributes. Returns how many linears were replaced (0 means the mapping matched
    nothing, which callers treat as an error)."""
    if tp == 1:
        return 0
    count = 0
    for name, sub in list(module.named_modules()):
        for attr in mapping.divide:
            if hasattr(sub, attr) and isinstance(getattr(sub, attr), int):
                v = getattr(sub, attr)
                if v % tp:
                    raise ExecError(f"{attr}={v} of {name or 'model'} is not divisible by "
                                    f"tp={tp}; choose tp dividing it")
                setattr(sub, attr, v // tp)
        def matches(specs, name=name) -> bool:
            return any(name == x or name.endswith("." + x) for x in specs)

        if isinstance(sub, nn.Embedding) and matches(mapping.vocab_embedding):
            parent_name, _, child = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            setattr(parent, child, VocabParallelEmbedding(sub, group, tp, rank))
            count += 1
            continue
        if not _is_linear(sub):
            continue
        new = None
        if matches(mapping.vocab_head):
            new = ColumnParallelLinear(sub, group, tp, rank)
            new.vocab_start = rank * new.weight.shape[0]
        for spec in mapping.column if new is None else ():
            suffix, _, k = spec.partition(":")
            if name == suffix or name.endswith("." + suffix):
                new = ColumnParallelLinear(sub, group, tp, rank, fused=int(k or 1))
        if new is None and matches(mapping.row):
            new = RowParallelLinear(sub, group, tp, rank)
        if new is None:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, new)
        count += 1
    return count
