"""Stage 2 of the planner: price candidates and screen out those that cannot fit.

Pricing caches cost tables by what they depend on (:meth:`Candidate.table_key`: the
schedule's placement, not its name nor the checkpointed fraction), so many candidates share one. The cheap
memory screen charges model state plus *one* micro-batch at the most economical
checkpointing the policy allows (the liveness walk's count): a candidate over the
capacity here can only be worse with more micro-batches in flight. The exact screen
(:func:`fit_fractions`) walks the schedule's live micro-batches
(:class:`~merak_sim.planner.templates.MemoryTemplate`) and, for "stage-aware", picks
the smallest layer-granular checkpointed fraction per stage that fits (Merak chose c0
by hand, Lai et al. TPDS 2023, Sec. on stage-aware recomputation; choosing it from the
memory model is the improvement Merak suggests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from merak_sim.config import ParallelConfig
from merak_sim.layout import DEFAULT_ORDER
from merak_sim.schedule import SCHEDULES

from .grid import rank_grid
from .space import Candidate
from .templates import MemoryTemplate, stage_arrays

__all__ = ["Pricer", "Fit", "quick_memory", "kept_one", "kept_rows", "state_per_rank",
           "worst_excess", "fit_fractions"]


@dataclass
class Pricer:
    """Cost tables per :meth:`Candidate.table_key`, built on first use.

    ``price`` returns (table, stage arrays) or the ValueError the cost model raised
    (a configuration it cannot price, reported as a pruned row); ``built`` counts the
    tables priced.
    """

    model: Any
    cluster: Any
    cost_model: Any
    global_batch_size: int
    dtype: str
    order: str = DEFAULT_ORDER
    built: int = field(default=0, init=False)
    _tables: dict[tuple, Any] = field(default_factory=dict, init=False, repr=False)

    def price(self, c: Candidate):
        """(CostTable, stage arrays) of ``c``, or the ValueError pricing raised."""
        key = c.table_key()
        if key not in self._tables:
            try:
                tab = self.cost_model.cost_table(self.model, self.cluster, self._config(c))
                self._tables[key] = (tab, stage_arrays(tab))
            except ValueError as e:
                self._tables[key] = e
            self.built += 1
        return self._tables[key]

    def _config(self, c: Candidate) -> ParallelConfig:
        # The table depends on the schedule only through its placement, not on the
        # checkpointed fraction (table_key); only selective recompute changes it.
        return ParallelConfig(
            dp=c.dp, tp=c.tp, pp=c.pp, virtual_stages=c.virtual_stages,
            micro_batch_size=c.micro_batch_size, global_batch_size=self.global_batch_size,
            schedule=c.schedule, recompute="selective" if c.recompute == "selective" else "none",
            sequence_parallel=c.sequence_parallel, tp_overlap=c.tp_overlap, zero=c.zero,
            cp=c.cp, ep=c.ep, zero_group=c.zero_group, attention=c.attention, dtype=self.dtype,
            order=self.order)


def kept_one(c: Candidate, arr: dict[str, np.ndarray]) -> np.ndarray:
    """Per rank, the largest activation bytes one micro-batch keeps on one chunk at the
    cheapest checkpointing ``c``'s policy allows (what :func:`quick_memory` adds to
    the model state)."""
    spec = SCHEDULES[c.schedule]
    return kept_rows(rank_grid(spec.placement, c.pp, c.virtual_stages),
                     arr["checkpoint_bytes"], arr["activation_bytes"],
                     c.recompute not in ("none", "selective"), c.recompute == "full",
                     spec.never_recompute(c.pp))


def kept_rows(grid: np.ndarray, checkpoint: np.ndarray, activation: np.ndarray,
              checkpointed: np.ndarray | bool, full: np.ndarray | bool,
              never: frozenset[int]) -> np.ndarray:
    """:func:`kept_one` on per-model-stage byte arrays with leading axes (one row per
    set of arrays): ``checkpointed`` whether the row's policy checkpoints at its
    cheapest, ``full`` whether it is full recompute (whose ``never`` ranks keep every
    activation), both broadcast against the leading axes."""
    frac = np.where(np.asarray(checkpointed), 1.0, 0.0)[..., None]
    kept = frac * checkpoint + (1 - frac) * activation
    full = np.asarray(full)
    if never and full.any():
        cols = np.isin(np.arange(kept.shape[-1]), grid[:, sorted(never)])
        kept = np.where(full[..., None] & cols, activation, kept)
    return kept[..., grid].max(axis=-2)


def state_per_rank(placement: str, num_stages: int, virtual_stages: int,
                   state_bytes: np.ndarray) -> np.ndarray:
    """Model-state bytes per rank: every chunk's ``state_bytes`` summed (along the
    last axis, so rows of several ZeRO stages at once)."""
    grid = rank_grid(placement, num_stages, virtual_stages)
    return state_bytes[..., grid].sum(axis=-2)


def worst_excess(need: np.ndarray, cap: float) -> tuple[np.ndarray, np.ndarray]:
    """(largest excess of ``need`` over ``cap``, its rank) along the last axis (``need``:
    one rank vector, or any array of them)."""
    r = np.argmax(need - cap, axis=-1)
    return np.take_along_axis(need, r[..., None], axis=-1)[..., 0] - cap, r


def quick_memory(c: Candidate, arr: dict[str, np.ndarray], cap: float) -> tuple[float, int]:
    """(largest excess over capacity of one micro-batch at the cheapest checkpointing,
    its rank): > 0 means the candidate cannot fit under any schedule."""
    # One micro-batch alive on one chunk (the largest), plus every chunk's state.
    state = state_per_rank(SCHEDULES[c.schedule].placement, c.pp, c.virtual_stages,
                           arr["state_bytes"])
    ex, r = worst_excess(state + kept_one(c, arr), cap)
    return float(ex), int(r)


@dataclass(frozen=True)
class Fit:
    """The exact memory screen of one candidate.

    Attributes:
        fractions: checkpointed fraction per rank (the policy's, or for stage-aware
            the smallest that fits).
        peaks: peak bytes per rank at those fractions.
        shortfall: worst excess over capacity (bytes; <= 0: it fits).
        rank: the rank of that excess.
    """

    fractions: tuple[float, ...]
    peaks: tuple[float, ...]
    shortfall: float
    rank: int


def fit_fractions(c: Candidate, arr: dict[str, np.ndarray], mt: MemoryTemplate,
                  cap: float, affine: tuple | None = None) -> Fit:
    """Fractions and peaks per rank for the candidate's policy (module docstring);
    ``affine``: ``mt.affine(arr)`` when known."""
    if affine is None:
        affine = mt.affine(arr)
    fracs, peaks = [], []
    worst, worst_rank = -np.inf, 0
    for r in range(c.pp):
        if r in mt.no_recompute or c.recompute in ("none", "selective"):
            opts = np.zeros(1)
        elif c.recompute == "full":
            opts = np.ones(1)
        else:
            n = max(int(arr["layers"][r]), 1)
            opts = np.arange(n + 1) / n
        pk = mt.peak_at(affine[r], opts)
        ok = np.nonzero(pk <= cap)[0]
        j = int(ok[0]) if len(ok) else len(opts) - 1
        x = float(opts[j])
        fracs.append(round(x, 6) if x < 1 else 1.0)
        peaks.append(float(pk[j]))
        if pk[j] - cap > worst:
            worst, worst_rank = float(pk[j] - cap), r
    return Fit(tuple(fracs), tuple(peaks), float(worst), worst_rank)
