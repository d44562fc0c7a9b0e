"""Checkpoints that are safe to load and resume at any layout.

Each rank writes what only it holds (:mod:`merak_exec.checkpoint_store` describes the
folder): parameters and optimizer state by their layout-free names, with their
tensor-parallel cut and their ZeRO-1 / FSDP shard; data-parallel replicas and tp
copies of unsplit tensors are written once, a tied copy on another pipeline rank not
at all (it is its partner). The manifest, written last by rank 0, records the step,
the data position (samples consumed), the layout, the model's parameter shapes, the
training state (optimizer iteration for the LR schedule, skipped steps, the fp16 loss
scaler) and every file's size and SHA-256.

Loading checks the manifest and every file it reads before using them, refuses a
checkpoint of another model in one line naming the first differing parameter, then
cuts each tensor for the loading layout, so a run saved at dp2 resumes at pp2, tp2 at
one process, ZeRO-3 at ZeRO-0, and so on. Random states come back exactly when the
layout is the same; otherwise each rank's generators are seeded from the step and its
pipeline and data-parallel coordinates (tensor-parallel peers agree, as they must).

A checkpoint is written to ``<dir>.tmp-<step>`` and renamed to ``<dir>`` by rank 0
after every rank finished, so an interrupted save never leaves a half-written
checkpoint under the final name. Any failure on any rank is the same one-line
:class:`CheckpointError` on every rank; every rendezvous is bounded by the mesh's
timeout.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from merak_exec.checkpoint_store import (
    Piece,
    Reader,
    StoreError,
    cut_flat,
    read_manifest,
    row_range,
    write_manifest,
    write_rank_file,
)
from merak_exec.fsdp import local_tensor
from merak_exec.mesh import ExecError, timed_collective
from merak_exec.optim import TrainingOptimizer
from merak_exec.zero import ZeroOptimizer

__all__ = ["CheckpointError", "Restored", "save_checkpoint", "load_checkpoint", "agree_error"]

_MESSAGE_BYTES = 1024


class CheckpointError(ExecError):
    """A checkpoint is missing, corrupt, foreign or does not match the job."""


@dataclass(frozen=True)
class Restored:
    """What :func:`load_checkpoint` restored.

    Attributes:
        step: the iteration the checkpoint was saved after.
        samples: samples consumed by then (None when the saver did not say).
        resharded: the checkpoint was saved at another layout.
    """

    step: int
    samples: int | None
    resharded: bool


@dataclass(frozen=True)
class _Local:
    """One local tensor as stored: its logical name, the tensor, its tp cut, its flat
    shard range of the cut tensor and whether this rank writes it."""

    name: str
    tensor: torch.Tensor
    view: object
    flat: tuple[int, int] | None
    cut_shape: tuple[int, ...]
    write: bool


def _agree(pm, value: int, what: str) -> int:
    """The minimum of ``value`` over all ranks (a bounded rendezvous on the device)."""
    t = torch.tensor([value], dtype=torch.int64, device=pm.mesh.device)
    timed_collective(dist.all_reduce, t, group=dist.group.WORLD, op=dist.ReduceOp.MIN,
                     what=what, timeout_s=pm.mesh.timeout_s)
    return int(t.item())


def agree_error(pm, message: str | None, what: str) -> None:
    """Raise the first failing rank's ``message`` as a CheckpointError on every rank
    (nothing when no rank failed): a bounded rendezvous of ``pm``'s whole world, where
    ``what`` names it in a timeout."""
    world = pm.mesh.world_size
    first = _agree(pm, pm.mesh.rank if message else world, what)
    if first == world:
        return
    buf = torch.zeros(_MESSAGE_BYTES, dtype=torch.uint8, device=pm.mesh.device)
    if pm.mesh.rank == first:
        raw = message.encode()[:_MESSAGE_BYTES - 1]
        buf[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    timed_collective(dist.broadcast, buf, src=first, group=dist.group.WORLD,
                     what=what, timeout_s=pm.mesh.timeout_s)
    text = bytes(buf.cpu().tolist()).rstrip(b"\0").decode(errors="replace")
    raise CheckpointError(text if pm.mesh.rank == first else f"{text} (reported by rank "
                          f"{first})")


# -- what this rank holds ---------------------------------------------------------
def _aliases(pm) -> dict[str, str]:
    """Tied parameters: the later layer's name -> the earlier layer's (the one stored)."""
    return {f"layers.{j}.{nj}": f"layers.{i}.{ni}" for (i, ni), (j, nj) in pm.chain.tied}


def _views(pm) -> dict[int, object]:
    """id(parameter) -> its tensor-parallel :class:`ShardView` (cut parameters only)."""
    out = {}
    for c in pm.chunks:
        for mod in c.modules():
            views = getattr(mod, "shard_views", None)
            if isinstance(views, dict):
                for attr, view in views.items():
                    p = getattr(mod, attr, None)
                    if p is not None:
                        out[id(p)] = view
    return out


def _params(pm) -> list[tuple[str, torch.nn.Parameter, bool]]:
    """(stored name, parameter, is a tied copy whose partner stores it), each parameter
    once, in layer order."""
    aliases, seen, out = _aliases(pm), set(), []
    for name, p in pm.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        out.append((aliases.get(name, name), p, name in aliases))
    return out


def _entry(pm, name: str, t: torch.Tensor, view, flat, write: bool) -> _Local:
    """A :class:`_Local` for ``t``; an FSDP (DTensor) shard gets its row range."""
    local = local_tensor(t)
    cut_shape = tuple(t.shape)
    if local is not t:  # FSDP: rows of the (tp-cut) tensor over the dp ranks
        flat = row_range(cut_shape, pm.mesh.dp, pm.mesh.dp_rank)
        if flat[1] - flat[0] != local.numel():
            raise CheckpointError(f"{name}: this rank's FSDP shard has {local.numel()} "
                                  f"elements, expected {flat[1] - flat[0]}; save with zero=0 "
                                  "or 1")
    return _Local(name, local, view, flat, cut_shape, write)


def _locals(pm) -> list[_Local]:
    """Every tensor of this rank's parameters and optimizer state, named for storage."""
    mesh, zero = pm.mesh, pm.config.zero
    views = _views(pm)
    sharded = zero in (2, 3) and mesh.dp_group is not None
    out = []
    for name, p, copy in _params(pm):
        view = views.get(id(p))
        once = not copy and (view is not None or mesh.tp_rank == 0)
        out.append(_entry(pm, f"model/{name}", p, view, None,
                          once and (sharded or mesh.dp_rank == 0)))
    _, opt = _layers(pm.runtime.optimizer)
    if isinstance(opt, ZeroOptimizer):
        return out + _zero1_locals(pm, opt, views)
    for name, p, copy in _params(pm):
        view = views.get(id(p))
        once = not copy and (view is not None or mesh.tp_rank == 0)
        for sk, sv in (opt.state.get(p, {}) if opt is not None else {}).items():
            if isinstance(sv, torch.Tensor):
                v = view if sv.shape == p.shape else None
                out.append(_entry(pm, f"optim/{name}/{sk}", sv, v, None,
                                  once and (sharded or mesh.dp_rank == 0)))
    return out


