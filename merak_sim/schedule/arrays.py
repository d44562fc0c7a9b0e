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

    def __eq__(self, other: object) -> bool:
        """Equal to any Schedule with the same fields (programs compared as Actions)."""
        if not isinstance(other, Schedule):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _FIELDS)

    __hash__ = Schedule.__hash__


#: The fields of a Schedule, cheapest to compare first.
_FIELDS = ("name", "num_stages", "num_microbatches", "virtual_stages", "no_recompute_stages",
           "lowered", "placement", "programs")


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


# -- compute orders in closed form --------------------------------------------------------

def _grid_rows(kind: np.ndarray, mb: np.ndarray, chunk: np.ndarray) -> StepRows:
    """Rows of (ranks, steps) grids of compute actions, each rank's program ended by AR
    and OPT (as :meth:`~merak_sim.schedule.spec.ScheduleSpec.build` ends it)."""
    S, L = kind.shape
    tail = np.full((S, 1), -1, dtype=np.int64)
    zero = np.zeros((S, 2), dtype=np.int64)
    k = np.hstack([kind, np.full((S, 1), _AR), np.full((S, 1), _OPT)]).astype(np.int8)
    return StepRows(k.ravel(), np.hstack([mb, tail, tail]).ravel(),
                    np.hstack([chunk, zero]).ravel(), np.zeros(S * (L + 2), dtype=bool),
                    np.arange(S + 1, dtype=np.int64) * (L + 2))


