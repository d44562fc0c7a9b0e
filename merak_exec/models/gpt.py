"""The built-in GPT: a GPT-2 style decoder written for this project.

Token + learned position embedding, ``n_layer`` pre-LayerNorm blocks (causal
self-attention, then a GELU MLP, each added to the residual stream), a final
LayerNorm and an LM head tied to the token embedding (Radford et al. 2019, "Language
Models are Unsupervised Multitask Learners", section 2.3: LayerNorm moved to the
input of each sub-block, an extra LayerNorm after the last block).

The model is laid out as a flat chain of *layers* so the pipeline runtime can cut it
anywhere between blocks without tracing: :meth:`GPT.layers` returns
``[embedding, block_0, ..., block_{L-1}, head]`` where only the residual stream
(a ``[batch, seq, hidden]`` tensor) crosses each boundary. The head holds the final
LayerNorm and projects with the (tied) embedding weight.

Attention projections are separate ``q_proj``/``k_proj``/``v_proj``/``o_proj`` linear
layers and the MLP is ``fc_in``/``fc_out`` so tensor parallelism can shard them by
module name (column-parallel q/k/v/fc_in, row-parallel o_proj/fc_out); the number of
heads a block runs is ``attn.n_head`` which tensor parallelism divides by tp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPTConfig", "GPT", "Embedding", "Block", "Head", "Attention", "MLP"]


@dataclass(frozen=True, kw_only=True, slots=True)
class GPTConfig:
    """Shape of the built-in GPT.

    Attributes:
        vocab_size: token vocabulary.
        n_positions: maximum sequence length (learned position table size).
        n_embd: hidden size.
        n_layer: transformer blocks.
        n_head: attention heads (must divide n_embd).
        ffn_mult: MLP inner size is ``ffn_mult * n_embd`` (4 for GPT-2).
        dropout: dropout probability on embeddings, attention output and MLP output.
        layer_norm_eps: LayerNorm epsilon.
        tie_embeddings: LM head reuses the token-embedding weight.
    """

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    ffn_mult: int = 4
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "ffn_mult"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {v!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig: n_head={self.n_head} does not divide n_embd={self.n_embd}; "
                "pick a head count that divides the hidden size"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must lie in [0, 1), got {self.dropout}")

    @property
    def ffn_hidden(self) -> int:
        """MLP inner size."""
        return self.ffn_mult * self.n_embd

    def num_params(self) -> int:
        """Parameter count (tied head counted once)."""
        h, L, V, P = self.n_embd, self.n_layer, self.vocab_size, self.n_positions
        block = 4 * h * h + 4 * h + 2 * h * self.ffn_hidden + self.ffn_hidden + h + 4 * h
        head = 2 * h + (0 if self.tie_embeddings else V * h)
        return V * h + P * h + L * block + head


class Embedding(nn.Module):
    """Token + position embedding (+ dropout): input ids -> residual stream."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[b, s]`` int64 -> ``[b, s, h]``."""
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.drop(self.wte(input_ids) + self.wpe(pos))


class Attention(nn.Module):
    """Causal multi-head self-attention with separate q/k/v/o projections."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        h = cfg.n_embd
        self.n_head = cfg.n_head
        self.head_dim = h // cfg.n_head
        self.q_proj = nn.Linear(h, h)
        self.k_proj = nn.Linear(h, h)
        self.v_proj = nn.Linear(h, h)
        self.o_proj = nn.Linear(h, h)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, h]`` -> ``[b, s, h]``; heads = ``self.n_head`` (divided under TP)."""
        b, s, _ = x.shape
        nh, hd = self.n_head, self.head_dim

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, nh, hd).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.o_proj(y.transpose(1, 2).reshape(b, s, nh * hd))


class MLP(nn.Module):
    """Two-layer GELU MLP (tanh approximation as in GPT-2)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(cfg.n_embd, cfg.ffn_hidden)
        self.fc_out = nn.Linear(cfg.ffn_hidden, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, h]`` -> ``[b, s, h]``."""
        return self.fc_out(F.gelu(self.fc_in(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.attn = Attention(cfg)
        self.drop_1 = nn.Dropout(cfg.dropout)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)
        self.drop_2 = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual stream in, residual stream out."""
        x = x + self.drop_1(self.attn(self.ln_1(x)))
        return x + self.drop_2(self.mlp(self.ln_2(x)))


class Head(nn.Module):
    """Final LayerNorm and LM projection. ``weight`` is the tied embedding or its own."""

    def __init__(self, cfg: GPTConfig, tied: nn.Embedding | None) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if tied is not None:
            self.lm_head.weight = tied.weight  # tie: one Parameter, two users

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, h]`` -> logits ``[b, s, V]``."""
        return self.lm_head(self.ln_f(x))


class GPT(nn.Module):
    """GPT-2 style language model; ``forward(ids)`` returns logits (the loss is
    :func:`lm_loss`, the mean next-token cross-entropy)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.head = Head(cfg, self.embed.wte if cfg.tie_embeddings else None)
        self.apply(self.init_weights)
        # GPT-2 scales residual projections by 1/sqrt(2L) so the stream's variance
        # does not grow with depth (Radford et al. 2019, section 2.3).
        for blk in self.blocks:
            for lin in (blk.attn.o_proj, blk.mlp.fc_out):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def init_weights(m: nn.Module) -> None:
        """GPT-2's initialisation of one module (normal 0.02 weights, zero biases)."""
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def layers(self) -> list[nn.Module]:
        """The chain ``[embed, block_0 .. block_{L-1}, head]`` the pipeline cuts."""
        return [self.embed, *self.blocks, self.head]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token ids ``[b, s]`` -> logits ``[b, s, V]``."""
        x = self.embed(input_ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def shift_labels(labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Next-token targets of ``labels [b, s]`` aligned with the input ids: position i
    gets label i+1, the last position ``ignore_index`` (HuggingFace's causal-LM loss
    pads then shifts the labels the same way, so the logits are never sliced)."""
    pad = torch.full_like(labels[..., :1], ignore_index)
    return torch.cat([labels[..., 1:], pad], dim=-1)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``logits [b, s, V]`` against ``labels [b, s]``
    aligned with the input ids (HuggingFace's convention: ``labels = input_ids`` works,
    the shift happens here; -100 entries are ignored)."""
    target = shift_labels(labels)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1),
                           ignore_index=-100)


__all__ += ["lm_loss", "shift_labels"]