def _zero1_locals(pm, opt: ZeroOptimizer, views) -> list[_Local]:
    """ZeRO-1's state: each dp rank's pieces, by flat range of the full local tensor."""
    params = _params(pm)
    by_index = {str(i): (name, p, copy) for i, (name, p, copy) in enumerate(params)}
    out = []
    state = opt.state_by_name([(str(i), p) for i, (_, p, _) in enumerate(params)])
    for key, sv in state.items():
        m = re.fullmatch(r"(\d+)\[(\d+):(\d+)\]\.(.+)", key)
        name, p, copy = by_index[m.group(1)]
        view = views.get(id(p))
        once = not copy and (view is not None or pm.mesh.tp_rank == 0)
        flat = (int(m.group(2)), int(m.group(3))) if sv.dim() else None
        out.append(_Local(f"optim/{name}/{m.group(4)}", sv, view if sv.dim() else None,
                          flat, tuple(p.shape) if sv.dim() else (), once))
    return out


def _layers(opt) -> tuple[TrainingOptimizer | None, torch.optim.Optimizer | None]:
    """(the training wrapper or None, the optimizer that holds the state) of ``opt``."""
    training = opt if isinstance(opt, TrainingOptimizer) else None
    return training, training.optimizer if training is not None else opt


def _layout(pm) -> dict:
    cfg = pm.config
    return {"world": pm.mesh.world_size, "dp": cfg.dp, "tp": cfg.tp, "pp": cfg.pp,
            "virtual_stages": cfg.virtual_stages, "zero": cfg.zero, "schedule": cfg.schedule,
            "order": cfg.order}


