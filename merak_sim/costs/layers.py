"""Per-layer compute costs of the analytic cost model
(:class:`~merak_sim.costs.analytic.AnalyticCostModel`).

Compute (one layer, one micro-batch of b sequences, on one GPU of a TP group of t)
---------------------------------------------------------------------------------
- GEMMs, each charged with :meth:`Efficiency.gemm_time` (shape-dependent fraction of
  peak, one kernel overhead): QKV (bs x h -> (h + 2kv)/t), output projection
  (bs x h/t -> h), fc1 (bs x h -> f/t, doubled for SwiGLU's gate), fc2 (bs x f/t -> h);
  attention cores as batched GEMMs (b*a/t of s x s x d, scaled by ``attn_factor``).
- Memory-bound kernels (norms, softmax, dropout, GELU/SwiGLU, bias + residual) from
  the bytes they read and write, at ``mem_bw_eff`` of HBM bandwidth, one overhead each.
  With sequence parallelism the norm/dropout/residual bytes are divided by t.
- Backward: every GEMM becomes two of the same size (input gradient ``I``, weight
  gradient ``W``); the attention-core GEMMs and all memory-bound backward kernels
  (about twice the forward bytes) are input-gradient work. ``backward_s = I + W``.
- Host issue floor: each pass (forward, backward) takes at least its kernel count
  times ``host_op_s`` (:meth:`Efficiency.host_bound`; the backward's two halves are
  stretched alike).
- Recompute = forward of the layers (communication included: the re-forward repeats
  its TP all-reduces). Selective recompute (Korthikanti et al. 2022) adds the
  attention core's forward to every backward instead.
- Sub-pipelined TP (Merak T3, ``tp_overlap="sub-pipelined"``, k parts): every GEMM
  and kernel runs k times on b/k of the batch (smaller, less efficient GEMMs, k times
  the kernel overheads); of the 2k all-reduces per layer pass only the last one (1/k of
  the bytes) stays exposed, plus whatever the others cannot hide behind the compute
  of the pass (Lai et al. TPDS 2023, T3).
- Flash attention (``attention="flash"``, :mod:`merak_sim.costs.kernels`): the two
  attention GEMMs become one fused kernel at its own efficiency, timed on the FLOPs it
  executes (half the tiles under causal masking); the softmax / dropout kernels and
  their s x s bytes vanish; its backward recomputes the scores inside the kernel (5/2
  of the forward's work). Model FLOPs are unchanged.
- Eager elementwise ops (``fused_elementwise=False``, :mod:`merak_sim.costs.fusion`):
  the norms, rotary embedding and SwiGLU run one PyTorch kernel per op, adding the
  bytes and kernels of their upcasts and intermediate tensors to the fused charge.
- Grouped-query attention: K and V are ``kv`` wide (``ModelSpec.kv_dim_per_rank``:
  kv/t, or one replicated head when t exceeds the kv heads) in the QKV GEMM, the rotary
  bytes, the ring exchange of context parallelism and the memory model.
- Context parallelism (``cp``): each GPU holds s/cp tokens of every sequence; every
  GEMM, kernel and TP collective shrinks accordingly; attention pairs the local
  queries with all s keys, visited in cp ring steps (load-balanced under causal
  masking, as Megatron's context parallelism splits each sequence into 2 cp chunks);
  the K/V block one step sends is ``cp_kv_bytes`` (the exposure is the cost model's).
- FP8 and the other low-precision formats (``fp8_peak`` > 0: the format's GEMM peak,
  :mod:`merak_sim.precision`): GEMMs at that peak times ``fp8_factor``; every GEMM input
  is cast (``cast_bytes`` moved per element, default 3: a per-tensor FP8 cast; one
  kernel) in forward, every output gradient in backward; attention and the LM head
  stay 16-bit.
- Framework kernels (``framework``, :mod:`merak_sim.costs.framework`): the default
  charges a fused softmax and a 12 / 24-byte cross entropy; Megatron's rules add the
  eager fp32 softmax where its fused kernel is unavailable and price its fp32
  vocab-parallel cross entropy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from merak_sim.costs.efficiency import Efficiency
from merak_sim.costs.framework import (
    DEFAULT_FRAMEWORK,
    FrameworkKernels,
    cross_entropy,
    softmax_extra,
)
from merak_sim.costs.fusion import EagerExtra, eager_extra
from merak_sim.costs.kernels import KernelEfficiency
from merak_sim.model import ModelSpec

__all__ = ["LayerCost", "LayerOptions", "layer_cost", "edge_costs", "ATTENTION_KERNELS"]

ATTENTION_KERNELS = ("unfused", "flash")


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Compute seconds of one layer pass (or the embedding / head) for one micro-batch.

    Attributes:
        forward_s: forward compute (no TP communication).
        backward_input_s / backward_weight_s: backward halves (no communication).
        attn_core_s: forward of the attention core (what selective recompute redoes).
        tp_fwd_bytes / tp_bwd_bytes: bytes per TP all-reduce and how many, as
            (bytes, count) pairs; exposure is applied by the cost model.
        flops: model FLOPs of forward + backward on this GPU.
        kernels_fwd: kernel launches of the forward (for reporting).
        recompute_s: re-forward compute when measured separately (None: forward_s).
        activation_bytes: bytes kept per micro-batch when measured (None: from the
            memory model).
        source: "analytic" or "trace" (for reports).
        attn_fwd_s / attn_bwd_s: attention-core compute of the forward / backward
            (what a context-parallel ring step overlaps its K/V exchange with).
        cp_kv_bytes: bytes of the K and V block one context-parallel ring step sends
            in forward (0 without context parallelism).
        fp8_cast_s: seconds of the FP8 scaling casts included in the times above.
    """

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    attn_core_s: float
    tp_fwd: tuple[float, int]
    tp_bwd: tuple[float, int]
    flops: float
    kernels_fwd: int
    recompute_s: float | None = None
    activation_bytes: float | None = None
    source: str = "analytic"
    attn_fwd_s: float = 0.0
    attn_bwd_s: float = 0.0
    cp_kv_bytes: float = 0.0
    fp8_cast_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LayerOptions:
    """Kernel choices of :func:`layer_cost` beyond the shape (module docstring).

    Attributes:
        attention: "unfused" (scores through HBM) or "flash" (fused kernel).
        cp: context-parallel degree.
        fp8_peak: dense peak FLOP/s of the low-precision GEMMs (FP8, MXFP8, NVFP4,
            times the format's efficiency factor; 0: 16-bit GEMMs).
        kernels: the flash / FP8 efficiency parameters.
        cast_bytes: HBM bytes per element of one quantizing cast (0: a per-tensor FP8
            cast, e + 1; :meth:`merak_sim.precision.Precision.cast_bytes`).
        fused_elementwise: False when the elementwise ops run one eager kernel each
            (:mod:`merak_sim.costs.fusion`).
        framework: the training framework's softmax and cross-entropy kernels
            (:mod:`merak_sim.costs.framework`; default: the fused charges).
    """

    attention: str = "unfused"
    cp: int = 1
    fp8_peak: float = 0.0
    cast_bytes: float = 0.0
    kernels: KernelEfficiency = KernelEfficiency()
    fused_elementwise: bool = True
    framework: FrameworkKernels = DEFAULT_FRAMEWORK


