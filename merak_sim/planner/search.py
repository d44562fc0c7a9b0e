"""The planner: the fastest configuration that fits, and why every other one lost.

Pipeline (each stage only looks at what survived the previous one):

1. Enumerate the :class:`~merak_sim.planner.space.SearchSpace`
   (:func:`~merak_sim.planner.space.enumerate_candidates`); candidates that break a
   divisibility rule or a schedule's declared requirement are kept as "pruned" rows
   naming the rule.
2. Relax (:mod:`merak_sim.planner.relaxed`): every candidate gets stage arrays
   rebuilt from one probe table per (tp, cp, micro-batch, sequence parallelism, TP
   overlap, selective recompute, attention), without its own cost table: a memory
   lower bound (one micro-batch plus the model state its ZeRO stage keeps whole)
   drops those that cannot fit, a time lower bound orders the rest. The pass runs a
   block of candidates at a time (:mod:`merak_sim.planner.sweep`), and the rows it
   decides stay columnar (:class:`~merak_sim.planner.rows.RowBook`).
3. Bound (:mod:`merak_sim.planner.bounds`): best first over two levels. The smallest
   relaxed bound left is priced exactly (:mod:`merak_sim.planner.screen`: its cost
   table, shared between candidates, and the exact one-micro-batch memory screen) and
   re-queued with its exact bound; the smallest exact bound left is evaluated. Once
   the smallest bound left exceeds the K-th best exact time, no later candidate can
   enter the top K ("bounded" rows). Every exact table priced checks that the
   relaxed arrays were below it; one that was not makes the search price every
   candidate before it may stop. ``exhaustive=True`` prices and evaluates everything
   (the reference the tests compare with).
4. Evaluate: for each visited candidate, the exact memory walk of its schedule (the
   smallest stage-aware fractions that fit), then the exact fast evaluator
   (contention-free critical path) re-pricing a cached schedule template.
5. Confirm: the top K by evaluator time are re-simulated with the SimPy engine (link
   contention on) and the winner is the fastest of those that fit.

The table, its reasons and the errors are built in :mod:`merak_sim.planner.report`.
"""

from __future__ import annotations

import bisect
import datetime as _dt
import heapq
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from merak_sim.config import ParallelConfig
from merak_sim.costs.calibrated import calibrated_cost_model
from merak_sim.memo import IdentityMemo
from merak_sim.plan import Plan
from merak_sim.progress import PLANNER_BOUND, Progress, progress_reporter
from merak_sim.resolve import cluster_record, resolve_cluster, resolve_model
from merak_sim.schedule import SCHEDULES, ScheduleError
from merak_sim.sim.from_config import split_grad_sync, zero_bubble_costs

from .bounds import bound_parts, lower_bound
from .closest import closest_exact
from .relaxed import RelaxedPricer, admissible
from .report import GiB, PlannerError, PlanResult, new_counts, no_fit
from .rows import RowBook, ranked_table, row
from .screen import Pricer, fit_fractions, quick_memory
from .space import Block, Candidate, SearchSpace, candidate_blocks, enumerate_candidates
from .sweep import Level0, bounded_reasons, relaxed_sweep
from .templates import eval_template, memory_template

__all__ = ["search"]


@dataclass(frozen=True)
class _Job:
    """What every stage of one search shares."""

    model: Any
    cluster: Any
    global_batch_size: int
    space: SearchSpace
    cost_model: Any
    memory_margin: float
    top_k: int
    exhaustive: bool

    def capacity(self, table) -> float:
        """Usable bytes per GPU under this table, after the margin."""
        return float(table.memory_capacity_bytes) * (1.0 - self.memory_margin)

    def config(self, r: dict) -> ParallelConfig:
        """The ParallelConfig of a table row (explicit fractions for stage-aware)."""
        return ParallelConfig(
            dp=r["dp"], tp=r["tp"], pp=r["pp"], virtual_stages=r["virtual_stages"],
            micro_batch_size=r["micro_batch_size"],
            global_batch_size=self.global_batch_size, schedule=r["schedule"],
            recompute=r["recompute"],
            recompute_fractions=(r["recompute_fractions"] if r["recompute"] == "stage-aware"
                                 else None),
            sequence_parallel=r["sequence_parallel"], tp_overlap=r["tp_overlap"],
            zero=r["zero"], cp=r["cp"], ep=r["ep"], zero_group=r["zero_group"],
            attention=r["attention"], overlap_param_gather=r["overlap_param_gather"],
            dtype=self.space.dtype, order=self.space.order)


