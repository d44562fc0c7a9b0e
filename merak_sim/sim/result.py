"""SimResult: what a simulation says, in numbers, tables, traces and pictures.

Breakdown per GPU (seconds, summing to the iteration time):
- compute: forward, backward and optimizer work, recomputation excluded;
- recompute: explicit re-forwards (R) and the checkpointed part of backwards;
- exposed communication: time the compute stream waits while a transfer it needs is
  in flight (from the later of "wait began" and "transfer began" to the transfer's
  end), a data-parallel reduction on the compute stream, the wait for an
  overlapped reduction before the optimizer step, and the exposed part of every
  action's tensor-parallel collectives (``Compiled.tp_exposed_s``, plus whatever link
  contention added to the action);
- bubble: everything else (waiting for a peer stage to produce, for tensor-parallel
  peers, and idling after the rank's last action).

FLOP/s: model FLOP/s per GPU counts each micro-batch's forward + backward once
(6 * params * tokens style, from the cost table); hardware FLOP/s adds
recomputation (a re-forward is counted as one third of forward + backward FLOPs).
MFU = model FLOP/s per GPU / peak FLOP/s of the GPU.

Events: one row per compute action (stream "compute"), transfer (stream "p2p") and
data-parallel reduction (stream "collective", kind "ALL_REDUCE"), plus, for tp > 1, one
row per compute action for its tensor-parallel collectives: stream "collective", kind
:data:`TP_KIND` ("TP_COLLECTIVE"), action the compute action's token, bytes sent per
GPU, spanning the time the collectives occupy the links (the action's last ``tp_s``
seconds, or what the fabric simulated under contention).

The events table, Chrome trace and charts are :mod:`merak_sim.timeline`'s; pandas and
matplotlib are imported lazily by the methods that need them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from merak_sim import timeline
from merak_sim.schedule.arrays import KIND_OF_CODE
from merak_sim.schedule.ir import Kind
from merak_sim.timeline import EVENT_COLUMNS, TP_KIND

from .engine import EventLog

_AR_CODE, _OPT_CODE = Kind.ALL_REDUCE.code, Kind.OPTIMIZER.code

__all__ = ["RankBreakdown", "OutOfMemory", "SimResult", "build_result", "result_of",
           "rank_breakdown", "range_breakdown"]


@dataclass(frozen=True, slots=True)
class RankBreakdown:
    """Where one GPU's iteration time goes (seconds) and what it holds (bytes)."""

    rank: int
    stage: int
    dp_index: int
    tp_index: int
    compute_s: float
    recompute_s: float
    exposed_comm_s: float
    bubble_s: float
    peak_memory_bytes: float

    def to_dict(self) -> dict:
        """Plain-JSON form."""
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """The first GPU to run out of memory: when, during which action, by how much."""

    rank: int
    stage: int
    time_s: float
    action: str
    overflow_bytes: float
    capacity_bytes: float

    def to_dict(self) -> dict:
        """Plain-JSON form."""
        return {k: getattr(self, k) for k in self.__slots__}

    def __str__(self) -> str:
        return (f"GPU {self.rank} (stage {self.stage}) runs out of memory at "
                f"{self.time_s * 1e3:.2f} ms during {self.action}: needs "
                f"{self.overflow_bytes / 2**30:.2f} GiB more than its "
                f"{self.capacity_bytes / 2**30:.2f} GiB")


