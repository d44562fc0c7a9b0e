"""Unit-cost replay: makespan and idle time of a schedule under toy costs.

Costs follow Merak's schedule analysis (Lai et al., TPDS 2023): forward ``f``, backward ``b`` (split into
``b - w`` for I and ``w`` for W in zero-bubble schedules), re-forward ``r`` (default
``f``). A backward whose forward was checkpointed also pays the recompute of the
checkpointed fraction ``c_s`` of the stage: ``b + c_s * r``, unless an explicit R
already ran for that micro-batch (then it pays ``b``; the R paid ``r``). Stages the
schedule marks as never recomputing use ``c_s = 0``. Communication is free unless
``comm`` is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .execute import Execution, execute
from .ir import Action, Kind, Schedule, ScheduleError, iter_actions

__all__ = ["ReplayResult", "replay", "stage_aware_fractions"]


@dataclass(frozen=True)
class ReplayResult:
    """Makespan, per-rank busy and idle time, and the underlying execution."""

    makespan: float
    busy: tuple[float, ...]
    idle: tuple[float, ...]
    execution: Execution

    @property
    def bubble_fraction(self) -> float:
        """Mean idle time over ranks divided by the makespan."""
        if not self.makespan:
            return 0.0
        return sum(self.idle) / len(self.idle) / self.makespan


def stage_aware_fractions(num_stages: int, c0: float) -> tuple[float, ...]:
    """Merak T2 checkpoint fractions: hold (1 - c_s)(S-1-s) constant.

    c_s = max(0, 1 - (1 - c0)(S-1)/(S-1-s)) for s < S-1 and c_{S-1} = 0
    (Lai et al., TPDS 2023, Sec. on stage-aware recomputation).
    """
    if not 0.0 <= c0 <= 1.0:
        raise ScheduleError(f"c0 must lie in [0, 1], got {c0}")
    S = num_stages
    return tuple(
        max(0.0, 1.0 - (1.0 - c0) * (S - 1) / (S - 1 - s)) if s < S - 1 else 0.0
        for s in range(S)
    )


def replay(
    sched: Schedule,
    f: float = 1.0,
    b: float = 2.0,
    w: float | None = None,
    r: float | None = None,
    recompute: float | Sequence[float] = 0.0,
    comm: float = 0.0,
) -> ReplayResult:
    """Replay ``sched`` with unit costs (see module docstring).

    Args:
        recompute: checkpointed fraction c_s per stage (one float for every stage).
        w: weight-gradient share of ``b`` for I/W splits (default ``b / 2``).
        comm: transfer time of every send.
    """
    S, v = sched.num_stages, sched.virtual_stages
    fr = [float(recompute)] * S if isinstance(recompute, (int, float)) else list(recompute)
    if len(fr) != S:
        raise ScheduleError(f"recompute has {len(fr)} fractions for {S} stages")
    fr = [0.0 if s in sched.no_recompute_stages else c for s, c in enumerate(fr)]
    rr = f if r is None else r
    ww = b / 2 if w is None else w
    explicit_r = {
        (a.stage, a.chunk, a.microbatch)
        for p in sched.programs
        for a in iter_actions(p)
        if a.kind is Kind.RECOMPUTE
    }
    # Per-chunk costs: a rank's v chunks share its layers equally.
    fc, bc, wc, rc = f / v, b / v, ww / v, rr / v

    def dur(a: Action) -> float:
        k = a.kind
        if k in (Kind.FORWARD, Kind.FORWARD_NOGRAD):
            return fc
        if k is Kind.RECOMPUTE:
            return rc
        extra = 0.0 if (a.stage, a.chunk, a.microbatch) in explicit_r else fr[a.stage] * rc
        if k is Kind.BACKWARD:
            return bc + extra
        if k is Kind.BACKWARD_INPUT:
            return bc - wc + extra
        if k is Kind.BACKWARD_WEIGHT:
            return wc
        return 0.0

    ex = execute(sched, dur, (lambda a: comm) if comm else None)
    busy = tuple(ex.busy(s) for s in range(S))
    return ReplayResult(ex.makespan, busy, tuple(ex.makespan - x for x in busy), ex)
