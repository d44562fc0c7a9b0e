"""Small file helpers: every file the toolkit writes is written atomically, and every
output path is checked before any work by one checker that both command lines use.

:func:`check_output_path` is that checker: an existing target must be a regular file
(or a symlink, which the write replaces as a link, leaving its target alone); a
device, FIFO, socket or directory is refused, so ``--chrome-trace /dev/full`` cannot
replace a device node. :func:`atomic_write_bytes` re-checks just before its rename,
so a non-regular file that appeared meanwhile is still never renamed over.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

__all__ = ["OutputPathError", "check_output_path", "atomic_write_bytes", "atomic_write_text"]


class OutputPathError(ValueError):
    """An output path that cannot be written; the message names the path, the problem
    and the fix (one line)."""


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists as something a file write must not replace:
    a device, FIFO, socket or directory (a symlink to a directory counts as one)."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None  # missing (or unreadable: the write itself will say)
    if stat.S_ISLNK(mode):
        return "a directory" if path.is_dir() else None
    if stat.S_ISDIR(mode):
        return "a directory"
    return next((what for test, what in _KINDS if test(mode)), None)


def _nearest_existing(p: Path) -> Path:
    for parent in (p, *p.parents):
        if parent.exists():
            return parent
    return Path(".")


def check_output_path(path: str | Path, *, folder: bool = False) -> None:
    """Raise :class:`OutputPathError` unless ``path`` can be written as a file (as a
    directory with ``folder``): an existing target of the wrong kind is refused, and a
    temporary file is created and removed in the nearest existing directory (the
    writers make missing ones), so nothing is left behind."""
    p = Path(path)
    if folder:
        if p.exists() and not p.is_dir():
            raise OutputPathError(f"{path}: is {_not_regular(p) or 'a file'}, give a "
                                  "directory")
    else:
        kind = _not_regular(p)
        if kind == "a directory":
            raise OutputPathError(f"{path}: is a directory, give a file name")
        if kind:
            raise OutputPathError(f"{path}: is {kind}, not a regular file; give a file "
                                  "name (writing would replace it)")
    base = _nearest_existing(p if folder else p.parent)
    if not base.is_dir():
        raise OutputPathError(f"{path}: {base} is not a directory; choose another path")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".merak-probe.", dir=base)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise OutputPathError(f"{path}: cannot write there ({e.strerror or e})") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename, so a crash never
    leaves a half-written file behind. Creates missing parent directories."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp creates 0600 files; give the result the usual permissions.
        os.chmod(tmp, 0o666 & ~_umask())
        kind = _not_regular(path)  # appeared since the check: never rename over it
        if kind:
            raise OutputPathError(f"{path}: is {kind}, not a regular file; not replaced")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Text version of :func:`atomic_write_bytes` (UTF-8)."""
    atomic_write_bytes(path, text.encode("utf-8"))