def _check_inputs(global_batch_size: int, top_k: int, memory_margin: float) -> None:
    if not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise PlannerError(f"global batch size must be a positive integer, got "
                           f"{global_batch_size!r}")
    if top_k < 1:
        raise PlannerError(f"top K must be >= 1, got {top_k}")
    if not 0.0 <= memory_margin < 1.0:
        raise PlannerError(f"memory margin must lie in [0, 1), got {memory_margin}")


def _rule_pruned(c: Candidate, rows: RowBook, counts: dict, prog: Progress) -> bool:
    """Record ``c`` as pruned when it breaks a rule (the work limit included)."""
    counts["considered"] += 1
    passes = c.pp * c.virtual_stages * c.microbatches
    if not c.pruned and not PLANNER_BOUND.admits(passes):
        c = replace(c, pruned=f"{passes:,} micro-batch passes (pp x v x micro-batches) "
                              f"exceed the work limit of {PLANNER_BOUND.passes:,}")
    if c.pruned:
        counts["pruned_rule"] += 1
        rows.append(row(c, "pruned", f"pruned: {c.pruned}"))
        prog.advance()
        return True
    return False


def _price(job: _Job, pricer: Pricer, c: Candidate, rows: RowBook, counts: dict,
           prog: Progress, bound: float = np.nan, memo: IdentityMemo | None = None):
    """Exact cost table and quick memory screen of ``c``: (table, arrays) or None when
    it is pruned here (its row appended). ``memo`` shares the screen between
    candidates of one table that it reads alike."""
    entry = pricer.price(c)
    if isinstance(entry, Exception):
        counts["pruned_rule"] += 1
        rows.append(row(c, "pruned", f"pruned: {entry}", bound_s=bound))
        prog.advance()
        return None
    tab, arr = entry
    cap = job.capacity(tab)
    if memo is None:
        excess, r = quick_memory(c, arr, cap)
    else:
        # What the screen reads of the candidate besides its table (kept_one).
        spec = SCHEDULES[c.schedule]
        full = c.recompute == "full"
        excess, r = memo.get((arr,), ("quick", spec.placement, c.pp, c.virtual_stages,
                                      c.recompute not in ("none", "selective"), full,
                                      spec.never_recompute(c.pp) if full else None, cap),
                             lambda: quick_memory(c, arr, cap))
    if excess > 0:
        counts["pruned_memory"] += 1
        rows.append(row(c, "pruned", f"memory: stage {r} needs {(excess + cap) / GiB:.1f} "
                                     f"GiB for one micro-batch > {cap / GiB:.1f} GiB",
                        shortfall_gib=excess / GiB, bound_s=bound))
        prog.advance()
        return None
    return entry


def _candidates(job: _Job, prog: Progress) -> list[Candidate]:
    """Every candidate of the space, counted into ``prog``."""
    candidates = list(enumerate_candidates(job.model, job.cluster.world_size,
                                           job.cluster.gpus_per_node,
                                           job.global_batch_size, job.space))
    prog.start(len(candidates))
    return candidates


def _screen(job: _Job, rows: RowBook, counts: dict, prog: Progress) -> list[tuple]:
    """Stages 1-3 priced exactly for every candidate (the exhaustive search): the
    survivors as (bound, order, candidate, table, arrays) in visiting order. Every
    candidate dropped here advances ``prog``."""
    pricer = Pricer(job.model, job.cluster, job.cost_model, job.global_batch_size,
                    job.space.dtype, job.space.order)
    live = []
    candidates = _candidates(job, prog)
    for c in candidates:
        if _rule_pruned(c, rows, counts, prog):
            continue
        entry = _price(job, pricer, c, rows, counts, prog)
        if entry is not None:
            live.append((lower_bound(c, entry[1]), len(live), c, *entry))
    counts["cost_tables"] = pricer.built
    live.sort(key=lambda x: (x[0], x[1]))
    return live


