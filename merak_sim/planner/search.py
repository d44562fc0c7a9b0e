"""The planner: the fastest configuration that fits, and why every other one lost.

Pipeline (each stage only looks at what survived the previous one):

1. Enumerate the :class:`~merak_sim.planner.space.SearchSpace`; candidates that break
   a divisibility rule are kept as "pruned" rows naming the rule.
2. Price each surviving candidate with the cost model. Tables are cached by what they
   depend on (:meth:`Candidate.table_key`: not the schedule nor the checkpointed
   fraction), so many candidates share one.
3. Cheap memory screen: model state plus *one* micro-batch at the most economical
   checkpointing the policy allows, plus the send/receive buffers; a candidate over the
   capacity here can only be worse with more micro-batches in flight.
4. A lower bound on the iteration time per candidate: a rank runs its actions one after
   another, so the iteration lasts at least the busiest rank's sum of forwards,
   backwards (with the recompute the policy forces), gradient reduction and optimizer
   step. Candidates are visited in increasing bound order; once the bound exceeds the
   K-th best exact time, no later candidate can enter the top K ("bounded" rows). This
   branch and bound is what keeps GPT-3 175B on 1024 GPUs within seconds.
5. For each visited candidate: the exact memory walk of its schedule (per-rank live
   micro-batches from :mod:`merak_sim.planner.templates`); for "stage-aware" the
   smallest layer-granular checkpointed fraction per stage that fits (Merak chose c0 by
   hand, Lai et al. TPDS 2023 Sec. on stage-aware recomputation; choosing it from the
   memory model is the improvement the reference suggests); then the exact fast
   evaluator (contention-free critical path).
6. The top K by evaluator time are re-simulated with the SimPy engine (link contention
   on) and the winner is the fastest of those that fit.

Every candidate ends with a status (best, confirmed, evaluated, bounded, pruned) and a
reason ("pruned: tp=3 does not divide 32 attention heads", "memory: stage 0 needs ...",
"12.3 % slower than the best").
"""

from __future__ import annotations

import bisect
import datetime as _dt
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from merak_sim.config import ParallelConfig
from merak_sim.plan import Plan
from merak_sim.schedule import SCHEDULES, ScheduleError

from .space import SearchSpace, enumerate_candidates
from .templates import eval_template, memory_template, stage_arrays

__all__ = ["search", "PlanResult", "NoFeasiblePlanError", "PlannerError", "GiB"]

GiB = float(2**30)
_STATUS_ORDER = {"best": 0, "confirmed": 1, "evaluated": 2, "bounded": 3, "pruned": 4}


class PlannerError(ValueError):
    """Bad planner input (message names the problem and the fix)."""


class NoFeasiblePlanError(PlannerError):
    """No candidate fits in memory; the message gives the smallest shortfall and the
    closest candidate."""

    def __init__(self, message: str, closest: dict | None = None,
                 shortfall_bytes: float | None = None) -> None:
        super().__init__(message)
        self.closest = closest
        self.shortfall_bytes = shortfall_bytes


