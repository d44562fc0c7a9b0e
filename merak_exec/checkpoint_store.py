"""The checkpoint folder: safetensors shards plus a manifest, read without running code.

A checkpoint is a folder holding one ``rank<r>.safetensors`` file per rank that had
something to write and ``manifest.json``, written last. Tensors are stored by *logical*
name, the same whatever the layout (``model/layers.3.attn.q_proj.weight``,
``optim/layers.3.attn.q_proj.weight/exp_avg``, ``rng/<rank>/cpu``); each stored piece
says where it sits in its logical tensor:

- ``view``: a tensor-parallel cut of the full tensor
  (:class:`~merak_exec.tensor_parallel.ShardView`), or none;
- ``flat``: a flat element range ``[a, b)`` of that (cut) tensor (a ZeRO-1 optimizer
  shard, an FSDP row shard), or none.

Loading assembles a logical tensor from whatever pieces the saving layout wrote and
cuts out what the loading layout needs, so a checkpoint resumes at other degrees.

Safety: nothing here unpickles. safetensors holds raw tensor bytes behind a JSON
header, the manifest is JSON, and every file is checked against the manifest's size
and SHA-256 before a byte of it is used; a file the manifest does not list, a
truncated or altered one, or a folder in another format is refused in one line
naming the file (:class:`StoreError`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from merak_exec.mesh import ExecError
from merak_exec.tensor_parallel import ShardView
from merak_sim.io import atomic_write_text

__all__ = ["FORMAT", "MANIFEST", "StoreError", "Piece", "write_rank_file", "write_manifest",
           "Manifest", "read_manifest", "Reader", "sha256_of", "cut_flat", "row_range"]

FORMAT = "merak-checkpoint/1"
MANIFEST = "manifest.json"
_INDEX = ".index.json"  # per-rank piece lists, merged into the manifest and removed


class StoreError(ExecError):
    """A checkpoint folder is missing, altered, foreign or holds another model."""


@dataclass(frozen=True)
class Piece:
    """One stored tensor: ``key`` in ``file``, part of logical tensor ``name``.

    Attributes:
        name: the logical tensor.
        file: the safetensors file holding it.
        key: its key in that file.
        shape: the stored tensor's shape.
        view: its tensor-parallel cut of the logical tensor (None: uncut).
        flat: its flat element range of the (cut) tensor; None: all of it.
        cut_shape: the shape of the cut tensor the flat range indexes.
    """

    name: str
    file: str
    key: str
    shape: tuple[int, ...]
    view: ShardView | None = None
    flat: tuple[int, int] | None = None
    cut_shape: tuple[int, ...] | None = None

    def full_shape(self) -> tuple[int, ...]:
        """Shape of the logical tensor."""
        if self.view is not None:
            return self.view.full_shape
        return self.cut_shape if self.cut_shape is not None else self.shape

    def to_dict(self) -> dict:
        """JSON form."""
        return {"name": self.name, "file": self.file, "key": self.key,
                "shape": list(self.shape),
                "view": None if self.view is None else self.view.to_dict(),
                "flat": None if self.flat is None else list(self.flat),
                "cut_shape": None if self.cut_shape is None else list(self.cut_shape)}

    @classmethod
    def from_dict(cls, d: dict) -> Piece:
        """The piece :meth:`to_dict` wrote."""
        return cls(str(d["name"]), str(d["file"]), str(d["key"]), tuple(d["shape"]),
                   None if d["view"] is None else ShardView.from_dict(d["view"]),
                   None if d["flat"] is None else (int(d["flat"][0]), int(d["flat"][1])),
                   None if d["cut_shape"] is None else tuple(d["cut_shape"]))


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def write_rank_file(folder: Path, rank: int, tensors: dict[str, torch.Tensor],
                    pieces: list[Piece]) -> None:
    """Write this rank's tensors (``key -> tensor``) and its piece list into ``folder``."""
    from safetensors.torch import save_file

    name = f"rank{rank:05d}.safetensors"
    path = folder / name
    # copies: safetensors refuses tensors that share storage (views of one buffer)
    save_file({k: t.detach().to("cpu", copy=True).contiguous() for k, t in tensors.items()},
              str(path))
    entry = {"file": name, "bytes": path.stat().st_size, "sha256": sha256_of(path),
             "pieces": [p.to_dict() for p in pieces]}
    atomic_write_text(str(folder / f"rank{rank:05d}{_INDEX}"), json.dumps(entry))


