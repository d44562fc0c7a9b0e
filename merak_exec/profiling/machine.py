"""Machine parameters of a gloo world: point-to-point latency and bandwidth, the cost of
posting an operation, and the contention of every rank computing at once."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from merak_exec.profiling.clock import median_time

__all__ = ["measure_machine"]


def _one_way(rank: int, t: torch.Tensor, warmup: int, repeats: int, world: int) -> float:
    """Median one-way seconds of ``t`` from rank 0 to rank 1: the receiver has posted
    its ``irecv`` and waits on it, the sender stamps the moment it posts ``isend``, the
    receiver the moment its wait returns (both ``perf_counter``, one clock for every
    process on the machine)."""
    stamps = []
    for _ in range(warmup + repeats):
        dist.barrier()
        w = dist.irecv(t, 0) if rank == 1 else None
        dist.barrier()
        stamp = 0.0
        if rank == 0:
            stamp = time.perf_counter()
            dist.isend(t, 1).wait()
        elif rank == 1:
            w.wait()
            stamp = time.perf_counter()
        stamps.append(stamp)
    allv: list = [None] * world
    dist.all_gather_object(allv, stamps)
    lat = [b - a for a, b in zip(allv[0][warmup:], allv[1][warmup:], strict=True)]
    return statistics.median(lat)


def _half_round_trip(rank: int, t: torch.Tensor, warmup: int, repeats: int) -> float:
    """Half the blocking ping-pong time between ranks 0 and 1 (a diagnostic)."""
    peer = 1 - rank if rank < 2 else -1

    def ping():
        if rank == 0:
            dist.send(t, peer)
            dist.recv(t, peer)
        elif rank == 1:
            dist.recv(t, peer)
            dist.send(t, peer)
    dist.barrier()
    return median_time(ping, warmup, repeats) / 2


def _post_cost(rank: int, nbytes: int, warmup: int, repeats: int) -> float:
    """Median seconds of posting one non-blocking send or receive (the runtime posts
    between compute actions; the simulator's posts take no time, so it is added to the
    action that follows). Both directions, in lockstep."""
    two = rank < 2
    peer = 1 - rank if two else -1
    t = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
    posts = []
    for i in range(warmup + repeats):
        for sender in (0, 1):
            dist.barrier()
            if not two:
                continue
            t0 = time.perf_counter()
            w = dist.isend(t, peer) if rank == sender else dist.irecv(t, peer)
            d = time.perf_counter() - t0
            w.wait()
            if i >= warmup:
                posts.append(d)
    return statistics.median(posts) if posts else 0.0


def _contention(rank: int, world: int, warmup: int, repeats: int) -> dict:
    """A fixed matmul loop timed on rank 0 alone and on every rank at once."""
    dist.barrier()
    a = torch.randn(192, 192)

    def work():
        for _ in range(20):
            a @ a
    solo = []
    for r in range(world):  # each rank alone, the others wait at the barrier
        if r == rank:
            solo.append(median_time(work, warmup, repeats))
        dist.barrier()
    together = median_time(work, warmup, repeats)
    dist.barrier()
    return {"compute_solo_s": solo[0], "compute_together_s": together,
            "contention_factor": together / solo[0] if solo and solo[0] > 0 else 1.0}


def _fit(points: list[list[float]]) -> dict:
    """alpha + bytes * beta, least squares over (bytes, seconds) points."""
    if len(points) < 2:
        return {}
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    beta = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx, 0.0)
    return {"p2p_alpha_s": max(0.0, my - beta * mx), "p2p_s_per_byte": beta}


def measure_machine(rank: int, world: int, sizes: list[int], warmup: int, repeats: int) -> dict:
    """gloo point-to-point between ranks 0 and 1 and the contention factor of ``world``
    busy processes (every rank calls it together).

    One-way time as the runtime meets it when a transfer is exposed, fitted as
    alpha + bytes * beta (least squares over the medians per size); the blocking
    ping-pong (half a round trip) is kept as a diagnostic; the cost of posting an
    operation at the largest size.
    """
    out: dict = {"p2p_points": [], "pingpong_points": []}
    for n in sizes if world >= 2 else []:
        t = torch.zeros(max(1, n // 4), dtype=torch.float32)
        out["p2p_points"].append([t.numel() * 4, _one_way(rank, t, warmup, repeats, world)])
        out["pingpong_points"].append([t.numel() * 4,
                                       _half_round_trip(rank, t, warmup, repeats)])
    if world >= 2:
        out["p2p_post_s"] = _post_cost(rank, sizes[-1], warmup, repeats)
    out.update(_contention(rank, world, warmup, repeats))
    out.update(_fit(out["p2p_points"]))
    out["threads"] = torch.get_num_threads()
    return out