def _evaluate_one(job: _Job, bound: float, c: Candidate, tab, arr, rows: RowBook,
                  counts: dict, seen: set, memo: IdentityMemo) -> float | None:
    """Stage 4 for one candidate: exact memory, then the fast evaluator; appends its
    row and returns its time (None when it is pruned here). ``memo`` shares the
    memory fit between candidates of one table, schedule and policy."""
    skey = (c.schedule, c.pp, c.microbatches, c.virtual_stages)
    try:
        mt = memory_template(*skey)
    except ScheduleError as e:
        counts["pruned_rule"] += 1
        rows.append(row(c, "pruned", f"pruned: {e}", bound_s=bound))
        return None
    cap = job.capacity(tab)
    fit = memo.get((arr, mt), ("fit", c.recompute, cap),
                   lambda: fit_fractions(c, arr, mt, cap, memo.get(
                       (arr, mt), ("affine",), lambda: mt.affine(arr))))
    stage_aware = c.recompute == "stage-aware"
    fracs = fit.fractions if stage_aware else None
    if fit.shortfall > 0:
        counts["pruned_memory"] += 1
        rows.append(row(
            c, "pruned",
            f"memory: stage {fit.rank} needs {fit.peaks[fit.rank] / GiB:.1f} GiB > "
            f"{cap / GiB:.1f} GiB (short {fit.shortfall / GiB:.2f} GiB"
            + (" even fully checkpointed)" if stage_aware else ")"),
            bound_s=bound, shortfall_gib=fit.shortfall / GiB,
            peak_memory_gib=max(fit.peaks) / GiB, recompute_fractions=fracs))
        return None
    if (stage_aware and not any(fit.fractions) and "none" in job.space.recompute
            and not SCHEDULES[c.schedule].explicit_recompute):
        counts["pruned_rule"] += 1
        rows.append(row(c, "pruned", "pruned: same as recompute=none (every stage fits "
                                     "without checkpointing)", bound_s=bound))
        return None
    if skey not in seen:
        seen.add(skey)
        counts["schedules"] += 1
    split = split_grad_sync(c)  # a candidate has the config's zero fields
    # A cost-aware order follows this table's times (as from_config.schedule_for).
    costs = (zero_bubble_costs(tab, fit.fractions)
             if SCHEDULES[c.schedule].cost_aware else None)
    tmpl = eval_template(*skey, costs)
    tied = tab.tied_embeddings
    prog = memo.get((arr, tmpl), ("durations", fit.fractions, tied),
                    lambda: tmpl.durations(arr, fit.fractions, tied))
    t = tmpl.evaluate(arr, fit.fractions, zero=split, overlap_dp=c.overlap_param_gather,
                      tied=tied, prog=prog)
    counts["evaluated"] += 1
    S, v, M = c.pp, c.virtual_stages, c.microbatches
    flops = M * arr["flops"].reshape(v, S).sum(axis=0).sum() / S
    gbs = job.global_batch_size
    rows.append(row(c, "evaluated", "", time_s=t, samples_per_s=gbs / t,
                    tokens_per_s=gbs * job.model.seq_len / t,
                    mfu=flops / t / float(tab.peak_flops),
                    peak_memory_gib=max(fit.peaks) / GiB, bound_s=bound,
                    engine="evaluator", recompute_fractions=fracs))
    return t


