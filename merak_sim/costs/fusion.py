"""Memory-bound elementwise ops of a transformer layer run eagerly (one kernel per
PyTorch op) instead of fused (one kernel per op group, as Megatron's fused kernels,
Transformer Engine or torch.compile's Inductor emit them).

The analytic layer cost (:mod:`merak_sim.costs.layers`) charges each elementwise group
once: a norm reads and writes its tensor (2 e bytes per element, 1 kernel), the rotary
embedding reads and writes q and k once, the gated MLP activation reads gate and up and
writes one output (3 e), the backward of them all twice the forward's bytes. That is
what a fused kernel, or Inductor fusing the decomposed ops into one pointwise /
reduction kernel per group, moves. Run eagerly, the same ops are dispatched one ATen
kernel at a time, each reading its inputs from HBM and writing its output, with fp32
upcasts in between; their backward follows autograd's derivative formulas (PyTorch's
``derivatives.yaml``), one kernel per formula term.

Per element of the op's tensor (``e`` bytes per 16-bit element, 4 per fp32 one; a
row-sized tensor such as a mean or an rsqrt counts as a kernel without bytes):

- RMSNorm as torchtitan's Llama blocks define it, ``(x.float() * rsqrt(x.float()
  .pow(2).mean(-1) + eps)).type_as(x) * weight`` (PyTorch's ``nn.RMSNorm`` decomposes
  into the same ops where it has no fused CUDA kernel): forward ``float`` (e + 4), ``pow``
  (8), ``mean`` (4), ``add`` and ``rsqrt`` (row-sized), ``mul`` (8), ``type_as``
  (4 + e), ``mul weight`` (2 e): 4 e + 28 bytes, 8 kernels. Backward: the weight mul
  (input gradient 2 e; weight gradient product 3 e and its row reduction e), the cast
  back to fp32 (e + 4), the ``mul`` (gradient of x 8; of the rsqrt 12 and its row sum
  4), ``rsqrt`` (row-sized), ``mean`` (expanded gradient divided by h: 4), ``pow``
  (``pow(x, 1)`` 8, times 2 8, times the gradient 12), the accumulation of x's two
  gradients (12) and the cast to 16 bits (4 + e): 8 e + 76 bytes, 14 kernels.
- Rotary embedding as torchtitan applies it (q and k upcast to fp32, viewed as complex,
  multiplied by the complex frequencies, cast back): per tensor forward ``float``
  (e + 4), complex ``mul`` (8; the frequencies are s x d / 2, small beside b s heads
  d), ``type_as`` (4 + e): 2 e + 16 bytes, 3 kernels; backward the same three terms
  (cast, multiply by the conjugate frequencies, cast): 2 e + 16 bytes, 3 kernels.
- SwiGLU, ``silu(x W1) * (x W3)``: forward ``silu`` (2 e) and ``mul`` (3 e): 5 e
  bytes, 2 kernels; backward the two product terms (3 e each) and ``silu_backward``
  (3 e): 9 e bytes, 3 kernels.
- LayerNorm (``F.layer_norm``), GELU and the residual adds are one native kernel each
  in eager PyTorch too: as charged fused.

:func:`eager_extra` returns what eager execution adds to the fused charge (the
difference of the two, per layer pass), which the layer cost prices at HBM bandwidth
times the calibrated memory efficiency with the per-kernel overhead of each extra
kernel. Nothing here is fitted. Check against torchtitan's own pairs of H100 runs
that differ only in torch.compile (Llama 3.1 8B, 8 and 128 GPUs): measured, eager
steps take 15.7 / 16.2 % longer than compiled ones; with the pytorch profile the model
predicts 11.1 % for both. Not modelled: the eager ops that selective activation
checkpointing re-runs in backward, ``repeat_kv``'s copies of K and V for grouped-query
attention, and the fp32 intermediates' transient memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from merak_sim.model import ModelSpec

__all__ = ["OpPasses", "EagerExtra", "RMSNORM_EAGER", "ROPE_EAGER", "SWIGLU_EAGER",
           "FUSED", "FUSED_ACT", "eager_extra"]

FP32 = 4


@dataclass(frozen=True, slots=True)
class OpPasses:
    """HBM traffic of one elementwise op group per element of its tensor, as linear
    functions of the 16-bit element size ``e``: bytes = ``*_e`` * e + ``*_c``.

    Attributes:
        fwd_e, fwd_c: forward bytes per element (coefficient of e, constant).
        fwd_kernels: forward kernels.
        bwd_e, bwd_c: backward bytes per element.
        bwd_kernels: backward kernels.
    """

    fwd_e: float
    fwd_c: float
    fwd_kernels: int
    bwd_e: float
    bwd_c: float
    bwd_kernels: int

    def fwd_bytes(self, e: float) -> float:
        """Forward bytes per element for ``e``-byte activations."""
        return self.fwd_e * e + self.fwd_c

    def bwd_bytes(self, e: float) -> float:
        """Backward bytes per element for ``e``-byte activations."""
        return self.bwd_e * e + self.bwd_c


#: torchtitan's RMSNorm run op by op (module docstring).
RMSNORM_EAGER = OpPasses(
    fwd_e=1 + 1 + 2, fwd_c=FP32 + 2 * FP32 + FP32 + 2 * FP32 + FP32, fwd_kernels=8,
    bwd_e=2 + 3 + 1 + 1 + 1, bwd_c=FP32 + 2 * FP32 + 3 * FP32 + FP32 + FP32
    + 2 * FP32 + 2 * FP32 + 3 * FP32 + 3 * FP32 + FP32, bwd_kernels=14)
#: torchtitan's complex-valued rotary embedding, per tensor (q or k).
ROPE_EAGER = OpPasses(fwd_e=2, fwd_c=FP32 + 2 * FP32 + FP32, fwd_kernels=3,
                      bwd_e=2, bwd_c=FP32 + 2 * FP32 + FP32, bwd_kernels=3)
#: SiLU and the gating product as two kernels.
SWIGLU_EAGER = OpPasses(fwd_e=5, fwd_c=0, fwd_kernels=2, bwd_e=9, bwd_c=0, bwd_kernels=3)
#: What :mod:`merak_sim.costs.layers` charges per op group (norm, rotary): read +
#: write, backward twice that, one kernel.
FUSED = OpPasses(fwd_e=2, fwd_c=0, fwd_kernels=1, bwd_e=4, bwd_c=0, bwd_kernels=1)
#: Its charge for the gated activation: read gate and up, write one (3 e), backward twice.
FUSED_ACT = OpPasses(fwd_e=3, fwd_c=0, fwd_kernels=1, bwd_e=6, bwd_c=0, bwd_kernels=1)


@dataclass(frozen=True, slots=True)
class EagerExtra:
    """What eager elementwise ops add to one layer pass of one micro-batch part.

    Attributes:
        fwd_bytes / bwd_bytes: extra HBM bytes of the forward / backward.
        fwd_kernels / bwd_kernels: extra kernels of the forward / backward.
    """

    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0
    fwd_kernels: int = 0
    bwd_kernels: int = 0


def _delta(eager: OpPasses, fused: OpPasses, elems: float, e: float, tensors: int = 1
           ) -> EagerExtra:
    return EagerExtra(elems * (eager.fwd_bytes(e) - fused.fwd_bytes(e)),
                      elems * (eager.bwd_bytes(e) - fused.bwd_bytes(e)),
                      tensors * eager.fwd_kernels - fused.fwd_kernels,
                      tensors * eager.bwd_kernels - fused.bwd_kernels)


def eager_extra(model: ModelSpec, tokens: float, tp: int, sp: bool, e: float,
                rope_width: float) -> EagerExtra:
    """Extra bytes and kernels of one layer pass over ``tokens`` tokens on one GPU of a
    TP group of ``tp`` when its elementwise ops run eagerly (module docstring): the
    two RMSNorms (on tokens / tp rows under sequence parallelism), the rotary embedding
    of the local q and k columns (``rope_width`` of them) and SwiGLU on ffn / tp.
    Models of the GPT family (LayerNorm, GELU) add nothing."""
    if model.family != "llama":
        return EagerExtra()
    rows = tokens / (tp if sp else 1)
    parts = [_delta(RMSNORM_EAGER, FUSED, rows * model.hidden, e) for _ in range(2)]
    # Both q and k share one fused rotary kernel; eagerly each runs its own three.
    parts.append(_delta(ROPE_EAGER, FUSED, tokens * rope_width, e, tensors=2))
    if model.gated_mlp:
        parts.append(_delta(SWIGLU_EAGER, FUSED_ACT, tokens * model.ffn_hidden / tp, e))
    return EagerExtra(sum(p.fwd_bytes for p in parts), sum(p.bwd_bytes for p in parts),
                      sum(p.fwd_kernels for p in parts), sum(p.bwd_kernels for p in parts))