@dataclass(frozen=True)
class SimResult:
    """One simulated training iteration.

    Attributes:
        iteration_time_s: makespan of the iteration.
        ranks: per simulated GPU, its :class:`RankBreakdown` (representative mode: one
            GPU per pipeline stage).
        peak_memory_bytes: per pipeline stage, the peak over its simulated GPUs.
        fits_in_memory: no GPU exceeded the capacity.
        oom: the first out-of-memory GPU, or None.
        model_flops_per_gpu: model FLOP/s per GPU (mean over all GPUs).
        hardware_flops_per_gpu: FLOP/s per GPU including recomputation.
        mfu: model FLOP/s per GPU over the peak.
        throughput_samples_per_s / throughput_tokens_per_s: global batch rate.
        bubble_fraction: mean bubble over simulated GPUs / iteration time.
        mode, engine: "representative"/"full"; "simpy" or "evaluator".
        config: the ParallelConfig (or None), cost-table notes and meta.
        trace: the raw :class:`~merak_sim.sim.engine.EventLog` (timeline source).
    """

    iteration_time_s: float
    ranks: tuple[RankBreakdown, ...]
    peak_memory_bytes: tuple[float, ...]
    fits_in_memory: bool
    oom: OutOfMemory | None
    model_flops_per_gpu: float
    hardware_flops_per_gpu: float
    mfu: float
    throughput_samples_per_s: float
    throughput_tokens_per_s: float | None
    bubble_fraction: float
    mode: str
    engine: str
    memory_capacity_bytes: float
    peak_flops: float
    config: Any = None
    notes: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict)
    trace: EventLog | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        fits = "fits" if self.fits_in_memory else "does not fit"
        return (f"SimResult({self.iteration_time_s * 1e3:.3f} ms/iteration, MFU "
                f"{self.mfu:.1%}, {fits} in memory (peak "
                f"{max(self.peak_memory_bytes, default=0) / 2**30:.1f} of "
                f"{self.memory_capacity_bytes / 2**30:.1f} GiB), {self.mode}/{self.engine})")

    # -- numbers -------------------------------------------------------------------
    @property
    def tflops_per_gpu(self) -> float:
        """Model TFLOP/s per GPU."""
        return self.model_flops_per_gpu / 1e12

    def to_dict(self) -> dict:
        """The stable JSON summary used by ``merak-sim simulate --json``."""
        cfg = self.config.to_dict() if hasattr(self.config, "to_dict") else self.config
        return {
            "iteration_time_s": self.iteration_time_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_flops_per_gpu / 1e12,
            "mfu": self.mfu,
            "bubble_fraction": self.bubble_fraction,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "peak_memory_bytes": list(self.peak_memory_bytes),
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits_in_memory": self.fits_in_memory,
            "oom": self.oom.to_dict() if self.oom else None,
            "mode": self.mode,
            "engine": self.engine,
            "breakdown": [r.to_dict() for r in self.ranks],
            "config": cfg,
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        """A readable summary table (plain text)."""
        lines = [
            f"iteration time      {self.iteration_time_s * 1e3:12.3f} ms",
            f"model TFLOP/s/GPU   {self.tflops_per_gpu:12.2f}   (MFU {self.mfu * 100:.1f} %, "
            f"hardware {self.hardware_flops_per_gpu / 1e12:.2f})",
            f"throughput          {self.throughput_samples_per_s:12.2f} samples/s"
            + (f"   {self.throughput_tokens_per_s:,.0f} tokens/s"
               if self.throughput_tokens_per_s else ""),
            f"bubble fraction     {self.bubble_fraction:12.3f}",
            f"fits in memory      {'yes' if self.fits_in_memory else 'NO'}"
            f"   (capacity {self.memory_capacity_bytes / 2**30:.1f} GiB)",
        ]
        if self.oom:
            lines.append(f"out of memory       {self.oom}")
        lines.append("")
        lines.append(f"{'rank':>5} {'stage':>5} {'compute ms':>11} {'recomp ms':>10} "
                     f"{'comm ms':>9} {'bubble ms':>10} {'peak GiB':>9}")
        rows = self.ranks if len(self.ranks) <= 64 else self.ranks[:64]
        for r in rows:
            lines.append(f"{r.rank:5d} {r.stage:5d} {r.compute_s * 1e3:11.3f} "
                         f"{r.recompute_s * 1e3:10.3f} {r.exposed_comm_s * 1e3:9.3f} "
                         f"{r.bubble_s * 1e3:10.3f} {r.peak_memory_bytes / 2**30:9.2f}")
        if len(self.ranks) > 64:
            lines.append(f"... {len(self.ranks) - 64} more GPUs")
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)

    # -- timelines -----------------------------------------------------------------
    def _event_rows(self):
        tr = self.trace
        if tr is None:
            raise ValueError("this result carries no trace (simulate with keep_trace=True)")
        prog = tr.prog
        acts = prog.actions
        ent_of = {}
        for e, (s, ci) in enumerate(zip(tr.stage_of, tr.copy_of, strict=False)):
            ent_of[(s, ci)] = e
        tp_s = prog.tp_s
        tp_b = prog.tp_bytes
        for e, rows in enumerate(tr.acts):
            rank, s = tr.ranks[e], tr.stage_of[e]
            rb = tr.buckets[e]
            sim_tp = tr.tp_comm[e] if tr.tp_comm else {}
            for aid, st, en in rows:
                a = acts[aid]
                if tp_s and tp_s[aid] > 0:
                    w = sim_tp.get(aid)
                    cs, ce = (w[0], w[1]) if w is not None else (
                        en - min(tp_s[aid], en - st), en)
                    yield (rank, s, a.chunk, "collective", TP_KIND, str(a), a.microbatch,
                           cs, ce, tp_b[aid])
                if a.kind is Kind.ALL_REDUCE and rb:
                    for ch, bs, be in rb:
                        yield (rank, s, max(ch, 0), "collective", a.kind.name, str(a), -1,
                               bs, be, prog.grad_bytes[s])
                    continue
                stream = "collective" if a.kind is Kind.ALL_REDUCE else "compute"
                nbytes = prog.grad_bytes[s] if a.kind is Kind.ALL_REDUCE else 0.0
                yield (rank, s, a.chunk, stream, a.kind.name, str(a), a.microbatch, st, en,
                       nbytes)
        ncopies = max(tr.copy_of) + 1 if tr.copy_of else 1
        for ci in range(ncopies):
            xs, xe = tr.xfers[ci]
            for tid, t in enumerate(prog.transfers):
                for act, s in ((t.send, t.src), (t.recv, t.dst)):
                    e = ent_of.get((s, ci))
                    if e is None:
                        continue
                    yield (tr.ranks[e], s, act.chunk, "p2p", act.kind.name, str(act),
                           act.microbatch, xs[tid], xe[tid], t.nbytes)

    def events(self):
        """The events table (pandas DataFrame, columns :data:`EVENT_COLUMNS`, sorted by
        rank, start)."""
        import pandas as pd

        rows = list(self._event_rows())
        df = pd.DataFrame.from_records(rows, columns=list(EVENT_COLUMNS))
        return df.sort_values(["rank", "start_s", "stream"], kind="stable").reset_index(
            drop=True)

    def _trace_info(self) -> dict:
        return {"iteration_time_s": self.iteration_time_s, "mode": self.mode,
                "engine": self.engine}

    def chrome_trace(self) -> dict:
        """Chrome trace-event JSON of the events (:func:`merak_sim.timeline.chrome_trace`:
        one process per GPU, one thread per stream, TP collectives on a thread of their
        own); ``otherData`` holds the iteration time, mode and engine."""
        return timeline.chrome_trace(self._event_rows(), self._trace_info())

    def write_chrome_trace(self, path: str | Path) -> None:
        """Write :meth:`chrome_trace` atomically."""
        timeline.write_chrome_trace(self._event_rows(), path, self._trace_info())

    def memory_timeline(self, rank: int | None = None):
        """Memory over time as a DataFrame (rank, time_s, bytes); one GPU if given
        (ValueError for a rank this result did not simulate)."""
        import pandas as pd

        tr = self.trace
        if tr is None:
            raise ValueError("this result carries no trace")
        if rank is not None and rank not in tr.ranks:
            shown = sorted(set(tr.ranks))
            listed = (", ".join(map(str, shown)) if len(shown) <= 16
                      else f"{shown[0]}..{shown[-1]} ({len(shown)} GPUs)")
            raise ValueError(f"rank {rank} was not simulated; simulated ranks: {listed}"
                             + (" (representative mode simulates one GPU per stage)"
                                if self.mode == "representative" else ""))
        rows = []
        for e, hbm in enumerate(tr.memory):
            if rank is not None and tr.ranks[e] != rank:
                continue
            rows.extend((tr.ranks[e], t, b) for t, b in hbm.timeline)
        return pd.DataFrame.from_records(rows, columns=["rank", "time_s", "bytes"])

    def plot_gantt(self, path: str | Path | None = None, max_ranks: int = 32):
        """Gantt chart of the compute stream and collectives per GPU
        (:func:`merak_sim.timeline.plot_gantt`); saves to ``path`` if given and returns
        the matplotlib figure."""
        ax = timeline.plot_gantt(
            list(self._event_rows()), path=path, max_ranks=max_ranks,
            title=f"iteration {self.iteration_time_s * 1e3:.2f} ms ({self.mode})")
        return ax.figure

    def plot_memory(self, path: str | Path | None = None, max_ranks: int = 16):
        """Memory over time per GPU (step plot) with the capacity line
        (:func:`merak_sim.timeline.plot_memory`); saves to ``path`` if given and returns
        the matplotlib figure."""
        ax = timeline.plot_memory(self.memory_timeline(), path=path, max_ranks=max_ranks,
                                  capacity_bytes=self.memory_capacity_bytes,
                                  end_s=self.iteration_time_s)
        return ax.figure


