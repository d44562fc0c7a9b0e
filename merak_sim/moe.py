"""Mixture-of-experts layers of a :class:`~merak_sim.model.ModelSpec`: shape, parameter
and FLOP counts, and the MoE model presets.

An MoE model (``ModelSpec.moe`` set) has ``dense_layers`` leading dense layers (the
model's ``ffn_hidden`` MLP, as DeepSeek-V3's first three) and ``layers - dense_layers``
MoE layers. An MoE layer keeps the dense layer's attention and norms and replaces the
MLP by a router (an h x E linear: Mixtral / Qwen3 / GPT-OSS softmax top-k, DeepSeek-V3
sigmoid scores with group-limited top-k; the same cost), ``experts`` routed experts of
``expert_ffn`` each (every token goes to ``top_k`` of them) and ``shared_experts``
experts of ``shared_ffn`` that every token passes through. Experts have the model's
MLP kind (SwiGLU for every preset: three h x f matrices).

Counting convention (FLOPs and MFU per *active* parameter)
---------------------------------------------------------
Model FLOPs count what one token activates: the attention as in a dense layer, the
router, the ``top_k`` routed experts and the shared experts (2 FLOPs per multiply-add,
backward = 2 x forward, no recompute), as Megatron-LM's ``num_floating_point_operations``
counts MoE layers (``moe_router_topk`` x expert FFN plus the shared expert), with the
router's h x E GEMM added (under 1 % of an MoE layer for every preset). MFU is those
FLOPs over the step time and the 16-bit peak, so an MoE model's MFU is "per active
parameter": the idle experts' weights do no work and count for nothing. Dropped tokens
(capacity factor) are not subtracted: model FLOPs are the routing's intent.

Load imbalance
--------------
``imbalance`` is the token load of the busiest expert-parallel rank over the mean
(1.0: perfectly balanced). Default 1.0: the open NeMo / Megatron-Bridge MoE benchmark
rows this simulator is validated on force-balance the token distribution among experts
(their performance summary: "MoE benchmarks force-balance token distribution among
experts"); aux-loss balanced training runs above it and a user states theirs. With a
capacity factor c (token dropping, ``capacity_factor`` > 0) no expert takes more than c
times its mean share, so the busiest rank's load is ``min(imbalance, c)``; 0 means
dropless (Megatron's default).

Presets: each MoE preset's shape from the model's published config (the HF
``config.json`` of the release, or the paper), its published total and active parameter
counts in ``extra`` (``published_params``, ``published_active_params``), and what the
spec cannot express stated in its source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MoESpec", "ROUTERS", "MOE_PRESET_FIELDS", "moe_layer_count", "dense_mlp_params",
           "moe_mlp_params", "moe_active_mlp_params", "expert_params", "moe_params_delta",
           "active_params", "moe_flops_delta", "busiest_load"]

#: Router scoring functions (same cost; recorded for the reader).
ROUTERS = ("softmax", "sigmoid")


@dataclass(frozen=True, slots=True)
class MoESpec:
    """The MoE layers of a model (module docstring).

    Attributes:
        experts: routed experts per MoE layer (E).
        top_k: routed experts per token (k <= E).
        expert_ffn: inner size of one routed expert (f_e).
        shared_experts: experts every token passes through (DeepSeek-V3: 1).
        shared_ffn: inner size of one shared expert (0: ``expert_ffn``).
        dense_layers: leading layers with the dense ``ffn_hidden`` MLP.
        capacity_factor: token-dropping capacity per expert over its mean share
            (0: dropless).
        imbalance: busiest expert-parallel rank's tokens over the mean (>= 1; default
            1.0, module docstring).
        router: "softmax" or "sigmoid" scores.
    """

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    shared_ffn: int = 0
    dense_layers: int = 0
    capacity_factor: float = 0.0
    imbalance: float = 1.0
    router: str = "softmax"

    def __post_init__(self) -> None:
        if self.shared_ffn == 0:
            object.__setattr__(self, "shared_ffn", self.expert_ffn)
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the offending field and value."""
        for f in ("experts", "top_k", "expert_ffn", "shared_ffn"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"moe field {f} must be a positive integer, got {v!r}")
        for f in ("shared_experts", "dense_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"moe field {f} must be an integer >= 0, got {v!r}")
        if self.top_k > self.experts:
            raise ValueError(f"moe top_k {self.top_k} exceeds the {self.experts} experts "
                             "(lower top_k or add experts)")
        if not isinstance(self.capacity_factor, (int, float)) or not (
                self.capacity_factor == 0 or self.capacity_factor >= 1.0):
            raise ValueError(f"moe capacity_factor must be 0 (dropless) or >= 1, got "
                             f"{self.capacity_factor!r}")
        if not isinstance(self.imbalance, (int, float)) or not self.imbalance >= 1.0:
            raise ValueError(f"moe imbalance (busiest rank's tokens over the mean) must be "
                             f">= 1, got {self.imbalance!r}")
        if self.router not in ROUTERS:
            raise ValueError(f"moe router {self.router!r} unknown; choose one of: "
                             f"{', '.join(ROUTERS)}")

    @staticmethod
    def from_value(v: Any) -> MoESpec | None:
        """A MoESpec from itself, a dict of its fields (JSON) or None."""
        if v is None or isinstance(v, MoESpec):
            return v
        if not isinstance(v, dict):
            raise ValueError(f"model field moe must be an object of MoE fields, got {v!r}")
        unknown = sorted(set(v) - set(MoESpec.__dataclass_fields__))
        if unknown:
            raise ValueError(f"model moe has unknown field(s): {', '.join(unknown)}")
        return MoESpec(**v)


def busiest_load(moe: MoESpec) -> float:
    """Load of the busiest expert-parallel rank over the mean: the imbalance, capped by
    the capacity factor when tokens are dropped (module docstring)."""
    if moe.capacity_factor > 0:
        return min(moe.imbalance, float(moe.capacity_factor))
    return float(moe.imbalance)


def moe_layer_count(model: Any) -> int:
    """MoE layers of ``model`` (0 for a dense model)."""
    return 0 if model.moe is None else model.layers - model.moe.dense_layers


def _mats(model: Any) -> int:
    return 3 if model.gated_mlp else 2


def dense_mlp_params(model: Any) -> int:
    """Parameters of the dense MLP of one layer (matrices and, gpt/bert, biases)."""
    h, f = model.hidden, model.ffn_hidden
    return _mats(model) * h * f + ((f + h) if model.has_bias else 0)


def expert_params(model: Any) -> int:
    """Parameters of the routed experts of one MoE layer (E x mats x h x f_e)."""
    m = model.moe
    return m.experts * _mats(model) * model.hidden * m.expert_ffn


def moe_mlp_params(model: Any) -> int:
    """Parameters of one MoE layer's MLP part: router, routed and shared experts."""
    m, h = model.moe, model.hidden
    return h * m.experts + expert_params(model) + m.shared_experts * _mats(model) * h * \
        m.shared_ffn


def moe_active_mlp_params(model: Any) -> int:
    """Parameters one token activates in an MoE layer's MLP part: the router, top_k
    routed experts and the shared experts."""
    m, h = model.moe, model.hidden
    return h * m.experts + _mats(model) * h * (m.top_k * m.expert_ffn
                                               + m.shared_experts * m.shared_ffn)


def moe_params_delta(model: Any) -> int:
    """Parameters an MoE model has beyond the same model with dense MLPs everywhere."""
    if model.moe is None:
        return 0
    return moe_layer_count(model) * (moe_mlp_params(model) - dense_mlp_params(model))


def active_params(model: Any) -> int:
    """Parameters one token activates (module docstring); the total for a dense model."""
    if model.moe is None:
        return model.total_params()
    inactive = expert_params(model) - _mats(model) * model.hidden * model.moe.top_k * \
        model.moe.expert_ffn
    return model.total_params() - moe_layer_count(model) * inactive


def moe_flops_delta(model: Any, batch: int, seq_len: int | None = None) -> float:
    """Forward FLOPs an MoE model's layers do beyond the same model with dense MLPs:
    2 per active parameter per token in the MoE layers' MLP part minus the dense MLP's."""
    if model.moe is None:
        return 0.0
    s = model.seq_len if seq_len is None else seq_len
    tokens = batch * s
    dense = 2 * tokens * _mats(model) * model.hidden * model.ffn_hidden
    return float(moe_layer_count(model) * (2 * tokens * moe_active_mlp_params(model) - dense))


def _preset(name: str, L: int, h: int, a: int, kv: int, hd: int, V: int, f: int,
            moe: MoESpec, total: float, active: float, source: str,
            s: int = 4096) -> dict:
    return dict(name=name, family="llama", layers=L, hidden=h, heads=a, kv_heads=kv,
                head_size=hd, seq_len=s, vocab=V, ffn_hidden=f, dropout=0.0, moe=moe,
                source=source, extra={"published_params": total,
                                      "published_active_params": active})


_SEQ = "; training sequence 4096 as the NeMo / Megatron-Bridge benchmark rows use"
_QWEN = ("{0} (Qwen team, Qwen3 technical report 2025; HF config Qwen/{0}: hidden {1}, "
         "{2} layers, {3} heads of head_dim 128, 4 kv heads, 128 experts of "
         "moe_intermediate_size {4}, 8 per token, no shared expert, every layer MoE, "
         "vocab 151936, untied embeddings); {5} total / {6} active parameters published; "
         "the q/k RMSNorms (2 x 128 per layer) are not counted" + _SEQ)

#: ModelSpec fields of each MoE preset (:data:`merak_sim.model.MODEL_PRESETS` builds them).
MOE_PRESET_FIELDS: tuple[dict, ...] = (
    _preset("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 151936, 6144,
            MoESpec(experts=128, top_k=8, expert_ffn=768), 30.5e9, 3.3e9,
            _QWEN.format("Qwen3-30B-A3B", 2048, 48, 32, 768, "30.5B", "3.3B")),
    _preset("qwen3-235b-a22b", 94, 4096, 64, 4, 128, 151936, 12288,
            MoESpec(experts=128, top_k=8, expert_ffn=1536), 235e9, 22e9,
            _QWEN.format("Qwen3-235B-A22B", 4096, 94, 64, 1536, "235B", "22B")),
    _preset("gpt-oss-120b", 36, 2880, 64, 8, 64, 201088, 2880,
            MoESpec(experts=128, top_k=4, expert_ffn=2880), 116.8e9, 5.13e9,
            "GPT-OSS-120B (OpenAI gpt-oss model card, 2025; HF config openai/gpt-oss-120b: "
            "hidden 2880, 36 layers, 64 heads of head_dim 64, 8 kv heads, 128 experts of "
            "intermediate_size 2880, 4 per token, vocab 201088); 116.8B total / 5.13B "
            "active published; not expressed: the attention and expert biases, attention "
            "sinks and the banded (128-token sliding window) attention of every second "
            "layer, whose attention FLOPs are counted as full causal" + _SEQ),
    _preset("mixtral-8x7b", 32, 4096, 32, 8, 128, 32000, 14336,
            MoESpec(experts=8, top_k=2, expert_ffn=14336), 46.7e9, 12.9e9,
            "Mixtral-8x7B (Jiang et al. 2024, 'Mixtral of Experts', Table 1; HF config "
            "mistralai/Mixtral-8x7B-v0.1: hidden 4096, 32 layers, 32 heads, 8 kv heads, 8 "
            "experts of 14336, top-2, vocab 32000); 46.7B total / 12.9B active published"
            + _SEQ),
    _preset("mixtral-8x22b", 56, 6144, 48, 8, 128, 32768, 16384,
            MoESpec(experts=8, top_k=2, expert_ffn=16384), 141e9, 39e9,
            "Mixtral-8x22B (Mistral AI release note 2024; HF config mistralai/Mixtral-8x22B"
            "-v0.1: hidden 6144, 56 layers, 48 heads, 8 kv heads, 8 experts of 16384, "
            "top-2, vocab 32768); 141B total / 39B active published" + _SEQ),
    _preset("deepseek-v3", 61, 7168, 128, 128, 56, 129280, 18432,
            MoESpec(experts=256, top_k=8, expert_ffn=2048, shared_experts=1,
                    dense_layers=3, router="sigmoid"), 671e9, 37e9,
            "DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437, Sec. 4.2; HF config "
            "deepseek-ai/DeepSeek-V3: hidden 7168, 61 layers, the first 3 dense with "
            "intermediate 18432, 256 routed experts of 2048 with 8 per token and 1 shared "
            "expert, sigmoid router, vocab 129280); 671B total / 37B active published "
            "(the 14B multi-token-prediction module not included). Its multi-head latent "
            "attention (128 heads, q_lora_rank 1536, kv_lora_rank 512, qk head dim 128 + "
            "64 rotary, v head dim 128) is not expressible: modelled as 128-head MHA of "
            "head dim 56 (= 7168 / 128): 205.5M attention parameters per layer against "
            "MLA's 187.1M (+9.8 %), attention-core FLOPs under MLA's (its 192-wide scores "
            "and 128-wide values against 56)" + _SEQ),
)
