"""How many parameters a calibration may move: leave-one-family-out cross-validation
inside its fit rows.

A fit on a handful of rows can lower its own error by moving more parameters while
extrapolating worse. The rule, fixed before any held-out row is looked at: for each
candidate (:class:`Variant`, the parameters it frees; every other parameter keeps its
published default), fit on the fit rows of all model families but one and score the
left-out family's rows (mean absolute log error); a variant's score is the mean over
the left-out families. The variant with the lowest score wins, ties (equal to 3
decimals) going to the one with fewer free parameters (:func:`choose`). Held-out rows
play no part; they are only reported after the chosen variant is refitted on all fit
rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Variant", "CvResult", "cross_validate", "choose"]


@dataclass(frozen=True)
class Variant:
    """A candidate fit: its name and the parameters it moves."""

    name: str
    free: tuple[str, ...]


@dataclass(frozen=True)
class CvResult:
    """One variant's cross-validation.

    Attributes:
        variant: the candidate.
        fold_losses: left-out family -> mean absolute log error of its rows when the
            variant is fitted on the other families' rows.
    """

    variant: Variant
    fold_losses: dict[str, float] = field(hash=False)

    @property
    def score(self) -> float:
        """Mean of the left-out families' losses."""
        return sum(self.fold_losses.values()) / len(self.fold_losses)


def cross_validate(rows: Sequence[Any], family_of: Callable[[Any], str],
                   variants: Sequence[Variant],
                   fit: Callable[[Sequence[Any], Variant], Any],
                   loss: Callable[[Sequence[Any], Any], float]) -> list[CvResult]:
    """Leave-one-family-out scores of every variant (module docstring): ``fit(train,
    variant)`` returns fitted parameters, ``loss(test, params)`` their error on the
    left-out rows. Needs at least two families."""
    families = list(dict.fromkeys(family_of(r) for r in rows))
    if len(families) < 2:
        raise ValueError(f"cross-validation needs two or more model families, got {families}")
    out = []
    for v in variants:
        losses = {}
        for fam in families:
            train = [r for r in rows if family_of(r) != fam]
            test = [r for r in rows if family_of(r) == fam]
            losses[fam] = loss(test, fit(train, v))
        out.append(CvResult(v, losses))
    return out


def choose(results: Sequence[CvResult]) -> CvResult:
    """The winning variant: lowest score, ties (3 decimals) to fewer free parameters."""
    return min(results, key=lambda r: (round(r.score, 3), len(r.variant.free)))
