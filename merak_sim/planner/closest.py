"""The candidate closest to fitting when nothing fits, by its exact memory.

The rows the search pruned for memory carry a lower bound of their shortfall: the
relaxed screen's or the one-micro-batch screen's (model state that a ZeRO stage might
still shard, one micro-batch where the schedule keeps several). Ranking by those
bounds would name a candidate that only looks close. So the candidates are visited in
the order of their bounds and priced exactly (their cost table, then the schedule's
live micro-batches, :func:`~merak_sim.planner.screen.fit_fractions`: the walk the
simulator's peak agrees with) until the next bound reaches the smallest exact
shortfall found. That candidate is the closest, and its shortfall is what simulating
it reports (stage-aware at the fractions the walk chose, fully checkpointed when
nothing fits). At most :data:`MAX_PRICED` candidates are priced; a search stopped
there says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from merak_sim.schedule import ScheduleError

from .rows import RowBook, row
from .screen import Pricer, fit_fractions
from .templates import memory_template

__all__ = ["Closest", "closest_exact", "MAX_PRICED"]

#: Candidates priced exactly at most while looking for the closest.
MAX_PRICED = 2000
_GiB = float(2**30)


@dataclass(frozen=True)
class Closest:
    """The closest candidate: its table row (exact shortfall and peak, stage-aware
    fractions), the stage over capacity, the capacity, and whether the search for
    it stopped at :data:`MAX_PRICED`."""

    row: dict
    shortfall_bytes: float
    peak_bytes: float
    stage: int
    capacity_bytes: float
    stopped: bool = False


def closest_exact(job: Any, rows: RowBook) -> Closest | None:
    """The memory-pruned candidate of ``rows`` with the smallest exact shortfall
    (module docstring); ``job`` is the search's (model, cluster, cost model, global
    batch, space, ``capacity(table)``). None when no row was pruned for memory."""
    short, sources = rows.memory_pruned()
    if not len(short):
        return None
    pricer = Pricer(job.model, job.cluster, job.cost_model, job.global_batch_size,
                    job.space.dtype, job.space.order)
    best: Closest | None = None
    priced = 0
    for i in np.argsort(short, kind="stable").tolist():
        if best is not None and short[i] * _GiB >= best.shortfall_bytes:
            break
        if priced >= MAX_PRICED:
            return None if best is None else Closest(**{**best.__dict__, "stopped": True})
        priced += 1
        got = _exact(job, pricer, rows.candidate_of(sources[i]))
        if got is not None and (best is None or got.shortfall_bytes < best.shortfall_bytes):
            best = got
    return best


def _exact(job: Any, pricer: Pricer, c) -> Closest | None:
    """The exact memory of candidate ``c`` as a :class:`Closest` (None when it cannot
    be priced or scheduled)."""
    entry = pricer.price(c)
    if isinstance(entry, Exception):
        return None
    tab, arr = entry
    try:
        mt = memory_template(c.schedule, c.pp, c.microbatches, c.virtual_stages)
    except ScheduleError:
        return None
    cap = job.capacity(tab)
    fit = fit_fractions(c, arr, mt, cap)
    fracs = fit.fractions if c.recompute == "stage-aware" else None
    peak = fit.peaks[fit.rank]
    reason = (f"memory: stage {fit.rank} needs {peak / _GiB:.1f} GiB > {cap / _GiB:.1f} GiB "
              f"(short {fit.shortfall / _GiB:.2f} GiB)")
    return Closest(row(c, "pruned", reason, shortfall_gib=fit.shortfall / _GiB,
                       peak_memory_gib=max(fit.peaks) / _GiB, recompute_fractions=fracs),
                   fit.shortfall, peak, fit.rank, cap)
