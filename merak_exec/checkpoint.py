"""Checkpoints with torch.distributed.checkpoint (DCP), sharded as trained.

Each rank saves its own parameters and optimizer state under keys that name the layer
(global layer index), the parameter and, for tensor-parallel shards, the tp rank
(``tp<r>.layers.<i>.<name>``): pipeline ranks hold disjoint keys, data-parallel
replicas hold identical ones (DCP's planner writes them once), so the checkpoint is
exactly the training layout. Under ZeRO-1 the optimizer state is that of this rank's
shard, keyed by the flat element range it covers in each parameter
(:meth:`~merak_exec.zero.ZeroOptimizer.state_by_name`), so every shard is saved once.
Per-rank RNG states are keyed by global rank; the step counter, the optimizer's
iteration (it sets the LR schedule) and the fp16 loss scaler's scale and growth
counter travel with them, so a resumed run continues exactly.

A checkpoint is written to ``<dir>.tmp-<step>`` and renamed to ``<dir>`` by rank 0
after every rank finished, so an interrupted save never leaves a half-written
checkpoint under the final name. Loading a missing or corrupt checkpoint raises
:class:`CheckpointError` (a one-line message) on every rank. Every rendezvous here is
a one-element all-reduce on the rank's device (NCCL groups take device tensors only),
bounded by the mesh's timeout.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from merak_exec.mesh import ExecError, bounded, timed_collective
from merak_exec.optim import TrainingOptimizer
from merak_exec.zero import ZeroOptimizer

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint"]


class CheckpointError(ExecError):
    """A checkpoint is missing, corrupt or does not match the job."""


def _agree(pm, value: int, what: str) -> int:
    """The minimum of ``value`` over all ranks (a bounded rendezvous on the device)."""
    t = torch.tensor([value], dtype=torch.int64, device=pm.mesh.device)
    timed_collective(dist.all_reduce, t, group=dist.group.WORLD, op=dist.ReduceOp.MIN,
                     what=what, timeout_s=pm.mesh.timeout_s)
    return int(t.item())


def _keys(pm) -> list[tuple[str, torch.nn.Parameter]]:
    tp = pm.mesh.tp_rank if pm.config.tp > 1 else 0
    return [(f"tp{tp}.{n}", p) for n, p in pm.named_parameters()]


def _layers(opt) -> tuple[TrainingOptimizer | None, torch.optim.Optimizer | None]:
    """(the training wrapper or None, the optimizer that holds the state) of ``opt``."""
    training = opt if isinstance(opt, TrainingOptimizer) else None
    return training, training.optimizer if training is not None else opt


def _optim_state(pm) -> dict[str, torch.Tensor]:
    """The optimizer's state tensors of this rank, keyed by parameter (and, under
    ZeRO-1, by the shard's element range)."""
    _, opt = _layers(pm.runtime.optimizer)
    if isinstance(opt, ZeroOptimizer):
        return opt.state_by_name(_keys(pm))
    out = {}
    for k, p in _keys(pm):
        for sk, sv in opt.state.get(p, {}).items():
            if isinstance(sv, torch.Tensor):
                out[f"{k}.{sk}"] = sv
    return out


def _train_state(pm) -> dict[str, torch.Tensor]:
    """Iteration, skipped steps and the loss scaler (equal on every rank)."""
    training, _ = _layers(pm.runtime.optimizer)
    if training is None:
        return {}
    out = {"iteration": torch.tensor(training.iteration, dtype=torch.int64),
           "skipped": torch.tensor(training.skipped, dtype=torch.int64)}
    if training.scaler is not None:
        out["scale"] = torch.tensor(training.scaler.scale, dtype=torch.float64)
        out["good_steps"] = torch.tensor(training.scaler.good_steps, dtype=torch.int64)
    return out


def _restore_train_state(pm, saved: dict[str, torch.Tensor]) -> None:
    training, _ = _layers(pm.runtime.optimizer)
    if training is None:
        return
    training.iteration = int(saved["iteration"].item())
    training.skipped = int(saved["skipped"].item())
    if training.scaler is not None:
        training.scaler.scale = float(saved["scale"].item())
        training.scaler.good_steps = int(saved["good_steps"].item())


