"""What happens around the optimizer step: mixed precision, clipping, LR schedules.

- Mixed precision follows torch AMP: the parameters stay fp32 (they are the master
  weights, and the optimizer state is fp32 with them); the stage forwards run under
  ``torch.autocast`` in bf16 or fp16 (:func:`autocast_hooks`). fp16 adds a dynamic
  loss scaler (:class:`LossScaler`): the gradient leaving the loss is multiplied by
  the scale (:func:`scaled_loss_fn`, the loss value itself is untouched), the step
  unscales, and a step whose gradients overflowed anywhere is skipped on every rank
  while the scale backs off, down to ``min_scale`` (1, as DeepSpeed and Megatron-LM);
  an overflow at the minimum means the scaler gave up, and the run stops.
- Divergence stops the run (as Megatron-LM's and torchtitan's NaN checks do): a
  global gradient norm that is not finite (and not an fp16 overflow the scaler still
  handles) raises :class:`~merak_exec.mesh.NonFiniteError`, one line naming the step,
  on every rank alike before any parameter changes.
- Gradient clipping by the global norm over every rank (:func:`global_grad_norm`):
  each local gradient counts once per distinct tensor in the job, so data-parallel
  replicas, tensor-parallel replicated parameters (norms, row-parallel biases) and the
  two copies of a tied embedding are not counted twice.
- LR schedules as HuggingFace's ``get_scheduler`` defines them (:func:`lr_lambda`):
  constant, constant_with_warmup, linear and cosine, with linear warmup.

:class:`TrainingOptimizer` wraps any torch optimizer with these and is what the
runtime's OPT action steps.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from merak_exec.fsdp import local_tensor
from merak_exec.hooks import RuntimeHooks
from merak_exec.mesh import ExecError, NonFiniteError, timed_collective
from merak_exec.replicas import sharded_parameters

__all__ = ["SCHEDULES", "lr_lambda", "LossScaler", "scaled_loss_fn", "autocast_hooks",
           "replica_counts", "global_grad_norm", "decay_groups", "TrainingOptimizer",
           "AMP_DTYPES"]

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine")


def lr_lambda(kind: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the base LR at optimizer step ``k`` (0-based), as HuggingFace's
    schedules of the same name: linear warmup from 0 over ``warmup_steps``, then
    constant, linear decay to 0 at ``total_steps``, or a half cosine to 0. "constant"
    ignores the warmup, as HuggingFace's does."""
    if kind not in SCHEDULES:
        raise ExecError(f"lr_scheduler_type {kind!r} is not supported; choose one of "
                        f"{', '.join(SCHEDULES)}")
    W, T = max(0, int(warmup_steps)), max(1, int(total_steps))

    def f(k: int) -> float:
        if kind == "constant":
            return 1.0
        if k < W:
            return k / max(1, W)
        if kind == "constant_with_warmup":
            return 1.0
        progress = (k - W) / max(1, T - W)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return f


@dataclass
class LossScaler:
    """Dynamic loss scale (torch's GradScaler defaults): halve on overflow, double
    after ``growth_interval`` steps without one; never below ``min_scale``.

    Attributes:
        skipped_in_a_row: overflowed steps since the last good one.
    """

    scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    good_steps: int = 0
    min_scale: float = 1.0
    skipped_in_a_row: int = 0

    @property
    def at_minimum(self) -> bool:
        """The scale cannot back off any further: another overflow means giving up."""
        return self.scale <= self.min_scale

    def update(self, overflow: bool) -> None:
        """Adjust the scale after a step (``overflow``: it was skipped)."""
        if overflow:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.good_steps = 0
            self.skipped_in_a_row += 1
            return
        self.skipped_in_a_row = 0
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by the scaler's current scale."""

    @staticmethod
    def forward(ctx, x, scaler):
        ctx.scaler = scaler
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scaler.scale, None


def scaled_loss_fn(loss_fn, scaler: LossScaler):
    """``loss_fn`` whose gradient into the logits is multiplied by ``scaler.scale``
    (so every upstream gradient is scaled); the returned loss value is unchanged."""

    def fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return loss_fn(_ScaleGrad.apply(logits, scaler), labels)

    return fn


class _Autocast(RuntimeHooks):
    def __init__(self, device_type: str, dtype: torch.dtype) -> None:
        self.device_type, self.dtype = device_type, dtype

    def saved_tensors_scope(self) -> contextlib.AbstractContextManager:
        # autocast state is thread-local like saved-tensor hooks: entered with them
        # around every layer application of the stage
        return torch.autocast(self.device_type, dtype=self.dtype)


def autocast_hooks(device: torch.device, dtype: str) -> RuntimeHooks:
    """Hooks that run a stage's layers under ``torch.autocast`` in ``dtype`` ("bf16" or
    "fp16"); register them with every stage (``StageModule.add_hooks``)."""
    return _Autocast(device.type, AMP_DTYPES[dtype])


def replica_counts(chunks, mesh, tied_params=()) -> dict[int, int]:
    """How many ranks hold an identical copy of each local parameter's gradient
    (keyed by ``id``): every data-parallel replica, every tp rank for a parameter tensor
    parallelism does not shard, both pipeline ends for a tied copy."""
    sharded = sharded_parameters(chunks)
    tied = {id(p) for p in tied_params}
    out = {}
    for c in chunks:
        for p in c.parameters():
            n = mesh.dp * (1 if id(p) in sharded else mesh.tp)
            out[id(p)] = n * (2 if id(p) in tied else 1)
    return out


