"""Long work: its bounds, and its progress on stderr.

Work is counted in micro-batch passes (pipeline stages x model chunks x micro-batches,
times the pipelines in full mode). Each engine has its own :class:`WorkBound`, set by
its measured cost per pass (``benchmarks/bench_scale.py``) so that the largest run it
admits takes seconds to tens of seconds, not minutes: the exact evaluator admits a
million passes (every published run: Megatron-LM's 1T model is 65,536 of them), the
SimPy engine an eighth of that with progress reported, and the commands that build,
print and replay a schedule action by action (``schedule``, ``costs``, ``demo``) and
a plan's candidates the 16,384 they always did. Beyond a bound a command refuses at
once, in one line naming an engine that can do the run (:meth:`WorkBound.refusal`).
Progress is a rich bar on a terminal, one line every few seconds elsewhere (logs,
pipes, CI), nothing for work that ends within seconds.

Usage::

    with progress_reporter("lines", "planning gpt-8.3b") as prog:
        prog.start(len(items))
        for item in items:
            ...
            prog.advance()
        prog.phase("confirming the top 3 with SimPy")
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["Progress", "progress_reporter", "LINE_AFTER_S", "LINE_EVERY_S", "WORK_LIMIT",
           "WorkBound", "EVALUATOR_BOUND", "SIMPY_BOUND", "REPLAY_BOUND", "PLANNER_BOUND",
           "TEARDOWN_AFTER", "is_console_process", "exit_without_teardown"]


@dataclass(frozen=True)
class WorkBound:
    """How many micro-batch passes one run of an engine may take.

    Attributes:
        engine: what runs the work, as a user names it ("the exact evaluator").
        passes: the most micro-batch passes one run may take.
        s_per_pass: its measured cold cost per pass on one core of a 2-core machine
            (``benchmarks/bench_scale.py``): the bound is about
            ``passes * s_per_pass`` seconds of work.
        alternative: the option or command that goes further, "" where none does.
    """

    engine: str
    passes: int
    s_per_pass: float
    alternative: str = ""

    @property
    def seconds(self) -> float:
        """About how long a run at the bound takes."""
        return self.passes * self.s_per_pass

    def admits(self, passes: int) -> bool:
        """Whether a run of ``passes`` micro-batch passes is within the bound."""
        return passes <= self.passes

    def refusal(self, passes: int, what: str, fix: str, alternative: str | None = None
                ) -> str:
        """The one-line refusal of a run of ``passes`` passes: ``what`` says how they
        are counted, ``fix`` ("use ...") how to shrink the run, ``alternative`` (default
        :attr:`alternative`) what goes further."""
        alt = self.alternative if alternative is None else alternative
        go = f"use {alt}, or {fix.removeprefix('use ')}" if alt else fix
        return (f"{what} = {passes:,} micro-batch passes exceeds the limit of "
                f"{self.passes:,} for {self.engine} (about {self.seconds:.0f} s of work at "
                f"the limit); {go}")


#: The exact evaluator (``simulate --engine evaluator``): about 9 us per pass cold
#: when it evaluates in full (1T: 0.6 s), far less where the periodic shortcut
#: applies; a million passes hold about 2 GB of actions.
EVALUATOR_BOUND = WorkBound("the exact evaluator", 1 << 20, 9e-6)
#: The SimPy engine (contention, full mode): 120-260 us per pass with contention (the
#: 1T run: 17 s of CPU through the CLI on a loaded 2-core machine), reported as
#: progress on stderr once past a few seconds.
SIMPY_BOUND = WorkBound("the SimPy engine", 1 << 17, 250e-6,
                        "--engine evaluator (exact without contention, up to "
                        f"{EVALUATOR_BOUND.passes:,} passes)")
#: Building, validating, printing and replaying a schedule action by action
#: (``schedule``, ``costs``, ``demo``): about 270 us per pass.
REPLAY_BOUND = WorkBound("building and replaying the schedule action by action", 16384,
                         270e-6, "merak-sim simulate --engine evaluator (up to "
                                 f"{EVALUATOR_BOUND.passes:,} passes)")
#: A plan candidate: a plan evaluates thousands of them and confirms its top K with
#: SimPy, so a candidate keeps the former bound (raised to SimPy's, a 20M-sample batch
#: on 64 GPUs planned for minutes instead of refusing at once).
PLANNER_BOUND = WorkBound("a plan candidate", 16384, SIMPY_BOUND.s_per_pass)
#: The replay bound, under its former name.
WORK_LIMIT = REPLAY_BOUND.passes

#: Micro-batch passes from which the merak-sim process skips the interpreter's
#: teardown once its output is out (:func:`exit_without_teardown`): freeing a large
#: run's objects one by one at exit took 0.75 s of the 1T run's 1.9 s.
TEARDOWN_AFTER = 16384
#: How ``sys.argv[0]`` ends in the merak-sim process itself: the console script,
#: ``python -m merak_sim`` and ``python -m merak_sim.cli``.
_CONSOLE_ENDINGS = ("merak-sim", "merak_sim/__main__.py", "merak_sim/cli/__main__.py")


def is_console_process() -> bool:
    """Whether this process is the merak-sim command itself, not a program (a test,
    a notebook) that calls :func:`merak_sim.cli.main` and goes on afterwards."""
    argv0 = (sys.argv[0] if sys.argv else "").replace(os.sep, "/")
    return argv0.endswith(_CONSOLE_ENDINGS)


def exit_without_teardown(status: int = 0) -> None:
    """In the merak-sim process itself (:func:`is_console_process`), flush stdout and
    stderr and end the process with ``status`` at once, skipping the interpreter's
    teardown (the objects of a large run freed one by one, for nothing); elsewhere
    return and let the caller go on. Call it only once every output is written."""
    if not is_console_process():
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to deliver
            pass
    os._exit(status)


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
