"""The least-squares line the vTrain diagnostics draw (vtrain_consistency, vtrain_layers)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["least_squares_line"]


def least_squares_line(xs: Sequence[float], ys: Sequence[float]
                       ) -> tuple[float, float, float]:
    """``(intercept, slope, r2)`` of the least-squares line ``y = intercept + slope * x``
    through the points (slope 0 where the x do not vary; r2 0 where x or y do not)."""
    n = len(xs)
    if n == 0 or n != len(ys):
        raise ValueError(f"a line needs points with one y per x: {n} x, {len(ys)} y")
    mx = sum(xs) / n
    my = sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    syy = sum((y - my) ** 2 for y in ys)
    b = sxy / sxx if sxx else 0.0
    r2 = sxy * sxy / (sxx * syy) if sxx and syy else 0.0
    return my - b * mx, b, r2