@dataclass(frozen=True)
class PlanResult:
    """What :func:`search` found.

    Attributes:
        table: pandas DataFrame, one row per candidate, best first (columns: status,
            time_s, samples_per_s, tokens_per_s, mfu, peak_memory_gib, dp, tp, pp,
            virtual_stages, micro_batch_size, microbatches, schedule, recompute,
            recompute_fractions, sequence_parallel, tp_overlap, zero, bound_s,
            engine, reason).
        best: the winning configuration as a :class:`~merak_sim.plan.Plan`.
        best_result: its SimPy :class:`~merak_sim.sim.result.SimResult` (or the
            evaluator's when confirmation is off).
        counts: candidates considered, pruned by rule, pruned by memory, bounded,
            evaluated, simulated with SimPy; cost tables and schedules built.
        seconds: wall-clock time of the search.
        notes: assumptions of the cost model and cluster.
    """

    model: Any
    cluster: Any
    global_batch_size: int
    space: SearchSpace
    table: Any
    best: Plan
    best_result: Any
    counts: dict[str, int]
    seconds: float
    notes: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict)

    @property
    def best_config(self) -> ParallelConfig:
        """The winning ParallelConfig."""
        return self.best.parallel

    def top(self, k: int = 10):
        """The k best rows that ran (confirmed or evaluated)."""
        df = self.table
        return df[df.status.isin(["best", "confirmed", "evaluated"])].head(k)

    def rich_table(self, k: int = 10):
        """A rich Table of the k best candidates plus one example of each way to lose."""
        from rich.table import Table

        t = Table(title=f"{self.model.name} on {self.cluster.name} "
                        f"({self.cluster.world_size} GPUs), global batch "
                        f"{self.global_batch_size}: {self.space.name} search")
        for col in ("#", "status", "dp.tp.pp v mbs", "schedule / recompute", "sp ovl zero",
                    "time s", "samples/s", "MFU", "peak GiB", "why it lost"):
            t.add_column(col, overflow="fold")
        df = self.table
        extra = []
        for st in ("bounded", "pruned"):
            seen = set()
            for _, r in df[df.status == st].iterrows():
                head = str(r.reason).split(" ")[0] + str(r.reason).split(":")[1][:12]
                if head not in seen:
                    seen.add(head)
                    extra.append(r)
                if len(seen) >= 2:
                    break

        def f(x, fmt):
            return "-" if x is None or (isinstance(x, float) and np.isnan(x)) \
                else format(x, fmt)

        rows = [r for _, r in self.top(k).iterrows()] + extra
        for i, r in enumerate(rows):
            rc = r.recompute
            if rc == "stage-aware" and r.recompute_fractions is not None:
                rc += " [" + ",".join(f"{x:.2g}" for x in r.recompute_fractions) + "]"
            t.add_row(str(i + 1), r.status,
                      f"{r.dp}.{r.tp}.{r.pp} v{r.virtual_stages} {r.micro_batch_size}",
                      f"{r.schedule} / {rc}",
                      f"{'y' if r.sequence_parallel else 'n'} "
                      f"{'sub' if r.tp_overlap != 'none' else '-'} {r.zero}",
                      f(r.time_s, ".3f"), f(r.samples_per_s, ".1f"), f(r.mfu, ".1%"),
                      f(r.peak_memory_gib, ".1f"), str(r.reason))
        return t

    def counts_line(self) -> str:
        """One line: candidates considered, pruned, bounded, evaluated, simulated."""
        c = self.counts
        return (f"{c['considered']} candidates: {c['pruned_rule']} pruned by divisibility, "
                f"{c['pruned_memory']} by memory, {c['bounded']} bounded out, "
                f"{c['evaluated']} evaluated (fast evaluator), {c['simulated']} simulated "
                f"(SimPy); {c['cost_tables']} cost tables, {c['schedules']} schedules; "
                f"{self.seconds:.2f} s")

    def save(self, path) -> None:
        """Write the best plan (``merak-plan/1``) atomically."""
        self.best.save(path)


def _resolve(model, cluster, nodes):
    from merak_sim.hardware import Cluster, get_cluster
    from merak_sim.model import ModelSpec, get_model

    spec = model if isinstance(model, ModelSpec) else get_model(model)
    if isinstance(cluster, Cluster):
        clus = cluster if nodes is None else cluster.with_nodes(nodes)
        cdict = clus.to_dict()
        try:  # a preset passed as a value is still written as a preset
            if get_cluster(clus.name, nodes=clus.nodes) == clus:
                cdict = {"preset": clus.name, "nodes": clus.nodes}
        except ValueError:
            pass
    else:
        clus = get_cluster(cluster, nodes=nodes)
        cdict = ({"preset": str(cluster), "nodes": clus.nodes}
                 if isinstance(cluster, str) and not cluster.endswith(".json")
                 and not cluster.lstrip().startswith("{") else clus.to_dict())
    return spec, clus, cdict


def _table_config(c, global_batch_size: int, dtype: str) -> ParallelConfig:
    return ParallelConfig(
        dp=c.dp, tp=c.tp, pp=c.pp, virtual_stages=c.virtual_stages,
        micro_batch_size=c.micro_batch_size, global_batch_size=global_batch_size,
        schedule="interleaved-1f1b" if c.virtual_stages > 1 else "1f1b",
        recompute="selective" if c.recompute == "selective" else "none",
        sequence_parallel=c.sequence_parallel, tp_overlap=c.tp_overlap, zero=c.zero,
        dtype=dtype)