def _bound_out(job: _Job, rest: list[tuple], kth: float, rows: RowBook,
               counts: dict) -> None:
    """Rows for the candidates whose bound exceeds the K-th best time."""
    for b, _j, c, _t, _a in rest:
        counts["bounded"] += 1
        rows.append(row(c, "bounded",
                        f"bounded: busiest rank alone needs {b:.3f} s, "
                        f"{(b / kth - 1) * 100:.1f} % above the top-{job.top_k} cut "
                        f"({kth:.3f} s); not simulated", bound_s=b))


def _evaluate(job: _Job, live: list[tuple], rows: RowBook, counts: dict,
              prog: Progress) -> list[tuple[float, int]]:
    """Stages 3-4: visit in bound order until the bound passes the top K; the
    (time, row index) of every evaluated candidate. Every candidate visited or
    bounded out advances ``prog``."""
    best_times: list[float] = []
    evaluated: list[tuple[float, int]] = []
    seen: set = set()
    memo = IdentityMemo()
    for pos, (bound, _i, c, tab, arr) in enumerate(live):
        k = job.top_k
        if not job.exhaustive and len(best_times) >= k and bound > best_times[k - 1]:
            _bound_out(job, live[pos:], best_times[k - 1], rows, counts)
            prog.advance(len(live) - pos)
            break
        t = _evaluate_one(job, bound, c, tab, arr, rows, counts, seen, memo)
        prog.advance()
        if t is not None:
            evaluated.append((t, len(rows) - 1))
            bisect.insort(best_times, t)
    return evaluated


def _relaxed_entries(job: _Job, rp: RelaxedPricer, pricer: Pricer, rows: RowBook,
                     counts: dict, prog: Progress) -> tuple[Level0, list[tuple]]:
    """Stages 1-3 without exact tables (:func:`~merak_sim.planner.sweep.relaxed_sweep`):
    every candidate that breaks no rule and whose relaxed memory fits, sorted by
    relaxed bound; and, for a cost model the relaxation does not cover, exactly priced
    entries (bound, order, candidate, table, arrays)."""
    exact: list[tuple] = []

    def one(c: Candidate) -> None:
        if _rule_pruned(c, rows, counts, prog):
            return
        entry = _price(job, pricer, c, rows, counts, prog)
        if entry is not None:
            exact.append((lower_bound(c, entry[1]), len(exact), c, *entry))

    items = list(candidate_blocks(job.model, job.cluster.world_size,
                                  job.cluster.gpus_per_node, job.global_batch_size,
                                  job.space))
    prog.start(sum(len(x.variants) if isinstance(x, Block) else 1 for x in items))
    level0 = relaxed_sweep(items, rp, job.memory_margin, rows, counts, prog, one)
    exact.sort(key=lambda x: (x[0], x[1]))
    return level0, exact


