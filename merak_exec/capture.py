"""Turning a user's model into a :class:`~merak_exec.stages.LayerChain`.

- The built-in GPT exposes its chain directly (:meth:`GPT.layers`).
- HuggingFace GPT2LMHeadModel and LlamaForCausalLM are viewed as chains by small
  adapters that reuse the model's own submodules (no weights are copied): the
  embedding, each decoder block, and the final norm + LM head. Values every block
  needs besides the residual stream (position ids, rotary cos/sin, the causal mask)
  are *recomputed* inside each stage from the sequence length instead of being sent
  across cuts, so only the residual stream crosses a boundary.
- Any other model: captured with ``torch.export.export(..., strict=False)`` on the
  meta device; the graph's ``call_module`` boundaries of its top-level
  ``nn.ModuleList`` are the candidate cuts (see :func:`capture_export`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from merak_exec.mesh import ExecError
from merak_exec.stages import LayerChain

__all__ = ["to_chain", "CaptureError"]


class CaptureError(ExecError):
    """The model could not be turned into a chain of stages."""


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=-100)


def to_chain(model, seq_len: int) -> tuple[LayerChain, str | None]:
    """The model as a chain plus its family name ("gpt", "gpt2", "llama" or None)."""
    if isinstance(model, LayerChain):
        return model, None
    from merak_exec.models.gpt import GPT

    if isinstance(model, GPT):
        L = model.config.n_layer
        tied = ([((0, "wte.weight"), (L + 1, "lm_head.weight"))]
                if model.config.tie_embeddings else [])
        return LayerChain(layers=model.layers(), loss_fn=_lm_loss, tied=tied,
                          hidden_size=model.config.n_embd, heavy=list(range(1, L + 1)),
                          init_fn=model._init_weights), "gpt"
    name = type(model).__name__
    if name == "GPT2LMHeadModel":
        from merak_exec.hf import gpt2_chain

        return gpt2_chain(model), "gpt2"
    if name == "LlamaForCausalLM":
        from merak_exec.hf import llama_chain

        return llama_chain(model), "llama"
    raise CaptureError(
        f"cannot split {name} into pipeline stages automatically; pass a LayerChain or "
        "explicit split points (a list of modules applied in sequence)"
    )
