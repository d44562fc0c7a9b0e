"""ZeRO-3 (FSDP) communication on its own lines: per-rank breakdowns, tables and trace
events, from a simulation's schedule and its cost table.

The cost model prices each micro-batch's all-gathers (before every unit's forward and
backward) and reduce-scatters (after its backward) and adds what prefetching cannot
hide to the compute time of the forward and backward (``StageCost.fsdp_*``,
:mod:`merak_sim.costs.sharded_dp`); the simulator runs those actions for that long.
This module says how much of each rank's compute and recompute columns is that
communication (:func:`zero_comm`), prints the breakdown with it as a column of its
own (:func:`breakdown_lines`) and draws it as events of kind :data:`ZERO_KIND` on a
track of its own (:func:`zero_events`): one per forward, re-forward and backward,
starting with the action (the first unit's all-gather comes before any compute) and
lasting the collectives' time priced alone, at most the action's.

Which actions carry it: a forward (F, and F* and an explicit re-forward R, which cost
a forward) the forward's exposed all-gathers; a backward (B, or the input half I of a
split one) the backward's; a weight-gradient half (W) none.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from merak_sim.schedule.ir import Action, Kind
from merak_sim.schedule.placement import stage_grid
from merak_sim.sim.from_config import schedule_for
from merak_sim.timeline import ZERO_KIND

__all__ = ["ZeroComm", "zero_comm", "zero_events", "breakdown_lines", "summary_with",
           "ZERO_KIND"]

_FWD = (Kind.FORWARD, Kind.FORWARD_NOGRAD, Kind.RECOMPUTE)
_BWD = (Kind.BACKWARD, Kind.BACKWARD_INPUT)


@dataclass(frozen=True)
class ZeroComm:
    """ZeRO-3 communication per simulated GPU (the result's rank order), seconds:
    ``in_compute_s`` and ``in_recompute_s`` the exposed part inside those columns of
    the breakdown, ``exposed_s`` their sum, ``total_s`` every collective priced alone
    (most hidden behind compute by prefetching), ``bytes`` sent per GPU."""

    ranks: tuple[int, ...]
    in_compute_s: tuple[float, ...]
    in_recompute_s: tuple[float, ...]
    total_s: tuple[float, ...]
    bytes: tuple[float, ...]

    @property
    def exposed_s(self) -> tuple[float, ...]:
        """Exposed ZeRO-3 seconds per GPU (compute and recompute parts together)."""
        return tuple(a + b for a, b in zip(self.in_compute_s, self.in_recompute_s,
                                           strict=True))

    def to_dict(self) -> list[dict]:
        """One JSON row per GPU."""
        return [{"rank": r, "exposed_s": a + b, "in_compute_s": a, "in_recompute_s": b,
                 "total_s": t, "bytes": n}
                for r, a, b, t, n in zip(self.ranks, self.in_compute_s, self.in_recompute_s,
                                         self.total_s, self.bytes, strict=True)]


def _per_action(sc, kind: Kind) -> tuple[float, float, float]:
    """(exposed, total, bytes) of one action of ``kind`` on a stage costing ``sc``."""
    if kind in _FWD:
        return sc.fsdp_exposed_fwd_s, sc.fsdp_comm_fwd_s, sc.fsdp_bytes_fwd
    if kind in _BWD:
        return sc.fsdp_exposed_bwd_s, sc.fsdp_comm_bwd_s, sc.fsdp_bytes_bwd
    return 0.0, 0.0, 0.0


def _stage_of(config: Any) -> dict[tuple[int, int], int]:
    """Model stage of each (pipeline rank, chunk)."""
    grid = stage_grid(config.placement, config.pp, config.virtual_stages)
    return {(r, c): int(grid[c][r]) for c in range(len(grid)) for r in range(len(grid[c]))}


def zero_comm(result: Any, table: Any) -> ZeroComm | None:
    """The ZeRO-3 communication of ``result`` (a SimResult of ``result.config``)
    priced by ``table`` (its cost table); None when the table has none."""
    if not any(sc.fsdp_comm_fwd_s or sc.fsdp_comm_bwd_s for sc in table.stages):
        return None
    cfg = result.config
    stage = _stage_of(cfg)
    sched = schedule_for(cfg, table)
    per_rank = []
    for prog in sched.programs:
        count = Counter((a.kind, a.chunk) for a in prog if type(a) is Action)
        comp = rec = tot = nb = 0.0
        for (kind, chunk), n in count.items():
            x, t, b = _per_action(table.stages[stage[prog[0].stage, chunk]], kind)
            comp += 0.0 if kind is Kind.RECOMPUTE else n * x
            rec += n * x if kind is Kind.RECOMPUTE else 0.0
            tot, nb = tot + n * t, nb + n * b
        per_rank.append((comp, rec, tot, nb))
    rows = [per_rank[r.stage] for r in result.ranks]
    return ZeroComm(tuple(r.rank for r in result.ranks), *(tuple(x[i] for x in rows)
                                                           for i in range(4)))


def zero_events(events: Any, result: Any, table: Any) -> list[tuple]:
    """Event rows (:data:`~merak_sim.timeline.EVENT_COLUMNS`) of the ZeRO-3
    collectives of every forward, re-forward and backward in ``events`` (the
    result's events table), kind :data:`ZERO_KIND` (module docstring)."""
    stage = _stage_of(result.config)
    out = []
    cols = ("rank", "stage", "chunk", "stream", "kind", "action", "microbatch", "start_s",
            "end_s")
    for rank, s, ch, stream, kind, action, mb, st, en in zip(
            *(events[c].tolist() for c in cols), strict=True):
        if stream != "compute" or kind not in Kind.__members__:
            continue
        _x, t, b = _per_action(table.stages[stage[s, ch]], Kind[kind])
        if t > 0.0:
            out.append((rank, s, ch, "collective", ZERO_KIND, action, mb, st,
                        st + min(t, en - st), b))
    return out


def breakdown_lines(result: Any, zc: ZeroComm, limit: int = 64) -> list[str]:
    """The per-GPU breakdown with ZeRO-3 communication as a column of its own (taken
    out of the compute and recompute columns it was inside)."""
    lines = [f"{'rank':>5} {'stage':>5} {'compute ms':>11} {'recomp ms':>10} "
             f"{'comm ms':>9} {'zero-3 ms':>10} {'bubble ms':>10} {'peak GiB':>9}"]
    for i, r in enumerate(result.ranks[:limit]):
        lines.append(
            f"{r.rank:5d} {r.stage:5d} {(r.compute_s - zc.in_compute_s[i]) * 1e3:11.3f} "
            f"{(r.recompute_s - zc.in_recompute_s[i]) * 1e3:10.3f} "
            f"{r.exposed_comm_s * 1e3:9.3f} {zc.exposed_s[i] * 1e3:10.3f} "
            f"{r.bubble_s * 1e3:10.3f} {r.peak_memory_bytes / 2**30:9.2f}")
    if len(result.ranks) > limit:
        lines.append(f"... {len(result.ranks) - limit} more GPUs")
    lines.append("zero-3 ms: the all-gathers and reduce-scatters prefetching cannot hide "
                 "(exposed);")
    lines.append(f"  every collective priced alone: {max(zc.total_s) * 1e3:.3f} ms on the "
                 f"busiest GPU, {max(zc.bytes) / 2**30:.2f} GiB sent")
    return lines


def summary_with(result: Any, zc: ZeroComm) -> str:
    """``result.summary()`` with its per-GPU table replaced by :func:`breakdown_lines`."""
    lines = result.summary().splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith(f"{'rank':>5} {'stage':>5}"))
    end = head + 1 + min(len(result.ranks), 64) + (len(result.ranks) > 64)
    return "\n".join(lines[:head] + breakdown_lines(result, zc) + lines[end:])
