"""Measured timelines: a per-rank :class:`Recorder` and the gathered :class:`RunResult`.

Events use the schema shared with the simulator (:data:`merak_sim.timeline.EVENT_COLUMNS`:
``rank, stage, chunk, stream, kind, action, microbatch, start_s, end_s, bytes``).
``action`` is the IR token (``str(Action)``), ``kind`` the Kind name, ``stream`` one of
"compute", "p2p", "collective", ``rank`` the global rank. Compute actions are timed
with ``time.perf_counter`` on CPU and CUDA events on GPU; a send or receive spans
from its posting to the moment its completion was observed (the consumer's wait for
a receive, the end-of-iteration drain for a send), which bounds the transfer from
above. Times are seconds from the start of the iteration on each rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from merak_sim.schedule.ir import Action, Kind
from merak_sim.timeline import EVENT_COLUMNS, chrome_trace, plot_gantt, write_chrome_trace
from merak_sim.validation.rundir import load_result, save_result

__all__ = ["Recorder", "RunResult"]


class Recorder:
    """Collects one rank's action timings for one iteration at a time."""

    def __init__(self, mesh, enabled: bool = True) -> None:
        self.mesh = mesh
        self.enabled = enabled
        self.cuda = mesh.device.type == "cuda"
        self._rows: list[list] = []
        self._t0 = 0.0
        self._e0 = None

    def _now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    @property
    def origin_s(self) -> float:
        """The current iteration's time origin: ``time.perf_counter()`` at
        :meth:`start_step` on CPU (one clock for every process of the machine, so
        ranks' events can be aligned); 0.0 under CUDA timing, whose events are relative
        to a CUDA event instead."""
        return self._t0

    def start_step(self) -> None:
        """Mark the iteration's time origin."""
        self._rows = []
        if self.enabled:
            if self.cuda:
                self._e0 = self._now()
            else:
                self._t0 = time.perf_counter()

    def _row(self, a: Action, stream: str, nbytes: int) -> int:
        self._rows.append([a, stream, nbytes, self._now(), None])
        return len(self._rows) - 1

    def begin(self, a: Action) -> int | None:
        """Start timing compute (or collective) action ``a``."""
        if not self.enabled:
            return None
        return self._row(a, "collective" if a.kind is Kind.ALL_REDUCE else "compute", 0)

    def end(self, h: int | None) -> None:
        """Stop timing the action started by :meth:`begin`."""
        if h is not None:
            self._rows[h][4] = self._now()

    def comm_posted(self, a: Action, nbytes: int) -> int | None:
        """A send/receive was posted now."""
        return self._row(a, "p2p", nbytes) if self.enabled else None

    def comm_done(self, h: int | None) -> None:
        """Its completion was observed now."""
        self.end(h)

    def finish_step(self) -> list[dict]:
        """Rows of the iteration as dicts in :data:`EVENT_COLUMNS` order."""
        if not self.enabled:
            return []
        if self.cuda:
            torch.cuda.synchronize()

            def t(x):
                return self._e0.elapsed_time(x) / 1e3
        else:

            def t(x):
                return x - self._t0
        out = []
        for a, stream, nbytes, s, e in self._rows:
            end = t(e) if e is not None else t(s)
            out.append(dict(
                rank=self.mesh.rank, stage=a.stage, chunk=a.chunk, stream=stream,
                kind=a.kind.name, action=str(a), microbatch=a.microbatch,
                start_s=t(s), end_s=end, bytes=nbytes,
            ))
        return out


@dataclass
class RunResult:
    """Measured iterations of a run, gathered from every rank.

    Attributes:
        events: rows in :data:`EVENT_COLUMNS` (one iteration, usually the last).
        step_times_s: wall time of every iteration (rank 0's clock).
        losses: mean loss of every iteration.
        meta: free-form description (config, model, device).
    """

    events: list[dict]
    step_times_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def to_dataframe(self):
        """Events as a pandas DataFrame with the shared column order."""
        import pandas as pd

        return pd.DataFrame(self.events, columns=list(EVENT_COLUMNS))

    @property
    def iteration_time_s(self) -> float:
        """Median measured iteration time."""
        ts = sorted(self.step_times_s)
        return ts[len(ts) // 2] if ts else float("nan")

    def to_chrome_trace(self) -> dict:
        """Chrome-trace JSON (open in Perfetto) of the events, one process per rank, one
        thread per stream (:func:`merak_sim.timeline.chrome_trace`); ``otherData`` holds
        :attr:`meta`."""
        return chrome_trace(self.events, self.meta)

    def save_chrome_trace(self, path) -> None:
        """Write :meth:`to_chrome_trace` atomically."""
        write_chrome_trace(self.events, path, self.meta)

    def gantt(self, ax=None):
        """Gantt chart of the compute stream and collectives, one row per rank
        (:func:`merak_sim.timeline.plot_gantt`); returns the matplotlib Axes."""
        return plot_gantt(self.events, ax=ax, row_label="rank {}")

    def save(self, path, profile: dict | None = None) -> Path:
        """Write this result as a run directory (``merak-run/1``, with ``profile`` as
        its profile.json if given); see :func:`merak_sim.validation.rundir.save_result`."""
        return save_result(path, self.events, self.step_times_s, self.losses, self.meta,
                           profile)

    @classmethod
    def load(cls, path) -> RunResult:
        """Read a run directory written by :meth:`save` (or by the validation
        measurement); events keep their iteration index ``step``."""
        return cls(**load_result(path))
