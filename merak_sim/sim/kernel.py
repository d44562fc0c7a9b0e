"""The engine's event loop: the part of SimPy the engine uses, with SimPy's ordering.

The engine's processes (:mod:`merak_sim.sim.gpu`) are generators that yield events,
as SimPy processes are. This module runs them with the same rules SimPy follows, so
a simulation processes the same events in the same order and computes the same
floats: events wait in a heap ordered by (time, priority, insertion number);
:data:`URGENT` (a process starting) before :data:`NORMAL` (timeouts, triggered
events) at one time; an event's callbacks run in the order they were added when
it is popped; a process resumes inside the callback of the event it waited on and
runs until it yields an event not yet processed; a process that ends is itself an
event; :meth:`Environment.all_of` succeeds when the last of its events is
processed. What it leaves out is what the engine never uses (failing events,
interrupts, resources, ``until``) and the checks around it: a step costs about a
third of SimPy's (measured on the engine: benchmarks/bench_scale.py).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from heapq import heappop, heappush
from itertools import count
from typing import Any

__all__ = ["Environment", "Event", "Process", "URGENT", "NORMAL", "PENDING"]

#: Priorities of events at one time: a process's start before the others.
URGENT, NORMAL = 0, 1


class _Pending:
    """The value of an event not triggered yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PENDING"


PENDING = _Pending()
_new_event = object.__new__


class Event:
    """Something that happens at a point in time: ``callbacks`` (a list until the
    event is processed, then None) run when it is popped from the heap."""

    __slots__ = ("env", "callbacks", "_value")

    def __init__(self, env: Environment):
        self.env = env
        self.callbacks: list[Callable[[Event], None]] | None = []
        self._value: Any = PENDING

    @property
    def triggered(self) -> bool:
        """Scheduled (succeeded), possibly not processed yet."""
        return self._value is not PENDING

    @property
    def processed(self) -> bool:
        """Popped from the heap and its callbacks run."""
        return self.callbacks is None

    @property
    def value(self) -> Any:
        """The value the event succeeded with."""
        return self._value

    def succeed(self, value: Any = None) -> Event:
        """Trigger the event now with ``value`` (processed after the events already
        scheduled for now)."""
        if self._value is not PENDING:
            raise RuntimeError(f"{self!r} has already been triggered")
        self._value = value
        env = self.env
        heappush(env._queue, (env.now, NORMAL, next(env._eid), self))
        return self


class Process(Event):
    """A generator run as a process: it starts at the next URGENT slot, resumes when
    the event it yielded is processed (with that event's value) and, when it
    returns, is itself triggered with the return value."""

    __slots__ = ("_generator",)

    def __init__(self, env: Environment, generator: Generator):
        super().__init__(env)
        self._generator = generator
        start = Event(env)
        start.callbacks.append(self._resume)
        start._value = None
        heappush(env._queue, (env.now, URGENT, next(env._eid), start))

    def _resume(self, event: Event) -> None:
        send = self._generator.send
        while True:
            try:
                event = send(event._value)
            except StopIteration as stop:
                self._value = stop.value
                env = self.env
                heappush(env._queue, (env.now, NORMAL, next(env._eid), self))
                return
            if event.callbacks is not None:  # not processed yet: wait for it
                event.callbacks.append(self._resume)
                return


class _AllOf(Event):
    """Succeeds when each of its events has been processed (at once if none)."""

    __slots__ = ("_left",)

    def __init__(self, env: Environment, events: Iterable[Event]):
        super().__init__(env)
        events = tuple(events)
        self._left = len(events)
        if not events:
            self.succeed()
            return
        for ev in events:
            if ev.callbacks is None:
                self._check(ev)
            else:
                ev.callbacks.append(self._check)

    def _check(self, _event: Event) -> None:
        if self._value is not PENDING:
            return
        self._left -= 1
        if not self._left:
            self.succeed()


class Environment:
    """The clock and the heap of scheduled events (module docstring)."""

    __slots__ = ("now", "_queue", "_eid")

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, int, Event]] = []
        self._eid = count()

    def event(self) -> Event:
        """A new event, triggered by :meth:`Event.succeed`."""
        ev = _new_event(Event)  # Event.__init__'s fields, set here: one call less
        ev.env = self
        ev.callbacks = []
        ev._value = PENDING
        return ev

    def timeout(self, delay: float, value: Any = None) -> Event:
        """An event processed ``delay`` seconds from now."""
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        ev = _new_event(Event)
        ev.env = self
        ev.callbacks = []
        ev._value = value
        heappush(self._queue, (self.now + delay, NORMAL, next(self._eid), ev))
        return ev

    def process(self, generator: Generator) -> Process:
        """Run ``generator`` as a :class:`Process`."""
        return Process(self, generator)

    def all_of(self, events: Iterable[Event]) -> Event:
        """An event processed after every one of ``events``."""
        return _AllOf(self, events)

    def run(self, every: int = 0, report: Callable[[], None] | None = None) -> int:
        """Process events until none is left; the number processed. With ``report``,
        it is called every ``every`` events."""
        queue = self._queue
        n = 0
        tick = every if report is not None and every > 0 else -1
        while queue:
            self.now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for cb in callbacks:
                cb(event)
            n += 1
            if n == tick:
                report()
                tick += every
        return n
