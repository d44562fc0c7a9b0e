"""Derivative-free fitting of bounded positive parameters (the calibrations' search)."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["coordinate_search"]


def coordinate_search(loss: Callable[[dict[str, float]], float], start: dict[str, float],
                      bounds: dict[str, tuple[float, float]], *, rounds: int = 10,
                      step: float = 1.5, log: Callable[[str], None] | None = None
                      ) -> tuple[dict[str, float], float]:
    """Minimise ``loss`` over the parameters of ``start`` inside ``bounds``: each round
    multiplies every parameter by ``step`` and ``1 / step`` and keeps improvements; the
    step shrinks (square root) after a round without one."""
    x = {k: min(max(v, bounds[k][0]), bounds[k][1]) for k, v in start.items()}
    best = loss(x)
    for rnd in range(rounds):
        improved = False
        for name in x:
            for mult in (step, 1.0 / step):
                v = min(max(x[name] * mult, bounds[name][0]), bounds[name][1])
                if v == x[name]:
                    continue
                cand = {**x, name: v}
                c = loss(cand)
                if c < best:
                    x, best, improved = cand, c, True
                    break
        if log:
            log(f"round {rnd}: step x{step:.3f} loss {best:.4f} {x}")
        if not improved:
            step = math.sqrt(step)
    return x, best