def _warm_steady_cool(S: int, total: int, warm: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(is forward, index k) of every step of a 1F1B-shaped order: rank s runs
    ``warm[s]`` forwards, then (forward, backward) pairs, then the remaining backwards,
    over ``total`` forwards and as many backwards (forward k, backward k in order)."""
    p = np.arange(2 * total, dtype=np.int64)[None, :]
    w = warm[:, None]
    steady = (p >= w) & (p < 2 * total - w)
    is_f = (p < w) | (steady & ((p - w) % 2 == 0))
    k = np.where(p < w, p, np.where(steady, np.where(is_f, w + (p - w) // 2, (p - w) // 2),
                                    p - total))
    return is_f, k


def _one_f_one_b_rows(S: int, M: int, v: int = 1) -> StepRows:
    """:func:`~merak_sim.schedule.generators.one_f_one_b` as rows."""
    warm = np.minimum(S - 1 - np.arange(S, dtype=np.int64), M)
    is_f, k = _warm_steady_cool(S, M, warm)
    return _grid_rows(np.where(is_f, _F, _B), k, np.zeros_like(k))


def _interleaved_rows(S: int, M: int, v: int) -> StepRows:
    """:func:`~merak_sim.schedule.generators.interleaved_1f1b` as rows (virtual
    micro-batch k runs chunk (k // S) % v of micro-batch (k // (S v)) S + k % S;
    backwards visit the chunks in reverse)."""
    total = M * v
    warm = np.minimum(2 * (S - 1 - np.arange(S, dtype=np.int64)) + (v - 1) * S, total)
    is_f, k = _warm_steady_cool(S, total, warm)
    c = (k // S) % v
    return _grid_rows(np.where(is_f, _F, _B), (k // (S * v)) * S + k % S,
                      np.where(is_f, c, v - 1 - c))


def _gpipe_rows(S: int, M: int, v: int = 1) -> StepRows:
    """:func:`~merak_sim.schedule.generators.gpipe` as rows."""
    m = np.tile(np.arange(M, dtype=np.int64), (S, 2))
    kind = np.repeat(np.array([[_F, _B]]), M, axis=1).repeat(S, axis=0)
    return _grid_rows(kind, m, np.zeros_like(m))


#: Generators whose compute order has a closed form, as rows: name -> (pp,
#: micro-batches, virtual stages) -> compute-only rows (AR and OPT included).
ARRAY_ORDERS: dict[str, Callable[[int, int, int], StepRows]] = {
    "gpipe": _gpipe_rows, "1f1b": _one_f_one_b_rows, "interleaved-1f1b": _interleaved_rows,
}


def compute_rows(spec: ScheduleSpec, pp: int, microbatches: int, virtual_stages: int = 1
                 ) -> StepRows:
    """The compute-only rows of ``spec``'s generator (its requirements checked first):
    from :data:`ARRAY_ORDERS` where it has a closed form, else from its Action
    programs."""
    spec.check(pp, microbatches, virtual_stages)
    order = ARRAY_ORDERS.get(spec.name)
    if order is None:
        return rows_of_programs(spec.build(pp, microbatches, virtual_stages).programs)
    return order(pp, microbatches, virtual_stages)


# -- the default lowering, vectorised -----------------------------------------------------

def _peers(rows: StepRows, placement: str, v: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per compute row: (receive kind or -1, its peer rank, send kind or -1, its peer)
    as :func:`~merak_sim.schedule.lowering.lower` places them."""
    S = rows.num_ranks
    G = S * v
    g = model_stages(rows, placement, v)
    holder = np.array([placed_rank(placement, S, x)[0] for x in range(G)] + [-1],
                      dtype=np.int64)  # index -1 and G: no stage
    local = np.append(holder[:-2] == holder[1:-1], [False, False])  # g, g+1 on one rank
    fwd = (rows.kind == _F) | (rows.kind == _FN)
    bwd = (rows.kind == _B) | (rows.kind == _I)
    up = np.minimum(g + 1, G)
    down = np.where(g > 0, g - 1, G)
    recv = np.where(fwd & (g > 0) & ~local[down], _RA,
                    np.where(bwd & (g < G - 1) & ~local[g], _RG, -1))
    send = np.where(fwd & (g < G - 1) & ~local[g], _SA,
                    np.where(bwd & (g > 0) & ~local[down], _SG, -1))
    recv_peer = np.where(recv == _RA, holder[down], holder[up])
    send_peer = np.where(send == _SA, holder[up], holder[down])
    return recv, recv_peer, send, send_peer


def lower_rows(rows: StepRows, placement: str, virtual_stages: int) -> StepRows:
    """The rows with communication added as :func:`~merak_sim.schedule.lowering.lower`
    adds it to a program without explicit sends and receives (ValueError for rows that
    hold some): a receive right before each consumer, a send right after each
    producer, and a send fused with the receive that follows it when both go to the
    same peer."""
    if np.any((rows.kind >= _SA) & (rows.kind <= _RG)):
        raise ValueError("lower_rows lowers compute-only rows; these hold sends or receives")
    recv, recv_peer, send, send_peer = _peers(rows, placement, virtual_stages)
    has_r, has_s = recv >= 0, send >= 0
    width = 1 + has_r + has_s
    at = np.cumsum(width) - width  # first output row of each input row
    n = int(width.sum())
    kind = np.empty(n, dtype=np.int8)
    mb = np.empty(n, dtype=np.int64)
    ch = np.empty(n, dtype=np.int64)
    joined = np.zeros(n, dtype=bool)
    own = at + has_r
    for sel, where, k in ((slice(None), own, rows.kind), (has_r, at, recv),
                          (has_s, own + 1, send)):
        idx = where[sel]
        kind[idx] = k[sel]
        mb[idx] = rows.microbatch[sel]
        ch[idx] = rows.chunk[sel]
    # A pending send fuses with the next row's receive on the same rank and peer.
    rank = rows.rank
    nxt = np.zeros(len(has_r), dtype=bool)
    nxt[:-1] = (has_s[:-1] & has_r[1:] & (rank[:-1] == rank[1:])
                & (send_peer[:-1] == recv_peer[1:]))
    joined[at[1:][nxt[:-1]]] = True
    return StepRows(kind, mb, ch, joined, np.append(at, n)[rows.bounds])


def array_schedule(spec: ScheduleSpec, pp: int, microbatches: int, virtual_stages: int = 1
                   ) -> ArraySchedule | None:
    """``generate(spec.name, ...)`` as an :class:`ArraySchedule` built from rows, or
    None where the generator has no closed form (:data:`ARRAY_ORDERS`) or is cost-aware."""
    if spec.name not in ARRAY_ORDERS or spec.cost_aware:
        return None
    rows = lower_rows(compute_rows(spec, pp, microbatches, virtual_stages), spec.placement,
                      virtual_stages)
    out = new_twin(ArraySchedule)
    out.__dict__.update(name=spec.name, num_stages=pp, num_microbatches=microbatches,
                        virtual_stages=virtual_stages,
                        no_recompute_stages=spec.never_recompute(pp), lowered=True,
                        placement=spec.placement, step_rows=rows)
    return out
