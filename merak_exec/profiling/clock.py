"""Timing helpers shared by the profilers: GPU synchronisation and medians of samples."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["sync", "median_time"]


def sync() -> None:
    """Wait for queued GPU work (timing GPU actions with a host clock needs it)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def median_time(fn: Callable[[], object], warmup: int, repeats: int,
                between: Callable[[], object] | None = None,
                fastest: dict | None = None) -> float:
    """Median seconds of ``fn`` over ``repeats`` after ``warmup``; ``between()`` runs
    after each sample, untimed. With a dict ``fastest``, its ``"t"`` gets the fastest
    sample and ``"mean"`` the mean."""
    ts = []
    for i in range(warmup + repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        d = time.perf_counter() - t
        if between is not None:
            between()
        if i >= warmup:
            ts.append(d)
    if fastest is not None:
        fastest["t"] = min(ts)
        fastest["mean"] = statistics.fmean(ts)
    return statistics.median(ts)
