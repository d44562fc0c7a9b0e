"""Starting a local world of ranks without racing for a port, and reporting a failed
start in one line.

Used by the measurements (:mod:`merak_exec.profiling`), the benchmarks and the tests'
multi-process workers; a worker calls :func:`merak_exec.mesh.loopback_env` and
:func:`merak_exec.mesh.init_distributed` with the port it was given.

Why a hosted store: picking a free port and letting rank 0 bind it later races with
every other process on the machine (a parallel test's rendezvous, or any outgoing
connection given that ephemeral port): under load two launches failed with
EADDRINUSE. :func:`hosted_store` binds the rendezvous store here, on a port the
kernel picks, *before* any rank starts, and serves it until the world ends, as
torchrun's agent serves its workers' store (``TORCHELASTIC_USE_AGENT_STORE``); the
ranks only connect to it. :func:`run_ranks` does this for every ``args`` entry that is
:data:`STORE_PORT`. :func:`free_port` remains for launchers that bind the port
themselves (torchrun ``--master-port``), where the race is theirs.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator

import torch.multiprocessing as mp

__all__ = ["free_port", "hosted_store", "run_ranks", "STORE_PORT", "launch_failure_line"]


class _StorePort:
    """Type of :data:`STORE_PORT` (a named placeholder, printed as such)."""

    def __repr__(self) -> str:
        return "STORE_PORT"


#: Put this in :func:`run_ranks`' ``args`` where the worker takes its rendezvous port:
#: it becomes the port of the store run_ranks hosts for the world.
STORE_PORT = _StorePort()


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago (another process may take it
    before it is bound again: prefer :func:`hosted_store` / :data:`STORE_PORT`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def hosted_store(world: int, timeout_s: float = 600) -> Iterator[dict[str, str]]:
    """Serve a rendezvous store for a local world of ``world`` ranks from this process
    for the duration of the block, bound before the block starts (no port race);
    yields the environment each rank needs besides its RANK / WORLD_SIZE
    (MASTER_ADDR, MASTER_PORT and ``TORCHELASTIC_USE_AGENT_STORE=True``, which makes
    torch.distributed's ``env://`` rendezvous connect instead of binding)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    try:
        yield {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
               "TORCHELASTIC_USE_AGENT_STORE": "True"}
    finally:
        del store  # closes the listening socket


def launch_failure_line(rank: int, e: BaseException) -> str | None:
    """One line for a rank whose distributed start or communication failed (torch's
    DistError, merak_exec's RankTimeoutError): its first message line, without
    torch's C++ frames; None for any other exception (a bug: keep its traceback)."""
    import torch.distributed as dist

    from merak_exec.mesh import RankTimeoutError

    if not isinstance(e, (dist.DistError, RankTimeoutError)):
        return None
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    return f"merak_exec.launch: rank {rank} failed to start or communicate: {first}"


def _rank_main(fn: Callable, env: dict[str, str], rank: int, *args) -> None:
    """A spawned rank: the world's environment, then ``fn(rank, *args)``; a failed
    start or communication ends it with one line (exit 1)."""
    os.environ.update(env)
    try:
        fn(rank, *args)
    except Exception as e:
        line = launch_failure_line(rank, e)
        if line is None:
            raise
        print(line, file=sys.stderr, flush=True)
        os._exit(1)


def run_ranks(fn: Callable, world: int, args: tuple = (), *, timeout_s: float = 600,
              fail_fast: bool = True) -> list[int | None]:
    """Run ``fn(rank, *args)`` in ``world`` fresh (spawned) processes and wait for all.

    Each :data:`STORE_PORT` in ``args`` is replaced by the port of a store this process
    hosts for the world (:func:`hosted_store`): no port race. ``fn`` must be importable
    by module and name (spawn pickles it). Returns each rank's exit code; None for a
    rank still running at ``timeout_s`` (it is killed). With ``fail_fast``, the first
    rank to exit with a non-zero code gets the others killed (their codes are then
    negative), so a crashed rank does not leave its peers waiting for their timeout.
    """
    hosted = any(a is STORE_PORT for a in args)
    with hosted_store(world, timeout_s) if hosted else contextlib.nullcontext({}) as env:
        if hosted:
            args = tuple(int(env["MASTER_PORT"]) if a is STORE_PORT else a for a in args)
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_rank_main, args=(fn, env, r, *args)) for r in range(world)]
        for p in procs:
            p.start()
        return _wait(procs, timeout_s, fail_fast)


def _wait(procs: list, timeout_s: float, fail_fast: bool) -> list[int | None]:
    """Exit codes of ``procs`` (None: killed at the deadline); see :func:`run_ranks`."""
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