def rank_breakdown(tr: EventLog, e: int, rows: list[tuple[int, float, float]] | None = None
                   ) -> tuple[float, float, float]:
    """(compute, recompute, exposed comm) seconds of entity ``e`` (module docstring);
    of ``rows``, a run of its ``tr.acts[e]`` rows, alone where given. A whole rank of
    a log with :attr:`~merak_sim.sim.engine.EventLog.times` sums its per-micro-batch
    actions with numpy (:func:`range_breakdown`) and walks only AR and OPT."""
    prog = tr.prog
    if rows is not None or tr.times is None or tr.tp_comm:
        return _walk_breakdown(tr, e, tr.acts[e] if rows is None else rows, _Per(prog, e),
                               0.0, 0.0, 0.0, 0.0)
    fa = prog.structure.arrays
    lo, hi = int(fa.first[tr.stage_of[e]]), int(fa.first[tr.stage_of[e] + 1])
    tail = (fa.kind[lo:hi] == _AR_CODE) | (fa.kind[lo:hi] == _OPT_CODE)
    head = lo + (int(np.argmax(tail)) if tail.any() else hi - lo)
    return _walk_breakdown(tr, e, _time_rows(tr, head, hi), _Per(prog, e, range(head, hi)),
                           *_sums(tr, e, lo, head))


