"""The schedule IR in flat arrays: one row per action, for schedules too large for one
Python object per action.

A :class:`StepRows` holds every rank's program as integer columns (kind code,
micro-batch, chunk, and whether the row joins the previous row's :class:`Fused`
step), rank after rank in program order; :func:`programs_of_rows` and
:func:`rows_of_programs` convert between it and the :class:`Action` programs exactly.
The generators with a closed form (GPipe, 1F1B, interleaved 1F1B:
:data:`ARRAY_ORDERS`) build their compute order as arrays directly, and
:func:`lower_rows` is :func:`~merak_sim.schedule.lowering.lower`'s default pass
vectorised (receive before its consumer, send after its producer, a send fused with
the next receive to the same peer). :func:`array_schedule` wraps the result as an
:class:`ArraySchedule`: a :class:`Schedule` whose Action programs are built only when
something reads them (printing, validation, the runtime), while the simulator's
compile path (:mod:`merak_sim.sim.flat_structure`) reads the rows.

Why rows and not objects: a published run (Megatron-LM's 1T model, 65,536 micro-batch
passes) has about 400,000 actions; building, lowering and walking an object per
action cost about 8 us per pass, the arrays well under one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .ir import Action, Kind, Schedule, Step
from .placement import placed_rank
from .spec import ScheduleSpec
from .unchecked import action, fused, new_twin

__all__ = ["StepRows", "ArraySchedule", "ARRAY_ORDERS", "KIND_OF_CODE", "rows_of_programs",
           "programs_of_rows", "rows_of", "lower_rows", "array_schedule", "compute_rows",
           "model_stages"]

#: Kind by :attr:`Kind.code`.
KIND_OF_CODE = tuple(Kind)
_F, _FN, _B, _I = (Kind.FORWARD.code, Kind.FORWARD_NOGRAD.code, Kind.BACKWARD.code,
                   Kind.BACKWARD_INPUT.code)
_SA, _RA, _SG, _RG = (Kind.SEND_ACT.code, Kind.RECV_ACT.code, Kind.SEND_GRAD.code,
                      Kind.RECV_GRAD.code)
_AR, _OPT = Kind.ALL_REDUCE.code, Kind.OPTIMIZER.code


@dataclass(frozen=True, eq=False)
class StepRows:
    """Every rank's program as flat columns, ranks in order, each in program order.

    Attributes:
        kind: :attr:`Kind.code` of each action (int8).
        microbatch: its micro-batch, -1 for AR and OPT (int64).
        chunk: its chunk (int64).
        joined: whether the row is a later part of the previous row's
            :class:`~merak_sim.schedule.ir.Fused` step (bool).
        bounds: rank r's rows are ``bounds[r]:bounds[r + 1]`` (int64, ranks + 1).
    """

    kind: np.ndarray
    microbatch: np.ndarray
    chunk: np.ndarray
    joined: np.ndarray
    bounds: np.ndarray

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks."""
        return len(self.bounds) - 1

    @cached_property
    def rank(self) -> np.ndarray:
        """The rank of each row (int64)."""
        return np.repeat(np.arange(self.num_ranks, dtype=np.int64), np.diff(self.bounds))

    def equals(self, other: StepRows) -> bool:
        """Whether both hold the same rows (column by column)."""
        return all(np.array_equal(getattr(self, f), getattr(other, f))
                   for f in ("kind", "microbatch", "chunk", "joined", "bounds"))


def rows_of_programs(programs: tuple[tuple[Step, ...], ...]) -> StepRows:
    """The rows of Action programs (one Python step per row: for small schedules and
    for generators without a closed form)."""
    kind: list[int] = []
    mb: list[int] = []
    ch: list[int] = []
    joined: list[bool] = []
    bounds = [0]
    for prog in programs:
        for step in prog:
            first = True
            for a in step.parts:
                kind.append(a.kind.code)
                mb.append(a.microbatch)
                ch.append(a.chunk)
                joined.append(not first)
                first = False
        bounds.append(len(kind))
    return StepRows(np.array(kind, dtype=np.int8), np.array(mb, dtype=np.int64),
                    np.array(ch, dtype=np.int64), np.array(joined, dtype=bool),
                    np.array(bounds, dtype=np.int64))


def programs_of_rows(rows: StepRows) -> tuple[tuple[Step, ...], ...]:
    """The Action programs the rows hold (the inverse of :func:`rows_of_programs`)."""
    kinds = KIND_OF_CODE
    out = []
    bounds = rows.bounds.tolist()
    kind, mb, ch, joined = (rows.kind.tolist(), rows.microbatch.tolist(),
                            rows.chunk.tolist(), rows.joined.tolist())
    for r in range(rows.num_ranks):
        prog: list[Step] = []
        group: list[Action] = []
        for i in range(bounds[r], bounds[r + 1]):
            # Unchecked: every row came from a checked action or a generator's ranges.
            a = action(kinds[kind[i]], r, mb[i], ch[i])
            if joined[i]:
                group.append(a)
                continue
            _close(prog, group)
            group = [a]
        _close(prog, group)
        out.append(tuple(prog))
    return tuple(out)


def _close(prog: list[Step], group: list[Action]) -> None:
    """Append the step ``group`` holds (one action or a fused group) to ``prog``."""
    if len(group) == 1:
        prog.append(group[0])
    elif group:
        prog.append(fused(tuple(group)))


class ArraySchedule(Schedule):
    """A lowered :class:`Schedule` held as :class:`StepRows` (module docstring): its
    ``programs`` are built from the rows on first use. Build one with
    :func:`array_schedule`."""

    @cached_property
    def programs(self) -> tuple[tuple[Step, ...], ...]:  # type: ignore[override]
        """The Action programs, built from :attr:`step_rows` on first use."""
        return programs_of_rows(self.__dict__["step_rows"])

    @cached_property
    def step_rows(self) -> StepRows:
        """The rows (those it was built from, or those of its programs)."""
        return rows_of_programs(self.programs)


def rows_of(sched: Schedule) -> StepRows:
    """The rows of a schedule: an :class:`ArraySchedule`'s own, else converted from its
    programs."""
    if isinstance(sched, ArraySchedule):
        return sched.step_rows
    return rows_of_programs(sched.programs)


def model_stages(rows: StepRows, placement: str, virtual_stages: int) -> np.ndarray:
    """The model stage of each row's (rank, chunk) under ``placement``
    (:func:`~merak_sim.schedule.placement.placed_stage`, vectorised)."""
    S = rows.num_ranks
    if placement == "v":
        return np.where(rows.chunk == 0, rows.rank, 2 * S - 1 - rows.rank)
    return rows.chunk * S + rows.rank
