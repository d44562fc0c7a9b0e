"""HuggingFace GPT2LMHeadModel and LlamaForCausalLM as layer chains (no downloads).

The adapters wrap the model's own submodules (no weight copies). Values each block
needs besides the residual stream, the causal mask (built by transformers'
``create_causal_mask`` exactly as the model builds it), position ids and LLaMA's
rotary cos/sin, are recomputed inside each stage from the sequence length, so only
the residual stream crosses a pipeline cut (Merak's "broadcast values", computed
locally instead of being threaded through the shards).
"""

from __future__ import annotations

import torch
from torch import nn

from merak_exec.models.gpt import lm_loss
from merak_exec.stages import LayerChain

__all__ = ["gpt2_chain", "llama_chain"]


def _causal_mask(config, h: torch.Tensor, pos: torch.Tensor):
    from transformers.masking_utils import create_causal_mask

    return create_causal_mask(config=config, inputs_embeds=h, attention_mask=None,
                              cache=None, position_ids=pos)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _hf_init(model):
    """The model's own per-module initialiser (used for meta-device materialisation)."""
    def init(m: nn.Module) -> None:
        if isinstance(m, LlamaBlockStage):
            m.materialize_rotary(next(m.parameters()).device, model._init_weights)
        model._init_weights(m)

    return init


class GPT2Embedding(nn.Module):
    """wte(ids) + wpe(positions), dropout."""

    def __init__(self, tr) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = tr.wte, tr.wpe, tr.drop

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> residual stream."""
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        return self.drop(self.wte(ids) + self.wpe(pos))


class GPT2BlockStage(nn.Module):
    """One GPT2Block with its causal mask rebuilt locally."""

    def __init__(self, block: nn.Module, config) -> None:
        super().__init__()
        self.block = block
        self._config = config

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Residual stream in and out."""
        pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        return _first(self.block(h, attention_mask=_causal_mask(self._config, h, pos)))


class NormHead(nn.Module):
    """Final norm then LM head."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Residual stream -> logits."""
        return self.lm_head(self.norm(h))


def gpt2_chain(model) -> LayerChain:
    """GPT2LMHeadModel -> [embedding, block_0..block_{L-1}, ln_f + lm_head]."""
    tr, cfg = model.transformer, model.config
    layers = [GPT2Embedding(tr), *(GPT2BlockStage(b, cfg) for b in tr.h),
              NormHead(tr.ln_f, model.lm_head)]
    L = len(tr.h)
    tied = ([((0, "wte.weight"), (L + 1, "lm_head.weight"))]
            if model.lm_head.weight is tr.wte.weight else [])
    return LayerChain(layers=layers, loss_fn=lm_loss, tied=tied, hidden_size=cfg.n_embd,
                      heavy=list(range(1, L + 1)), init_fn=_hf_init(model))


class LlamaEmbedding(nn.Module):
    """embed_tokens(ids)."""

    def __init__(self, emb: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = emb

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> residual stream."""
        return self.embed_tokens(ids)


class LlamaBlockStage(nn.Module):
    """One LlamaDecoderLayer with its mask and rotary cos/sin rebuilt locally."""

    def __init__(self, layer: nn.Module, rotary: nn.Module, config) -> None:
        super().__init__()
        self.layer = layer
        self._rotary = [rotary]  # a list: shared, not registered once per block
        self._config = config

    def materialize_rotary(self, device: torch.device, init) -> None:
        """Give a meta-device rotary embedding real buffers, recomputed by the model's
        own initialiser (they are functions of the config, never loaded)."""
        rot = self._rotary[0]
        if rot.inv_freq.is_meta:
            rot.to_empty(device=device)
            init(rot)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Residual stream in and out."""
        pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        rot = self._rotary[0]
        if rot.inv_freq.device != h.device:
            rot.to(h.device)
        pe = rot(h, position_ids=pos)
        return _first(self.layer(h, attention_mask=_causal_mask(self._config, h, pos),
                                 position_ids=pos, position_embeddings=pe))


def llama_chain(model) -> LayerChain:
    """LlamaForCausalLM -> [embed_tokens, decoder layers, norm + lm_head]."""
    m, cfg = model.model, model.config
    layers = [LlamaEmbedding(m.embed_tokens),
              *(LlamaBlockStage(layer, m.rotary_emb, cfg) for layer in m.layers),
              NormHead(m.norm, model.lm_head)]
    L = len(m.layers)
    tied = ([((0, "embed_tokens.weight"), (L + 1, "lm_head.weight"))]
            if model.lm_head.weight is m.embed_tokens.weight else [])
    return LayerChain(layers=layers, loss_fn=lm_loss, tied=tied, hidden_size=cfg.hidden_size,
                      heavy=list(range(1, L + 1)), init_fn=_hf_init(model))
