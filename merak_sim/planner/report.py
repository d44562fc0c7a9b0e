"""The planner's report: one row per candidate saying how it ended and why it lost,
the ranked table, :class:`PlanResult` and the no-fit error.

Every candidate ends with a status (best, confirmed, evaluated, bounded, pruned) and a
reason ("pruned: tp=3 does not divide 32 attention heads", "memory: stage 0 needs ...",
"12.3 % slower than the best").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from merak_sim.config import ParallelConfig
from merak_sim.plan import Plan

from .explain import explain
from .rows import RowBook
from .space import SearchSpace

__all__ = ["GiB", "PlannerError", "NoFeasiblePlanError", "PlanResult", "no_fit",
           "new_counts", "WIDE_TABLE"]

GiB = float(2**30)


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


def new_counts() -> dict[str, int]:
    """Zeroed search counts (see :attr:`PlanResult.counts`)."""
    return dict(considered=0, pruned_rule=0, pruned_memory=0, bounded=0, evaluated=0,
                simulated=0, cost_tables=0, schedules=0)


def _describe(r: dict) -> str:
    s = (f"dp={r['dp']} tp={r['tp']} pp={r['pp']}"
         + (f" v={r['virtual_stages']}" if r["virtual_stages"] > 1 else "")
         + f" mbs={r['micro_batch_size']} {r['schedule']} recompute={r['recompute']}")
    if r["sequence_parallel"]:
        s += " +sp"
    if r["tp_overlap"] != "none":
        s += f" tp-overlap={r['tp_overlap']}"
    if r["zero"]:
        s += f" zero={r['zero']}"
    if r.get("cp", 1) > 1:
        s += f" cp={r['cp']}"
    if r.get("zero_group"):
        s += f" hsdp={r['zero_group']}"
    if r.get("attention", "auto") != "auto":
        s += f" attention={r['attention']}"
    if r.get("overlap_param_gather"):
        s += " overlap-param-gather"
    return s


def no_fit(model, cluster, gbs: int, rows: RowBook, space: SearchSpace,
           closest: Any = None) -> NoFeasiblePlanError:
    """The error when nothing was evaluated: every candidate broke a rule, or the one
    closest to fitting (``closest``: :func:`~merak_sim.planner.closest.closest_exact`,
    its exact shortfall, the one simulating it reports) and its shortfall."""
    if closest is None:
        rules = sorted({r["reason"] for r in rows.dicts()})
        return NoFeasiblePlanError(
            f"no configuration of {model.name} on {cluster.name} ({cluster.world_size} GPUs) "
            f"with global batch {gbs} passes the divisibility rules "
            f"({'; '.join(rules[:3])}); change the global batch size or the search space")
    r = closest.row
    fr = r["recompute_fractions"]
    how = (" at stage-aware fractions " + ",".join(f"{x:.2g}" for x in fr)
           if fr is not None and any(fr) else "")
    stopped = (" (the closest of the first candidates priced; the search for it stopped "
               "there)" if closest.stopped else "")
    return NoFeasiblePlanError(
        f"{model.name} fits nowhere on {cluster.name} ({cluster.world_size} GPUs, "
        f"{closest.capacity_bytes / GiB:.1f} GiB usable each) with global batch {gbs} in "
        f"the {space.name} space: the closest candidate ({_describe(r)}{how}) is short "
        f"{closest.shortfall_bytes / GiB:.2f} GiB (stage {closest.stage} needs "
        f"{closest.peak_bytes / GiB:.1f} GiB){stopped}; add nodes, use GPUs with more "
        "memory, or allow more recompute / ZeRO / sequence parallelism",
        closest=r, shortfall_bytes=closest.shortfall_bytes)


def _fmt(x, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, fmt)


def _losers(df) -> list:
    """Up to two rows per way of losing (bounded, pruned), one per distinct reason."""
    import pandas as pd

    extra = []
    for st in ("bounded", "pruned"):
        sub = df[df.status == st]
        # The head of each distinct reason, in order of first appearance: the first
        # row with a new head is the first row of the first reason that has it.
        codes, uniq = pd.factorize(sub.reason.astype(str))
        first = {}
        for k, reason in enumerate(uniq):
            head = reason.split(" ")[0] + reason.split(":")[1][:12]
            if head not in first:
                first[head] = k
                if len(first) >= 2:
                    break
        pos = {k: int(np.argmax(codes == k)) for k in first.values()}
        extra.extend(sub.iloc[pos[k]] for k in sorted(first.values()))
    return extra


def _recompute_text(r) -> str:
    rc = r.recompute
    if rc == "stage-aware" and r.recompute_fractions is not None:
        rc += " [" + ",".join(f"{x:.2g}" for x in r.recompute_fractions) + "]"
    return rc


def _table_row(i: int, r) -> list[str]:
    return [str(i + 1), r.status,
            f"{r.dp}.{r.tp}.{r.pp} v{r.virtual_stages} {r.micro_batch_size}",
            f"{r.schedule} / {_recompute_text(r)}",
            f"{'y' if r.sequence_parallel else 'n'} "
            f"{'sub' if r.tp_overlap != 'none' else '-'} {r.zero}",
            _fmt(r.time_s, ".3f"), _fmt(r.samples_per_s, ".1f"), _fmt(r.mfu, ".1%"),
            _fmt(r.peak_memory_gib, ".1f"), str(r.reason)]


def _compact_row(i: int, r) -> list[str]:
    extras = ((" sp" if r.sequence_parallel else "")
              + (" ovl" if r.tp_overlap != "none" else "")
              + (f" z{r.zero}" if r.zero else ""))
    return [str(i + 1),
            f"{r.dp}.{r.tp}.{r.pp} v{r.virtual_stages} m{r.micro_batch_size}{extras}",
            f"{r.schedule}\n{r.recompute}",
            _fmt(r.time_s, ".3f"), _fmt(r.mfu, ".1%"), _fmt(r.peak_memory_gib, ".1f")]


def _compact_note(i: int, r) -> str:
    """Line ``i`` under the compact table: how the row ended, why, and the stage-aware
    fractions the table leaves out."""
    reason = str(r.reason)
    head = "" if reason.split(":")[0] in ("bounded", "pruned", "memory") else f"{r.status}: "
    fr = r.recompute_fractions if r.recompute == "stage-aware" else None
    if fr is None:
        tail = ""
    elif not any(fr):
        tail = "; no stage checkpointed"
    else:
        tail = f"; checkpointed per stage {_recompute_text(r)[len(r.recompute):].strip()}"
    return f"{i + 1:>2}. {head}{reason}{tail}"


#: Below this many columns the table drops the status and samples/s, folds sp /
#: overlap / ZeRO into the configuration, puts the recompute policy under the
#: schedule and lists how each row ended (with stage-aware fractions) beneath it;
#: the time, MFU and peak-memory columns always stay.
WIDE_TABLE = 120


@dataclass(frozen=True)
class PlanResult:
    """What :func:`~merak_sim.planner.search` found.

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

    def rich_table(self, k: int = 10, width: int | None = None):
        """The k best candidates plus one example of each way to lose, as a rich
        renderable: one table when ``width`` is None or at least :data:`WIDE_TABLE`;
        narrower, a compact table (nothing broken inside a word or number at 80
        columns) with the reasons listed beneath it."""
        from rich import box
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        title = (f"{self.model.name} on {self.cluster.name} ({self.cluster.world_size} "
                 f"GPUs), global batch {self.global_batch_size}: {self.space.name} search")
        rows = [r for _, r in self.top(k).iterrows()] + _losers(self.table)
        if width is None or width >= WIDE_TABLE:
            t = Table(title=title)
            for col in ("#", "status", "dp.tp.pp v mbs", "schedule / recompute",
                        "sp ovl zero", "time s", "samples/s", "MFU", "peak GiB",
                        "why it lost"):
                t.add_column(col, overflow="fold")
            for i, r in enumerate(rows):
                t.add_row(*_table_row(i, r))
            return t
        # Every column has a bounded width (the longest schedule name is 21), so the
        # whole table fits 80 columns and rich never drops one.
        t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        t.add_column("#", no_wrap=True, justify="right")
        t.add_column("dp.tp.pp v mbs", no_wrap=True)
        t.add_column("schedule / recompute", no_wrap=True)
        for col in ("time s", "MFU", "peak GiB"):
            t.add_column(col, justify="right", no_wrap=True)
        for i, r in enumerate(rows):
            t.add_row(*_compact_row(i, r))
        why = Text("\n".join(_compact_note(i, r) for i, r in enumerate(rows)))
        return Group(t, Text("why each lost:"), why)

    def explanation(self) -> list[str]:
        """Why the best plan won, one line per knob (cp, ZeRO, schedule, recompute,
        attention, degrees ...): each other value's best outcome and what stopped it
        (:func:`merak_sim.planner.explain.explain`)."""
        return explain(self.table)

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

    def __repr__(self) -> str:
        c, p = self.counts, self.best.parallel
        b = self.best_result
        return (f"PlanResult({self.model.name} on {self.cluster.name}, best dp={p.dp} "
                f"tp={p.tp} pp={p.pp} mbs={p.micro_batch_size} {p.schedule} "
                f"recompute={p.recompute}: {b.iteration_time_s:.3f} s/iteration, MFU "
                f"{b.mfu:.1%}; {c['considered']} candidates, {c['evaluated']} evaluated, "
                f"{self.seconds:.1f} s)")
