"""Timelines: the events table, Chrome traces, Gantt and memory charts.

Simulated (:class:`~merak_sim.sim.result.SimResult`), measured (merak_exec's
``RunResult``) and schedule-level (:class:`~merak_sim.schedule.execute.Execution`)
timelines share one events schema, :data:`EVENT_COLUMNS`: ``rank`` the global rank,
``stage`` the pipeline rank, ``chunk`` the virtual stage, ``stream`` one of
"compute", "p2p", "collective", ``kind`` the :class:`~merak_sim.schedule.ir.Kind` name
(or :data:`TP_KIND`, :data:`ZERO_KIND`), ``action`` the IR token, ``microbatch`` (-1
for AR/OPT), times in seconds and ``bytes`` moved. Every function here takes events as
a pandas DataFrame with those columns, as dicts keyed by them, or as tuples in their
order.

Every chart colours actions by kind from the one :data:`KIND_COLORS` map and carries a
legend of the kinds it shows, idle time (the axes' background) included. pandas is not
needed and matplotlib is imported only inside the plotting functions, so importing this
module stays light.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from merak_sim.io import atomic_write_bytes, atomic_write_text

__all__ = ["EVENT_COLUMNS", "TP_KIND", "ZERO_KIND", "IDLE", "KIND_COLORS", "event_rows",
           "chrome_trace",
           "write_chrome_trace", "plot_gantt", "plot_side_by_side", "plot_memory",
           "save_figure"]

#: Column order of the events table shared by simulated and measured timelines.
EVENT_COLUMNS = ("rank", "stage", "chunk", "stream", "kind", "action", "microbatch",
                 "start_s", "end_s", "bytes")

#: Events-table kind of an action's tensor-parallel collectives (stream "collective").
TP_KIND = "TP_COLLECTIVE"
#: Events-table kind of an action's ZeRO-3 (FSDP) all-gathers and reduce-scatters
#: (stream "collective"; :mod:`merak_sim.zero_comm`).
ZERO_KIND = "ZERO3_COLLECTIVE"

#: Legend label of the time a rank runs nothing (drawn as the chart's background).
IDLE = "IDLE"

_COMM = "#C44E52"
#: One colour per action kind (events-table kind names), in legend order. Point-to-point
#: transfers and tensor-parallel collectives share the communication colour. The
#: zero-bubble halves of a backward differ in hue (I green like B, W olive) so a Gantt
#: of a split schedule shows where the weight-gradient passes went.
KIND_COLORS: dict[str, str] = {
    "FORWARD": "#4C72B0",
    "FORWARD_NOGRAD": "#8FB0E0",
    "RECOMPUTE": "#DD8452",
    "BACKWARD": "#55A868",
    "BACKWARD_INPUT": "#1B7837",
    "BACKWARD_WEIGHT": "#CCB974",
    "SEND_ACT": _COMM,
    "RECV_ACT": _COMM,
    "SEND_GRAD": _COMM,
    "RECV_GRAD": _COMM,
    TP_KIND: _COMM,
    ZERO_KIND: "#DA8BC3",
    "ALL_REDUCE": "#8172B3",
    "OPTIMIZER": "#937860",
    IDLE: "#EEEEEE",
}
_UNKNOWN = "grey"

# Chrome-trace thread of each stream; TP and ZeRO-3 collectives get tracks of their own
# because they may overlap a data-parallel bucket (or each other) in time, and slices
# on one track must nest.
_TIDS = {"compute": 0, "p2p": 1, "collective": 2, "collective (tp)": 3,
         "collective (zero-3)": 4}
_KIND_TIDS = {TP_KIND: _TIDS["collective (tp)"], ZERO_KIND: _TIDS["collective (zero-3)"]}

# Gantt lanes (centre offset, height) inside a rank's row: compute fills the row,
# collectives the lower part, transfers (when drawn) the upper part.
_LANES = {"compute": (0.0, 0.8), "collective": (0.225, 0.35), "p2p": (-0.225, 0.35)}


def event_rows(events: Any) -> list[tuple]:
    """Events as plain tuples in :data:`EVENT_COLUMNS` order (Python scalars).

    Accepts a DataFrame holding at least those columns, an iterable of mappings keyed
    by them, or an iterable of sequences already in that order.
    """
    if hasattr(events, "columns"):  # a DataFrame: tolist() gives Python scalars
        return list(zip(*(events[c].tolist() for c in EVENT_COLUMNS), strict=True))
    out = []
    for r in events:
        if isinstance(r, Mapping):
            out.append(tuple(r[c] for c in EVENT_COLUMNS))
        else:
            out.append(tuple(r[:len(EVENT_COLUMNS)]))
    return out


# -- Chrome trace ---------------------------------------------------------------------
def chrome_trace(events: Any, other_data: dict | None = None) -> dict:
    """Chrome trace-event JSON (opens in Perfetto / chrome://tracing).

    One process per rank (named "GPU r (stage s)"), one thread per stream ("compute",
    "p2p", "collective", "collective (tp)" for :data:`TP_KIND` events and "collective
    (zero-3)" for :data:`ZERO_KIND` events), one complete
    ("X") event per row: name the action token, category its kind, microseconds, args
    stage, chunk, micro-batch and bytes. ``other_data`` goes to the trace's
    ``otherData``.
    """
    rows = event_rows(events)
    zero = any(r[4] == ZERO_KIND for r in rows)  # its track only where it has events
    stage_of: dict[int, int] = {}
    for r in rows:
        stage_of.setdefault(r[0], r[1])
    out: list[dict] = []
    for rank in sorted(stage_of):
        out.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                    "args": {"name": f"GPU {rank} (stage {stage_of[rank]})"}})
        out.extend({"name": "thread_name", "ph": "M", "pid": rank, "tid": t,
                    "args": {"name": name}} for name, t in _TIDS.items()
                   if name != "collective (zero-3)" or zero)
    for rank, s, ch, stream, kind, action, mb, st, en, nbytes in rows:
        tid = _KIND_TIDS.get(kind, _TIDS[stream])
        out.append({"name": action, "cat": kind, "ph": "X", "pid": rank, "tid": tid,
                    "ts": st * 1e6, "dur": max(0.0, en - st) * 1e6,
                    "args": {"stage": s, "chunk": ch, "microbatch": mb, "bytes": nbytes}})
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": dict(other_data or {})}


def write_chrome_trace(events: Any, path: str | Path, other_data: dict | None = None) -> None:
    """Write :func:`chrome_trace` to ``path``. The JSON is serialised before the file
    is touched and written through a temporary file and a rename, so a failure leaves
    no partial file (and an existing one as it was)."""
    atomic_write_text(path, json.dumps(chrome_trace(events, other_data)))


# -- charts ---------------------------------------------------------------------------
def save_figure(fig, path: str | Path, dpi: int = 120) -> None:
    """Save a matplotlib figure atomically, in the format its suffix names (png if
    none)."""
    import io

    buf = io.BytesIO()
    fmt = Path(path).suffix.lstrip(".") or "png"
    fig.savefig(buf, format=fmt, dpi=dpi)
    atomic_write_bytes(path, buf.getvalue())


def _pyplot(headless: bool):
    import matplotlib

    if headless:  # drawing only to a file: no display needed
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _finish(ax, own: bool, path: str | Path | None) -> None:
    """Lay out a figure this module created (room for the outside legend) and save the
    figure to ``path`` if given."""
    if own:
        ax.figure.tight_layout()
    if path is not None:
        save_figure(ax.figure, path)


def _legend(ax, kinds: Iterable[str], idle: bool = True) -> None:
    """A legend of ``kinds`` (in :data:`KIND_COLORS` order, unknown kinds last) plus
    idle time, outside the axes on the right."""
    from matplotlib.patches import Patch

    order = {k: i for i, k in enumerate(KIND_COLORS)}
    shown = sorted(set(kinds), key=lambda k: (order.get(k, len(order)), k))
    if idle:
        shown.append(IDLE)
    handles = [Patch(facecolor=KIND_COLORS.get(k, _UNKNOWN), edgecolor="grey",
                     linewidth=0.3, label=k) for k in shown]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=7)


def plot_gantt(events: Any, ax=None, path: str | Path | None = None, *, max_ranks: int = 32,
               title: str = "", streams: tuple[str, ...] = ("compute", "collective"),
               time_scale: float = 1e3, time_label: str = "time (ms)",
               row_label: str = "GPU {}", annotate: bool = False,
               figsize: tuple[float, float] | None = None):
    """Gantt chart of an events table: one row per rank (the first ``max_ranks``), a
    bar per event of the chosen ``streams`` coloured by kind (compute full height,
    collectives in the row's lower part, transfers in its upper part), a legend of the
    kinds shown and idle time.

    Times are multiplied by ``time_scale`` (seconds to ms by default); ``row_label``
    formats the rank; ``annotate`` writes each bar's micro-batch. Draws on ``ax`` or on
    a new figure, saves the figure to ``path`` (atomically) if given, and returns the
    Axes.
    """
    rows = [r for r in event_rows(events) if r[3] in streams and r[8] > r[7]]
    ranks = sorted({r[0] for r in rows})[:max_ranks]
    own = ax is None
    plt = _pyplot(headless=own and path is not None)
    if own:
        _, ax = plt.subplots(figsize=figsize or (12, 0.45 * len(ranks) + 1.5))
    row_of = {r: i for i, r in enumerate(ranks)}
    groups: dict[tuple[str, str], list[tuple]] = {}
    for r in rows:
        if r[0] in row_of:
            groups.setdefault((r[4], r[3]), []).append(r)
    for (kind, stream), g in groups.items():
        off, h = _LANES[stream]
        ax.barh([row_of[r[0]] + off for r in g], [(r[8] - r[7]) * time_scale for r in g],
                height=h, left=[r[7] * time_scale for r in g],
                color=KIND_COLORS.get(kind, _UNKNOWN), edgecolor="white", linewidth=0.3,
                label=kind)
        if annotate:
            for r in g:
                if r[6] >= 0:
                    ax.text((r[7] + r[8]) / 2 * time_scale, row_of[r[0]] + off, str(r[6]),
                            ha="center", va="center", fontsize=7)
    ax.set_facecolor(KIND_COLORS[IDLE])
    _legend(ax, (k for k, _ in groups))
    ax.set_yticks(range(len(ranks)), [row_label.format(r) for r in ranks])
    ax.invert_yaxis()  # first rank on top
    ax.set_xlabel(time_label)
    if title:
        ax.set_title(title)
    _finish(ax, own, path)
    return ax


def plot_side_by_side(measured_events: Any, simulated_events: Any, *,
                      labels: tuple[str, str] = ("measured", "simulated"), name: str = "",
                      path: str | Path | None = None, max_ranks: int = 32,
                      row_label: str = "rank {}"):
    """Two Gantt charts on one time axis (ms): ``measured_events`` above,
    ``simulated_events`` below, each titled "name: label (makespan ms)" and with its
    own legend. Saves to ``path`` (atomically) if given; returns the Figure."""
    tables = [[r for r in event_rows(ev) if r[3] != "p2p"]
              for ev in (measured_events, simulated_events)]
    n = [min(len({r[0] for r in t}), max_ranks) for t in tables]
    plt = _pyplot(headless=path is not None)
    fig, axes = plt.subplots(2, 1, sharex=True, figsize=(12, 1.6 + 0.5 * sum(n)))
    for ax, rows, label in zip(axes, tables, labels, strict=True):
        T = max((r[8] for r in rows), default=0.0) * 1e3
        head = f"{name}: " if name else ""
        plot_gantt(rows, ax=ax, max_ranks=max_ranks, row_label=row_label)
        ax.set_title(f"{head}{label} ({T:.1f} ms)", fontsize=9)
    axes[0].set_xlabel("")
    fig.tight_layout()
    if path is not None:
        save_figure(fig, path)
    return fig


def _memory_rows(timeline: Any) -> list[tuple]:
    if hasattr(timeline, "columns"):
        return list(zip(*(timeline[c].tolist() for c in ("rank", "time_s", "bytes")),
                        strict=True))
    return [(r["rank"], r["time_s"], r["bytes"]) if isinstance(r, Mapping) else tuple(r)
            for r in timeline]


def plot_memory(timeline: Any, ax=None, path: str | Path | None = None, *,
                capacity_bytes: float | None = None, end_s: float | None = None,
                max_ranks: int = 16, title: str = ""):
    """Memory over time per rank (step plot, GiB over ms) with the capacity line.

    ``timeline`` holds (rank, time_s, bytes) change points: a DataFrame with those
    columns (``SimResult.memory_timeline()``), mappings or tuples. Each rank's last
    value is held until ``end_s`` (default: the last change point). Draws the first
    ``max_ranks`` ranks in order of appearance on ``ax`` or a new figure, saves the
    figure to ``path`` (atomically) if given, and returns the Axes.
    """
    pts: dict[int, list[tuple[float, float]]] = {}
    for rank, t, b in _memory_rows(timeline):
        if rank in pts or len(pts) < max_ranks:
            pts.setdefault(rank, []).append((t, b))
    if end_s is None:
        end_s = max((t for p in pts.values() for t, _ in p), default=0.0)
    own = ax is None
    plt = _pyplot(headless=own and path is not None)
    if own:
        _, ax = plt.subplots(figsize=(10, 4))
    for rank, p in pts.items():
        ts = [t * 1e3 for t, _ in p] + [end_s * 1e3]
        bs = [b / 2**30 for _, b in p]
        ax.step(ts, bs + bs[-1:], where="post", label=f"GPU {rank}")
    if capacity_bytes is not None:
        ax.axhline(capacity_bytes / 2**30, color="red", linestyle="--", label="capacity")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("memory (GiB)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1))
    if title:
        ax.set_title(title)
    _finish(ax, own, path)
    return ax
