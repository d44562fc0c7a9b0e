"""torch.distributed.pipelining's schedule orders, converted into the schedule IR.

torch (2.13) builds every schedule's per-rank compute order when the schedule object
is constructed, as ``pipeline_order``: rank -> list of actions, each with a stage
index, a computation type (``F``, ``I``, ``W``, ``B`` = full backward, or
``OVERLAP_F_B`` holding a forward and a backward run one after the other) and a
micro-batch index, ``None`` marking an idle step. Building it needs no process group:
the constructors read only ``num_stages``, ``group_size`` and ``group_rank`` of their
stages, so :func:`torch_pipeline_order` hands them stand-in stages and builds the
order of every rank at once.

:func:`from_torch_order` turns such an order into a compute-only
:class:`~merak_sim.schedule.ir.Schedule`; :func:`torch_schedule` lowers it with
:func:`merak_sim.schedule.lower`, so our validator, posting rule, replay and simulator
run torch's schedules exactly as they run ours. Where each torch stage index lives
comes from the schedule's own ``stage_index_to_group_rank`` and must agree with our
placement: ``"loop"`` (stage g on rank g mod S, chunk g div S: GPipe, 1F1B,
interleaved 1F1B, interleaved zero bubble) or ``"v"`` (stage g on rank g for g < S,
rank 2S-1-g otherwise: ZBV and DualPipeV).

torch runs the single-stage schedules (GPipe, 1F1B) from micro-batch counters, not
from ``pipeline_order`` (which they build only to draw or dry-run the schedule);
torch 2.13's 1F1B order labels the last rank's forwards 1..M instead of 0..M-1. For
those classes the converter therefore keeps the order of kinds and numbers the
micro-batches of each (stage, kind) by occurrence, as the counters do; the
multi-stage classes run their ``pipeline_order`` as written, so it is read verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from merak_sim.schedule import Action, Kind, Schedule, ScheduleError, lower
from merak_sim.schedule.placement import placed_rank

__all__ = ["TORCH_SCHEDULES", "TorchScheduleInfo", "torch_pipeline_order",
           "from_torch_order", "torch_schedule"]


@dataclass(frozen=True)
class TorchScheduleInfo:
    """How one torch.distributed.pipelining schedule class is placed and run.

    Attributes:
        cls: class name in ``torch.distributed.pipelining.schedules``.
        local_stages: stages per rank (our virtual stages).
        placement: ``"loop"`` or ``"v"`` (module docstring).
        by_counter: torch runs it from micro-batch counters (single-stage classes), so
            micro-batches are numbered by occurrence.
    """

    cls: str
    local_stages: int
    placement: str
    by_counter: bool = False


#: The torch schedule classes the converter reads, by class name.
TORCH_SCHEDULES: dict[str, TorchScheduleInfo] = {i.cls: i for i in (
    TorchScheduleInfo("ScheduleGPipe", 1, "loop", by_counter=True),
    TorchScheduleInfo("Schedule1F1B", 1, "loop", by_counter=True),
    TorchScheduleInfo("ScheduleInterleaved1F1B", 2, "loop"),
    TorchScheduleInfo("ScheduleInterleavedZeroBubble", 2, "loop"),
    TorchScheduleInfo("ScheduleZBVZeroBubble", 2, "v"),
    TorchScheduleInfo("ScheduleDualPipeV", 2, "v"),
)}

_KINDS = {"F": Kind.FORWARD, "B": Kind.BACKWARD, "I": Kind.BACKWARD_INPUT,
          "W": Kind.BACKWARD_WEIGHT}
_OVERLAP = "OVERLAP_F_B"
_SKIPPED = ("REDUCE_GRAD", "UNSHARD", "RESHARD")  # not compute: our AR/OPT tail covers it


def _info(cls_name: str) -> TorchScheduleInfo:
    info = TORCH_SCHEDULES.get(cls_name)
    if info is None:
        raise ScheduleError(f"unknown torch schedule {cls_name!r}; choose one of: "
                            f"{', '.join(TORCH_SCHEDULES)}")
    return info


def torch_pipeline_order(cls_name: str, pp: int, microbatches: int,
                         local_stages: int | None = None) -> tuple[dict, dict[int, int]]:
    """Build torch's schedule ``cls_name`` for ``pp`` ranks and ``microbatches`` and
    return its ``(pipeline_order, stage index -> rank)``; torch's own refusals (e.g.
    too few micro-batches) come back as :class:`ScheduleError`."""
    from torch.distributed.pipelining import schedules

    info = _info(cls_name)
    n_local = info.local_stages if local_stages is None else local_stages
    stages = [SimpleNamespace(num_stages=pp * n_local, group_size=pp, group_rank=0,
                              submod=None, stage_index_to_group_rank=None)
              for _ in range(n_local)]
    cls = getattr(schedules, cls_name)
    try:
        sched = cls(stages[0] if n_local == 1 else stages, microbatches)
    except (ValueError, AssertionError, RuntimeError) as e:
        raise ScheduleError(f"torch {cls_name} refuses pp={pp}, microbatches="
                            f"{microbatches}: {e}") from None
    mapping = getattr(sched, "stage_index_to_group_rank", None) or {
        g: g % pp for g in range(pp * n_local)}
    return sched.pipeline_order, dict(mapping)


def _flat(order_row) -> list:
    """Compute actions of one rank in order: idle steps and non-compute actions
    dropped, an overlapped forward+backward split into its parts (torch runs them one
    after the other)."""
    out = []
    for a in order_row:
        if a is None:
            continue
        kind = a.computation_type.value
        if kind == _OVERLAP:
            out.extend(a.sub_actions or ())
        elif kind in _KINDS:
            out.append(a)
        elif kind not in _SKIPPED:
            raise ScheduleError(f"torch action {a} ({kind}) has no counterpart in the IR")
    return out


def from_torch_order(order: dict, pp: int, microbatches: int, *, local_stages: int,
                     placement: str = "loop", stage_to_rank: dict[int, int] | None = None,
                     by_counter: bool = False, name: str = "torch") -> Schedule:
    """A compute-only :class:`Schedule` (AR and OPT appended) from a torch
    ``pipeline_order`` (module docstring).

    Raises :class:`ScheduleError` when a stage sits on another rank than
    ``placement`` puts it, or an action lies outside the pipeline.
    """
    n_stages = pp * local_stages
    for g, r in (stage_to_rank or {}).items():
        if placed_rank(placement, pp, g)[0] != r:
            raise ScheduleError(f"torch places stage {g} on rank {r}, but placement "
                                f"{placement!r} puts it on rank {placed_rank(placement, pp, g)[0]}")
    programs = []
    for rank in range(pp):
        seen: dict[tuple[int, str], int] = {}
        prog: list[Action] = []
        for a in _flat(order.get(rank, ())):
            g, kind = a.stage_index, a.computation_type.value
            if not 0 <= g < n_stages:
                raise ScheduleError(f"torch action {a} on rank {rank}: stage {g} outside "
                                    f"0..{n_stages - 1}")
            where, chunk = placed_rank(placement, pp, g)
            if where != rank:
                raise ScheduleError(f"torch action {a} runs on rank {rank} but stage {g} "
                                    f"lives on rank {where}")
            mb = a.microbatch_index
            if by_counter:  # B and I share torch's backward counter
                key = (g, "I" if kind == "B" else kind)
                mb = seen[key] = seen.get(key, -1) + 1
            prog.append(Action(_KINDS[kind], rank, mb, chunk))
        prog += [Action(Kind.ALL_REDUCE, rank), Action(Kind.OPTIMIZER, rank)]
        programs.append(tuple(prog))
    return Schedule(name=name, num_stages=pp, num_microbatches=microbatches,
                    virtual_stages=local_stages, programs=tuple(programs), lowered=False,
                    placement=placement)


def torch_schedule(cls_name: str, pp: int, microbatches: int) -> Schedule:
    """torch's schedule ``cls_name`` as a lowered :class:`Schedule` named
    ``torch:<cls_name>``, ready for validate / replay / simulate."""
    info = _info(cls_name)
    order, mapping = torch_pipeline_order(cls_name, pp, microbatches)
    return lower(from_torch_order(order, pp, microbatches, local_stages=info.local_stages,
                                  placement=info.placement, stage_to_rank=mapping,
                                  by_counter=info.by_counter, name=f"torch:{cls_name}"))
