"""gloo collective timings for a ``merak-trace/1`` trace: two local processes on loopback.

:func:`measure_collectives` times all-reduce, all-gather and send/recv (gloo has no
reduce-scatter) for a few sizes, each the median of ``repeats`` runs started after a
barrier, recorded as group size 2, placement "intra" (bytes = the full buffer: the
all-reduced tensor, the gathered output, the message).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from merak_exec.launch import STORE_PORT, run_ranks
from merak_exec.mesh import init_distributed, loopback_env
from merak_sim.io import atomic_write_text
from merak_sim.trace import CollectiveRecord

__all__ = ["measure_collectives"]


def _median_after_barrier(op, repeats: int) -> float:
    ts = []
    for _ in range(repeats + 1):
        dist.barrier()
        t = time.perf_counter()
        op()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts[1:])


def _worker(rank: int, world: int, port: int, sizes: list[int], repeats: int,
            out_dir: str) -> None:
    loopback_env(rank, world, port)
    os.environ.setdefault("MERAK_TIMEOUT_S", "60")
    init_distributed(backend="gloo")
    res = []
    for nbytes in sizes:
        n = nbytes // 4
        x = torch.ones(n)
        outs = [torch.empty(n // 2), torch.empty(n // 2)]
        ops = {
            "all-reduce": functools.partial(dist.all_reduce, x),
            "all-gather": functools.partial(dist.all_gather, outs, x[: n // 2]),
            "p2p": (functools.partial(dist.send, x, 1) if rank == 0
                    else functools.partial(dist.recv, x, 0)),
        }
        for name, op in ops.items():
            res.append((name, nbytes, _median_after_barrier(op, repeats)))
    if rank == 0:
        atomic_write_text(os.path.join(out_dir, "collectives.json"), json.dumps(res))
    dist.barrier()
    os._exit(0)  # skip gloo teardown (known exit-time aborts); results are written


def measure_collectives(sizes: list[int], repeats: int = 15,
                        timeout_s: float = 300) -> list[CollectiveRecord]:
    """Collective timings between 2 gloo processes on this machine (module docstring)."""
    with tempfile.TemporaryDirectory() as d:
        codes = run_ranks(_worker, 2, (2, STORE_PORT, list(sizes), repeats, d),
                          timeout_s=timeout_s)
        path = os.path.join(d, "collectives.json")
        if codes != [0, 0] or not os.path.exists(path):
            raise RuntimeError(f"collective measurement failed (exit codes {codes}); check "
                               "that loopback TCP works")
        with open(path) as f:
            res = json.load(f)
    return [CollectiveRecord(name, 2, "intra", float(nb), t) for name, nb, t in res]
