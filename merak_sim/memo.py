"""Memoisation on object identity.

The planner prices the same cost-table arrays, relaxed arrays and schedule templates
for many candidates (those differing only in the recompute policy, the DP overlap or a
schedule of the same placement), and the cost models price the same rank groups,
clusters and measured tables many times; hashing those objects themselves (arrays, a
data-parallel group of thousands of ranks) would cost more than the work.
:class:`IdentityMemo` keys on the objects' ids and keeps the objects in its entries, so
an id cannot be reused while its entry lives: the same (immutable) objects mean the
same inputs, hence the same value. Here, in the package root, because both
:mod:`merak_sim.costs` and :mod:`merak_sim.planner` use it and the costs may not import
the planner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["IdentityMemo", "PROCESS_MEMO_ENTRIES"]

#: ``max_entries`` of the memos that live as long as the process (the cost models'):
#: far above the working set of one search, so it keeps hitting between the clears.
PROCESS_MEMO_ENTRIES = 65536


class IdentityMemo:
    """``get(objects, extra, make)``: ``make()`` once per (identity of each of
    ``objects``, ``extra``).

    ``max_entries`` bounds a memo that lives as long as the process (a module-level
    one): reaching it empties the memo before the next entry is stored, so its memory
    stays bounded while the working set of one search, far smaller, keeps hitting.
    None (the default) never empties it, for a memo that lives for one search.
    """

    __slots__ = ("_values", "_max_entries")

    def __init__(self, max_entries: int | None = None) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be >= 1 or None, got {max_entries}")
        self._values: dict[tuple, tuple[tuple, Any]] = {}
        self._max_entries = max_entries

    def get(self, objects: tuple, extra: tuple, make: Callable[..., Any],
            *args: Any) -> Any:
        """The value of ``make(*args)`` for these objects and ``extra`` (computed once;
        ``args`` let a hot caller pass a function instead of building a closure)."""
        # The ids spelled out for up to three objects: the cost models call this about
        # 10^5 times in a large search, and map(id, ...) costs as much as the lookup.
        n = len(objects)
        if n == 3:
            a, b, c = objects
            key = (id(a), id(b), id(c), extra)
        elif n == 2:
            a, b = objects
            key = (id(a), id(b), extra)
        elif n == 1:
            key = (id(objects[0]), extra)
        else:
            key = (*map(id, objects), extra)
        hit = self._values.get(key)
        if hit is not None:
            return hit[1]
        value = make(*args)
        values = self._values
        if self._max_entries is not None and len(values) >= self._max_entries:
            values.clear()
        values[key] = (objects, value)
        return value

    def clear(self) -> None:
        """Forget every entry (and release the objects they hold)."""
        self._values.clear()

    def __len__(self) -> int:
        """Entries held."""
        return len(self._values)