def _qkv_width(model: ModelSpec, tp: int) -> float:
    """Output width of the QKV GEMM on one GPU (h/t queries plus K and V)."""
    if model.kv_heads % tp == 0:
        return (model.q_dim + 2 * model.kv_dim) / tp
    return model.q_dim / tp + 2 * model.kv_dim_per_rank(tp)


def _attention(model: ModelSpec, peak: float, eff: Efficiency, o: LayerOptions, b: float,
               s_loc: float, bh: float) -> tuple[float, float]:
    """(forward, backward) seconds of the attention GEMMs of one part: the unfused
    batched GEMMs, or the flash kernel (one per ring step)."""
    s, d = model.seq_len, model.head_dim
    if o.attention == "unfused":
        f = 2 * eff.gemm_time(s_loc, s, d, peak, batch=bh, attention=True)
        return f, 2 * f
    work = 4.0 * bh * s_loc * s * d * (0.5 if model.causal else 1.0)
    k = o.kernels
    blk = s / o.cp
    over = o.cp * eff.kernel_overhead_s
    fwd = work / (peak * k.flash(blk, d)) + over
    bwd = 2.5 * work / (peak * k.flash(blk, d, backward=True)) + over
    return fwd, bwd


def _casts(gemms: list, opts: LayerOptions, e: int, eff: Efficiency,
           mem_bw: float) -> tuple[float, float]:
    """(forward, backward) seconds quantizing every GEMM input of a part: its ``m x k``
    inputs in forward, its ``m x n`` output gradients in backward, ``cast_bytes`` per
    element (a per-tensor FP8 cast: e + 1)."""
    nk = opts.kernels.fp8_cast_kernels * len(gemms)
    cb = opts.cast_bytes or e + 1
    return (eff.mem_time(sum(mm * k for mm, _n, k in gemms) * cb, mem_bw, nk),
            eff.mem_time(sum(mm * n for mm, n, _k in gemms) * cb, mem_bw, nk))


