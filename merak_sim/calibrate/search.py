"""The calibration's search: a derivative-free, deterministic minimisation of a loss over
bounded positive parameters (scipy is not a dependency)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["SearchResult", "coordinate_search"]


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What :func:`coordinate_search` found, and why it ended.

    Attributes:
        params: the best point (a name -> value dict; a caller wrapping the search may
            put its own parameter object here, as the vTrain fit does).
        loss: the loss there.
        rounds_run: rounds completed (0 when ``rounds`` is 0).
        stopped_by_rule: True when the stopping rule ended the search (a round gaining
            ``tol`` or less at a step at or below ``min_step``), False when it ran
            out of rounds.

    It unpacks as ``params, loss = coordinate_search(...)``.
    """

    params: Any
    loss: float
    rounds_run: int
    stopped_by_rule: bool

    def __iter__(self) -> Iterator[Any]:
        return iter((self.params, self.loss))

    @property
    def stop_reason(self) -> str:
        """A phrase for reports: "stopped by its rule after N rounds" or "stopped at
        the round limit (N rounds)"."""
        if self.stopped_by_rule:
            return f"stopped by its rule after {self.rounds_run} rounds"
        return f"stopped at the round limit ({self.rounds_run} rounds)"


def coordinate_search(loss: Callable[[dict[str, float]], float], start: dict[str, float],
                      bounds: dict[str, tuple[float, float]], *, rounds: int = 10,
                      step: float = 1.5, tol: float = 0.0, min_step: float = 1.0,
                      pattern: bool = False, log: Callable[[str], None] | None = None
                      ) -> SearchResult:
    """Minimise ``loss`` over the parameters of ``start`` inside ``bounds``.

    Each round visits the parameters in ``start``'s order and multiplies each by
    ``step``, else by ``1 / step``, keeping the first change that lowers the loss. With
    ``pattern`` (Hooke and Jeeves' pattern move), a round that moved the point then
    tries repeating the whole round's move (in log space) and keeps it if it lowers
    the loss, so a narrow valley oblique to the axes is followed in strides, not in
    alternating single steps.
    Stopping rule: a round that lowers the loss by ``tol`` or less shrinks the step to
    its square root, unless the step is already at or below ``min_step``, in which case
    the search stops; it also stops after ``rounds`` rounds. With the defaults
    (``tol`` 0, ``min_step`` 1, no pattern move) the step shrinks only after a round
    without any improvement and the search runs all ``rounds``. The search is
    deterministic: the same start, bounds and loss give the same result, and the
    :class:`SearchResult` says which of the two ended it."""
    x = {k: min(max(v, bounds[k][0]), bounds[k][1]) for k, v in start.items()}
    best = loss(x)
    rounds_run, stop = 0, False
    for rnd in range(rounds):
        before, x0 = best, x
        for name in x:
            for mult in (step, 1.0 / step):
                v = min(max(x[name] * mult, bounds[name][0]), bounds[name][1])
                if v == x[name]:
                    continue
                cand = {**x, name: v}
                c = loss(cand)
                if c < best:
                    x, best = cand, c
                    break
        if pattern and x is not x0:
            cand = {k: min(max(v * v / x0[k], bounds[k][0]), bounds[k][1])
                    for k, v in x.items()}
            if cand != x:
                c = loss(cand)
                if c < best:
                    x, best = cand, c
        stop = before - best <= tol and step <= min_step
        rounds_run = rnd + 1
        if log:
            log(f"round {rnd}: step x{step:.4f} loss {best:.6f} (gain {before - best:.2e})"
                f"{' stop: gain <= tol at the smallest step' if stop else ''} {x}")
        if stop:
            break
        if before - best <= tol:
            step = math.sqrt(step)
    return SearchResult(x, best, rounds_run, stop)
