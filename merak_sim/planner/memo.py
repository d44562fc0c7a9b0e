"""Memoisation on object identity for one search.

The planner prices the same cost-table arrays, relaxed arrays and schedule templates
for many candidates (those differing only in the recompute policy, the DP overlap or a
schedule of the same placement), and hashing the arrays themselves would cost more
than the work. :class:`IdentityMemo` keys on the objects' ids and keeps the objects
in its entries, so an id cannot be reused while the memo lives: the same objects mean
the same inputs, hence the same value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["IdentityMemo"]


class IdentityMemo:
    """``get(objects, extra, make)``: ``make()`` once per (identity of each of
    ``objects``, ``extra``)."""

    def __init__(self) -> None:
        self._values: dict[tuple, tuple[tuple, Any]] = {}

    def get(self, objects: tuple, extra: tuple, make: Callable[[], Any]) -> Any:
        """The value of ``make()`` for these objects and ``extra`` (computed once)."""
        key = tuple(map(id, objects)) + extra
        hit = self._values.get(key)
        if hit is None:
            hit = self._values[key] = (objects, make())
        return hit[1]
