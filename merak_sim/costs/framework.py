"""Framework kernel facts: where a training framework's own code runs the attention
softmax or the cross entropy differently from the charges of
:mod:`merak_sim.costs.layers`.

The default (:class:`FrameworkKernels` ``()``) is the layer model's own charge: a
fused scale-mask-softmax kernel (2 bytes moved per score element per 16-bit byte, one
kernel; backward twice the forward bytes) and a cross entropy over fp32 logits of 12
bytes per logit element in forward and 24 in backward. :data:`MEGATRON` states what
Megatron(-DeepSpeed) of the vTrain runs' era does instead (read from its source; bytes
per element, read + write, at 16-bit training, e = 2):

Attention softmax (``megatron/model/fused_softmax.py``, ``FusedScaleMaskSoftmax``):
``is_kernel_available`` runs the fused scaled-upper-triangular-masked softmax only for
fp16/bf16 input with 16 < sk <= 4096 (2048 in older copies; the vTrain rows have
sk <= 2048), sq % 4 == 0, sk % 4 == 0 and attn_batches = micro-batch x heads per GPU
divisible by 4 and by the kernel's batches per block (:func:`batch_per_block`: 128-thread
blocks of 32-lane warps, one row per warp above 128 keys, two at or below it: 4 or 8).
Otherwise ``forward_torch_softmax`` runs eagerly. Megatron-DeepSpeed applies query-key
layer scaling by default (its flag is ``--no-query-key-layer-scaling``), which sets
``softmax_in_fp32`` and a scale, so the fallback is five kernels
(:func:`torch_softmax`): cast to fp32 (r e, w 4), scale (r 4, w 4), mask fill in place
(r 4 + the 1-byte mask, w 4), softmax (r 4, w 4), cast back (r 4, w e): 2e + 33 = 37
bytes; its autograd backward is the same five in reverse: cast (r e, w 4), softmax
backward (reads gradient and output, writes the gradient: 12), mask fill (9), scale
(8), cast (r 4, w e): 2e + 37 = 41 bytes. The fused kernel moves 2e in forward and
3e in backward (reads gradient and output, writes in place), which the layer model's
charge (2e, and 4e in backward) already stands for; :func:`softmax_extra` is what the
fallback adds to it.

Cross entropy (the GPT loss without ``--fp16-lm-cross-entropy``, the default, calls
``output.float()``; then ``megatron/core/tensor_parallel/cross_entropy.py``,
``_VocabParallelCrossEntropy.forward`` / ``backward``): forward over the logits: cast
(r e, w 4), max over the vocabulary (r 4), subtract the max (r 4, w 4), exp (r 4, w 4),
sum (r 4), divide by the sum in place to keep the softmax for backward (r 4, w 4): six
kernels, e + 36 = 38 bytes; backward: subtract the one-hot target (per token), multiply
by the output gradient in place (r 4, w 4), cast back for the LM-head GEMM (r 4, w e):
two kernels, e + 12 = 14 bytes (:func:`cross_entropy`). The per-token bookkeeping
(target mask, gather of the target logit, log: about a dozen kernels on one element
per token in forward, four in backward) moves no logits-sized bytes and, like the
per-layer bookkeeping ops elsewhere in the layer model, is not itemised.
"""

from __future__ import annotations

from dataclasses import dataclass

from merak_sim.costs.fusion import EagerExtra

__all__ = ["DEFAULT_FRAMEWORK", "FrameworkKernels", "LogitBytes", "MEGATRON", "batch_per_block",
           "cross_entropy", "megatron_softmax_fused", "softmax_extra", "torch_softmax"]


@dataclass(frozen=True, slots=True)
class FrameworkKernels:
    """Which framework facts (module docstring) the layer model applies.

    Attributes:
        softmax_rule: "fused" (the fused softmax always runs, the default) or
            "megatron" (Megatron's ``is_kernel_available``; otherwise the eager fp32
            fallback, :func:`torch_softmax`).
        cross_entropy: "default" (the layer model's 12 / 24 bytes per logit) or
            "megatron-fp32" (:func:`cross_entropy`).
        max_fused_keys: the longest key sequence the fused kernel takes.
    """

    softmax_rule: str = "fused"
    cross_entropy: str = "default"
    max_fused_keys: int = 4096

    def __post_init__(self) -> None:
        if self.softmax_rule not in ("fused", "megatron"):
            raise ValueError(f"unknown softmax rule {self.softmax_rule!r}; choose fused "
                             "or megatron")
        if self.cross_entropy not in ("default", "megatron-fp32"):
            raise ValueError(f"unknown cross entropy {self.cross_entropy!r}; choose "
                             "default or megatron-fp32")


