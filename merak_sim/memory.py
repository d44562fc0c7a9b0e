"""Memory model: model state and activations per pipeline stage.

Model state (per GPU, after tensor-parallel sharding)
----------------------------------------------------
- Mixed precision (bf16/fp16) Adam: 16 bytes/param = 2 (16-bit weights) + 2 (16-bit
  gradients) + 12 (fp32 master weights, Adam m and v) (Rajbhandari et al., ZeRO, SC'20,
  Sec. 3.1: "2 + 2 + K" with K = 12).
- fp32 Adam: also 16 bytes/param but split 4 (weights) + 4 (gradients) + 8 (m, v).
- ZeRO over a shard group of g ranks (dp x cp, or the HSDP group): stage 1 divides
  the optimizer part by g, stage 2 the gradients too, stage 3 (FSDP) the weights too
  (the gathered layers FSDP holds while computing are the cost model's: see
  :mod:`merak_sim.costs.sharded_dp`).
- fp8 training keeps the mixed-precision state (2 + 2 + 12) plus the FP8 copy of the
  weights cached between micro-batches (1 byte/param, sharded like the weights);
  activations stay 16-bit. fp8-block, mxfp8 and nvfp4 cache a row-wise and a
  column-wise copy with their block scales (2.06 / 2.06 / 1.13 bytes/param,
  :meth:`merak_sim.precision.Precision.cached_weight_bytes`).

Activations per transformer layer (bytes one micro-batch keeps for backward)
---------------------------------------------------------------------------
Built from the tensors each sub-layer saves (:func:`layer_activation_breakdown`), per
token, with e = bytes per activation element, m = bytes per dropout-mask element,
h hidden, f ffn, kv the K/V width, a heads, s sequence, t tensor parallel degree:

- residual stream (replicated under TP, divided by t with sequence parallelism):
  LN1 input, LN1 output (QKV input), LN2 input, LN2 output (fc1 input): 4eh, and the
  two dropout masks after attention and MLP: 2mh (if dropout). (DTensor's sequence
  parallelism, ``sp_saves_gathered``, keeps the two norm outputs all-gathered: 2eh.)
- sharded by TP: Q, K (e(h + kv)), V (e kv), projection input (eh), the MLP's saved
  f-sized tensors (GELU: input and output = 2ef; fused SwiGLU: 3ef).
- attention core (sharded): softmax output e*a*s, plus its dropout mask m*a*s and the
  dropped output e*a*s if dropout; a flash-style kernel instead saves only the log-sum-
  exp (4a bytes) and no s x s tensor.

With e = 2 and m = 1 (16-bit activations, byte masks, GPT, ffn 4h) this is exactly
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(MLSys 2023), Table 2, per layer:
  no parallelism          sbh(34 + 5as/h)
  tensor parallel         sbh(10 + 24/t + 5as/(ht))
  tensor + sequence par.  sbh/t (34 + 5as/h)
  selective recompute     sbh/t * 34  (with sp; without sp: sbh(10 + 24/t))
  full recompute          2sbh         (the layer input only; divided by t with sp,
                                        since Megatron keeps the sharded input)
:func:`korthikanti_layer_bytes` gives those closed forms, and the tests check the
breakdown reproduces them.

A second profile, ``cpu-eager`` (:data:`CPU_EAGER`), is what eager PyTorch on CPU
really saves (measured with ``torch.autograd.graph.saved_tensors_hooks``, tests in
tests/test_memory_measured.py): fp32 activations, dropout masks stored as 4-byte floats,
LayerNorm mean and rstd (2 x 4 bytes per token each), scaled-dot-product attention
taking the flash path (q, k, v, output, log-sum-exp) without dropout and the math path
(softmax, float mask, dropped probabilities, a separate projection input) with it, and
HuggingFace GPT-2's ``gelu_new`` written in Python saving five f-sized tensors instead
of two.

Selective recompute comes in two policies (``ActivationProfile.selective``):
"attention-core" (Megatron: everything above except the s x s part, which the
attention core recomputes) and "alternate-mm" (torchtitan's op-level selective
checkpointing: each layer is a checkpointed region whose policy saves the outputs of
its matmuls except every second one, of the attention kernel and of the TP
reduce-scatters; everything else is recomputed in backward). With LLaMA's block
(q, k, v, o, w1, w3, w2 in that order) that keeps, per token, the layer input
(eh, /t with sp), Q (eh/t), V (e kv/t), the attention output (eh/t) with its
log-sum-exp (4a/t), the w1 output (ef/t) and the w2 output (eh: the partial sums before
the reduce-scatter under TP), plus under TP the two reduce-scatter outputs (2eh/t)
(:func:`alternate_mm_layer_bytes`). That is what eager PyTorch keeps: its selective
checkpoint caches the output of every op the policy saves until the recompute pops it
(``torch.utils.checkpoint``'s caching dispatch mode), the w2 output and, under TP, the
MLP's reduce-scatter output included, though no backward formula reads them (the
residual add's derivative needs neither input). Compiled (``torch.compile``), the
AOTAutograd partitioner saves only forward values its backward graph reads, so those
two are not kept (``ActivationProfile.saves_unread``).

The loss (``ActivationProfile.loss``): "fp32-log-softmax" (eager PyTorch and Megatron:
the logits cast to fp32 and the log-softmax output, 4V/t bytes per token, kept; its
backward holds two more fp32 V-sized tensors), "fp32-loss-parallel" (the same, except
that under TP the cross entropy runs torch's DTensor loss-parallel decomposition, whose
backward ``(zeros + exp(log_probs)) * grad`` holds three fp32 V/t-sized temporaries) or
"fused" (a compiled or fused cross entropy: the 16-bit logits kept, 2V/t, and one
16-bit gradient of them in backward).

Context parallelism (cp) keeps s/cp tokens of each sequence per GPU: every per-token
term above is divided by cp, the s x s term keeps its full key length (local queries
against all keys).

Stage extras: the first stage keeps the embedding-dropout mask and the token (and
position) ids, the last stage the
final-norm input, the LM-head input and the fp32 logits (4V/t bytes per token) that the
cross entropy keeps (Korthikanti et al., Sec. 4.3). A final RMSNorm run as eager ops
(``ActivationProfile.eager_final_norm``: torchtitan compiles each transformer block, not
the final norm) keeps its fp32 upcast of the input (``pow`` and ``mul`` save it,
PyTorch's derivatives.yaml) and the normalised 16-bit tensor the weight ``mul`` saves,
(4 + e)h per token (/t with sp), where a fused norm keeps its 16-bit input, eh. Merak's
F* keeps only the stage input (e*h per token; /t with sp). The number of micro-batches
alive per rank comes from the schedule (:func:`peak_memory`), never from a formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from merak_sim.model import ModelSpec
from merak_sim.precision import get_precision
from merak_sim.schedule.liveness import liveness, stash_sizes
from merak_sim.sim.from_config import recompute_fractions, schedule_for

__all__ = [
    "ActivationProfile", "KORTHIKANTI", "FLASH", "CPU_EAGER", "CPU_EAGER_HF_GPT2",
    "MemoryModelError", "ModelState", "model_state_bytes", "layer_activation_breakdown",
    "layer_activation_bytes", "layer_checkpoint_bytes", "korthikanti_layer_bytes",
    "stage_input_bytes", "first_stage_extra_bytes", "last_stage_extra_bytes",
    "peak_memory", "StageMemory", "DTYPE_BYTES", "backward_working_bytes",
    "TORCHTITAN", "TORCHTITAN_COMPILED", "TORCHTITAN_COMPILED_LOSS",
    "alternate_mm_layer_bytes",
    "SELECTIVE_POLICIES", "LOSS_STORAGE",
]

#: Bytes per activation element (and per element of a TP collective) by training dtype:
#: fp8 training keeps 16-bit activations, only GEMM inputs are cast to 8 bits.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2, "fp8-block": 2, "mxfp8": 2,
               "nvfp4": 2}


class MemoryModelError(ValueError):
    """Bad input to the memory model (a ValueError naming the offending value)."""


@dataclass(frozen=True, slots=True)
class ActivationProfile:
    """How a framework stores a layer's activations (module docstring).

    Attributes:
        name: label.
        act_bytes: bytes per activation element (0 = from the training dtype).
        mask_bytes: bytes per dropout-mask element (1: GPU byte mask; 4: CPU float).
        attention: "unfused" (softmax kept), "flash" (log-sum-exp only) or "sdpa-cpu"
            (flash without dropout, unfused with it: PyTorch's CPU dispatch).
        mlp_saved_f: f-sized tensors the MLP keeps (0 = family default: 2 for GELU,
            3 for fused SwiGLU).
        norm_stats_bytes: bytes per token per norm for saved statistics (0 for
            Korthikanti, who neglects them; 8 for CPU LayerNorm's fp32 mean and rstd).
        math_sdpa_keeps_fused_qkv: PyTorch's CPU math attention (taken with dropout)
            reshapes V by a view when the batch is 1, which keeps the whole fused QKV
            projection output alive (HuggingFace GPT-2's ``c_attn``): V then costs
            h + 2kv instead of kv. Measured; see tests/test_memory_measured.py.
        selective: what selective recompute keeps: "attention-core" (Megatron) or
            "alternate-mm" (torchtitan's op-level policy; module docstring).
        loss: how the cross entropy stores the logits: "fp32-log-softmax",
            "fp32-loss-parallel" or "fused" (module docstring).
        sp_saves_gathered: with sequence parallelism the matmuls after each norm save
            the all-gathered (full-sequence) norm output, as DTensor's sequence
            parallelism runs the all-gather as an op of its own (torchtitan); False:
            Megatron keeps it sharded and gathers it again in backward.
        saves_unread: the "alternate-mm" policy keeps the saved ops' outputs that no
            backward formula reads (the w2 output, under TP the MLP's reduce-scatter
            output), as eager selective checkpointing caches them; False: compiled,
            the partitioner keeps only what the backward graph reads (module docstring).
        eager_final_norm: the final RMSNorm runs as eager ops and keeps its fp32 upcast
            input beside the normalised tensor (module docstring, stage extras).
    """

    name: str
    act_bytes: int = 0
    mask_bytes: int = 1
    attention: str = "unfused"
    mlp_saved_f: int = 0
    norm_stats_bytes: int = 0
    math_sdpa_keeps_fused_qkv: bool = False
    selective: str = "attention-core"
    loss: str = "fp32-log-softmax"
    sp_saves_gathered: bool = False
    saves_unread: bool = True
    eager_final_norm: bool = False

    def __post_init__(self) -> None:
        if self.selective not in SELECTIVE_POLICIES:
            raise MemoryModelError(f"unknown selective policy {self.selective!r}; choose "
                                   f"{' or '.join(SELECTIVE_POLICIES)}")
        if self.loss not in LOSS_STORAGE:
            raise MemoryModelError(f"unknown loss storage {self.loss!r}; choose "
                                   f"{' or '.join(LOSS_STORAGE)}")


#: Selective-recompute policies and loss storages an ActivationProfile may name.
SELECTIVE_POLICIES = ("attention-core", "alternate-mm")
LOSS_STORAGE = ("fp32-log-softmax", "fp32-loss-parallel", "fused")

KORTHIKANTI = ActivationProfile("korthikanti")
FLASH = ActivationProfile("flash", attention="flash")
CPU_EAGER = ActivationProfile("cpu-eager", act_bytes=4, mask_bytes=4, attention="sdpa-cpu",
                              norm_stats_bytes=8)
CPU_EAGER_HF_GPT2 = ActivationProfile("cpu-eager-hf-gpt2", act_bytes=4, mask_bytes=4,
                                      attention="sdpa-cpu", mlp_saved_f=5,
                                      norm_stats_bytes=8, math_sdpa_keeps_fused_qkv=True)
#: torchtitan (flash attention, op-level selective checkpointing): eager (no
#: ``--compile``); compiled blocks with the eager loss (its 2024 releases compiled each
#: transformer block only, the final norm ran as PyTorch 2.6's decomposed ops); blocks
#: and loss compiled (its releases since 2025, on a PyTorch whose RMSNorm kernel is not
#: known here: the final norm is priced fused).
TORCHTITAN = ActivationProfile("torchtitan", attention="flash", selective="alternate-mm",
                               loss="fp32-loss-parallel", sp_saves_gathered=True,
                               eager_final_norm=True)
TORCHTITAN_COMPILED = ActivationProfile("torchtitan-compiled", attention="flash",
                                        selective="alternate-mm", loss="fp32-loss-parallel",
                                        sp_saves_gathered=True, saves_unread=False,
                                        eager_final_norm=True)
TORCHTITAN_COMPILED_LOSS = ActivationProfile("torchtitan-compiled-loss", attention="flash",
                                             selective="alternate-mm", loss="fused",
                                             sp_saves_gathered=True, saves_unread=False)
PROFILES = {p.name: p for p in (KORTHIKANTI, FLASH, CPU_EAGER, CPU_EAGER_HF_GPT2,
                                TORCHTITAN, TORCHTITAN_COMPILED, TORCHTITAN_COMPILED_LOSS)}


def _e(model: ModelSpec, profile: ActivationProfile, dtype: str | None) -> int:
    return profile.act_bytes or DTYPE_BYTES[dtype or model.dtype]


def layer_activation_breakdown(model: ModelSpec, micro_batch: int, tp: int = 1,
                               sp: bool = False, profile: ActivationProfile = KORTHIKANTI,
                               dtype: str | None = None, cp: int = 1) -> dict[str, float]:
    """Bytes one layer keeps per micro-batch, by component (module docstring; ``cp``
    divides the tokens).

    Keys: "residual" (norm inputs/outputs, replicated unless sp), "masks" (residual
    dropout masks), "norm_stats", "qkv", "proj_in", "mlp", "scores" (the s x s part
    or flash statistics).
    """
    if micro_batch < 1:
        raise MemoryModelError(f"micro_batch must be a positive integer, got {micro_batch}")
    model.check_tp(tp)
    h, f, kv, a, s = model.hidden, model.ffn_hidden, model.kv_dim, model.heads, model.seq_len
    e, m = _e(model, profile, dtype), profile.mask_bytes
    tok = micro_batch * s / cp if cp > 1 else micro_batch * s
    rep = tp if sp else 1  # divisor of the residual-stream part
    p = model.dropout > 0
    mlp_f = profile.mlp_saved_f or (3 if model.gated_mlp else 2)
    attn = profile.attention
    qkv = h + 2 * kv
    if attn == "sdpa-cpu":
        attn = "unfused" if p else "flash"
        if p and micro_batch == 1 and profile.math_sdpa_keeps_fused_qkv:
            qkv += h + kv
    if attn == "unfused":
        scores = (e + ((m + e) if p else 0)) * a * s
    elif attn == "flash":
        scores = 4 * a
    else:
        raise MemoryModelError(f"unknown attention storage {profile.attention!r}")
    return {
        "residual": (tok * 4 * e * h / rep if not (sp and profile.sp_saves_gathered)
                     else tok * 2 * e * h * (1 + 1 / rep)),
        "masks": tok * (2 * m * h if p else 0) / rep,
        "norm_stats": tok * 2 * profile.norm_stats_bytes / rep,
        "qkv": tok * e * (qkv / tp if model.kv_heads % tp == 0 else
                          (qkv - 2 * kv) / tp + 2 * model.kv_dim_per_rank(tp)),
        "proj_in": tok * e * h / tp,
        "mlp": tok * mlp_f * e * f / tp,
        "scores": tok * scores / tp,
    }


def layer_activation_bytes(model: ModelSpec, micro_batch: int, tp: int = 1, sp: bool = False,
                           recompute: str = "none",
                           profile: ActivationProfile = KORTHIKANTI,
                           dtype: str | None = None, cp: int = 1) -> float:
    """Bytes one layer keeps per micro-batch under ``recompute`` ("none",
    "selective": what the profile's selective policy keeps, by default everything but
    the attention core's s x s part, "full": only the layer input)."""
    if recompute == "full":
        return layer_checkpoint_bytes(model, micro_batch, tp, sp, profile, dtype, cp)
    if recompute == "selective" and profile.selective == "alternate-mm":
        return alternate_mm_layer_bytes(model, micro_batch, tp, sp, profile, dtype, cp)
    d = layer_activation_breakdown(model, micro_batch, tp, sp, profile, dtype, cp)
    if recompute == "selective":
        d = dict(d, scores=0.0)
    elif recompute != "none":
        raise MemoryModelError(f"unknown recompute setting {recompute!r}; choose none, "
                           "selective or full")
    return float(sum(d.values()))


def layer_checkpoint_bytes(model: ModelSpec, micro_batch: int, tp: int = 1, sp: bool = False,
                           profile: ActivationProfile = KORTHIKANTI,
                           dtype: str | None = None, cp: int = 1) -> float:
    """Bytes a fully checkpointed layer keeps: its input, e*s*b*h (/t with sp, /cp)."""
    return stage_input_bytes(model, micro_batch, tp, sp, profile, dtype, cp)


def alternate_mm_layer_bytes(model: ModelSpec, micro_batch: int, tp: int = 1,
                             sp: bool = False, profile: ActivationProfile = KORTHIKANTI,
                             dtype: str | None = None, cp: int = 1) -> float:
    """Bytes one layer keeps under torchtitan's op-level selective checkpointing (module
    docstring): the layer input, Q, V, the attention output and log-sum-exp, the w1 and
    w2 outputs, and under TP the two reduce-scatter outputs; without
    ``profile.saves_unread`` (compiled) neither the w2 output nor the MLP's
    reduce-scatter output, which no backward formula reads."""
    model.check_tp(tp)
    e = _e(model, profile, dtype)
    h, f, a = model.hidden, model.ffn_hidden, model.heads
    tok = micro_batch * model.seq_len / cp
    kv = (model.kv_dim / tp if model.kv_heads % tp == 0 else model.kv_dim_per_rank(tp))
    rs = (2 if profile.saves_unread else 1) * e * h / tp if tp > 1 else 0.0
    w2 = e * h if profile.saves_unread else 0.0
    per_tok = (e * h / (tp if sp else 1) + e * h / tp + e * kv + e * h / tp + 4 * a / tp
               + e * f / tp + w2 + rs)
    return float(tok * per_tok)


def stage_input_bytes(model: ModelSpec, micro_batch: int, tp: int = 1, sp: bool = False,
                      profile: ActivationProfile = KORTHIKANTI,
                      dtype: str | None = None, cp: int = 1) -> float:
    """The residual-stream tensor crossing a stage boundary (what F* keeps)."""
    e = _e(model, profile, dtype)
    return float(micro_batch * model.seq_len * model.hidden * e / (tp if sp else 1) / cp)


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, t: int = 1,
                            setting: str = "none") -> float:
    """Korthikanti et al. (MLSys 2023) Table 2 closed forms, bytes per layer.

    setting: "none" (no parallelism; t ignored), "tp", "tp+sp", "selective" (with
    tp+sp), "full" (2sbh)."""
    if setting == "none":
        return s * b * h * (34 + 5 * a * s / h)
    if setting == "tp":
        return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    if setting == "tp+sp":
        return s * b * h / t * (34 + 5 * a * s / h)
    if setting == "selective":
        return s * b * h / t * 34
    if setting == "full":
        return 2 * s * b * h
    raise MemoryModelError(f"unknown Korthikanti setting {setting!r}")


def first_stage_extra_bytes(model: ModelSpec, micro_batch: int, tp: int = 1, sp: bool = False,
                            profile: ActivationProfile = KORTHIKANTI,
                            dtype: str | None = None, cp: int = 1) -> float:
    """Embedding activations on the first stage: the dropout mask (if dropout), the
    token ids (8 bytes each) and, with a learned position table, the position ids of
    one sequence (8 bytes per position)."""
    tok = micro_batch * model.seq_len / cp if cp > 1 else micro_batch * model.seq_len
    mask = profile.mask_bytes * model.hidden / (tp if sp else 1) if model.dropout > 0 else 0
    pos = 8 * model.seq_len if model.max_positions else 0
    return float(tok * (mask + 8) + pos)


def last_stage_extra_bytes(model: ModelSpec, micro_batch: int, tp: int = 1, sp: bool = False,
                           profile: ActivationProfile = KORTHIKANTI,
                           dtype: str | None = None, cp: int = 1) -> float:
    """LM head activations on the last stage: final-norm input and output (2eh, /t
    with sp; the output all-gathered with ``sp_saves_gathered``) and the logits the
    cross entropy keeps, per token: fp32 (4V/t), or 16-bit (eV/t) with a fused loss;
    an eager final norm also its fp32 upcast input (4h, /t with sp)."""
    e = _e(model, profile, dtype)
    tok = micro_batch * model.seq_len / cp if cp > 1 else micro_batch * model.seq_len
    logits = e if profile.loss == "fused" else 4
    norm = (2 * e * model.hidden / (tp if sp else 1) if not (sp and profile.sp_saves_gathered)
            else e * model.hidden * (1 + 1 / tp))
    if profile.eager_final_norm:
        norm += 4 * model.hidden / (tp if sp else 1)
    return float(tok * (norm + logits * model.vocab / tp))


def backward_working_bytes(model: ModelSpec, micro_batch: int, tp: int = 1, sp: bool = False,
                           recompute: str = "none", profile: ActivationProfile = KORTHIKANTI,
                           dtype: str | None = None, cp: int = 1, last: bool = False
                           ) -> float:
    """Transient bytes the largest backward step allocates on top of the stash: what an
    allocator's peak (reserved or device-used memory) sees and the saved-tensor stash
    (:func:`peak_memory`) does not.

    - A layer's backward: the gradients of its output and input (2eh per token, /t
      with sp), plus, when the layer was checkpointed (full or stage-aware
      recompute), the activations its recomputed forward rebuilds (the "none"
      stash); selective recompute rebuilds the attention core's s x s part.
    - The loss on the last stage: the cross entropy's backward holds the fp32 gradient
      of the log-probabilities and the fp32 gradient of the logits at once
      (8V/t bytes per token) next to the fp32 log-probabilities it saved (already in
      :func:`last_stage_extra_bytes`); DTensor's loss-parallel backward (TP) three
      (12V/t); a fused loss writes one 16-bit gradient of the logits (eV/t).
    The larger of the two (they do not overlap in time)."""
    e = _e(model, profile, dtype)
    tok = micro_batch * model.seq_len / cp
    layer = 2 * tok * e * model.hidden / (tp if sp else 1)
    if recompute in ("full", "stage-aware"):
        layer += layer_activation_bytes(model, micro_batch, tp, sp, "none", profile, dtype, cp)
    elif recompute == "selective" and profile.selective == "alternate-mm":
        layer += max(0.0, layer_activation_bytes(model, micro_batch, tp, sp, "none", profile,
                                                 dtype, cp)
                     - alternate_mm_layer_bytes(model, micro_batch, tp, sp, profile, dtype, cp))
    elif recompute == "selective":
        layer += layer_activation_breakdown(model, micro_batch, tp, sp, profile, dtype,
                                            cp)["scores"]
    per_v = {"fused": e, "fp32-loss-parallel": 12 if tp > 1 else 8}.get(profile.loss, 8)
    head = tok * per_v * model.vocab / tp if last else 0.0
    return float(max(layer, head))


# ------------------------------------------------------------------------- state
@dataclass(frozen=True, slots=True)
class ModelState:
    """Bytes of weights, gradients and optimizer state on one GPU."""

    params: float
    weight_bytes: float
    grad_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        """Sum of the three."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes


def stage_params(model: ModelSpec, n_layers: int, first: bool, last: bool, tp: int = 1,
                 pp: int = 1) -> float:
    """Parameters one GPU of a stage holds: its layers (sharded part / tp plus the
    replicated norms and biases), the vocab-parallel embedding on the first stage, the
    final norm and LM head on the last (a tied head is a second copy of the embedding
    when first and last stages differ, as in Megatron)."""
    p = n_layers * (model.layer_params_sharded() / tp + model.layer_params_replicated())
    h, V = model.hidden, model.vocab
    if first:
        p += V * h / tp + model.max_positions * h
        if model.family == "bert":
            p += 4 * h
    if last:
        if model.family == "gpt":
            p += 2 * h + (V * h / tp if not first else 0)
        elif model.family == "llama":
            p += h + V * h / tp
        else:
            p += (h * h + h) + (V * h / tp if not first else 0)
    return float(p)


def model_state_bytes(params: float, dtype: str = "bf16", dp: int = 1,
                      zero: int = 0) -> ModelState:
    """Weights/grads/optimizer bytes for ``params`` parameters on one GPU (module
    docstring: 2+2+12 mixed precision, 4+4+8 fp32, 3+2+12 fp8; ZeRO over a shard group
    of ``dp`` ranks: stage 1 divides the optimizer part, 2 the gradients too, 3 the
    weights too)."""
    if dtype not in DTYPE_BYTES:
        raise MemoryModelError(f"unknown dtype {dtype!r}; choose one of: "
                               f"{', '.join(DTYPE_BYTES)}")
    if dp < 1:
        raise MemoryModelError(f"dp must be a positive integer, got {dp}")
    if zero not in (0, 1, 2, 3):
        raise MemoryModelError(f"zero stage {zero!r} unknown; choose 0, 1, 2 or 3")
    if dtype == "fp32":
        w, g, o = 4, 4, 8
    else:
        # The cached quantized weight copies (merak_sim.precision): fp8 1 byte, the
        # block-scaled formats a row-wise and a column-wise copy with their scales.
        w, g, o = 2 + get_precision(dtype).cached_weight_bytes(), 2, 12
    opt = params * o / (dp if zero >= 1 else 1)
    grad = params * g / (dp if zero >= 2 else 1)
    weight = params * w / (dp if zero >= 3 else 1)
    return ModelState(params, weight, grad, opt)


# ------------------------------------------------------------------------- peaks
@dataclass(frozen=True, slots=True)
class StageMemory:
    """Peak memory of one pipeline rank.

    Attributes:
        state_bytes: weights + gradients + optimizer state (all its chunks).
        activation_peak_bytes: the largest sum of kept activations of alive
            micro-batches over the schedule (:mod:`merak_sim.schedule.liveness`).
        peak_in_flight: most micro-batches alive at once (from the schedule).
        reserved_bytes: the allocator's reservations (the table's, per rank).
    """

    state_bytes: float
    activation_peak_bytes: float
    peak_in_flight: int
    reserved_bytes: float = 0.0

    @property
    def total_bytes(self) -> float:
        """Peak bytes on the rank (what the simulator reports for it)."""
        return self.state_bytes + self.activation_peak_bytes + self.reserved_bytes


def peak_memory(table: Any, config: Any, schedule: Any | None = None) -> tuple[StageMemory, ...]:
    """Peak memory per pipeline rank for a :class:`~merak_sim.costs.base.CostTable` and
    a ParallelConfig: the schedule's :func:`~merak_sim.schedule.liveness.liveness` walk
    priced per chunk at the rank's checkpointed fraction (the simulator's own memory
    deltas, so the peaks equal the simulated ones), plus the table's reservations."""
    sched = schedule if schedule is not None else schedule_for(config, table)
    fracs = recompute_fractions(config, sched)
    pp = sched.num_stages
    out = []
    for rank in range(pp):
        chunks = [table.stages[sched.stage_of(rank, c)] for c in range(sched.virtual_stages)]
        live = liveness(sched, rank)
        peak = live.peak([stash_sizes(st, fracs[rank]) for st in chunks])
        state = sum(s.state_bytes for s in chunks)
        out.append(StageMemory(state, peak, live.peak_in_flight, table.reserved(rank)))
    return tuple(out)