def global_grad_norm(params, counts: dict[int, int], device: torch.device,
                     timeout_s: float = 300.0) -> torch.Tensor:
    """L2 norm of the job's whole gradient (one all-reduce over every rank), each
    distinct tensor counted once (``counts``: :func:`replica_counts`). Inf or NaN when
    any rank's gradient overflowed. An FSDP-sharded gradient counts its local shard."""
    sq = torch.zeros((), dtype=torch.float32, device=device)
    seen: set[int] = set()
    for p in params:
        if p.grad is None or id(p) in seen:
            continue
        seen.add(id(p))
        sq += local_tensor(p.grad).detach().float().pow(2).sum() / counts.get(id(p), 1)
    if dist.is_initialized() and dist.get_world_size() > 1:
        timed_collective(dist.all_reduce, sq, group=None, timeout_s=timeout_s,
                         what="the gradient-norm all-reduce over every rank")
    return sq.sqrt()


def decay_groups(params, weight_decay: float) -> list[dict]:
    """Parameter groups with weight decay on matrices and embeddings only: biases and
    norm weights (every 1-D parameter, sharded or not) get none, as HuggingFace's
    Trainer excludes biases and LayerNorm weights."""
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return [g for g in ({"params": decay, "weight_decay": weight_decay},
                        {"params": rest, "weight_decay": 0.0}) if g["params"]]


class TrainingOptimizer:
    """A torch optimizer with loss-scale handling, global-norm clipping and an LR
    schedule around its ``step`` (what the runtime's OPT calls).

    Args:
        optimizer: the inner optimizer (its ``state`` and ``param_groups`` are exposed
            unchanged, so checkpoints see the inner state).
        counts: replica counts for the global norm (:func:`replica_counts`).
        device: where the norm is reduced.
        max_grad_norm: clip to this global norm (None or 0: no clipping).
        schedule: LR multiplier per step (:func:`lr_lambda`); None keeps the LR.
        scaler: the fp16 loss scaler (None for fp32 and bf16).
        timeout_s: bound on the norm all-reduce.

    Attributes:
        iteration: optimizer steps taken (skipped fp16 steps included; sets the LR).
        last_grad_norm: the global norm before clipping (NaN/inf on an fp16 overflow).
        skipped: steps skipped because the gradients overflowed.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, counts: dict[int, int],
                 device: torch.device, max_grad_norm: float | None = None,
                 schedule: Callable[[int], float] | None = None,
                 scaler: LossScaler | None = None, timeout_s: float = 300.0) -> None:
        self.optimizer, self.counts, self.device = optimizer, counts, device
        self.max_grad_norm, self.schedule, self.scaler = max_grad_norm, schedule, scaler
        self.timeout_s = timeout_s
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.iteration = 0
        self.last_grad_norm = float("nan")
        self.skipped = 0

    @property
    def state(self):
        """The inner optimizer's per-parameter state."""
        return self.optimizer.state

    @property
    def param_groups(self):
        """The inner optimizer's parameter groups."""
        return self.optimizer.param_groups

    def _params(self) -> list[nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def step(self, closure=None):
        """Unscale, measure the global norm, clip, then step with the scheduled LR, or
        skip the step (fp16 overflow, on every rank alike). A norm that is not finite
        raises :class:`~merak_exec.mesh.NonFiniteError` (under fp16: an overflow with
        the scale already at its minimum), before anything changes."""
        params = self._params()
        if self.scaler is not None:
            inv = 1.0 / self.scaler.scale
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(inv)
        need_norm = self.scaler is not None or bool(self.max_grad_norm)
        if need_norm:
            norm = global_grad_norm(params, self.counts, self.device, self.timeout_s)
            self.last_grad_norm = float(norm)
        overflow = self.scaler is not None and not math.isfinite(self.last_grad_norm)
        if need_norm and not math.isfinite(self.last_grad_norm):
            self._check_diverged()
        if self.schedule is not None:
            f = self.schedule(self.iteration)
            for g, lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
                g["lr"] = lr * f
        self.iteration += 1
        if self.scaler is not None:
            self.scaler.update(overflow)
        if overflow:
            self.skipped += 1
            return None
        if self.max_grad_norm and self.last_grad_norm > self.max_grad_norm:
            coef = self.max_grad_norm / (self.last_grad_norm + 1e-6)
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        return self.optimizer.step(closure)

    def _check_diverged(self) -> None:
        """Raise the one line of a non-finite gradient norm at this step, unless an fp16
        loss scaler can still back off (the step is then skipped instead)."""
        step, norm = self.iteration + 1, self.last_grad_norm
        if self.scaler is None:
            raise NonFiniteError(f"merak_exec: training diverged at step {step}: the gradient "
                                 f"norm is {norm}; lower the learning rate or check the inputs")
        if self.scaler.at_minimum:
            raise NonFiniteError(
                f"merak_exec: training diverged at step {step}: the fp16 gradients overflowed "
                f"with the loss scale at its minimum {self.scaler.min_scale:g} "
                f"({self.scaler.skipped_in_a_row + 1} steps skipped in a row); lower the "
                "learning rate or train in bf16 or fp32")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients (the inner optimizer's ``zero_grad``)."""
        self.optimizer.zero_grad(set_to_none=set_to_none)