def config_of(c, global_batch_size: int, dtype: str,
              fractions: tuple[float, ...] | None) -> ParallelConfig:
    """The ParallelConfig of a candidate (explicit fractions for stage-aware)."""
    return ParallelConfig(
        dp=c.dp, tp=c.tp, pp=c.pp, virtual_stages=c.virtual_stages,
        micro_batch_size=c.micro_batch_size, global_batch_size=global_batch_size,
        schedule=c.schedule, recompute=c.recompute,
        recompute_fractions=fractions if c.recompute == "stage-aware" else None,
        sequence_parallel=c.sequence_parallel, tp_overlap=c.tp_overlap, zero=c.zero,
        dtype=dtype)


def _no_recompute_last(schedule: str) -> bool:
    return schedule in ("last-no-recompute", "shifted-critical-path")


def _bound(c, arr) -> float:
    """Lower bound on the iteration time (module docstring, step 4).

    Per rank r, the larger of (a) the forward of one micro-batch through the model
    stages before r (r cannot start earlier) plus all of r's work, and (b) one
    micro-batch's forward through every model stage and input-gradient pass back
    through the stages after r's last chunk (r's first backward cannot start earlier)
    plus all of r's backward work, gradient reduction and optimizer step. Transfers
    only add time, so both are valid bounds; (b) is what sees the pipeline bubble.
    Recompute counts only where it must follow the gradient (inside B under 1F1B-style
    full recompute); Merak's schedules may re-forward while waiting.
    """
    S, v, M = c.pp, c.virtual_stages, c.microbatches
    F, B, BI = arr["forward_s"], arr["backward_s"], arr["backward_input_s"]

    def per_rank(x):
        return x.reshape(v, S).sum(axis=0)

    tail = per_rank(arr["grad_allreduce_s"]) + per_rank(arr["optimizer_s"])
    bwd = M * per_rank(B)
    fwd = M * per_rank(F)
    if c.recompute == "full":
        rc = M * np.minimum(per_rank(arr["recompute_s"]), per_rank(F))
        if _no_recompute_last(c.schedule):
            rc[S - 1] = 0.0
        fwd = fwd + rc
        if not SCHEDULES[c.schedule].merak:
            bwd = bwd + rc
    prefix = np.concatenate([[0.0], np.cumsum(F[:S - 1])])
    a = prefix + fwd + M * per_rank(B) + tail
    # Stages after rank r's last chunk (model stage (v-1) S + r).
    rev = np.concatenate([np.cumsum(BI[::-1])[::-1][1:], [0.0]])  # sum over g' > g
    chain = F.sum() + rev[(v - 1) * S + np.arange(S)]
    b = chain + bwd + tail
    return float(np.maximum(a, b).max()) * (1 - 1e-9)


def _quick_memory(c, arr, cap: float) -> tuple[float, int]:
    """(largest excess over capacity of one micro-batch at the cheapest checkpointing,
    its rank): > 0 means the candidate cannot fit under any schedule."""
    S, v = c.pp, c.virtual_stages
    frac = 0.0 if c.recompute in ("none", "selective") else 1.0
    kept = frac * arr["checkpoint_bytes"] + (1 - frac) * arr["activation_bytes"]
    if c.recompute == "full" and _no_recompute_last(c.schedule):
        kept = kept.copy()
        for ch in range(v):
            kept[ch * S + S - 1] = arr["activation_bytes"][ch * S + S - 1]
    # One micro-batch alive on one chunk (the largest), plus every chunk's state.
    state = arr["state_bytes"].reshape(v, S).sum(axis=0)
    one = kept.reshape(v, S).max(axis=0)
    buf = 2 * arr["p2p_bytes"].reshape(v, S).max(axis=0)
    need = state + one + buf
    r = int(np.argmax(need - cap))
    return float(need[r] - cap), r


def _fit_fractions(c, arr, mt, cap: float):
    """(fractions per rank, peak bytes per rank, worst shortfall, its rank) for the
    candidate's policy; stage-aware picks the smallest k / n_s per rank that fits."""
    fracs, peaks = [], []
    worst, worst_rank = -np.inf, 0
    for r in range(c.pp):
        if r in mt.no_recompute or c.recompute in ("none", "selective"):
            opts = np.zeros(1)
        elif c.recompute == "full":
            opts = np.ones(1)
        else:
            n = max(int(arr["layers"][r]), 1)
            opts = np.arange(n + 1) / n
        pk = mt.peak_bytes(arr, r, opts)
        ok = np.nonzero(pk <= cap)[0]
        j = int(ok[0]) if len(ok) else len(opts) - 1
        x = float(opts[j])
        fracs.append(round(x, 6) if x < 1 else 1.0)
        peaks.append(float(pk[j]))
        if pk[j] - cap > worst:
            worst, worst_rank = float(pk[j] - cap), r
    return tuple(fracs), peaks, float(worst), worst_rank