#: The layer model's own charges (module docstring): the default everywhere.
DEFAULT_FRAMEWORK = FrameworkKernels()
#: Megatron(-DeepSpeed) of the vTrain runs (module docstring).
MEGATRON = FrameworkKernels(softmax_rule="megatron", cross_entropy="megatron-fp32")


@dataclass(frozen=True, slots=True)
class LogitBytes:
    """Bytes moved per element (read + write) and kernels of one pass pair.

    Attributes:
        fwd_bytes / bwd_bytes: bytes per element of the forward / backward.
        fwd_kernels / bwd_kernels: kernels of the forward / backward.
    """

    fwd_bytes: float
    fwd_kernels: int
    bwd_bytes: float
    bwd_kernels: int


def batch_per_block(sk: int) -> int:
    """Rows of scores one 128-thread block of Megatron's fused softmax handles: four
    32-lane warps, each taking two rows when the (power-of-two rounded) key length is
    at most 128, one otherwise."""
    return (128 // 32) * (2 if sk <= 128 else 1)


def megatron_softmax_fused(e: int, sq: float, sk: float, attn_batches: float,
                           max_keys: int = 4096) -> bool:
    """Whether Megatron's ``FusedScaleMaskSoftmax.is_kernel_available`` picks the fused
    causal kernel for scores of ``attn_batches`` x ``sq`` x ``sk`` at ``e`` bytes per
    element (module docstring)."""
    ints = all(float(v).is_integer() for v in (sq, sk, attn_batches))
    if e != 2 or not ints or not 16 < sk <= max_keys:
        return False
    n = int(attn_batches)
    return int(sq) % 4 == 0 and int(sk) % 4 == 0 and n % 4 == 0 and \
        n % batch_per_block(int(sk)) == 0


def torch_softmax(e: int) -> LogitBytes:
    """Megatron's eager ``forward_torch_softmax`` with query-key layer scaling and its
    backward, per score element (module docstring): the casts only for 16-bit input."""
    cast = e < 4
    fwd = (e + 4 if cast else 0) + 8 + 9 + 8 + (4 + e if cast else 0)
    bwd = (e + 4 if cast else 0) + 12 + 9 + 8 + (4 + e if cast else 0)
    n = 3 + (2 if cast else 0)
    return LogitBytes(fwd, n, bwd, n)


def softmax_extra(fw: FrameworkKernels, e: int, sq: float, sk: float,
                  attn_batches: float) -> EagerExtra:
    """What the framework's softmax adds to the layer model's fused charge (2e bytes,
    one kernel; backward 4e bytes, one kernel) for ``attn_batches`` x ``sq`` x ``sk``
    scores of one micro-batch part: nothing unless the Megatron rule falls back."""
    if fw.softmax_rule == "fused" or megatron_softmax_fused(e, sq, sk, attn_batches,
                                                            fw.max_fused_keys):
        return EagerExtra()
    t = torch_softmax(e)
    sc = attn_batches * sq * sk
    return EagerExtra(fwd_bytes=sc * (t.fwd_bytes - 2 * e), bwd_bytes=sc * (t.bwd_bytes - 4 * e),
                      fwd_kernels=t.fwd_kernels - 1, bwd_kernels=t.bwd_kernels - 1)


def cross_entropy(fw: FrameworkKernels, e: int) -> LogitBytes:
    """Bytes per logit element and kernels of the loss over the logits (module
    docstring): the layer model's charge (three fp32 passes forward, twice that
    backward, three kernels each) or Megatron's fp32 vocab-parallel cross entropy."""
    if fw.cross_entropy == "default":
        return LogitBytes(12.0, 3, 24.0, 3)
    cast = e < 4
    return LogitBytes(32 + (e + 4 if cast else 0), 5 + (1 if cast else 0),
                      8 + (4 + e if cast else 0), 1 + (1 if cast else 0))