def range_breakdown(tr: EventLog, e: int, lo: int, hi: int) -> tuple[float, float, float]:
    """:func:`rank_breakdown` of entity ``e``'s rows for the action ids ``lo`` ..
    ``hi - 1`` (per-micro-batch actions of one rank, in id order, as the fast
    evaluator's log holds them), with numpy where the log has
    :attr:`~merak_sim.sim.engine.EventLog.times`."""
    if tr.times is None or tr.tp_comm:
        first = tr.prog.structure.compute_ids[tr.stage_of[e]][0]
        return rank_breakdown(tr, e, tr.acts[e][lo - first:hi - first])
    return _walk_breakdown(tr, e, [], _Per(tr.prog, e, range(0)), *_sums(tr, e, lo, hi))


#: Actions from which :func:`_sums` adds with numpy (below, a loop costs less than
#: the arrays' fixed cost).
ARRAY_ACTIONS = 64


def _rank_heads(tr: EventLog) -> tuple[list[int], list[int], list]:
    """Per entity of a log with ``times`` (one per pipeline rank): where its AR and
    OPT start, where its actions end, and the sums of the actions before them
    (:func:`_array_sums`)."""
    fa = tr.prog.structure.arrays
    first = fa.first
    tail = (fa.kind == _AR_CODE) | (fa.kind == _OPT_CODE)
    stages = np.array(tr.stage_of, dtype=np.int64)
    lo, hi = first[stages], first[stages + 1]
    # the first AR or OPT of each rank (its end where it has none)
    marks = np.append(np.flatnonzero(tail), len(tail))
    head = np.minimum(marks[np.searchsorted(marks, lo)], hi)
    return head.tolist(), hi.tolist(), _array_sums(tr, lo, head)


def _time_rows(tr: EventLog, lo: int, hi: int) -> list[tuple[int, float, float]]:
    """(action id, start, end) of the actions ``lo`` .. ``hi - 1`` from the log's
    arrays."""
    start, end = tr.times[0], tr.times[1]
    return list(zip(range(lo, hi), start[lo:hi].tolist(), end[lo:hi].tolist(), strict=True))