@lru_cache(maxsize=4096)
def layer_cost(model: ModelSpec, peak: float, mem_bw: float, eff: Efficiency, e: int,
                mbs: int, tp: int, sp: bool, parts: int,
                opts: LayerOptions = LayerOptions()) -> LayerCost:
    """Compute costs of one transformer layer (module docstring) for ``mbs`` sequences
    in ``parts`` sub-batches on one GPU of a TP group of ``tp`` (``e`` bytes per
    element, ``peak`` 16-bit FLOP/s, ``mem_bw`` bytes/s of HBM; ``opts``: attention
    kernel, context parallelism, FP8)."""
    if opts.attention not in ATTENTION_KERNELS:
        raise ValueError(f"unknown attention kernel {opts.attention!r}; choose one of: "
                         f"{', '.join(ATTENTION_KERNELS)}")
    h, f, a, s = model.hidden, model.ffn_hidden, model.heads, model.seq_len
    cp = opts.cp
    s_loc = s / cp if cp > 1 else s
    b = mbs / parts
    m = b * s_loc
    fc1_n = f * (2 if model.gated_mlp else 1) / tp
    qkv_n = _qkv_width(model, tp)
    gemms = [(m, qkv_n, h), (m, h, model.q_dim / tp), (m, fc1_n, h), (m, h, f / tp)]
    fp8 = opts.fp8_peak > 0
    gpeak = opts.fp8_peak * opts.kernels.fp8_factor if fp8 else peak
    g_fwd = sum(eff.gemm_time(mm, n, k, gpeak) for mm, n, k in gemms)
    bh = b * a / tp
    flash = opts.attention == "flash"
    attn, attn_b = _attention(model, peak, eff, opts, b, s_loc, bh)
    rep = tp if sp else 1
    p = model.dropout > 0
    # Bytes moved by the forward's memory-bound kernels (read + write), per part.
    norm = 2 * (2 * m * h * e / rep)                       # two norms
    resid = 2 * (m * h * e * 3 + (m * h if p else 0)) / rep  # bias+dropout+residual x2
    sc = bh * s_loc * s
    softmax = 0.0 if flash else sc * e * 2 + (sc * (2 * e + 1) if p else 0)
    act_elems = m * f / tp
    act = act_elems * e * (3 if model.gated_mlp else 2)
    rope_n = ((model.q_dim + model.kv_dim) / tp if model.kv_heads % tp == 0
              else model.q_dim / tp + model.kv_dim_per_rank(tp))
    rope = 2 * m * rope_n * e if model.family == "llama" else 0.0
    mem_bytes = norm + resid + softmax + act + rope
    n_soft = 0 if flash else (2 if p else 1)
    n_mem = 2 + 2 + n_soft + 1 + (1 if rope else 0)
    mem_fwd = eff.mem_time(mem_bytes, mem_bw, n_mem)
    ex = EagerExtra() if opts.fused_elementwise else eager_extra(model, m, tp, sp, e, rope_n)
    mem_fwd += eff.mem_time(ex.fwd_bytes, mem_bw, ex.fwd_kernels) if ex.fwd_kernels else 0.0
    mem_bwd = eff.mem_time(2 * mem_bytes, mem_bw, n_mem + 2) + (
        eff.mem_time(ex.bwd_bytes, mem_bw, ex.bwd_kernels) if ex.bwd_kernels else 0.0)
    softmax_t = eff.mem_time(softmax, mem_bw, n_soft) if softmax else 0.0
    # The framework's softmax where its fused kernel is unavailable (framework module).
    sx = EagerExtra() if flash else softmax_extra(opts.framework, e, s_loc, s, bh)
    if sx.fwd_kernels:
        mem_fwd += eff.mem_time(sx.fwd_bytes, mem_bw, sx.fwd_kernels)
        mem_bwd += eff.mem_time(sx.bwd_bytes, mem_bw, sx.bwd_kernels)
        softmax_t = eff.mem_time(softmax + sx.fwd_bytes, mem_bw, n_soft + sx.fwd_kernels)
    cast_f, cast_b = _casts(gemms, opts, e, eff, mem_bw) if fp8 else (0.0, 0.0)
    fwd = parts * (g_fwd + attn + mem_fwd + cast_f)
    bwd_in = parts * (g_fwd + attn_b + mem_bwd + cast_b)
    bwd_w = parts * g_fwd
    # Host issue floor (Efficiency.host_bound): kernels of each pass as charged above.
    n_attn = (1 if flash else 2) * (cp if flash else 1)
    n_cast = opts.kernels.fp8_cast_kernels * len(gemms) if fp8 else 0
    n_fwd = parts * (len(gemms) + n_attn + n_mem + n_cast + ex.fwd_kernels + sx.fwd_kernels)
    n_bwd = parts * (2 * len(gemms) + 2 * n_attn + n_mem + 2 + n_cast + ex.bwd_kernels
                     + sx.bwd_kernels)
    fwd = eff.host_bound(fwd, n_fwd)
    bwd_dev = bwd_in + bwd_w
    if bwd_dev > 0 and eff.host_op_s > 0:
        scale = eff.host_bound(bwd_dev, n_bwd) / bwd_dev
        bwd_in, bwd_w = bwd_in * scale, bwd_w * scale
    core = parts * (attn + softmax_t)
    flops = 3.0 * model.layer_forward_flops(mbs) / tp / cp
    ar_bytes = mbs * s_loc * h * e / parts
    n_ar = 2 * parts
    kv_bytes = 2 * mbs * s_loc * model.kv_dim_per_rank(tp) * e if cp > 1 else 0.0
    return LayerCost(fwd, bwd_in, bwd_w, core, (ar_bytes, n_ar), (ar_bytes, n_ar), flops,
                     parts * (4 + 2 + n_mem + ex.fwd_kernels + sx.fwd_kernels),
                     attn_fwd_s=parts * attn,
                     attn_bwd_s=parts * attn_b, cp_kv_bytes=kv_bytes,
                     fp8_cast_s=parts * (cast_f + cast_b))


