"""Per-schedule structures the planner reuses across many cost tables.

A schedule's *structure* (which action runs where, which transfer it waits for, how
many micro-batches each rank holds at every moment) depends only on (schedule name,
pp, micro-batches, virtual stages); the *durations and bytes* come from a cost table.
The planner evaluates thousands of (structure, cost table) pairs, so it builds each
structure once and re-prices it with array arithmetic:

- :class:`EvalTemplate`: the lowered schedule compiled once against an all-zero cost
  table plus the evaluator's dependency :func:`~merak_sim.sim.evaluator.plan`; the
  durations :func:`~merak_sim.sim.program.compile_program` would assign are rebuilt by
  :meth:`EvalTemplate.evaluate` with numpy (the same rules, see that module's
  docstring), and the exact fast evaluator runs on the result. Tests check it equals
  ``simulate(..., engine="evaluator")``.
- :class:`MemoryTemplate`: per rank, the distinct (chunk, held state) count vectors
  of the schedule's :func:`~merak_sim.schedule.liveness.liveness` walk after each
  allocation ("k forwards keeping their activations, j F* keeping only the input, i
  re-forwarded"). The peak for a checkpointed fraction c is the largest dot product of
  those counts with the per-micro-batch bytes plus the model state: the peak the
  simulator reports and :func:`merak_sim.memory.peak_memory` computes, so the planner
  can solve for the smallest fraction per stage that fits without walking the
  schedule again.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter

import numpy as np

from merak_sim.costs.base import CostTable, StageCost
from merak_sim.schedule import SCHEDULES, Kind, Schedule, generate, iter_actions, lower
from merak_sim.schedule.liveness import liveness
from merak_sim.schedule.zero_bubble import ZeroBubbleCosts
from merak_sim.sim.evaluator import DependencyGraph, evaluate, plan
from merak_sim.sim.program import Compiled, compile_program

from .grid import rank_grid

__all__ = ["EvalTemplate", "MemoryTemplate", "built_schedule", "eval_template",
           "memory_template", "stage_arrays"]

_ZERO_STAGE = StageCost(*([0.0] * 16), layers=1)
_F, _FN, _RC, _B, _BI, _BW, _AR, _OPT = range(8)
_KIND_CODE = {Kind.FORWARD: _F, Kind.FORWARD_NOGRAD: _FN, Kind.RECOMPUTE: _RC,
              Kind.BACKWARD: _B, Kind.BACKWARD_INPUT: _BI, Kind.BACKWARD_WEIGHT: _BW,
              Kind.ALL_REDUCE: _AR, Kind.OPTIMIZER: _OPT}


_STAGE_NAMES = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s",
                "recompute_s", "send_activation_s", "grad_allreduce_s", "optimizer_s",
                "activation_bytes", "checkpoint_bytes", "input_bytes", "p2p_bytes", "flops",
                "state_bytes", "layers")
_STAGE_FIELDS = attrgetter(*_STAGE_NAMES)


def stage_arrays(table: CostTable) -> dict[str, np.ndarray]:
    """The cost table's per-model-stage fields as numpy arrays (one entry per stage)."""
    # One pass over the stages, one row per field (each a contiguous array).
    rows = np.array([_STAGE_FIELDS(s) for s in table.stages], dtype=float).reshape(
        -1, len(_STAGE_NAMES)).T.copy()
    out = dict(zip(_STAGE_NAMES, rows, strict=True))
    out["reserved_bytes"] = np.array(table.reserved_bytes, dtype=float)  # per rank
    return out