def _sums(tr: EventLog, e: int, lo: int, hi: int) -> tuple[float, float, float, float]:
    """(compute, recompute, exposed comm, end of the last) of the per-micro-batch
    actions ``lo`` .. ``hi - 1`` of entity ``e``, from nothing before them: with numpy
    from :data:`ARRAY_ACTIONS` on, else by the loop (the same floats either way)."""
    if hi - lo >= ARRAY_ACTIONS:
        return _head_breakdown(tr, e, lo, hi)
    rows = _time_rows(tr, lo, hi)
    comp, recomp, comm = _walk_breakdown(tr, e, rows, _Per(tr.prog, e, range(lo, hi)),
                                         0.0, 0.0, 0.0, 0.0, buckets=False)
    return comp, recomp, comm, rows[-1][2] if rows else 0.0


class _Per:
    """What :func:`_walk_breakdown` reads per action id: the program's tuples, or for
    the few ``ids`` given, dictionaries of them (the array path walks only AR and OPT,
    and need not build a tuple per action)."""

    __slots__ = ("acts", "dur", "rec", "tpx", "tprx", "consumed")

    def __init__(self, prog, e: int, ids: range | None = None):
        if ids is None:
            self.acts, self.dur, self.rec = prog.actions, prog.duration_s, prog.recompute_s
            self.tpx, self.tprx = prog.tp_exposed_s, prog.tp_recompute_exposed_s
            self.consumed = None
            return
        fa = prog.structure.arrays
        rule = fa.rule
        cols = prog.rule_values
        self.acts = {x: _KindOnly(KIND_OF_CODE[int(fa.kind[x])]) for x in ids}
        self.dur = {x: prog.duration_s[x] for x in ids}
        self.rec, self.tpx, self.tprx = ({x: cols[j][int(rule[x])] for x in ids}
                                         for j in (1, 3, 4))
        self.consumed = {x: int(fa.consumed[x]) for x in ids if fa.consumed[x] >= 0}


class _KindOnly:
    """An action as :func:`_walk_breakdown` reads it: its kind."""

    __slots__ = ("kind",)

    def __init__(self, kind: Kind):
        self.kind = kind


def _head_breakdown(tr: EventLog, e: int, lo: int, hi: int
                    ) -> tuple[float, float, float, float]:
    """(compute, recompute, exposed comm, end of the last) of entity ``e``'s actions
    ``lo`` .. ``hi - 1`` (no AR or OPT among them, contention-free): the loop of
    :func:`_walk_breakdown` as array operations (:func:`_array_sums`)."""
    if hi <= lo:
        return 0.0, 0.0, 0.0, 0.0
    return _array_sums(tr, np.array([lo]), np.array([hi]))[0]


def _array_sums(tr: EventLog, lo: np.ndarray, hi: np.ndarray
                ) -> list[tuple[float, float, float, float]]:
    """For each range ``lo[k]`` .. ``hi[k] - 1`` of one rank's per-micro-batch action
    ids (contention-free, of a log with ``times``; the ranges padded to one length
    with terms of 0.0 at their ends), (compute, recompute, exposed comm, end of the
    last): every term of :func:`_walk_breakdown`'s loop at once, and each sum a
    sequential ``cumsum`` along its range of the loop's terms in the loop's order,
    so the floats are the loop's."""
    prog = tr.prog
    fa = prog.structure.arrays
    n = hi - lo
    L = int(n.max(initial=0))
    if L == 0:
        return [(0.0, 0.0, 0.0, 0.0)] * len(lo)
    valid = np.arange(L)[None, :] < n[:, None]
    ids = np.where(valid, lo[:, None] + np.arange(L)[None, :], 0)
    st, en = tr.times[0][ids], tr.times[1][ids]
    xs, xe = tr.times[2], tr.times[3]
    per = prog.action_arrays
    dur, rec, tpx, tprx = (per[k][ids] for k in ("duration_s", "recompute_s",
                                                  "tp_exposed_s", "tp_recompute_exposed_s"))
    prev = np.concatenate([np.zeros((len(lo), 1)), en[:, :-1]], axis=1)
    wait = st - prev
    y = fa.consumed[ids]
    comm = np.zeros((len(lo), L, 2))
    w = (wait > 0.0) & (y >= 0) & valid
    if w.any():
        yw, pw, sw = y[w], prev[w], st[w]
        low = np.where(xs[yw] > pw, xs[yw], pw)
        high = np.where(sw < xe[yw], sw, xe[yw])
        g = high - low
        g = np.where(g > 0.0, g, 0.0)
        comm[w, 0] = np.where(g < wait[w], g, wait[w])
    d = en - st
    tp = tpx > 0.0
    c = np.where(tpx < d, tpx, d)
    comm[:, :, 1] = np.where(tp & valid, c, 0.0)
    d = np.where(tp, d - c, d)
    base = dur - tpx
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(tp, np.where((base > 0.0) & (rec > 0.0), d * (rec - tprx) / base, 0.0),
                     np.where((dur > 0.0) & (rec > 0.0), d * rec / dur, 0.0))
    comp = np.where(tp | (dur > 0.0) & (rec > 0.0), d - r, d)
    sums = [np.cumsum(np.where(valid, x, 0.0), axis=1)[:, -1] for x in (comp, r)]
    sums.append(np.cumsum(comm.reshape(len(lo), 2 * L), axis=1)[:, -1])
    last = en[np.arange(len(lo)), np.maximum(n - 1, 0)]
    return [(float(a), float(b), float(cm), float(x) if k else 0.0) for a, b, cm, x, k in
            zip(sums[0], sums[1], sums[2], last, n.tolist(), strict=True)]


