"""Models written in this project (the built-in GPT)."""

from merak_exec.models.gpt import GPT, GPTConfig, lm_loss, shift_labels

__all__ = ["GPT", "GPTConfig", "lm_loss", "shift_labels"]