@dataclass(frozen=True)
class EvalTemplate:
    """A lowered schedule compiled once, re-priced per cost table (module docstring)."""

    schedule: Schedule
    prog: Compiled
    dep: DependencyGraph
    fwd_idx: np.ndarray
    fwd_g: np.ndarray
    b_idx: np.ndarray
    b_g: np.ndarray
    b_rank: np.ndarray
    b_explicit: np.ndarray
    i_idx: np.ndarray
    i_g: np.ndarray
    i_rank: np.ndarray
    i_explicit: np.ndarray
    w_idx: np.ndarray
    w_g: np.ndarray
    ar_idx: np.ndarray
    ar_rank: np.ndarray
    opt_idx: np.ndarray
    opt_rank: np.ndarray
    xfer_boundary: np.ndarray

    def durations(self, arrays: dict[str, np.ndarray], fractions: tuple[float, ...],
                  tied: bool = False) -> Compiled:
        """The compiled program with the durations of ``arrays`` (from
        :func:`stage_arrays`) and checkpointed fractions ``fractions`` per rank (the
        schedule's never-recompute ranks use 0); ``tied``: the table's
        ``tied_embeddings``."""
        S = self.schedule.num_stages
        v = self.schedule.virtual_stages
        c = np.array([0.0 if s in self.schedule.no_recompute_stages else float(x)
                      for s, x in enumerate(fractions)])
        F, RC = arrays["forward_s"], arrays["recompute_s"]
        dur = np.zeros(len(self.prog.actions))
        dur[self.fwd_idx] = F[self.fwd_g]
        cs = np.where(self.b_explicit, 0.0, c[self.b_rank])
        dur[self.b_idx] = arrays["backward_s"][self.b_g] + cs * RC[self.b_g]
        cs = np.where(self.i_explicit, 0.0, c[self.i_rank])
        dur[self.i_idx] = arrays["backward_input_s"][self.i_g] + cs * RC[self.i_g]
        dur[self.w_idx] = arrays["backward_weight_s"][self.w_g]
        ar = arrays["grad_allreduce_s"]
        grid = rank_grid(self.schedule.placement, S, v)
        dur[self.ar_idx] = ar[grid].sum(axis=0)[self.ar_rank]
        dur[self.opt_idx] = arrays["optimizer_s"][grid].sum(axis=0)[self.opt_rank]
        send = arrays["send_activation_s"][self.xfer_boundary].tolist()
        ar_chunks = tuple(tuple((ch, float(ar[grid[ch, r]])) for ch, _ in self.prog.ar_chunks[r])
                          for r in range(S))
        return self.prog.repriced(tuple(dur.tolist()), send, ar_chunks, tied)

    def evaluate(self, arrays: dict[str, np.ndarray], fractions: tuple[float, ...],
                 zero: int = 0, overlap_dp: bool = False, buckets: int = 4,
                 tied: bool = False, prog: Compiled | None = None) -> float:
        """Iteration time (s) from the exact contention-free evaluator; ``prog``:
        ``self.durations(arrays, fractions, tied)`` when known (candidates that differ
        only in the DP synchronisation share it)."""
        if prog is None:
            prog = self.durations(arrays, fractions, tied)
        return evaluate(prog, self.dep, overlap_dp=overlap_dp, buckets=buckets,
                        zero=zero).makespan


@lru_cache(maxsize=4096)
def built_schedule(name: str, pp: int, microbatches: int, virtual_stages: int) -> Schedule:
    """The unlowered schedule of a shape (cached; ``costs=None`` for a cost-aware one):
    the memory template walks it and the evaluation template lowers it, so a shape
    that gets both is ordered once. Raises ScheduleError when the schedule's
    requirements fail."""
    return SCHEDULES[name].build(pp, microbatches, virtual_stages)


@lru_cache(maxsize=2048)
def eval_template(name: str, pp: int, microbatches: int, virtual_stages: int,
                  costs: ZeroBubbleCosts | None = None) -> EvalTemplate:
    """The :class:`EvalTemplate` of a schedule (cached); ``costs`` orders a cost-aware
    schedule as :func:`~merak_sim.sim.from_config.schedule_for` does."""
    # As generate(): the schedule lowered, ordered by ``costs`` where it adapts to them.
    sched = (lower(built_schedule(name, pp, microbatches, virtual_stages)) if costs is None
             else generate(name, pp, microbatches, virtual_stages, costs))
    zero = CostTable(stages=(_ZERO_STAGE,) * sched.num_model_stages,
                     memory_capacity_bytes=1.0, peak_flops=1.0)
    prog = compile_program(sched, zero, None)
    dep = plan(prog)
    # The actions' fields as arrays, each group's ids in action order (one pass over
    # the actions instead of one dispatch per action).
    acts = prog.actions
    kind_of = _KIND_CODE.get
    kind, stage, chunk, micro = np.array(
        [(kind_of(a.kind, -1), a.stage, a.chunk, a.microbatch) for a in acts],
        dtype=np.int64).reshape(-1, 4).T
    rank = np.array(prog.rank_of_action, dtype=np.int64)
    grid = rank_grid(sched.placement, sched.num_stages, sched.virtual_stages)
    # An explicit re-forward (rank, chunk, micro-batch): its B / I adds no recompute.
    width = max(sched.virtual_stages, int(chunk.max(initial=0)) + 1)
    span = int(micro.max(initial=0)) + 2

    def code(r, ch, mb):
        return (np.asarray(r) * width + np.asarray(ch)) * span + np.asarray(mb) + 1

    rc = [(a.stage, a.chunk, a.microbatch) for p in sched.programs for a in iter_actions(p)
          if a.kind is Kind.RECOMPUTE]
    explicit = np.isin(code(rank, chunk, micro),
                       code(*zip(*rc, strict=True)) if rc else np.zeros(0, dtype=np.int64))

    def ids(*kinds: int) -> np.ndarray:
        return np.nonzero(np.isin(kind, kinds))[0]

    fi = ids(_F, _FN, _RC)
    bi, ii, wi, ai, oi = (ids(k) for k in (_B, _BI, _BW, _AR, _OPT))

    def model_stage(i: np.ndarray) -> np.ndarray:
        # Schedule.model_stage of each action: its chunk's stage on its rank.
        return grid[chunk[i], stage[i]]

    fg, bg, br, be = model_stage(fi), model_stage(bi), rank[bi], explicit[bi]
    ig, ir, ie, wg = model_stage(ii), rank[ii], explicit[ii], model_stage(wi)
    ar, orr = rank[ai], rank[oi]
    # The boundary each transfer crosses, as the structure walk recorded it.
    bounds = np.array(prog.structure.transfer_boundary, dtype=int)
    return EvalTemplate(sched, prog, dep, fi, fg, bi, bg, br, be, ii, ig, ir, ie, wi, wg,
                        ai, ar, oi, orr, bounds)