def _describe(row: dict) -> str:
    s = (f"dp={row['dp']} tp={row['tp']} pp={row['pp']}"
         + (f" v={row['virtual_stages']}" if row["virtual_stages"] > 1 else "")
         + f" mbs={row['micro_batch_size']} {row['schedule']} recompute={row['recompute']}")
    if row["sequence_parallel"]:
        s += " +sp"
    if row["tp_overlap"] != "none":
        s += f" tp-overlap={row['tp_overlap']}"
    if row["zero"]:
        s += f" zero={row['zero']}"
    return s


def search(model: Any, cluster: Any, global_batch_size: int, *, nodes: int | None = None,
           space: SearchSpace | None = None, cost_model: Any = None, top_k: int = 3,
           confirm: bool = True, progress: bool = False, memory_margin: float = 0.0,
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
        progress: show a rich progress bar.
        memory_margin: fraction of GPU memory kept free (allocator fragmentation,
            workspaces); 0 plans against the full capacity as the simulator does.
        exhaustive: evaluate every candidate that fits (no branch and bound); for
            tests and for studies that want every time.

    Raises:
        NoFeasiblePlanError: nothing fits; names the smallest shortfall and the
            closest candidate.
        PlannerError: bad input.
    """
    import pandas as pd

    t0 = time.perf_counter()
    space = space or SearchSpace()
    if not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise PlannerError(f"global batch size must be a positive integer, got "
                           f"{global_batch_size!r}")
    if top_k < 1:
        raise PlannerError(f"top K must be >= 1, got {top_k}")
    if not 0.0 <= memory_margin < 1.0:
        raise PlannerError(f"memory margin must lie in [0, 1), got {memory_margin}")
    spec, clus, cdict = _resolve(model, cluster, nodes)
    if cost_model is None:
        from merak_sim.costs.calibrated import calibrated_cost_model

        cost_model = calibrated_cost_model()
    N = clus.world_size
    dtype = space.dtype
    rows: list[dict] = []
    tables: dict[tuple, Any] = {}
    live = []
    cap = None
    counts = dict(considered=0, pruned_rule=0, pruned_memory=0, bounded=0, evaluated=0,
                  simulated=0, cost_tables=0, schedules=0)

    def base_row(c, status, reason, **kw):
        d = dict(status=status, time_s=np.nan, samples_per_s=np.nan, tokens_per_s=np.nan,
                 mfu=np.nan, peak_memory_gib=np.nan, dp=c.dp, tp=c.tp, pp=c.pp,
                 virtual_stages=c.virtual_stages, micro_batch_size=c.micro_batch_size,
                 microbatches=c.microbatches, schedule=c.schedule, recompute=c.recompute,
                 recompute_fractions=None, sequence_parallel=c.sequence_parallel,
                 tp_overlap=c.tp_overlap, zero=c.zero, bound_s=np.nan, engine="",
                 reason=reason, shortfall_gib=np.nan)
        d.update(kw)
        return d

    for c in enumerate_candidates(spec, N, clus.gpus_per_node, global_batch_size, space):
        counts["considered"] += 1
        if c.pruned:
            counts["pruned_rule"] += 1
            rows.append(base_row(c, "pruned", f"pruned: {c.pruned}"))
            continue
        key = c.table_key()
        entry = tables.get(key)
        if entry is None:
            try:
                tab = cost_model.cost_table(spec, clus, _table_config(c, global_batch_size,
                                                                      dtype))
                entry = (tab, stage_arrays(tab))
            except ValueError as e:
                entry = e
            tables[key] = entry
            counts["cost_tables"] += 1
        if isinstance(entry, Exception):
            counts["pruned_rule"] += 1
            rows.append(base_row(c, "pruned", f"pruned: {entry}"))
            continue
        tab, arr = entry
        cap = float(tab.memory_capacity_bytes) * (1.0 - memory_margin)
        excess, r = _quick_memory(c, arr, cap)
        if excess > 0:
            counts["pruned_memory"] += 1
            rows.append(base_row(c, "pruned",
                                 f"memory: stage {r} needs {(excess + cap) / GiB:.1f} GiB "
                                 f"for one micro-batch > {cap / GiB:.1f} GiB",
                                 shortfall_gib=excess / GiB))
            continue
        live.append((_bound(c, arr), len(live), c, tab, arr))

    live.sort(key=lambda x: (x[0], x[1]))
    best_times: list[float] = []
    evaluated: list[tuple[float, int]] = []  # (time, row index)
    bar = None
    if progress and live:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task(f"planning {spec.name} on {N} GPUs", total=len(live))
    seen_sched: set = set()
    try:
        for pos, (bound, _i, c, tab, arr) in enumerate(live):
            if bar is not None and pos % 16 == 0:
                bar.update(task, completed=pos)
            if (not exhaustive and len(best_times) >= top_k
                    and bound > best_times[top_k - 1]):
                kth = best_times[top_k - 1]
                for b2, _j, c2, _t2, _a2 in live[pos:]:
                    counts["bounded"] += 1
                    rows.append(base_row(
                        c2, "bounded",
                        f"bounded: busiest rank alone needs {b2:.3f} s, "
                        f"{(b2 / kth - 1) * 100:.1f} % above the top-{top_k} cut "
                        f"({kth:.3f} s); not simulated", bound_s=b2))
                break
            skey = (c.schedule, c.pp, c.microbatches, c.virtual_stages)
            try:
                mt = memory_template(*skey)
            except ScheduleError as e:
                counts["pruned_rule"] += 1
                rows.append(base_row(c, "pruned", f"pruned: {e}", bound_s=bound))
                continue
            fracs, peaks, worst, wr = _fit_fractions(c, arr, mt, cap)
            if worst > 0:
                counts["pruned_memory"] += 1
                rows.append(base_row(
                    c, "pruned",
                    f"memory: stage {wr} needs {peaks[wr] / GiB:.1f} GiB > "
                    f"{cap / GiB:.1f} GiB (short {worst / GiB:.2f} GiB"
                    + (" even fully checkpointed)" if c.recompute == "stage-aware" else ")"),
                    bound_s=bound, shortfall_gib=worst / GiB,
                    peak_memory_gib=max(peaks) / GiB,
                    recompute_fractions=fracs if c.recompute == "stage-aware" else None))
                continue
            if (c.recompute == "stage-aware" and not any(fracs) and "none" in space.recompute
                    and not SCHEDULES[c.schedule].merak):
                counts["pruned_rule"] += 1
                rows.append(base_row(c, "pruned", "pruned: same as recompute=none (every "
                                     "stage fits without checkpointing)", bound_s=bound))
                continue
            et = eval_template(*skey)
            if skey not in seen_sched:
                seen_sched.add(skey)
                counts["schedules"] += 1
            t = et.evaluate(arr, fracs, zero=c.zero, tied=tab.tied_embeddings)
            counts["evaluated"] += 1
            S, v, M = c.pp, c.virtual_stages, c.microbatches
            flops = M * arr["flops"].reshape(v, S).sum(axis=0).sum() / S
            row = base_row(c, "evaluated", "", time_s=t,
                           samples_per_s=global_batch_size / t,
                           tokens_per_s=global_batch_size * spec.seq_len / t,
                           mfu=flops / t / float(tab.peak_flops),
                           peak_memory_gib=max(peaks) / GiB, bound_s=bound,
                           engine="evaluator",
                           recompute_fractions=fracs if c.recompute == "stage-aware" else None)
            rows.append(row)
            evaluated.append((t, len(rows) - 1))
            bisect.insort(best_times, t)
    finally:
        if bar is not None:
            bar.stop()

    if not evaluated:
        raise _no_fit(spec, clus, global_batch_size, rows, space)

    evaluated.sort()
    top = evaluated[:top_k]
    best_idx, best_res = top[0][1], None
    if confirm:
        from merak_sim.sim import simulate

        sims = []
        for _t, idx in top:
            r = rows[idx]
            cfg = _row_config(r, global_batch_size, dtype)
            res = simulate(spec, clus, cfg, cost_model=cost_model, engine="simpy",
                           keep_trace=False)
            counts["simulated"] += 1
            r.update(status="confirmed", engine="simpy", time_s=res.iteration_time_s,
                     samples_per_s=res.throughput_samples_per_s,
                     tokens_per_s=res.throughput_tokens_per_s or np.nan, mfu=res.mfu,
                     peak_memory_gib=max(res.peak_memory_bytes) / GiB)
            if not res.fits_in_memory:
                r.update(status="pruned", reason=f"memory (SimPy): {res.oom}")
                continue
            sims.append((res.iteration_time_s, idx, res))
        if sims:
            sims.sort(key=lambda x: (x[0], x[1]))
            _bt, best_idx, best_res = sims[0]
    best_row = rows[best_idx]
    best_row["status"] = "best"
    best_row["reason"] = "fastest that fits" + (" (SimPy-confirmed)" if best_res else "")
    best_t = best_row["time_s"]
    for r in rows:
        if r["status"] in ("confirmed", "evaluated") and not r["reason"]:
            slower = (r["time_s"] / best_t - 1) * 100
            r["reason"] = (f"{slower:.1f} % slower than the best"
                           + (" (SimPy)" if r["engine"] == "simpy" else " (evaluator)"))
    best_cfg = _row_config(best_row, global_batch_size, dtype)
    if best_res is None:
        from merak_sim.sim import simulate

        best_res = simulate(spec, clus, best_cfg, cost_model=cost_model,
                            engine="evaluator", keep_trace=False)
    df = pd.DataFrame(rows)
    df["_o"] = df.status.map(_STATUS_ORDER)
    df["_t"] = df.time_s.fillna(df.bound_s).fillna(np.inf)
    df = df.sort_values(["_o", "_t"], kind="stable").drop(columns=["_o", "_t"])
    df = df.reset_index(drop=True)
    seconds = time.perf_counter() - t0
    try:
        from importlib.metadata import version

        ver = version("merak")
    except Exception:  # noqa: BLE001 - metadata missing in a source checkout
        ver = "unknown"
    plan = Plan(
        model=spec.to_dict(), cluster=cdict, parallel=best_cfg,
        predicted={"iteration_time_s": best_res.iteration_time_s,
                   "throughput_samples_per_s": best_res.throughput_samples_per_s,
                   "mfu": best_res.mfu,
                   "peak_memory_bytes": list(best_res.peak_memory_bytes),
                   "engine": best_res.engine},
        provenance={"tool": "merak-sim plan", "version": ver,
                    "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                    "search_space": space.name, "global_batch_size": global_batch_size,
                    "candidates": counts["considered"]})
    notes = tuple(dict.fromkeys(tuple(best_res.notes)))
    return PlanResult(model=spec, cluster=clus, global_batch_size=global_batch_size,
                      space=space, table=df, best=plan, best_result=best_res,
                      counts=counts, seconds=seconds, notes=notes)


def _row_config(r: dict, global_batch_size: int, dtype: str) -> ParallelConfig:
    from types import SimpleNamespace

    return config_of(SimpleNamespace(**r), global_batch_size, dtype,
                     r["recompute_fractions"])


def _no_fit(spec, clus, gbs: int, rows: list[dict], space: SearchSpace) -> NoFeasiblePlanError:
    mem = [r for r in rows if not np.isnan(r["shortfall_gib"])]
    if not mem:
        reasons = sorted({r["reason"] for r in rows})[:3]
        return NoFeasiblePlanError(
            f"no configuration of {spec.name} on {clus.name} ({clus.world_size} GPUs) with "
            f"global batch {gbs} passes the divisibility rules ({'; '.join(reasons)}); "
            "change the global batch size or the search space")
    r = min(mem, key=lambda x: x["shortfall_gib"])
    return NoFeasiblePlanError(
        f"{spec.name} fits nowhere on {clus.name} ({clus.world_size} GPUs, "
        f"{clus.gpu.memory_bytes / GiB:.1f} GiB each) with global batch {gbs} in the "
        f"{space.name} space: the closest candidate ({_describe(r)}) is short "
        f"{r['shortfall_gib']:.2f} GiB ({r['reason']}); add nodes, use GPUs with more "
        "memory, or allow more recompute / ZeRO / sequence parallelism",
        closest=r, shortfall_bytes=r["shortfall_gib"] * GiB)
