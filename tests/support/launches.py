"""Launching ranks from the tests without racing for a port, and short failure reports.

- Workers spawned by :func:`merak_exec.launch.run_ranks` take :data:`STORE_PORT` and
  processes started by hand take :func:`merak_exec.launch.hosted_store`'s environment:
  the rendezvous store is bound by the test process before any rank starts.
- A launcher that binds a port of its own (a dispatched ``launch.sh`` runs torchrun
  with ``--master-port``) keeps the race; :func:`run_with_fresh_port` retries such a
  launch with a fresh port when it lost the port (EADDRINUSE), and only then.
- :func:`failure_text` is what a worker writes to its result file for an exception:
  one line for a failed start or communication, the traceback for anything else.
"""

from __future__ import annotations

import subprocess
import sys
import traceback
from collections.abc import Callable

from merak_exec.launch import STORE_PORT, free_port, hosted_store, launch_failure_line

__all__ = ["STORE_PORT", "hosted_store", "failure_text", "address_in_use",
           "run_with_fresh_port"]


def failure_text(rank: int) -> str:
    """The exception being handled, for rank ``rank``'s result file: one line (no C++
    frames) for a failed start or communication, else its full traceback."""
    return launch_failure_line(rank, sys.exc_info()[1]) or traceback.format_exc()


def address_in_use(text: str) -> bool:
    """Whether a launch's output says its port was taken (torch's TCPStore, any OS)."""
    return "EADDRINUSE" in text or "ddress already in use" in text


def run_with_fresh_port(command: Callable[[int], list[str]], attempts: int = 3,
                        **run_kw) -> subprocess.CompletedProcess:
    """``subprocess.run(command(port), capture_output=True, text=True, **run_kw)`` with
    a fresh :func:`free_port`; run again with another port (at most ``attempts``
    times in all) only when the launch failed because the port was taken."""
    attempts = max(1, attempts)
    for attempt in range(attempts):
        r = subprocess.run(command(free_port()), capture_output=True, text=True, **run_kw)
        if r.returncode == 0 or not address_in_use(r.stdout + r.stderr) \
                or attempt == attempts - 1:
            return r
    raise AssertionError("unreachable")  # the loop returns on its last attempt