@dataclass(frozen=True)
class MemoryTemplate:
    """Live micro-batch multisets per rank (module docstring).

    Attributes:
        pp, virtual_stages: shape.
        states: per rank, an int array (n_states x 3 v): for each chunk the number of
            live micro-batches kept by F, by F* and by R.
        in_flight: per rank, the most micro-batches alive at once.
        no_recompute: ranks the schedule marks as never recomputing.
    """

    pp: int
    virtual_stages: int
    states: tuple[np.ndarray, ...]
    in_flight: tuple[int, ...]
    no_recompute: frozenset[int]
    placement: str = "loop"

    def affine(self, arrays: dict[str, np.ndarray]) -> tuple[tuple, ...]:
        """Per rank, what :meth:`peak_bytes` reads of ``arrays``: (model-state plus
        allocator-reserved bytes, live bytes per state at checkpointed fraction 0,
        their slope in the fraction), the last two None for a rank without states. A
        planner computes it once per (arrays, template) and prices several policies
        with it."""
        S, v = self.pp, self.virtual_stages
        grid = rank_grid(self.placement, S, v)
        act, ck, inp = (arrays[f][grid] for f in ("activation_bytes", "checkpoint_bytes",
                                                   "input_bytes"))
        # kept(c) = act + c (ck - act): the live bytes are affine in c per state;
        # an R'd micro-batch never holds less than the input it grew from.
        w0 = np.stack([act, inp, np.maximum(act, inp)], axis=-1)
        w1 = np.stack([ck - act, 0 * inp, 0 * act], axis=-1)
        state = arrays["state_bytes"][grid]
        res = arrays.get("reserved_bytes", ())  # the allocator's, per rank
        out = []
        for r in range(S):
            st = self.states[r]
            total = float(np.ascontiguousarray(state[:, r]).sum()) + (
                float(res[r]) if len(res) else 0.0)
            if len(st):
                out.append((total, st @ np.ascontiguousarray(w0[:, r]).reshape(-1),
                            st @ np.ascontiguousarray(w1[:, r]).reshape(-1)))
            else:
                out.append((total, None, None))
        return tuple(out)

    @staticmethod
    def peak_at(affine: tuple, fractions: np.ndarray | float) -> np.ndarray | float:
        """:meth:`peak_bytes` from one rank's entry of :meth:`affine`."""
        scalar = np.ndim(fractions) == 0
        cs = np.atleast_1d(np.asarray(fractions, dtype=float))
        total, base, slope = affine
        if base is not None:
            peak = np.maximum((base[:, None] + slope[:, None] * cs[None, :]).max(axis=0), 0.0)
        else:
            peak = np.zeros_like(cs)
        out = total + peak
        return float(out[0]) if scalar else out

    def peak_bytes(self, arrays: dict[str, np.ndarray], rank: int,
                   fractions: np.ndarray | float) -> np.ndarray | float:
        """Peak bytes of ``rank`` for each checkpointed fraction in ``fractions``: model
        state plus the largest live activation total (the terms of
        :func:`merak_sim.memory.peak_memory`)."""
        return self.peak_at(self.affine(arrays)[rank], fractions)


@lru_cache(maxsize=4096)
def memory_template(name: str, pp: int, microbatches: int, virtual_stages: int
                    ) -> MemoryTemplate:
    """The :class:`MemoryTemplate` of a schedule (cached; built from the unlowered
    schedule, raising ScheduleError when the schedule's requirements fail)."""
    sched = built_schedule(name, pp, microbatches, virtual_stages)
    lives = [liveness(sched, rank) for rank in range(pp)]
    states = tuple(np.array(lv.allocation_counts(), dtype=float).reshape(-1, 3 * virtual_stages)
                   for lv in lives)
    return MemoryTemplate(pp, virtual_stages, states, tuple(lv.peak_in_flight for lv in lives),
                          sched.no_recompute_stages, sched.placement)