def write_manifest(folder: Path, header: dict) -> None:
    """Merge the ranks' piece lists into ``manifest.json`` (written last, atomically)
    with ``header`` (step, layout, model fingerprint, training state)."""
    files, pieces = {}, []
    indexes = sorted(folder.glob(f"rank*{_INDEX}"))
    for idx in indexes:
        entry = json.loads(idx.read_text())
        files[entry["file"]] = {"bytes": entry["bytes"], "sha256": entry["sha256"]}
        pieces.extend(entry["pieces"])
    for idx in indexes:
        idx.unlink()
    atomic_write_text(str(folder / MANIFEST), json.dumps(
        {"format": FORMAT, **header, "files": files, "pieces": pieces}, indent=1))


@dataclass(frozen=True)
class Manifest:
    """A checkpoint's manifest, read and checked.

    Attributes:
        folder: the checkpoint folder.
        header: every top-level field besides files and pieces (step, layout, ...).
        files: file name -> {"bytes", "sha256"}.
        pieces: logical name -> its stored pieces.
    """

    folder: Path
    header: dict
    files: dict[str, dict]
    pieces: dict[str, list[Piece]]


def read_manifest(folder: str | os.PathLike) -> Manifest:
    """The manifest of ``folder``; :class:`StoreError` when the folder is no checkpoint
    of this format or holds a file the manifest does not list."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise StoreError(f"no checkpoint at {folder} (not a directory); check the path or "
                         "start without resuming")
    if not path.is_file():
        if (folder / ".metadata").exists():
            raise StoreError(f"{folder} is a torch.distributed.checkpoint folder; its metadata "
                             "is a pickle, which merak_exec does not load: resume from a "
                             "checkpoint this version wrote")
        raise StoreError(f"no checkpoint at {folder} (missing {MANIFEST}); check the path or "
                         "start without resuming")
    try:
        raw = json.loads(path.read_text())
        files = {str(k): {"bytes": int(v["bytes"]), "sha256": str(v["sha256"])}
                 for k, v in raw["files"].items()}
        pieces: dict[str, list[Piece]] = {}
        for d in raw["pieces"]:
            p = Piece.from_dict(d)
            pieces.setdefault(p.name, []).append(p)
        fmt = raw["format"]
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise StoreError(f"{path} is not a valid checkpoint manifest ({type(e).__name__}); "
                         "the checkpoint is damaged: resume from another") from None
    if fmt != FORMAT:
        raise StoreError(f"{path} has format {fmt!r}, this version reads {FORMAT!r}; resume "
                         "from a checkpoint this version wrote")
    for p in (p for ps in pieces.values() for p in ps):
        if p.file not in files:
            raise StoreError(f"{path} lists a piece in {p.file}, which it does not list as a "
                             "file; the checkpoint is damaged: resume from another")
    for entry in sorted(folder.iterdir()):
        if entry.name != MANIFEST and entry.name not in files:
            raise StoreError(f"{entry} is not part of the checkpoint (its manifest does not "
                             "list it); remove it or resume from another checkpoint")
    header = {k: v for k, v in raw.items() if k not in ("files", "pieces")}
    return Manifest(folder, header, files, pieces)


class Reader:
    """Assembles logical tensors from a checked :class:`Manifest`; each file is checked
    against its size and SHA-256 the first time it is needed."""

    def __init__(self, manifest: Manifest) -> None:
        self.m = manifest
        self._open: dict[str, object] = {}

    def has(self, name: str) -> bool:
        """Whether the checkpoint stores ``name``."""
        return name in self.m.pieces

    def files_for(self, names) -> set[str]:
        """The files holding any piece of ``names``."""
        return {p.file for n in names for p in self.m.pieces.get(n, ())}

    def verify(self, files) -> None:
        """Check ``files`` against the manifest (size, then SHA-256)."""
        for f in sorted(files):
            self._handle(f)

    def full(self, name: str) -> torch.Tensor:
        """The whole logical tensor ``name``."""
        pieces = self.m.pieces.get(name)
        if not pieces:
            raise StoreError(f"checkpoint at {self.m.folder} has no tensor {name!r}; it was "
                             "saved from another model or optimizer")
        whole = next((p for p in pieces if p.view is None and p.flat is None), None)
        if whole is not None:
            return self._read(whole)
        shape = pieces[0].full_shape()
        full = seen = None  # the dtype is the stored one: allocated at the first read
        for view, group in _by_view(pieces).items():
            cut_shape = group[0].cut_shape or group[0].shape
            cut = cut_seen = None
            for p in group:
                data = self._read(p)
                if full is None:
                    full = torch.zeros(shape, dtype=data.dtype)
                    seen = torch.zeros(shape, dtype=torch.bool)
                if cut is None:
                    cut = torch.zeros(cut_shape, dtype=data.dtype)
                    cut_seen = torch.zeros(cut_shape, dtype=torch.bool)
                a, b = p.flat or (0, cut.numel())
                cut.view(-1)[a:b] = data.reshape(-1)
                cut_seen.view(-1)[a:b] = True
            if view is None:
                full, seen = cut, cut_seen
            else:
                view.put(full, cut)
                view.put(seen, cut_seen)
        if not bool(seen.all()):
            raise StoreError(f"checkpoint at {self.m.folder} holds only part of {name!r}; "
                             "it is incomplete: resume from another")
        return full

    def _read(self, p: Piece) -> torch.Tensor:
        try:
            t = self._handle(p.file).get_tensor(p.key)
        except Exception as e:  # a header that passed the hash but not safetensors' checks
            raise StoreError(f"{self.m.folder / p.file} cannot be read ({type(e).__name__}); "
                             "the checkpoint is damaged: resume from another") from None
        if tuple(t.shape) != p.shape:
            raise StoreError(f"{self.m.folder / p.file}: {p.key} has shape {tuple(t.shape)}, "
                             f"the manifest says {p.shape}; resume from another checkpoint")
        return t

    def _handle(self, file: str):
        if file not in self._open:
            from safetensors import safe_open

            path = self.m.folder / file
            want = self.m.files[file]
            if not path.is_file():
                raise StoreError(f"{path} is missing; the checkpoint is incomplete: resume "
                                 "from another")
            if path.stat().st_size != want["bytes"]:
                raise StoreError(f"{path} has {path.stat().st_size} bytes, the manifest says "
                                 f"{want['bytes']} (truncated or replaced); resume from another "
                                 "checkpoint")
            if sha256_of(path) != want["sha256"]:
                raise StoreError(f"{path} does not match its SHA-256 in the manifest (altered "
                                 "or corrupt); resume from another checkpoint")
            try:
                self._open[file] = safe_open(str(path), framework="pt", device="cpu")
            except Exception as e:
                raise StoreError(f"{path} cannot be read ({type(e).__name__}); the "
                                 "checkpoint is damaged: resume from another") from None
        return self._open[file]


def _by_view(pieces: list[Piece]) -> dict[ShardView | None, list[Piece]]:
    out: dict = {}
    for p in pieces:
        out.setdefault(p.view, []).append(p)
    return out


def cut_flat(t: torch.Tensor, flat: tuple[int, int] | None) -> torch.Tensor:
    """The flat element range ``flat`` of ``t`` (all of it for None), as a 1-D view
    when ``flat`` is given."""
    return t if flat is None else t.reshape(-1)[flat[0]:flat[1]]


def row_range(shape: tuple[int, ...], parts: int, index: int) -> tuple[int, int]:
    """The flat element range of part ``index`` when a tensor of ``shape`` is cut into
    ``parts`` along dim 0 as ``torch.chunk`` does (FSDP's row shards)."""
    if not shape:
        return (0, 1)
    rows = shape[0]
    per = math.ceil(rows / parts)
    row_elems = math.prod(shape[1:])
    a, b = min(rows, index * per), min(rows, (index + 1) * per)
    return (a * row_elems, b * row_elems)
