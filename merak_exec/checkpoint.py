"""Checkpoints with torch.distributed.checkpoint (DCP), sharded as trained.

Each rank saves its own parameters and optimizer state under keys that name the layer
(global layer index), the parameter and, for tensor-parallel shards, the tp rank
(``tp<r>.layers.<i>.<name>``): pipeline ranks hold disjoint keys, data-parallel
replicas hold identical ones (DCP's planner writes them once), so the checkpoint is
exactly the training layout. Per-rank RNG states are keyed by global rank; the step
counter and the config travel with them.

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


def _state(pm, step: int) -> dict:
    opt = pm.runtime.optimizer
    model = {k: p.detach() for k, p in _keys(pm)}
    optim = {}
    for k, p in _keys(pm):
        for sk, sv in opt.state.get(p, {}).items():
            if isinstance(sv, torch.Tensor):
                optim[f"{k}.{sk}"] = sv
    rng = {f"rank{pm.mesh.rank}": torch.get_rng_state()}
    if pm.mesh.device.type == "cuda":
        rng[f"cuda{pm.mesh.rank}"] = torch.cuda.get_rng_state(pm.mesh.device)
    return {"model": model, "optim": optim, "rng": rng,
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
    state["optim"] = dict(state["optim"])
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
    opt = pm.runtime.optimizer
    # Optimizer state tensors must exist to be loaded in place: take one zero-lr step
    # shape by running the optimizer's lazy init on zero gradients.
    _init_optimizer_state(opt)
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
    for k, p in _keys(pm):
        for sk, sv in opt.state.get(p, {}).items():
            if isinstance(sv, torch.Tensor) and f"{k}.{sk}" in state["optim"]:
                sv.copy_(state["optim"][f"{k}.{sk}"])
    torch.set_rng_state(state["rng"][f"rank{pm.mesh.rank}"])
    if pm.mesh.device.type == "cuda":
        torch.cuda.set_rng_state(state["rng"][f"cuda{pm.mesh.rank}"], pm.mesh.device)
    return int(state["step"].item())


def _init_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Create the optimizer's per-parameter state without changing any parameter."""
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