def _walk_breakdown(tr: EventLog, e: int, rows, per: _Per, comp: float, recomp: float,
                    comm: float, prev_end: float, buckets: bool = True
                    ) -> tuple[float, float, float]:
    """:func:`rank_breakdown`'s loop over ``rows``, from the given sums and the end of
    the action before them (and the exposed ZeRO-1 all-gather if ``buckets``)."""
    xs, xe = tr.xfers[tr.copy_of[e]]
    acts, dur, rec, tpx, tprx = per.acts, per.dur, per.rec, per.tpx, per.tprx
    sim_tp = tr.tp_comm[e] if tr.tp_comm else {}
    consumed = (tr.prog.structure.consumed[tr.stage_of[e]] if per.consumed is None
                else per.consumed)
    all_reduce, optimizer = Kind.ALL_REDUCE, Kind.OPTIMIZER
    overlapped = bool(tr.buckets[e])
    # min and max are written out as comparisons (the loop runs once per action), and
    # floats are compared with float literals (the interpreter's fast float compare):
    # ``b if b < a else a`` is min(a, b) and ``b if b > a else a`` is max(a, b),
    # ties and signed zeros included.
    for aid, st, en in rows:
        k = acts[aid].kind
        if k is all_reduce:
            if not overlapped:  # overlapped: its exposed part is the optimizer's wait
                comm += en - st
                if en > prev_end:
                    prev_end = en
            continue
        wait = st - prev_end
        if wait > 0.0:
            y = consumed.get(aid)
            if y is not None:
                lo = xs[y]
                if not lo > prev_end:
                    lo = prev_end
                hi = xe[y]
                if st < hi:
                    hi = st
                g = hi - lo
                if not g > 0.0:
                    g = 0.0
                comm += g if g < wait else wait
            elif k is optimizer and overlapped:
                comm += wait
        d = en - st
        x_tp = tpx[aid]  # one per action id (a gather), so never empty here
        if x_tp > 0.0 or (sim_tp and aid in sim_tp):
            # Exposed TP collectives (plus any contention delay) are communication;
            # the rest splits into compute and recompute as the contention-free parts.
            c = x_tp  # no contention records: the exposed part alone
            if sim_tp:
                w = sim_tp.get(aid)
                c = x_tp + (w[2] if w is not None else 0.0)
            if not c < d:
                c = d
            comm += c
            d -= c
            base = dur[aid] - x_tp
            r = d * (rec[aid] - tprx[aid]) / base if base > 0.0 and rec[aid] > 0.0 else 0.0
            recomp += r
            comp += d - r
        elif dur[aid] > 0.0 and rec[aid] > 0.0:
            r = d * rec[aid] / dur[aid]
            recomp += r
            comp += d - r
        else:
            comp += d
        prev_end = en
    # ZeRO-1 all-gather after the optimizer (overlap mode) is exposed.
    for ch, bs, be in tr.buckets[e] if buckets else ():
        if ch == -1:
            comm += be - bs
    return comp, recomp, comm