def _fingerprint(pm) -> dict[str, list[int]]:
    """Every parameter of the whole model (all ranks') by stored name -> full shape:
    local cut parameters report their uncut shape, other layers their own."""
    views, aliases = _views(pm), _aliases(pm)
    local = {li for c in pm.chunks for li in pm.ranges[c.index]}
    out = {}
    for li, layer in enumerate(pm.chain.layers):
        if li in local:
            continue
        for n, p in layer.named_parameters():
            out[aliases.get(f"layers.{li}.{n}", f"layers.{li}.{n}")] = list(p.shape)
    for name, p, _ in _params(pm):
        view = views.get(id(p))
        out[name] = list(view.full_shape if view is not None else p.shape)
    return dict(sorted(out.items()))


def _train_state(pm) -> dict:
    training, _ = _layers(pm.runtime.optimizer)
    if training is None:
        return {}
    out = {"iteration": training.iteration, "skipped": training.skipped}
    if training.scaler is not None:
        out.update(scale=training.scaler.scale, good_steps=training.scaler.good_steps)
    return out


def _restore_train_state(pm, saved: dict) -> None:
    training, _ = _layers(pm.runtime.optimizer)
    if training is None or not saved:
        return
    training.iteration = int(saved["iteration"])
    training.skipped = int(saved["skipped"])
    if training.scaler is not None and "scale" in saved:
        training.scaler.scale = float(saved["scale"])
        training.scaler.good_steps = int(saved["good_steps"])


# -- save -----------------------------------------------------------------------
def save_checkpoint(pm, path: str | os.PathLike, step: int, samples: int | None = None) -> None:
    """Save ``pm`` (a :class:`~merak_exec.parallel.ParallelModel`) after ``step``
    iterations, ``samples`` samples consumed (default ``step`` global batches)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{step}")
    mesh = pm.mesh
    failed = None
    if mesh.rank == 0:
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        except OSError as e:
            failed = f"cannot create {tmp}: {e.strerror}; choose a writable directory"
    agree_error(pm, failed, "the checkpoint rendezvous before saving")
    try:
        _write_rank(pm, tmp)
        failed = None
    except OSError as e:
        failed = f"rank {mesh.rank} could not write its checkpoint file in {tmp}: {e.strerror}"
    agree_error(pm, failed, "the checkpoint rendezvous after saving")
    if mesh.rank == 0:
        try:
            header = {"step": step, "samples": samples if samples is not None else
                      step * pm.config.global_batch_size, "layout": _layout(pm),
                      "model": _fingerprint(pm), "train": _train_state(pm),
                      "origin": pm.origin}
            write_manifest(tmp, header)
            _replace(path, tmp)
        except OSError as e:
            failed = f"cannot finish the checkpoint at {path}: {e.strerror}"
    agree_error(pm, failed, "the checkpoint rendezvous after renaming")


def _write_rank(pm, folder: Path) -> None:
    """This rank's tensors, its random states and their piece list."""
    file = f"rank{pm.mesh.rank:05d}.safetensors"
    tensors, pieces = {}, []
    for i, e in enumerate(x for x in _locals(pm) if x.write):
        key = f"t{i}"
        tensors[key] = e.tensor
        pieces.append(Piece(e.name, file, key, tuple(e.tensor.shape), e.view, e.flat,
                            e.cut_shape))
    for kind, state in _rng_states(pm).items():
        key = f"rng.{kind}"
        tensors[key] = state
        pieces.append(Piece(f"rng/{pm.mesh.rank}/{kind}", file, key, tuple(state.shape)))
    write_rank_file(folder, pm.mesh.rank, tensors, pieces)


