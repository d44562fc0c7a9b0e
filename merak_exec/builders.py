"""The models ``merak-exec train`` builds: from its shape flags, or from a plan's
:class:`~merak_sim.model.ModelSpec` with every field the simulator priced.

A plan's "gpt" model is the built-in GPT when its MLP width is a multiple of the hidden
size, else HuggingFace GPT-2 (``n_inner``); "llama" is HuggingFace LLaMA with the
plan's ``ffn_hidden`` (``intermediate_size``) and ``kv_heads`` (grouped-query
attention). :func:`parameter_count` of the result equals
:meth:`ModelSpec.total_params` (``merak-exec train --plan`` refuses otherwise).
"""

from __future__ import annotations

import torch
from torch import nn

from merak_exec.mesh import ExecError
from merak_sim.model import ModelSpec

__all__ = ["build_model", "model_from_spec", "parameter_count", "MODEL_KINDS"]

MODEL_KINDS = ("gpt", "gpt2", "llama")


def build_model(kind: str, layers: int, hidden: int, heads: int, vocab: int, seq: int,
                dropout: float, meta: bool, *, ffn_hidden: int | None = None,
                kv_heads: int | None = None, max_positions: int | None = None) -> nn.Module:
    """A ``kind`` model of this shape (``ffn_hidden`` default 4h, ``kv_heads`` default
    ``heads``, ``max_positions`` default ``seq``), on the meta device if ``meta``."""
    ffn = ffn_hidden or 4 * hidden
    kv = kv_heads or heads
    positions = max_positions or seq
    if kind not in MODEL_KINDS:
        raise ExecError(f"unknown model {kind!r}; choose {', '.join(MODEL_KINDS)}")
    if kind != "llama" and kv != heads:
        raise ExecError(f"{kind} has no grouped-query attention (kv_heads={kv}, "
                        f"heads={heads}); use llama")
    with torch.device("meta") if meta else torch.device("cpu"):
        if kind == "gpt" and ffn % hidden == 0:
            from merak_exec.models import GPT, GPTConfig

            return GPT(GPTConfig(vocab_size=vocab, n_positions=positions, n_embd=hidden,
                                 n_layer=layers, n_head=heads, ffn_mult=ffn // hidden,
                                 dropout=dropout))
        import transformers

        transformers.logging.set_verbosity_error()
        if kind in ("gpt", "gpt2"):
            from transformers import GPT2Config, GPT2LMHeadModel

            return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=positions,
                                              n_embd=hidden, n_layer=layers, n_head=heads,
                                              n_inner=ffn, resid_pdrop=dropout,
                                              embd_pdrop=dropout, attn_pdrop=dropout,
                                              bos_token_id=0, eos_token_id=0))
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden,
                                            intermediate_size=ffn, num_hidden_layers=layers,
                                            num_attention_heads=heads,
                                            num_key_value_heads=kv,
                                            max_position_embeddings=positions,
                                            bos_token_id=0, eos_token_id=0, pad_token_id=0))


def model_from_spec(spec: ModelSpec, dropout: float, meta: bool) -> nn.Module:
    """The model a plan's ``spec`` describes (family gpt or llama)."""
    if spec.family not in ("gpt", "llama"):
        raise ExecError(f"model family {spec.family!r} is simulate-only; merak-exec trains "
                        "gpt and llama plans")
    return build_model(spec.family, spec.layers, spec.hidden, spec.heads, spec.vocab,
                       spec.seq_len, dropout, meta, ffn_hidden=spec.ffn_hidden,
                       kv_heads=spec.kv_heads,
                       max_positions=spec.max_positions if spec.family == "gpt" else None)


def parameter_count(model: nn.Module) -> int:
    """Parameters of ``model``, tied ones counted once (meta tensors count too)."""
    return sum(p.numel() for p in model.parameters())
