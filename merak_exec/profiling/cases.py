"""What the validation loop measures: configurations of the built-in GPT, their data."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Case", "MeasureError", "small_gpt", "token_batches"]


class MeasureError(ValueError):
    """The measurement could not run (message names the problem and the fix)."""


def small_gpt(layers: int = 8, hidden: int = 128, heads: int = 4, vocab: int = 512,
              seq: int = 128) -> dict:
    """Built-in GPT settings for the CPU validation suite (a dict of GPTConfig fields)."""
    return {"vocab_size": vocab, "n_positions": seq, "n_embd": hidden, "n_layer": layers,
            "n_head": heads, "dropout": 0.0}


@dataclass(frozen=True)
class Case:
    """One configuration to validate.

    Attributes:
        name: directory name of its run.
        config: :class:`~merak_sim.config.ParallelConfig` fields (dict form).
        model: built-in GPT settings (:func:`small_gpt`).
    """

    name: str
    config: dict
    model: dict = field(default_factory=small_gpt)


def token_batches(model_cfg: dict, global_batch: int, steps: int, seed: int = 0
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` random (ids, labels) batches for a :func:`small_gpt` model; labels
    equal the ids (the loss shifts them). The draws, shapes and so the timings are
    those of the earlier next-token labels."""
    g = torch.Generator().manual_seed(seed)
    seq, vocab = model_cfg["n_positions"], model_cfg["vocab_size"]
    out = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (global_batch, seq + 1), generator=g)
        ids = ids[:, :-1].contiguous()
        out.append((ids, ids.clone()))
    return out
