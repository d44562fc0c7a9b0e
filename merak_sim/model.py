"""ModelSpec: the shape of a transformer, its parameter and FLOP counts, and presets.

Families
--------
- ``gpt``: GPT-2 / Megatron GPT. Pre-LayerNorm blocks with biases, learned position
  embeddings, GELU MLP (``ffn_hidden`` default 4h), LM head tied to the word embedding.
- ``llama``: LLaMA-style. RMSNorm without bias, rotary positions (no position
  table), SwiGLU MLP (three h x f matrices), grouped-query attention (``kv_heads``),
  untied LM head.
- ``bert``: BERT encoder. Post-LN blocks shaped like GPT's (biases, GELU, 4h MLP),
  word + position (512) + token-type (2) embeddings with a LayerNorm, a pooler; the
  masked-LM head is not counted (the published counts are of BertModel).

Parameter counts (per transformer layer; d = head dim = h / heads, kv = kv_heads * d)
-----------------------------------------------------------------------------------
- attention: h*(h + 2 kv) QKV weights + h*h output projection, plus biases
  (h + 2 kv) + h for gpt/bert.
- MLP: 2*h*f (+ f + h biases) for GELU; 3*h*f for SwiGLU.
- norms: 2 LayerNorms = 4h (gpt/bert), 2 RMSNorms = 2h (llama).
For gpt with f = 4h this is 12h^2 + 13h per layer (Narayanan et al., SC'21, eq. for P).

FLOPs (model FLOPs, multiply-add = 2, causal masking not discounted, as Megatron counts)
------------------------------------------------------------------------------------
Forward of one layer on B sequences of length s:
  2Bs*h*(h + 2kv) QKV + 2Bs^2*h scores + 2Bs^2*h attention x V + 2Bs*h^2 projection
  + 2Bs*h*f*(2 or 3) MLP; for gpt (kv = h, f = 4h): 24Bsh^2 + 4Bs^2h.
LM head (logits): 2BshV. Backward = 2 x forward. So for GPT one training iteration is
  3 * (L(24Bsh^2 + 4Bs^2h) + 2BshV) = 72BLsh^2 (1 + s/(6h) + V/(12hL)),
Megatron's model-FLOPs formula (Narayanan et al., SC'21, Sec. 5.1, without the
recompute term); :meth:`ModelSpec.training_flops` returns exactly that.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from merak_sim.moe import (
    MOE_PRESET_FIELDS,
    MoESpec,
    active_params,
    moe_flops_delta,
    moe_params_delta,
)

__all__ = ["ModelSpec", "ModelSpecError", "MODEL_PRESETS", "get_model", "list_models",
           "FAMILIES"]

FAMILIES = ("gpt", "llama", "bert")
_DTYPES = ("bf16", "fp16", "fp32")


class ModelSpecError(ValueError):
    """A model description is invalid or unknown (the message names field and value)."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of a transformer model.

    Attributes:
        name: preset name or a user label.
        family: "gpt", "llama" or "bert" (see module docstring).
        layers, hidden, heads: L, h, a.
        seq_len: training sequence length s.
        vocab: vocabulary size V as used in the embedding (already padded if padding
            is wanted).
        ffn_hidden: MLP inner size f (default 4h; LLaMA presets give theirs).
        kv_heads: key/value heads for grouped-query attention (default = heads).
        max_positions: size of the learned position table (gpt: seq_len, bert: 512,
            llama: 0, rotary).
        dtype: default training precision (bf16, fp16 or fp32).
        dropout: dropout probability used in training (0 disables the masks).
        source: where the shape comes from.
        head_size: per-head width when it is not hidden / heads (Qwen3, GPT-OSS,
            Mixtral: 128 or 64); 0 = hidden / heads. Queries are heads x head_size wide.
        moe: the mixture-of-experts layers (:class:`merak_sim.moe.MoESpec`; None:
            dense). FLOPs, parameters and MFU then count active parameters
            (:mod:`merak_sim.moe`).
    """

    name: str
    family: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn_hidden: int = 0
    kv_heads: int = 0
    max_positions: int = -1
    dtype: str = "bf16"
    dropout: float = 0.1
    source: str = ""
    head_size: int = 0
    moe: MoESpec | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        # Defaults that depend on other fields; object.__setattr__ because frozen.
        try:
            object.__setattr__(self, "moe", MoESpec.from_value(self.moe))
        except ValueError as e:
            raise ModelSpecError(str(e)) from None
        if self.ffn_hidden == 0:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.max_positions == -1:
            mp = {"gpt": self.seq_len, "bert": 512}.get(self.family, 0)
            object.__setattr__(self, "max_positions", mp)
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise :class:`ModelSpecError` naming the offending field and value."""
        if self.family not in FAMILIES:
            raise ModelSpecError(
                f"model family {self.family!r} unknown; choose one of: {', '.join(FAMILIES)}")
        for f in ("layers", "hidden", "heads", "seq_len", "vocab", "ffn_hidden", "kv_heads"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ModelSpecError(f"model field {f} must be a positive integer, got {v!r}")
        if not isinstance(self.max_positions, int) or self.max_positions < 0:
            raise ModelSpecError(
                f"model field max_positions must be >= 0, got {self.max_positions!r}")
        if not isinstance(self.head_size, int) or self.head_size < 0:
            raise ModelSpecError(f"model field head_size must be >= 0, got {self.head_size!r}")
        if self.moe is not None and self.moe.dense_layers >= self.layers:
            raise ModelSpecError(f"moe dense_layers {self.moe.dense_layers} leaves no MoE "
                                 f"layer of the {self.layers}")
        if self.hidden % self.heads and not self.head_size:
            raise ModelSpecError(
                f"model hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ModelSpecError(
                f"model heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.dtype not in _DTYPES:
            raise ModelSpecError(
                f"model dtype {self.dtype!r} unknown; choose one of: {', '.join(_DTYPES)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ModelSpecError(f"model dropout must lie in [0, 1), got {self.dropout}")
        if self.family == "bert" and self.seq_len > self.max_positions:
            raise ModelSpecError(
                f"model seq_len {self.seq_len} exceeds max_positions {self.max_positions}")

    def check_tp(self, tp: int) -> None:
        """Raise :class:`ModelSpecError` if tensor parallelism ``tp`` cannot split this
        model (heads, kv heads, ffn and vocabulary must divide; vocab is padded by
        Megatron, so only heads/kv_heads/ffn/hidden are hard requirements)."""
        if tp < 1:
            raise ModelSpecError(f"tp must be a positive integer, got {tp}")
        if self.heads % tp:
            raise ModelSpecError(f"tp={tp} does not divide {self.heads} attention heads")
        if self.kv_heads % tp and tp % self.kv_heads:
            raise ModelSpecError(f"tp={tp} does not divide {self.kv_heads} kv heads")
        if self.hidden % tp:
            raise ModelSpecError(f"tp={tp} does not divide hidden {self.hidden}")
        if self.ffn_hidden % tp:
            raise ModelSpecError(f"tp={tp} does not divide ffn_hidden {self.ffn_hidden}")

    def check_pp(self, pp: int, virtual_stages: int = 1) -> None:
        """Raise :class:`ModelSpecError` if there are fewer layers than model stages."""
        n = pp * virtual_stages
        if n > self.layers:
            raise ModelSpecError(
                f"pp={pp} x virtual stages {virtual_stages} = {n} stages exceeds the "
                f"model's {self.layers} layers")

    # ------------------------------------------------------------------ shape
    @property
    def head_dim(self) -> int:
        """Per-head width: ``head_size``, or h / a."""
        return self.head_size or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output): heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    def kv_dim_per_rank(self, tp: int = 1) -> float:
        """K (or V) width one GPU of a TP group of ``tp`` holds: kv / tp while tp
        divides the kv heads, one whole head (replicated) when tp exceeds them
        (Megatron's grouped-query attention with tp > kv heads)."""
        return max(self.kv_heads / tp, 1.0) * self.head_dim

    @property
    def gated_mlp(self) -> bool:
        """True for SwiGLU (three MLP matrices)."""
        return self.family == "llama"

    @property
    def has_bias(self) -> bool:
        """Linear layers and norms carry biases (gpt, bert) or not (llama)."""
        return self.family != "llama"

    @property
    def tied_embeddings(self) -> bool:
        """LM head shares the word-embedding matrix (gpt, bert)."""
        return self.family != "llama"

    @property
    def causal(self) -> bool:
        """Decoder (True) or encoder (False)."""
        return self.family != "bert"

    # ------------------------------------------------------------------ params
    def layer_params(self) -> int:
        """Parameters of one transformer layer (module docstring)."""
        h, f, kv, q = self.hidden, self.ffn_hidden, self.kv_dim, self.q_dim
        attn = h * (q + 2 * kv) + q * h
        mlp = (3 if self.gated_mlp else 2) * h * f
        if self.has_bias:
            attn += (q + 2 * kv) + h
            mlp += f + h
            norms = 4 * h
        else:
            norms = 2 * h
        return attn + mlp + norms

    def layer_params_sharded(self) -> int:
        """Parameters of one layer that tensor parallelism divides (matrices and the
        biases of column-parallel layers); the rest (norms, row-parallel biases) is
        replicated on every TP rank."""
        return self.layer_params() - self.layer_params_replicated()

    def layer_params_replicated(self) -> int:
        """Parameters of one layer kept whole on every TP rank."""
        h = self.hidden
        if self.has_bias:
            return 4 * h + 2 * h  # two LayerNorms + the two row-parallel output biases
        return 2 * h

    def embedding_params(self) -> int:
        """Input embedding: words (V x h, vocab-parallel under TP) plus the position
        table (and BERT's token types and embedding LayerNorm)."""
        p = self.vocab * self.hidden + self.max_positions * self.hidden
        if self.family == "bert":
            p += 2 * self.hidden + 2 * self.hidden
        return p

    def head_params(self) -> int:
        """Parameters after the last layer: final norm, untied LM head (llama) and
        BERT's pooler. A tied head adds no parameters."""
        h = self.hidden
        if self.family == "gpt":
            return 2 * h
        if self.family == "llama":
            return h + self.vocab * h
        return h * h + h  # bert pooler; BertModel has no final norm

    def total_params(self) -> int:
        """All parameters (tied weights counted once; every expert of an MoE model)."""
        return self.layers * self.layer_params() + self.embedding_params() + \
            self.head_params() + moe_params_delta(self)

    def active_params(self) -> int:
        """Parameters one token activates (:func:`merak_sim.moe.active_params`)."""
        return active_params(self)

    # ------------------------------------------------------------------ flops
    def layer_forward_flops(self, batch: int, seq_len: int | None = None) -> float:
        """Forward model FLOPs of one layer on ``batch`` sequences."""
        s = self.seq_len if seq_len is None else seq_len
        h, f, kv, q = self.hidden, self.ffn_hidden, self.kv_dim, self.q_dim
        t = batch * s
        qkv = 2 * t * h * (q + 2 * kv)
        attn = 2 * 2 * batch * s * s * q
        proj = 2 * t * q * h
        mlp = 2 * t * h * f * (3 if self.gated_mlp else 2)
        return float(qkv + attn + proj + mlp)

    def logits_forward_flops(self, batch: int, seq_len: int | None = None) -> float:
        """Forward FLOPs of the LM head (2BshV)."""
        s = self.seq_len if seq_len is None else seq_len
        return float(2 * batch * s * self.hidden * self.vocab)

    def forward_flops(self, batch: int, seq_len: int | None = None) -> float:
        """Forward FLOPs of the whole model (layers + LM head; an MoE model's active
        experts, :func:`merak_sim.moe.moe_flops_delta`)."""
        return self.layers * self.layer_forward_flops(batch, seq_len) + \
            self.logits_forward_flops(batch, seq_len) + moe_flops_delta(self, batch, seq_len)

    def training_flops(self, batch: int, seq_len: int | None = None) -> float:
        """Model FLOPs of one training step (forward + backward = 3 x forward, no
        recompute). For gpt this equals 72BLsh^2(1 + s/(6h) + V/(12hL))."""
        return 3.0 * self.forward_flops(batch, seq_len)

    # ------------------------------------------------------------------ io
    def with_(self, **changes: Any) -> ModelSpec:
        """A copy with some fields changed (validated)."""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-ready dict (the keys :meth:`from_json` accepts)."""
        d = asdict(self)
        d.pop("extra")
        # Dense models keep their pre-MoE keys (saved plans and goldens compare them).
        for k, unset in (("moe", None), ("head_size", 0)):
            if d[k] == unset:
                d.pop(k)
        return d

    @staticmethod
    def from_json(src: str | Path | dict) -> ModelSpec:
        """Build from a dict, a JSON string or a JSON file path.

        Required keys: family, layers, hidden, heads, seq_len, vocab. Optional:
        ffn_hidden (default 4*hidden), kv_heads (default heads), name, max_positions,
        dtype, dropout, source. Unknown keys are an error naming the key.
        """
        if isinstance(src, dict):
            d = dict(src)
        else:
            text = str(src)
            if not text.lstrip().startswith("{"):
                p = Path(text)
                try:
                    text = p.read_text(encoding="utf-8")
                except OSError as e:
                    raise ModelSpecError(f"cannot read model file {p}: {e.strerror}") from None
            try:
                d = json.loads(text)
            except json.JSONDecodeError as e:
                raise ModelSpecError(f"model JSON is malformed: {e}") from None
            if not isinstance(d, dict):
                raise ModelSpecError("model JSON must be an object")
        missing = [k for k in ("family", "layers", "hidden", "heads", "seq_len", "vocab")
                   if k not in d]
        if missing:
            raise ModelSpecError(f"model JSON lacks required field(s): {', '.join(missing)}")
        known = set(ModelSpec.__dataclass_fields__) - {"extra"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ModelSpecError(f"model JSON has unknown field(s): {', '.join(unknown)}")
        d.setdefault("name", "custom")
        return ModelSpec(**d)


def _gpt(name: str, L: int, h: int, a: int, s: int = 1024, V: int = 50257,
         source: str = "", **kw: Any) -> ModelSpec:
    return ModelSpec(name=name, family="gpt", layers=L, hidden=h, heads=a, seq_len=s,
                     vocab=V, source=source, **kw)


_MERAK = ("Merak (Lai et al., TPDS 2023) paper model; shape is an assumption "
          "(not stated in the paper)")
_VTRAIN = ("vTrain ground truth (Bang et al., MICRO 2024; data/vtrain); vocab "
           "51200 (Megatron's padded GPT-2 BPE) is an assumption")

_MPT = ("MPT as llm-foundry benchmarks it (MosaicML llm-foundry scripts/train/yamls/"
        "pretrain/mpt-*.yaml: d_model, n_heads, n_layers, expansion ratio 4, vocab 50368, "
        "sequence 2048); parameters = the benchmark table's NumParams at sequence 2048")
#: (size, layers, hidden, heads, NumParams of llm-foundry's benchmark table).
_MPT_SHAPES = (("1b", 24, 2048, 16, 1_315_950_592), ("3b", 32, 2560, 20, 2_651_837_440),
               ("7b", 32, 4096, 32, 6_658_859_008), ("13b", 40, 5120, 40, 12_853_954_560),
               ("30b", 48, 7168, 56, 29_975_214_080), ("70b", 80, 8192, 64, 64_862_437_376))
_NEMO_GPT = ("NeMo GPT-3 {0} (NVIDIA NeMo nemo/collections/llm/gpt/model/base.py "
             "GPTConfig{0}); vocab 51200 (padded GPT-2 BPE) is an assumption")


def _llama(name: str, L: int, h: int, a: int, kv: int, f: int, params: float,
           source: str, s: int = 8192, V: int = 128256) -> ModelSpec:
    return ModelSpec(name=name, family="llama", layers=L, hidden=h, heads=a, kv_heads=kv,
                     seq_len=s, vocab=V, ffn_hidden=f, dropout=0.0, source=source,
                     extra={"published_params": params})


#: Presets by name. Each carries its source and, in ``extra['published_params']``, the
#: published size its parameter count is checked against.
MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m for m in [
        _gpt("gpt-1.5b", 48, 1600, 25, source=_MERAK + "; = GPT-2 XL (Radford et al. "
             "2019), whose released checkpoint has 1,557,611,200 parameters (the paper's "
             "Table 2 rounds it to 1542M, the name to 1.5B)",
             extra={"published_params": 1.5576e9}),
        _gpt("gpt-2.5b", 54, 1920, 20, source=_MERAK, extra={"published_params": 2.5e9}),
        _gpt("gpt-8.3b", 72, 3072, 32, source=_MERAK + "; = Megatron-LM 8.3B "
             "(Shoeybi et al. 2019, Table 1: h 3072, L 72, 32 heads)",
             extra={"published_params": 8.3e9}),
        _gpt("gpt-20b", 44, 6144, 64, source=_MERAK, extra={"published_params": 20e9}),
        _gpt("vtrain-3.6b", 30, 3072, 32, s=2048, V=51200, source=_VTRAIN,
             extra={"published_params": 3.6e9}),
        _gpt("vtrain-18.4b", 40, 6144, 48, s=2048, V=51200, source=_VTRAIN,
             extra={"published_params": 18.4e9}),
        _gpt("vtrain-39.1b", 48, 8192, 64, s=2048, V=51200, source=_VTRAIN,
             extra={"published_params": 39.1e9}),
        _gpt("vtrain-175b", 96, 12288, 96, s=2048, V=51200, source=_VTRAIN,
             extra={"published_params": 175e9}),
        _gpt("gpt3-175b", 96, 12288, 96, s=2048, V=50257,
             source="GPT-3 175B (Brown et al. 2020, Table 2.1: L 96, h 12288, 96 heads, "
                    "context 2048; 175.0B parameters)",
             extra={"published_params": 175.0e9}),
        ModelSpec(name="llama2-7b", family="llama", layers=32, hidden=4096, heads=32,
                  seq_len=4096, vocab=32000, ffn_hidden=11008, dropout=0.0,
                  source="LLaMA-2 7B (Touvron et al. 2023; HF config meta-llama/Llama-2-7b"
                         "-hf: h 4096, L 32, 32 heads, ffn 11008, vocab 32000); 6.74B params",
                  extra={"published_params": 6.74e9}),
        ModelSpec(name="llama2-13b", family="llama", layers=40, hidden=5120, heads=40,
                  seq_len=4096, vocab=32000, ffn_hidden=13824, dropout=0.0,
                  source="LLaMA-2 13B (Touvron et al. 2023; HF config: h 5120, L 40, 40 "
                         "heads, ffn 13824, vocab 32000); 13.0B params",
                  extra={"published_params": 13.0e9}),
        ModelSpec(name="llama2-70b", family="llama", layers=80, hidden=8192, heads=64,
                  kv_heads=8, seq_len=4096, vocab=32000, ffn_hidden=28672, dropout=0.0,
                  source="LLaMA-2 70B (Touvron et al. 2023; HF config: h 8192, L 80, 64 "
                         "heads, 8 kv heads (GQA), ffn 28672, vocab 32000); 69.0B params",
                  extra={"published_params": 68.98e9}),
        ModelSpec(name="llama3-405b-like", family="llama", layers=126, hidden=16384,
                  heads=128, kv_heads=8, seq_len=8192, vocab=128256, ffn_hidden=53248,
                  dropout=0.0,
                  source="LLaMA-3.1 405B shape (Meta's HF config meta-llama/Llama-3.1-"
                         "405B: h 16384, L 126, 128 heads, 8 kv heads (GQA), ffn 53248, "
                         "vocab 128256); sequence 8192; about 405.9B parameters",
                  extra={"published_params": 405.9e9}),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 8.03e9, "LLaMA-3 / 3.1 8B (Meta's HF "
               "config meta-llama/Meta-Llama-3-8B: h 4096, L 32, 32 heads, 8 kv heads, ffn "
               "14336, vocab 128256); sequence 8192; 8.03B parameters"),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 70.55e9, "LLaMA-3 / 3.1 70B (Meta's HF "
               "config meta-llama/Meta-Llama-3-70B: h 8192, L 80, 64 heads, 8 kv heads, ffn "
               "28672, vocab 128256); sequence 8192; 70.55B parameters"),
        *(_gpt(f"mpt-{n}", L, h, a, s=2048, V=50368, source=_MPT, extra={"published_params": p})
          for n, L, h, a, p in _MPT_SHAPES),
        _gpt("nemo-gpt3-5b", 24, 4096, 32, s=2048, V=51200, source=_NEMO_GPT.format("5B"),
             extra={"published_params": 5e9}),
        _gpt("nemo-gpt3-20b", 44, 6144, 48, s=2048, V=51200, source=_NEMO_GPT.format("20B"),
             extra={"published_params": 20e9}),
        *(ModelSpec(**kw) for kw in MOE_PRESET_FIELDS),
        ModelSpec(name="bert-large", family="bert", layers=24, hidden=1024, heads=16,
                  seq_len=512, vocab=30522,
                  source="BERT-large (Devlin et al. 2019: L 24, h 1024, 16 heads; "
                         "published '340M' rounded; BertModel has 335,141,888)",
                  extra={"published_params": 335.14e6}),
    ]
}


def list_models() -> list[str]:
    """Names of the model presets."""
    return sorted(MODEL_PRESETS)


def get_model(name: str | Path | dict) -> ModelSpec:
    """A preset by name, or a model from a JSON file / dict (see
    :meth:`ModelSpec.from_json`)."""
    if isinstance(name, dict):
        return ModelSpec.from_json(name)
    key = str(name)
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    if key.endswith(".json") or key.lstrip().startswith("{") or Path(key).is_file():
        return ModelSpec.from_json(key)
    raise ModelSpecError(
        f"unknown model preset {key!r}; choose one of: {', '.join(list_models())} "
        f"or give a JSON file")