def _state(pm, step: int) -> dict:
    model = {k: p.detach() for k, p in _keys(pm)}
    rng = {f"rank{pm.mesh.rank}": torch.get_rng_state()}
    if pm.mesh.device.type == "cuda":
        rng[f"cuda{pm.mesh.rank}"] = torch.cuda.get_rng_state(pm.mesh.device)
    return {"model": model, "optim": _optim_state(pm), "rng": rng, "train": _train_state(pm),
            "step": torch.tensor(step, dtype=torch.int64)}


def save_checkpoint(pm, path: str | os.PathLike, step: int) -> None:
    """Save ``pm`` (a :class:`~merak_exec.parallel.ParallelModel`) at ``step``."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{step}")
    if pm.mesh.rank == 0 and tmp.exists():
        shutil.rmtree(tmp)
    _agree(pm, 1, "the checkpoint rendezvous before saving")
    state = _state(pm, step)
    with bounded("saving the checkpoint"):
        dcp.save(state, checkpoint_id=str(tmp))
    _agree(pm, 1, "the checkpoint rendezvous after saving")
    if pm.mesh.rank == 0:
        if path.exists():
            old = path.with_name(f"{path.name}.old")
            if old.exists():
                shutil.rmtree(old)
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old)
        else:
            tmp.rename(path)
    _agree(pm, 1, "the checkpoint rendezvous after renaming")


def load_checkpoint(pm, path: str | os.PathLike) -> int:
    """Restore parameters, optimizer state and RNG of ``pm``; returns the saved step."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    if not _agree(pm, 1 if (path / ".metadata").is_file() else 0,
                  "the checkpoint rendezvous before loading"):
        raise CheckpointError(f"no checkpoint at {path} (missing .metadata); check the path "
                              "or start without resuming")
    # Optimizer state tensors must exist to be loaded in place: run the state-holding
    # optimizer's lazy init on zero gradients (no collective, no wrapper bookkeeping).
    _init_optimizer_state(_inner(_layers(pm.runtime.optimizer)[1]))
    state = _state(pm, 0)
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, checkpoint_id=str(path))
    except (Exception, CheckpointException) as e:  # raised on every rank; one line
        lines = [ln.strip() for ln in str(e).splitlines()]
        causes = [ln for ln in lines if re.match(r"^\w+(Error|Exception): ", ln)
                  and not ln.startswith("CheckpointException")]
        msg = (causes or lines or [type(e).__name__])[0]
        raise CheckpointError(f"checkpoint at {path} is unreadable or does not match this job "
                              f"({msg[:160]}); re-save it or resume from another") from None
    with torch.no_grad():
        for k, p in _keys(pm):
            p.copy_(state["model"][k])
    for k, v in _optim_state(pm).items():  # dcp.load fills tensors in place; be sure
        if state["optim"][k] is not v:
            v.copy_(state["optim"][k])
    _restore_train_state(pm, state["train"])
    torch.set_rng_state(state["rng"][f"rank{pm.mesh.rank}"])
    if pm.mesh.device.type == "cuda":
        torch.cuda.set_rng_state(state["rng"][f"cuda{pm.mesh.rank}"], pm.mesh.device)
    return int(state["step"].item())


def _inner(opt):
    """The torch optimizer that owns the per-parameter state (a ZeRO-1 shard's own)."""
    return opt.inner if isinstance(opt, ZeroOptimizer) else opt


def _init_optimizer_state(opt: torch.optim.Optimizer | None) -> None:
    """Create the optimizer's per-parameter state without changing any parameter."""
    if opt is None:
        return
    params = [p for g in opt.param_groups for p in g["params"]]
    if all(p in opt.state and opt.state[p] for p in params):
        return
    saved = [(g.get("lr"), g.get("weight_decay")) for g in opt.param_groups]
    keep = [p.detach().clone() for p in params]
    grads = [p.grad for p in params]
    for g in opt.param_groups:
        if "lr" in g:
            g["lr"] = 0.0
        if "weight_decay" in g:
            g["weight_decay"] = 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    with torch.no_grad():
        for p, k in zip(params, keep, strict=True):
            p.copy_(k)
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    for g, (lr, wd) in zip(opt.param_groups, saved, strict=True):
        if lr is not None:
            g["lr"] = lr
        if wd is not None:
            g["weight_decay"] = wd
