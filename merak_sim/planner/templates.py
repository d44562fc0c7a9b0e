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


def stage_arrays(table: CostTable) -> dict[str, np.ndarray]:
    """The cost table's per-model-stage fields as numpy arrays (one entry per stage)."""
    st = table.stages
    names = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s",
             "recompute_s", "send_activation_s", "grad_allreduce_s", "optimizer_s",
             "activation_bytes", "checkpoint_bytes", "input_bytes", "p2p_bytes", "flops")
    out = {n: np.array([getattr(s, n) for s in st], dtype=float) for n in names}
    out["state_bytes"] = np.array([s.state_bytes for s in st], dtype=float)
    out["layers"] = np.array([s.layers for s in st], dtype=float)
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
                 tied: bool = False) -> float:
        """Iteration time (s) from the exact contention-free evaluator."""
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
    schedule as :meth:`~merak_sim.config.ParallelConfig.build_schedule` does."""
    # As generate(): the schedule lowered, ordered by ``costs`` where it adapts to them.
    sched = (lower(built_schedule(name, pp, microbatches, virtual_stages)) if costs is None
             else generate(name, pp, microbatches, virtual_stages, costs))
    zero = CostTable(stages=(_ZERO_STAGE,) * sched.num_model_stages,
                     memory_capacity_bytes=1.0, peak_flops=1.0)
    prog = compile_program(sched, zero, None)
    dep = plan(prog)
    explicit = {(a.stage, a.chunk, a.microbatch) for p in sched.programs
                for a in iter_actions(p) if a.kind is Kind.RECOMPUTE}
    groups: dict[str, list] = {k: [] for k in ("f", "b", "i", "w", "ar", "opt")}
    for aid, a in enumerate(prog.actions):
        r = prog.rank_of_action[aid]
        k = a.kind
        if k in (Kind.FORWARD, Kind.FORWARD_NOGRAD, Kind.RECOMPUTE):
            groups["f"].append((aid, sched.model_stage(a)))
        elif k in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
            groups["b" if k is Kind.BACKWARD else "i"].append(
                (aid, sched.model_stage(a), r, (r, a.chunk, a.microbatch) in explicit))
        elif k is Kind.BACKWARD_WEIGHT:
            groups["w"].append((aid, sched.model_stage(a)))
        elif k is Kind.ALL_REDUCE:
            groups["ar"].append((aid, r))
        elif k is Kind.OPTIMIZER:
            groups["opt"].append((aid, r))

    def cols(key: str, n: int) -> list[np.ndarray]:
        rows = groups[key]
        if not rows:
            return [np.zeros(0, dtype=int if j < 3 else bool) for j in range(n)]
        arr = list(zip(*rows, strict=True))
        return [np.array(arr[j], dtype=bool if j == 3 else int) for j in range(n)]

    fi, fg = cols("f", 2)
    bi, bg, br, be = cols("b", 4)
    ii, ig, ir, ie = cols("i", 4)
    wi, wg = cols("w", 2)
    ai, ar = cols("ar", 2)
    oi, orr = cols("opt", 2)
    bounds = np.array([t.key[1] if t.key[0] == "A" else t.key[1] - 1 for t in prog.transfers],
                      dtype=int)
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

    def peak_bytes(self, arrays: dict[str, np.ndarray], rank: int,
                   fractions: np.ndarray | float) -> np.ndarray | float:
        """Peak bytes of ``rank`` for each checkpointed fraction in ``fractions``: model
        state plus the largest live activation total (the terms of
        :func:`merak_sim.memory.peak_memory`)."""
        S, v = self.pp, self.virtual_stages
        scalar = np.ndim(fractions) == 0
        cs = np.atleast_1d(np.asarray(fractions, dtype=float))
        g = rank_grid(self.placement, S, v)[:, rank]
        act, ck = arrays["activation_bytes"][g], arrays["checkpoint_bytes"][g]
        inp = arrays["input_bytes"][g]
        st = self.states[rank]
        if len(st):
            # kept(c) = act + c (ck - act): the live bytes are affine in c per state;
            # an R'd micro-batch never holds less than the input it grew from.
            base = st @ np.stack([act, inp, np.maximum(act, inp)], axis=1).reshape(-1)
            slope = st @ np.stack([ck - act, 0 * inp, 0 * act], axis=1).reshape(-1)
            peak = np.maximum((base[:, None] + slope[:, None] * cs[None, :]).max(axis=0), 0.0)
        else:
            peak = np.zeros_like(cs)
        res = arrays.get("reserved_bytes", ())
        out = float(arrays["state_bytes"][g].sum()) + (res[rank] if len(res) else 0.0) + peak
        return float(out[0]) if scalar else out


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
