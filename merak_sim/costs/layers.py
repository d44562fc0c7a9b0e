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
- Recompute = forward of the layers (communication included: the re-forward repeats
  its TP all-reduces). Selective recompute (Korthikanti et al. 2022) adds the
  attention core's forward to every backward instead.
- Sub-pipelined TP (Merak T3, ``tp_overlap="sub-pipelined"``, k parts): every GEMM
  and kernel runs k times on b/k of the batch (smaller, less efficient GEMMs, k times
  the kernel overheads); of the 2k all-reduces per layer pass only the last one (1/k of
  the bytes) stays exposed, plus whatever the others cannot hide behind the compute
  of the pass (Lai et al. TPDS 2023, T3).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from merak_sim.costs.efficiency import Efficiency
from merak_sim.model import ModelSpec

__all__ = ["LayerCost", "layer_cost", "edge_costs"]


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


@lru_cache(maxsize=4096)
def layer_cost(model: ModelSpec, peak: float, mem_bw: float, eff: Efficiency, e: int,
                mbs: int, tp: int, sp: bool, parts: int) -> LayerCost:
    """Compute costs of one transformer layer (module docstring) for ``mbs`` sequences
    in ``parts`` sub-batches on one GPU of a TP group of ``tp`` (``e`` bytes per
    element, ``peak`` FLOP/s, ``mem_bw`` bytes/s of HBM)."""
    h, f, kv, a, s = model.hidden, model.ffn_hidden, model.kv_dim, model.heads, model.seq_len
    d = model.head_dim
    b = mbs / parts
    m = b * s
    fc1_n = f * (2 if model.gated_mlp else 1) / tp
    gemms = [(m, (h + 2 * kv) / tp, h), (m, h, h / tp), (m, fc1_n, h), (m, h, f / tp)]
    g_fwd = sum(eff.gemm_time(mm, n, k, peak) for mm, n, k in gemms)
    bh = b * a / tp
    attn = 2 * eff.gemm_time(s, s, d, peak, batch=bh, attention=True)
    rep = tp if sp else 1
    p = model.dropout > 0
    # Bytes moved by the forward's memory-bound kernels (read + write), per part.
    norm = 2 * (2 * m * h * e / rep)                       # two norms
    resid = 2 * (m * h * e * 3 + (m * h if p else 0)) / rep  # bias+dropout+residual x2
    sc = bh * s * s
    softmax = sc * e * 2 + (sc * (2 * e + 1) if p else 0)
    act_elems = m * f / tp
    act = act_elems * e * (3 if model.gated_mlp else 2)
    rope = 2 * m * (h + kv) / tp * e if model.family == "llama" else 0.0
    mem_bytes = norm + resid + softmax + act + rope
    n_mem = 2 + 2 + (2 if p else 1) + 1 + (1 if rope else 0)
    mem_fwd = eff.mem_time(mem_bytes, mem_bw, n_mem)
    softmax_t = eff.mem_time(softmax, mem_bw, 2 if p else 1)
    fwd = parts * (g_fwd + attn + mem_fwd)
    bwd_in = parts * (g_fwd + 2 * attn + eff.mem_time(2 * mem_bytes, mem_bw, n_mem + 2))
    bwd_w = parts * g_fwd
    core = parts * (attn + softmax_t)
    flops = 3.0 * model.layer_forward_flops(mbs) / tp
    ar_bytes = mbs * s * h * e / parts
    n_ar = 2 * parts
    return LayerCost(fwd, bwd_in, bwd_w, core, (ar_bytes, n_ar), (ar_bytes, n_ar), flops,
                     parts * (4 + 2 + n_mem))


@lru_cache(maxsize=4096)
def edge_costs(model: ModelSpec, peak: float, mem_bw: float, eff: Efficiency, e: int,
                mbs: int, tp: int, sp: bool) -> tuple[LayerCost, LayerCost]:
    """(embedding, head) compute costs. The head is final norm + LM-head GEMM + fp32
    cross entropy; the embedding a gather plus position add and dropout."""
    h, V, s = model.hidden, model.vocab, model.seq_len
    m = mbs * s
    rep = tp if sp else 1
    emb_bytes = m * h * e * 3 / rep + m * 8
    emb_f = eff.mem_time(emb_bytes, mem_bw, 3)
    # Backward: scatter-add into the (sharded) embedding gradient, zeroing it first.
    emb_b = eff.mem_time(2 * emb_bytes + V * h * e / tp, mem_bw, 3)
    emb = LayerCost(emb_f, 0.0, emb_b, 0.0, (m * h * e, 1), (0.0, 0), 0.0, 3)
    g = eff.gemm_time(m, V / tp, h, peak)
    ce_bytes = m * V / tp * 4 * 3  # fp32 logits: cast, softmax, loss
    head_f = g + eff.mem_time(ce_bytes + 2 * m * h * e / rep, mem_bw, 4)
    head_bi = g + eff.mem_time(2 * ce_bytes + 4 * m * h * e / rep, mem_bw, 4)
    head = LayerCost(head_f, head_bi, g, 0.0, (0.0, 0), (m * h * e, 1),
                     3.0 * model.logits_forward_flops(mbs) / tp, 5)
    return emb, head
