"""Memoisation on object identity for one search: :class:`merak_sim.memo.IdentityMemo`
(in the package root, since the cost models use it too), re-exported for the planner."""

from __future__ import annotations

from merak_sim.memo import IdentityMemo

__all__ = ["IdentityMemo"]