def _best_first(job: _Job, rows: RowBook, counts: dict, prog: Progress
                ) -> list[tuple[float, int]]:
    """Stages 2-4 as one best-first branch and bound over two levels of bounds: a
    candidate is priced exactly only once its relaxed bound
    (:mod:`merak_sim.planner.relaxed`) is the smallest left, and evaluated only once
    its exact bound is; the search stops when the smallest bound left exceeds the
    K-th best time. Returns the (time, row index) of every evaluated candidate."""
    pricer = Pricer(job.model, job.cluster, job.cost_model, job.global_batch_size,
                    job.space.dtype, job.space.order)
    rp = RelaxedPricer(job.model, job.cluster, job.cost_model, job.space.dtype)
    level0, heap = _relaxed_entries(job, rp, pricer, rows, counts, prog)
    heapq.heapify(heap)
    best_times: list[float] = []
    evaluated: list[tuple[float, int]] = []
    seen: set = set()
    memo = IdentityMemo()
    admissible_so_far = True
    i, order, k = 0, len(heap), job.top_k
    n0 = len(level0)
    while i < n0 or heap:
        kth = best_times[k - 1] if len(best_times) >= k else np.inf
        # A relaxed bound found below an exact one proves nothing: then every
        # candidate is priced before the search may stop.
        nxt0 = (float(level0.bounds[i]) if admissible_so_far else -np.inf) if i < n0 \
            else np.inf
        nxt1 = heap[0][0] if heap else np.inf
        if min(nxt0, nxt1) > kth:
            break
        if nxt0 <= nxt1:
            b0 = float(level0.bounds[i])
            c = rows.block(int(level0.block_ids[i])).candidate(int(level0.positions[i]))
            i += 1
            entry = _price(job, pricer, c, rows, counts, prog, bound=b0, memo=memo)
            if entry is None:
                continue
            rel, arr = rp.arrays(c), entry[1]
            admissible_so_far &= memo.get((rel, arr), ("admissible", c.zero),
                                          lambda: admissible(rel, arr, c.zero))
            spec = SCHEDULES[c.schedule]
            place = spec.placement
            parts = memo.get((arr,), ("parts", place),
                             lambda: bound_parts(arr, place, c.pp, c.virtual_stages))
            # What lower_bound reads of the candidate besides its parts.
            bound = memo.get((parts,), ("bound", c.microbatches, c.recompute == "full",
                                        c.overlap_param_gather, spec.never_recompute(c.pp),
                                        spec.explicit_recompute),
                             lambda: lower_bound(c, arr, parts))
            heapq.heappush(heap, (bound, order, c, *entry))
            order += 1
            continue
        bound, _j, c, tab, arr = heapq.heappop(heap)
        t = _evaluate_one(job, bound, c, tab, arr, rows, counts, seen, memo)
        prog.advance()
        if t is not None:
            evaluated.append((t, len(rows) - 1))
            bisect.insort(best_times, t)
    if i < n0 or heap:
        kth = best_times[k - 1]
        rest = level0.bounds[i:]
        rows.extend(level0.block_ids[i:], level0.positions[i:], "bounded",
                    bounded_reasons(rest, kth, k), bounds=rest)
        counts["bounded"] += len(rest)
        _bound_out(job, sorted(heap, key=lambda x: (x[0], x[1])), kth, rows, counts)
        prog.advance(n0 - i + len(heap))
    counts["cost_tables"] = pricer.built + rp.probes
    return evaluated


def _simulate(job: _Job, cfg: ParallelConfig, engine: str):
    from merak_sim.sim import simulate

    return simulate(job.model, job.cluster, cfg, cost_model=job.cost_model, engine=engine,
                    keep_trace=False)


def _confirm(job: _Job, top: list[tuple[float, int]], rows: RowBook, counts: dict):
    """Stage 5: SimPy on the top K; (winning row index, its SimResult or None when
    none of them fits under SimPy)."""
    sims = []
    for _t, idx in top:
        r = rows[idx]
        res = _simulate(job, job.config(r), "simpy")
        counts["simulated"] += 1
        r.update(status="confirmed", engine="simpy", time_s=res.iteration_time_s,
                 samples_per_s=res.throughput_samples_per_s,
                 tokens_per_s=res.throughput_tokens_per_s or np.nan, mfu=res.mfu,
                 peak_memory_gib=max(res.peak_memory_bytes) / GiB)
        if not res.fits_in_memory:
            r.update(status="pruned", reason=f"memory (SimPy): {res.oom}")
            continue
        sims.append((res.iteration_time_s, idx, res))
    if not sims:
        return top[0][1], None
    _t, idx, res = min(sims, key=lambda x: (x[0], x[1]))
    return idx, res


def _crown(rows: RowBook, best_idx: int, confirmed: bool) -> None:
    """Mark the best row and say how much slower every other row that ran is."""
    best = rows[best_idx]
    best["status"] = "best"
    best["reason"] = "fastest that fits" + (" (SimPy-confirmed)" if confirmed else "")
    for r in rows:
        if r["status"] in ("confirmed", "evaluated") and not r["reason"]:
            slower = (r["time_s"] / best["time_s"] - 1) * 100
            r["reason"] = (f"{slower:.1f} % slower than the best"
                           + (" (SimPy)" if r["engine"] == "simpy" else " (evaluator)"))


