"""Starting a local world of ranks: a free loopback port and spawned processes.

Used by the measurements (:mod:`merak_exec.profiling`), the benchmarks and the tests'
multi-process workers; a worker calls :func:`merak_exec.mesh.loopback_env` and
:func:`merak_exec.mesh.init_distributed` with the port it was given.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import torch.multiprocessing as mp

__all__ = ["free_port", "run_ranks"]


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn: Callable, world: int, args: tuple = (), *, timeout_s: float = 600,
              fail_fast: bool = True) -> list[int | None]:
    """Run ``fn(rank, *args)`` in ``world`` fresh (spawned) processes and wait for all.

    ``fn`` must be importable by module and name (spawn pickles it). Returns each
    rank's exit code; None for a rank still running at ``timeout_s`` (it is killed).
    With ``fail_fast``, the first rank to exit with a non-zero code gets the others
    killed (their codes are then negative), so a crashed rank does not leave its
    peers waiting for their timeout.
    """
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=fn, args=(r, *args)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    timed_out: set[int] = set()
    while any(p.is_alive() for p in procs):
        if time.monotonic() > deadline:
            timed_out = {r for r, p in enumerate(procs) if p.is_alive()}
            break
        if fail_fast and any(p.exitcode not in (None, 0) for p in procs):
            break
        for p in procs:
            p.join(0.2)
            if p.is_alive():
                break
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    return [None if r in timed_out else p.exitcode for r, p in enumerate(procs)]