def build_result(tr: EventLog, *, capacity: float, peak_flops: float, engine: str,
                 global_batch: int, seq_len: int | None, config: Any = None,
                 notes: tuple[str, ...] = (), meta: dict | None = None,
                 keep_trace: bool = True) -> SimResult:
    """Turn an :class:`EventLog` into a :class:`SimResult`."""
    prog = tr.prog
    figures = []
    oom = None
    split = _rank_heads(tr) if tr.times is not None and not tr.tp_comm else None
    for e, grank in enumerate(tr.ranks):
        s = tr.stage_of[e]
        hbm = tr.memory[e]
        if split is None:
            figures.append((grank, s, *rank_breakdown(tr, e), hbm.peak))
        else:
            head, hi, sums = split[0][e], split[1][e], split[2][e]
            figures.append((grank, s, *_walk_breakdown(
                tr, e, _time_rows(tr, head, hi), _Per(prog, e, range(head, hi)), *sums),
                hbm.peak))
        if hbm.oom_time is not None:
            cand = OutOfMemory(
                grank, s, hbm.oom_time,
                str(prog.actions[hbm.oom_action]) if hbm.oom_action is not None
                and hbm.oom_action >= 0 else "model state",
                hbm.overflow, capacity)
            if oom is None or (cand.time_s, cand.rank) < (oom.time_s, oom.rank):
                oom = cand
    return result_of(
        tr.makespan, figures, oom, sum(prog.flops), sum(prog.recompute_flops),
        placement=tr.placement, stages=prog.num_ranks, mode=tr.mode, capacity=capacity,
        peak_flops=peak_flops, engine=engine, global_batch=global_batch, seq_len=seq_len,
        config=config, notes=notes, meta=meta, trace=tr if keep_trace else None)


def result_of(T: float, figures: list[tuple[int, int, float, float, float, float]],
              oom: OutOfMemory | None, flops: float, recompute_flops: float, *,
              placement: Any, stages: int, mode: str, capacity: float, peak_flops: float,
              engine: str, global_batch: int, seq_len: int | None, config: Any = None,
              notes: tuple[str, ...] = (), meta: dict | None = None,
              trace: EventLog | None = None) -> SimResult:
    """A :class:`SimResult` from its measured figures: the makespan ``T``, per
    simulated GPU (global rank, pipeline stage, compute, recompute, exposed
    communication seconds, peak bytes), the first out-of-memory GPU, and the model
    and recomputation FLOPs of one pipeline's iteration."""
    pl = placement
    ranks = []
    peak_stage = [0.0] * stages
    for grank, s, comp, recomp, comm, peak in figures:
        bubble = max(0.0, T - comp - recomp - comm)
        at = pl.coords(grank)
        ranks.append(RankBreakdown(grank, s, at.dp, at.tp, comp, recomp, comm, bubble, peak))
        peak_stage[s] = max(peak_stage[s], peak)
    # FLOPs: every stage of the pipeline, replicated over dp * cp * tp GPUs.
    total_model = flops * pl.dp * pl.cp * pl.tp
    total_hw = (flops + recompute_flops) * pl.dp * pl.cp * pl.tp
    world = pl.world_size
    mf = total_model / T / world if T > 0 else 0.0
    hf = total_hw / T / world if T > 0 else 0.0
    bubble_frac = (sum(r.bubble_s for r in ranks) / len(ranks) / T) if T > 0 and ranks else 0.0
    samples = global_batch / T if T > 0 else 0.0
    return SimResult(
        iteration_time_s=T,
        ranks=tuple(ranks),
        peak_memory_bytes=tuple(peak_stage),
        fits_in_memory=oom is None,
        oom=oom,
        model_flops_per_gpu=mf,
        hardware_flops_per_gpu=hf,
        mfu=mf / peak_flops if peak_flops else 0.0,
        throughput_samples_per_s=samples,
        throughput_tokens_per_s=samples * seq_len if seq_len else None,
        bubble_fraction=bubble_frac,
        mode=mode,
        engine=engine,
        memory_capacity_bytes=capacity,
        peak_flops=peak_flops,
        config=config,
        notes=tuple(notes),
        meta=dict(meta or {}),
        trace=trace,
    )
