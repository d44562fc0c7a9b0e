"""One equivalence launch per world size for the whole session.

The equivalence test modules register their cases when they are imported (pytest
imports every test module before running any test); the first test that asks for the
results of a world size launches every case registered for it at once (conftest's
``equivalence`` fixture), and each test then judges its own cases. A process start per
rank is paid once per world size, not once per test.
"""

from __future__ import annotations

from support.workers import launch

__all__ = ["register", "Launches"]

_REGISTERED: dict[int, list[tuple[list[dict], float]]] = {}


def register(world: int, cases: list[dict], timeout_s: float) -> list[dict]:
    """Add ``cases`` (a module's list, ``timeout_s`` its own launch's budget) to the
    session's launch of ``world`` ranks; returns ``cases``."""
    _REGISTERED.setdefault(world, []).append((cases, timeout_s))
    return cases


class Launches:
    """The session's launches, one per world size, made when first asked for."""

    def __init__(self, out_dir_for) -> None:
        self._out_dir_for = out_dir_for  # world -> a fresh directory
        self._done: dict[int, tuple[list[dict], list]] = {}

    def results(self, world: int, cases: list[dict]) -> list:
        """Every rank's results of ``cases`` (registered for ``world``), in their order;
        a rank whose launch reported an error returns its whole list, error included."""
        groups = _REGISTERED.get(world, [])
        if not any(c is cases for c, _ in groups):
            raise ValueError(f"cases not registered for world {world} (support.shared_launch"
                             ".register at the test module's import)")
        if world not in self._done:
            every = [c for group, _ in groups for c in group]
            timeout_s = sum(t for _, t in groups)
            self._done[world] = (every, launch(world, every, str(self._out_dir_for(world)),
                                               timeout_s=timeout_s))
        every, results = self._done[world]
        positions = [next(i for i, c in enumerate(every) if c is case) for case in cases]
        out = []
        for rs in results:
            if any("error" in r for r in rs) or len(rs) != len(every):
                out.append(rs)
            else:
                out.append([rs[i] for i in positions])
        return out