@lru_cache(maxsize=4096)
def edge_costs(model: ModelSpec, peak: float, mem_bw: float, eff: Efficiency, e: int,
                mbs: int, tp: int, sp: bool, cp: int = 1,
                framework: FrameworkKernels = DEFAULT_FRAMEWORK
                ) -> tuple[LayerCost, LayerCost]:
    """(embedding, head) compute costs. The head is final norm + LM-head GEMM + fp32
    cross entropy (bytes and kernels per logit as ``framework`` runs it:
    :func:`merak_sim.costs.framework.cross_entropy`); the embedding a gather plus
    position add and dropout (on s/cp tokens per sequence under context
    parallelism)."""
    h, V, s = model.hidden, model.vocab, model.seq_len
    m = mbs * s / cp if cp > 1 else mbs * s
    rep = tp if sp else 1
    emb_bytes = m * h * e * 3 / rep + m * 8
    emb_f = eff.mem_time(emb_bytes, mem_bw, 3)
    # Backward: scatter-add into the (sharded) embedding gradient, zeroing it first.
    emb_b = eff.mem_time(2 * emb_bytes + V * h * e / tp, mem_bw, 3)
    emb = LayerCost(emb_f, 0.0, emb_b, 0.0, (m * h * e, 1), (0.0, 0), 0.0, 3)
    g = eff.gemm_time(m, V / tp, h, peak)
    ce = cross_entropy(framework, e)
    logits = m * V / tp
    # Final norm (one kernel) plus the loss over the logits.
    head_f = g + eff.mem_time(logits * ce.fwd_bytes + 2 * m * h * e / rep, mem_bw,
                              1 + ce.fwd_kernels)
    head_bi = g + eff.mem_time(logits * ce.bwd_bytes + 4 * m * h * e / rep, mem_bw,
                               1 + ce.bwd_kernels)
    head = LayerCost(head_f, head_bi, g, 0.0, (0.0, 0), (m * h * e, 1),
                     3.0 * model.logits_forward_flops(mbs) / tp / cp, 2 + ce.fwd_kernels)
    return emb, head