def _rng_states(pm) -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if pm.mesh.device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(pm.mesh.device)
    return out


def _replace(path: Path, tmp: Path) -> None:
    """Rename ``tmp`` to ``path``, the old checkpoint removed only once replaced."""
    if path.exists():
        old = path.with_name(f"{path.name}.old")
        if old.exists():
            shutil.rmtree(old)
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old)
    else:
        tmp.rename(path)


# -- load -----------------------------------------------------------------------
def load_checkpoint(pm, path: str | os.PathLike) -> Restored:
    """Restore the parameters, optimizer state, training state and random states of
    ``pm`` from the checkpoint at ``path``, whatever layout saved it."""
    path = Path(path)
    # Optimizer state tensors must exist to be loaded in place: run the state-holding
    # optimizer's lazy init on zero gradients (no collective, no wrapper bookkeeping).
    _init_optimizer_state(_inner(_layers(pm.runtime.optimizer)[1]))
    locals_ = _locals(pm)
    reader, failed = None, None
    try:
        manifest = read_manifest(path)
        _check_model(pm, manifest)
        reader = Reader(manifest)
        names = [e.name for e in locals_]
        if any(n.startswith("optim/") for n in manifest.pieces):
            missing = next((n for n in names if not reader.has(n)), None)
            if missing:
                raise StoreError(f"checkpoint at {path} has no {missing!r}: it was saved with "
                                 "another optimizer; resume with the one that saved it")
        reader.verify(reader.files_for(n for n in names if reader.has(n)))
    except StoreError as e:
        failed = str(e)
    agree_error(pm, failed, "the checkpoint rendezvous before loading")
    with torch.no_grad():
        for e in locals_:
            if reader.has(e.name):
                full = reader.full(e.name)
                cut = e.view.take(full) if e.view is not None else full
                e.tensor.copy_(cut_flat(cut, e.flat).reshape(e.tensor.shape))
    header = manifest.header
    _restore_train_state(pm, header.get("train", {}))
    same = header.get("layout") == _layout(pm)
    _restore_rng(pm, reader, same, int(header["step"]))
    samples = header.get("samples")
    return Restored(int(header["step"]), None if samples is None else int(samples), not same)


def _check_model(pm, manifest) -> None:
    """Refuse a checkpoint of another model, naming the first difference."""
    saved = manifest.header.get("model", {})
    here = _fingerprint(pm)
    for name in sorted(set(saved) | set(here)):
        a, b = saved.get(name), here.get(name)
        if a != b:
            there = "absent" if a is None else f"{a}"
            mine = "absent" if b is None else f"{b}"
            raise StoreError(f"checkpoint at {manifest.folder} holds another model: {name} is "
                             f"{there} there and {mine} here; resume the model it was saved "
                             "from")


def _restore_rng(pm, reader: Reader, same_layout: bool, step: int) -> None:
    """Exact random states at the same layout; otherwise seeds from the step and this
    rank's pipeline and data-parallel coordinates (tp peers stay equal)."""
    mesh = pm.mesh
    if same_layout:
        torch.set_rng_state(reader.full(f"rng/{mesh.rank}/cpu"))
        if mesh.device.type == "cuda" and reader.has(f"rng/{mesh.rank}/cuda"):
            torch.cuda.set_rng_state(reader.full(f"rng/{mesh.rank}/cuda"), mesh.device)
        return
    seed = (step * 1_000_003 + mesh.pp_rank * 7919 + mesh.dp_rank * 104_729) % (1 << 63)
    torch.manual_seed(seed)


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
