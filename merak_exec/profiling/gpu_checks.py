"""Checks one accelerator can make beyond the step-time validation.

- :func:`amp_check`: one training step of the built-in GPT through
  :func:`~merak_exec.parallel.parallelize` in fp32 and under bf16 autocast (fp32
  master weights), same initial weights and batch: the two losses agree within
  :data:`AMP_REL_TOL`, and both runs' parameters stay fp32.
- :func:`memory_check`: the activation bytes one transformer block keeps for its
  backward, with no recompute and with selective recompute (the attention core
  recomputed), measured against merak_sim's memory model
  (:func:`merak_sim.memory.layer_activation_bytes`) for the same shape. On CUDA the
  measure is ``torch.cuda.memory_allocated`` after the forward minus before it, less
  the block's output (the next layer's saved input), and the attention runs through
  SDPA's flash kernel (the model's "flash" profile); the peak of forward plus backward
  (``torch.cuda.max_memory_allocated``) is reported beside it. On CPU (the dry run)
  the measure is the saved-tensor count the CPU suite uses
  (:func:`~merak_exec.profiling.saved_tensors.saved_tensor_bytes`, the model's
  "cpu-eager" profile).

Both are small and run in seconds on an H200.
"""

from __future__ import annotations

import torch

from merak_sim.memory import CPU_EAGER, FLASH, layer_activation_bytes
from merak_sim.model import ModelSpec

__all__ = ["AMP_REL_TOL", "MEMORY_REL_TOL", "amp_check", "memory_check", "gpt_spec"]

#: bf16 autocast loss vs fp32 loss after one step (bf16 keeps 8 mantissa bits)
AMP_REL_TOL = 2e-2
#: measured block activations vs the memory model
MEMORY_REL_TOL = 0.15


def gpt_spec(model_cfg: dict, dtype: str) -> ModelSpec:
    """The merak_sim shape of a built-in GPT configuration (GPTConfig fields)."""
    return ModelSpec(name="gpt-check", family="gpt", layers=model_cfg["n_layer"],
                     hidden=model_cfg["n_embd"], heads=model_cfg["n_head"],
                     seq_len=model_cfg["n_positions"], vocab=model_cfg["vocab_size"],
                     dtype=dtype, dropout=model_cfg.get("dropout", 0.0))


def amp_check(model_cfg: dict, mbs: int, steps: int = 2) -> dict:
    """Losses of ``steps`` fp32 and bf16-autocast iterations from the same weights."""
    from merak_exec.models import GPT, GPTConfig
    from merak_exec.parallel import parallelize
    from merak_exec.profiling.cases import token_batches
    from merak_sim.config import ParallelConfig

    batches = token_batches(model_cfg, mbs * 2, steps, seed=3)
    out: dict = {}
    for dtype in ("fp32", "bf16"):
        torch.manual_seed(0)
        pc = ParallelConfig(micro_batch_size=mbs, global_batch_size=2 * mbs, dtype=dtype)
        pm = parallelize(GPT(GPTConfig(**model_cfg)), pc, seq_len=model_cfg["n_positions"],
                         record=False)
        out[dtype] = [pm.train_step(x, y).loss for x, y in batches]
        out[f"{dtype}_param_dtypes"] = sorted({str(p.dtype) for p in pm.parameters()})
    rel = max(abs(a - b) / abs(b) for a, b in zip(out["bf16"], out["fp32"], strict=True))
    out.update(rel_error=rel, tolerance=AMP_REL_TOL,
               ok=rel <= AMP_REL_TOL and out["bf16_param_dtypes"] == ["torch.float32"])
    return out


def _block_bytes(block, x: torch.Tensor, selective: bool) -> tuple[int, int]:
    """(bytes kept after the forward, peak bytes of forward + backward) of ``block``."""
    from merak_exec.stages import AttentionRecompute

    def fwd():
        if selective:
            with AttentionRecompute():
                return block(x)
        return block(x)

    if x.is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        y = fwd()
        torch.cuda.synchronize()
        # the output is the next layer's saved input, not this layer's
        kept = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
        y.float().sum().backward()
        torch.cuda.synchronize()
        return kept, torch.cuda.max_memory_allocated() - before
    from merak_exec.profiling.saved_tensors import saved_tensor_bytes

    y, kept = saved_tensor_bytes(fwd, block.parameters())
    y.sum().backward()
    return kept, kept


def memory_check(model_cfg: dict, mbs: int, device: str, dtype: str) -> list[dict]:
    """Measured against modelled activation bytes of one block, per recompute policy."""
    from merak_exec.models import GPTConfig
    from merak_exec.models.gpt import Block

    spec = gpt_spec(model_cfg, dtype)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    profile = FLASH if device == "cuda" else CPU_EAGER
    torch.manual_seed(0)
    block = Block(GPTConfig(**model_cfg)).to(device=device, dtype=dt)
    rows = []
    for recompute in ("none", "selective"):
        x = torch.randn(mbs, spec.seq_len, spec.hidden, device=device, dtype=dt,
                        requires_grad=True)
        kept, peak = _block_bytes(block, x, recompute == "selective")
        want = layer_activation_bytes(spec, mbs, recompute=recompute, profile=profile,
                                      dtype=dtype)
        rel = kept / want - 1
        rows.append({"recompute": recompute, "measured_bytes": kept, "model_bytes": want,
                     "peak_fwd_bwd_bytes": peak, "rel_error": rel, "profile": profile.name,
                     "ok": abs(rel) <= MEMORY_REL_TOL})
        block.zero_grad(set_to_none=True)
    return rows
