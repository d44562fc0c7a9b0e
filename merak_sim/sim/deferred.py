"""Sequences built on first use: the fields of a compiled schedule and of a timeline
that only some consumers read (Action objects, per-rank dictionaries, the rows of a
large timeline), so that the array paths (:mod:`merak_sim.sim.flat_structure`, the
fast evaluator's trace) need not build one Python object per action up front."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["Deferred", "PerRank"]


class Deferred(Sequence):
    """A tuple built by ``make()`` on first use (then read as that tuple; pickled as
    it); ``length``, where given, answers ``len()`` without building it."""

    __slots__ = ("_make", "_items", "_length")

    def __init__(self, make: Callable[[], Sequence], length: int | None = None):
        self._make = make
        self._items: tuple | None = None
        self._length = length

    def _all(self) -> tuple:
        if self._items is None:
            self._items = tuple(self._make())
            self._make = None
        return self._items

    def __len__(self) -> int:
        if self._items is None and self._length is not None:
            return self._length
        return len(self._all())

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __iter__(self) -> Iterator:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return self._all() == (tuple(other) if isinstance(other, Sequence) else other)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return (tuple, (self._all(),))


class PerRank(Sequence):
    """One item per rank, each built by ``make(rank)`` on first use (a tuple once
    pickled)."""

    __slots__ = ("_make", "_items")
    _UNSET = object()

    def __init__(self, ranks: int, make: Callable[[int], Any]):
        self._make = make
        self._items = [self._UNSET] * ranks

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, r: Any) -> Any:
        if isinstance(r, slice):
            return tuple(self[i] for i in range(*r.indices(len(self._items))))
        x = self._items[r]
        if x is self._UNSET:
            x = self._items[r] = self._make(r if r >= 0 else r + len(self._items))
        return x

    def __iter__(self) -> Iterator:
        return (self[r] for r in range(len(self._items)))

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return (tuple, (tuple(self),))
