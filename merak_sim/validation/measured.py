"""The measured side of a run: effective starts, exposed communication, bubbles, CPU
shares.

Measured timing conventions: the runtime starts timing a compute action before it
waits for the receive it consumes, so a measured action's effective start is the
later of its start and the end of that receive; the wait before it is exposed
communication where the transfer was in flight (the later of the send's and the
receive's postings, up to the receive's end) and bubble otherwise, which is the
simulator's own definition.
"""

from __future__ import annotations

import pandas as pd

from merak_sim.config import ParallelConfig
from merak_sim.layout import RankLayout
from merak_sim.validation.rundir import MeasuredRun

__all__ = ["step_frame", "measured_breakdown", "cpu_shares"]


def step_frame(run: MeasuredRun, step: int):
    """One step's events with ``eff_start_s`` (after the consumed receive) and
    ``wait_comm_s`` (exposed communication before the action)."""
    df = run.events_frame(step).copy()
    p2p = df[df["stream"] == "p2p"]
    recv_end, recv_post, send_post = {}, {}, {}
    for r in p2p.itertuples():
        if r.kind in ("RECV_ACT", "RECV_GRAD"):
            recv_end[(r.rank, r.kind, r.chunk, r.microbatch)] = r.end_s
            recv_post[(r.rank, r.kind, r.chunk, r.microbatch)] = r.start_s
        else:
            # by sending rank: a stage's data- or tensor-parallel replicas each send
            # their own copy, posted at their own time
            send_post.setdefault((r.rank, r.kind, r.microbatch), r.start_s)
    layout = RankLayout.of(ParallelConfig.from_dict(run.config))
    eff, wait_comm = [], []
    for r in df.itertuples():
        e, w = r.start_s, 0.0
        if r.stream == "compute":
            for rk, sk, peer in (("RECV_ACT", "SEND_ACT", -1), ("RECV_GRAD", "SEND_GRAD", 1)):
                key = (r.rank, rk, r.chunk, r.microbatch)
                if key in recv_end and r.start_s <= recv_end[key] <= r.end_s:
                    e = max(e, recv_end[key])
                    src = _pipeline_peer(layout, r.rank, peer)
                    xs = max(recv_post[key], send_post.get((src, sk, r.microbatch), r.start_s))
                    w = max(0.0, min(recv_end[key], e) - max(r.start_s, xs))
        eff.append(e)
        wait_comm.append(w)
    df["eff_start_s"] = eff
    df["wait_comm_s"] = wait_comm
    return df


def _pipeline_peer(layout: RankLayout, rank: int, offset: int) -> int:
    """The rank ``offset`` pipeline stages from ``rank`` with its other coordinates."""
    c = layout.coords(rank)
    return layout.rank(c.pp + offset, c.dp, c.tp, c.cp)


def measured_breakdown(run: MeasuredRun, step: int, frame=None) -> tuple[float, list[dict]]:
    """(makespan, per-rank compute / exposed comm / bubble seconds) of one step
    (``frame``: that step's :func:`step_frame`, when the caller has it already)."""
    df = step_frame(run, step) if frame is None else frame
    T = float(df["end_s"].max())
    rows = []
    for rank, g in df.groupby("rank"):
        comp = g[g["stream"] == "compute"]
        compute = float((comp["end_s"] - comp["eff_start_s"]).sum())
        coll = g[g["stream"] == "collective"]
        comm = float((coll["end_s"] - coll["start_s"]).sum() + comp["wait_comm_s"].sum())
        rows.append({"rank": int(rank), "stage": int(g["stage"].iloc[0]), "compute_s": compute,
                     "exposed_comm_s": comm, "bubble_s": max(0.0, T - compute - comm)})
    return T, rows


def cpu_shares(run: MeasuredRun, frames=None):
    """Per timed iteration and rank: the rank's busy seconds (its compute actions from
    their effective start, :func:`step_frame`; ``frames``: those of ``run.steps``,
    when the caller has them already), the CPU seconds its main thread got in the
    iteration (``run.cpu_s``), and their ratio ``share``.

    On CPU, with one thread per rank and a core per rank, the thread runs whenever it
    computes (waiting for a receive or the peer takes no CPU), so ``share`` sits near
    1 (0.95-1.02 in the CPU suite: the runtime's posts and bookkeeping outside the
    actions against the last bits of a wait inside them); well below 1, the core was
    taken by other work during the iteration and the measured times include the wait
    for it: the machine's noise, not the model's. Empty for run directories without
    CPU times (older ones), for runs on another backend than gloo (a GPU's kernels run
    while the host thread waits or spins) and under tensor parallelism, whose compute
    actions wait inside for their collectives (a share of 0.2-0.5 there says nothing
    about the machine)."""
    cols = ["step", "rank", "busy_s", "cpu_s", "share"]
    if (not run.cpu_s or int(run.config.get("tp", 1)) > 1
            or run.meta.get("backend", "gloo") != "gloo"):
        return pd.DataFrame(columns=cols)
    rows = []
    for k, step in enumerate(run.steps):
        df = step_frame(run, step) if frames is None else frames[k]
        comp = df[df["stream"] == "compute"]
        busy = (comp["end_s"] - comp["eff_start_s"]).groupby(comp["rank"]).sum()
        for rank, cpu in enumerate(run.cpu_s):
            if k < len(cpu) and rank in busy.index and busy[rank] > 0:
                rows.append({"step": step, "rank": rank, "busy_s": float(busy[rank]),
                             "cpu_s": cpu[k], "share": cpu[k] / float(busy[rank])})
    return pd.DataFrame(rows, columns=cols)