def _plan(job: _Job, cfg: ParallelConfig, res, counts: dict) -> Plan:
    try:
        from importlib.metadata import version

        ver = version("merak")
    except Exception:  # noqa: BLE001 - metadata missing in a source checkout
        ver = "unknown"
    return Plan(
        model=job.model.to_dict(), cluster=cluster_record(job.cluster), parallel=cfg,
        predicted={"iteration_time_s": res.iteration_time_s,
                   "throughput_samples_per_s": res.throughput_samples_per_s,
                   "mfu": res.mfu, "peak_memory_bytes": list(res.peak_memory_bytes),
                   "engine": res.engine},
        provenance={"tool": "merak-sim plan", "version": ver,
                    "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                    "search_space": job.space.name,
                    "global_batch_size": job.global_batch_size,
                    "candidates": counts["considered"]})


def _default_cost_model():
    return calibrated_cost_model()


def search(model: Any, cluster: Any, global_batch_size: int, *, nodes: int | None = None,
           space: SearchSpace | None = None, cost_model: Any = None, top_k: int = 3,
           confirm: bool = True, progress: bool | str | Progress = False, memory_margin: float = 0.0,
           exhaustive: bool = False) -> PlanResult:
    """Search the space for the fastest configuration that fits (module docstring).

    Args:
        model, cluster: preset names, JSON files/dicts, or ModelSpec / Cluster values;
            ``nodes`` resizes the cluster.
        global_batch_size: samples per iteration.
        space: restrictions (default: everything).
        cost_model: default the calibrated analytic model (as ``simulate``).
        top_k: candidates confirmed with the SimPy engine.
        confirm: run SimPy on the top K (False: rank by the evaluator alone).
        progress: True or "bar": a rich progress bar on stderr counting every
            candidate (pruned, bounded, evaluated) to 100 %; "lines": one line on
            stderr every few seconds once the search passes 5 s; False: silent; a
            :class:`~merak_sim.progress.Progress` to count into.
        memory_margin: fraction of GPU memory kept free (allocator fragmentation,
            workspaces); 0 plans against the full capacity as the simulator does.
        exhaustive: evaluate every candidate that fits (no branch and bound); for
            tests and for studies that want every time.

    Raises:
        NoFeasiblePlanError: nothing fits; names the smallest shortfall and the
            closest candidate.
        PlannerError: bad input.
    """
    t0 = time.perf_counter()
    _check_inputs(global_batch_size, top_k, memory_margin)
    job = _Job(resolve_model(model), resolve_cluster(cluster, nodes), global_batch_size,
               space or SearchSpace(),
               _default_cost_model() if cost_model is None else cost_model, memory_margin,
               top_k, exhaustive)
    job.cluster.gpu.peak(job.space.dtype)  # --dtype vs the hardware, before any search
    rows = RowBook()
    counts = new_counts()
    label = f"planning {job.model.name} on {job.cluster.world_size} GPUs"
    with progress_reporter(progress, label) as prog:
        evaluated = sorted(_evaluate(job, _screen(job, rows, counts, prog), rows, counts,
                                     prog) if exhaustive else _best_first(job, rows, counts,
                                                                          prog))
        if not evaluated:
            raise no_fit(job.model, job.cluster, global_batch_size, rows, job.space,
                         closest_exact(job, rows))
        top = evaluated[:top_k]
        if confirm:
            prog.phase(f"confirming the top {len(top)} with SimPy")
        best_idx, best_res = (_confirm(job, top, rows, counts) if confirm
                              else (top[0][1], None))
    _crown(rows, best_idx, best_res is not None)
    best_cfg = job.config(rows[best_idx])
    if best_res is None:
        best_res = _simulate(job, best_cfg, "evaluator")
    table = ranked_table(rows)
    seconds = time.perf_counter() - t0
    return PlanResult(model=job.model, cluster=job.cluster,
                      global_batch_size=global_batch_size, space=job.space, table=table,
                      best=_plan(job, best_cfg, best_res, counts), best_result=best_res,
                      counts=counts, seconds=seconds,
                      notes=tuple(dict.fromkeys(tuple(best_res.notes))))
