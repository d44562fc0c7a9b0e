"""Long work: its limit, and its progress on stderr.

:data:`WORK_LIMIT` bounds what one command simulates. Progress is a rich bar on a
terminal, one line every few seconds elsewhere (logs, pipes, CI), nothing for work
that ends within seconds.

Usage::

    with progress_reporter("lines", "planning gpt-8.3b") as prog:
        prog.start(len(items))
        for item in items:
            ...
            prog.advance()
        prog.phase("confirming the top 3 with SimPy")
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Progress", "progress_reporter", "LINE_AFTER_S", "LINE_EVERY_S", "WORK_LIMIT"]

#: Micro-batch passes (pipeline stages x model chunks x micro-batches, times the
#: pipelines in full mode) one schedule, simulation or plan candidate may take: about
#: 5 s of work on one CPU core. Larger inputs are refused (the planner prunes such
#: candidates) rather than running for minutes.
WORK_LIMIT = 16384

#: Off a terminal, the first line appears after this many seconds of work ...
LINE_AFTER_S = 5.0
#: ... and then one line every this many seconds.
LINE_EVERY_S = 3.0


class Progress:
    """Counts done items out of a total and reports them (mode "bar", "lines" or
    "off"); the counts are exact whatever the mode."""

    def __init__(self, mode: str, label: str, stream: Any = None, *,
                 after_s: float = LINE_AFTER_S, every_s: float = LINE_EVERY_S) -> None:
        if mode not in ("bar", "lines", "off"):
            raise ValueError(f"progress mode is bar, lines or off, got {mode!r}")
        self.mode, self.label = mode, label
        self.stream = stream if stream is not None else sys.stderr
        self.total = 0
        self.done = 0
        self._t0 = time.monotonic()
        self.after_s, self.every_s = after_s, every_s
        self._next_line = self._t0 + after_s
        self._bar = None
        self._task = None

    def start(self, total: int) -> None:
        """Set the number of items (and show the bar)."""
        self.total = int(total)
        if self.mode == "bar" and self.total:
            from rich.console import Console
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(console=Console(file=self.stream))
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total)

    def advance(self, n: int = 1) -> None:
        """``n`` more items are done."""
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
        elif self.mode == "lines":
            now = time.monotonic()
            if now >= self._next_line:
                self._next_line = now + self.every_s
                self._line(f"{self.done:,}/{self.total:,} ({self.fraction:.0%})")

    @property
    def fraction(self) -> float:
        """Done over total (1 when there is nothing to do)."""
        return self.done / self.total if self.total else 1.0

    def phase(self, text: str) -> None:
        """Announce a later phase of the work (in lines mode once past the delay)."""
        if self.mode == "lines" and time.monotonic() >= self._t0 + self.after_s:
            self._line(text)

    def _line(self, text: str) -> None:
        elapsed = time.monotonic() - self._t0
        print(f"{self.label}: {text}, {elapsed:.0f} s", file=self.stream, flush=True)

    def close(self) -> None:
        """Stop the bar, leaving it drawn at its final count."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@contextmanager
def progress_reporter(mode: str | bool | Progress, label: str, stream: Any = None
                      ) -> Iterator[Progress]:
    """A :class:`Progress` closed on exit; ``True`` means "bar", ``False`` "off"; a
    Progress given is used as it is (and left to its owner to close)."""
    if isinstance(mode, Progress):
        yield mode
        return
    if mode is True:
        mode = "bar"
    elif mode is False or mode is None:
        mode = "off"
    prog = Progress(mode, label, stream)
    try:
        yield prog
    finally:
        prog.close()
