"""Partitioners: assign contiguous runs of weighted layers to model stages.

Pure arithmetic on layer counts and weights (no model, no cost model); what a layer
weighs comes from the caller. Merak's partitioner offers the same three methods (Lai
et al. TPDS 2023); :mod:`merak_sim.costs.partition` prices them for a model:
- :func:`uniform`: equal layer counts; when the count does not divide, the extra
  layers go to the middle stages (the first and last already carry the embedding and
  head).
- :func:`balanced`: minimise the largest stage weight, with extra weight on the first
  and last stage (parameters: the embedding and the final norm / LM head).
- :func:`time_balanced`: the same for forward+backward seconds, embedding and
  LM-head costs on the first and last stage.

The balanced methods solve the min-max contiguous partition exactly: the optimum is one
of the O(n^2) sums "extra + run of layers", so a binary search over those candidates
with a greedy feasibility test (fill each stage as far as its capacity allows while
leaving one layer for every later stage) finds it in O(n^2 log n). Tests compare it with
brute force on small cases.

A partition is a tuple of half-open layer ranges ``(start, end)``, one per model stage
in pipeline order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

__all__ = ["Partition", "PartitionLike", "PartitionError", "uniform", "balanced",
           "time_balanced", "as_ranges"]


class PartitionError(ValueError):
    """Impossible or malformed partition (message names the numbers)."""


@dataclass(frozen=True, slots=True)
class Partition:
    """Layer ranges per model stage and the cost of each stage under ``method``.

    Attributes:
        ranges: ``(start, end)`` per model stage, contiguous, covering every layer.
        method: "uniform", "parameters", "time" or "given".
        stage_costs: the balanced quantity per stage (parameters, seconds, or layer
            counts for uniform), extras included.
    """

    ranges: tuple[tuple[int, int], ...]
    method: str = "given"
    stage_costs: tuple[float, ...] = ()

    @property
    def counts(self) -> tuple[int, ...]:
        """Layers per stage."""
        return tuple(e - s for s, e in self.ranges)

    @property
    def num_stages(self) -> int:
        """Number of model stages."""
        return len(self.ranges)

    @property
    def max_cost(self) -> float:
        """The largest stage cost (what the balanced methods minimise)."""
        return max(self.stage_costs) if self.stage_costs else float("nan")


def _check(num_layers: int, num_stages: int) -> None:
    for n, v in (("layers", num_layers), ("stages", num_stages)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise PartitionError(f"{n} must be a positive integer, got {v!r}")
    if num_stages > num_layers:
        raise PartitionError(f"{num_stages} stages exceed {num_layers} layers; every stage "
                             "needs at least one layer (lower pp or virtual stages)")


def _ranges(counts: Sequence[int]) -> tuple[tuple[int, int], ...]:
    ends = list(accumulate(counts))
    return tuple((e - c, e) for c, e in zip(counts, ends, strict=True))


def uniform(num_layers: int, num_stages: int) -> Partition:
    """Equal counts; the remainder goes one layer each to the middle stages."""
    _check(num_layers, num_stages)
    q, r = divmod(num_layers, num_stages)
    counts = [q] * num_stages
    # Middle stages first (centred), then the ends, so first/last stay lighter.
    order = sorted(range(num_stages), key=lambda i: (i in (0, num_stages - 1),
                                                     abs(i - (num_stages - 1) / 2), i))
    for i in order[:r]:
        counts[i] += 1
    return Partition(_ranges(counts), "uniform", tuple(float(c) for c in counts))


def _greedy(w: Sequence[float], k: int, caps: Sequence[float]) -> list[int] | None:
    n = len(w)
    counts, i = [], 0
    for st in range(k - 1):
        total, c = 0.0, 0
        while i < n - (k - 1 - st) and total + w[i] <= caps[st] + 1e-12 * (1 + abs(caps[st])):
            total += w[i]
            i += 1
            c += 1
        if c == 0:
            return None
        counts.append(c)
    rest = w[i:]
    if not rest or sum(rest) > caps[k - 1] + 1e-12 * (1 + abs(caps[k - 1])):
        return None
    counts.append(len(rest))
    return counts


def balanced(weights: Sequence[float], num_stages: int, first_extra: float = 0.0,
             last_extra: float = 0.0, method: str = "balanced") -> Partition:
    """Exact min-max contiguous partition of ``weights`` into ``num_stages`` non-empty
    stages, stage 0 charged ``first_extra`` and the last ``last_extra`` (both when
    there is one stage)."""
    n, k = len(weights), num_stages
    _check(n, k)
    if any(x < 0 for x in weights) or first_extra < 0 or last_extra < 0:
        raise PartitionError("partition weights must be non-negative")
    extra = [0.0] * k
    extra[0] += first_extra
    extra[-1] += last_extra
    pre = [0.0, *accumulate(weights)]
    cands = sorted({pre[j] - pre[i] + x for i in range(n) for j in range(i + 1, n + 1)
                    for x in set(extra)})
    lo, hi, best = 0, len(cands) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        T = cands[mid]
        got = _greedy(weights, k, [T - x for x in extra])
        if got is not None:
            best, hi = got, mid - 1
        else:
            lo = mid + 1
    if best is None:  # pragma: no cover - the largest candidate is always feasible
        raise PartitionError("no feasible partition found")
    rs = _ranges(best)
    costs = tuple(pre[e] - pre[s] + extra[i] for i, (s, e) in enumerate(rs))
    return Partition(rs, method, costs)


def time_balanced(layer_times: Sequence[float], num_stages: int, first_extra_s: float = 0.0,
                  last_extra_s: float = 0.0) -> Partition:
    """Balance forward+backward seconds per stage; ``first_extra_s`` /
    ``last_extra_s`` are the embedding and LM-head (+ loss) costs."""
    return balanced(layer_times, num_stages, first_extra_s, last_extra_s, "time")


#: What a partition may be given as: a :class:`Partition`, layer counts per stage or
#: ``(start, end)`` ranges per stage.
PartitionLike = Partition | Sequence[int] | Sequence[tuple[int, int]]


def as_ranges(partition: PartitionLike, num_layers: int, num_stages: int
              ) -> tuple[tuple[int, int], ...]:
    """Normalise a partition given as a :class:`Partition`, a sequence of ranges or a
    sequence of layer counts; checks it covers ``num_layers`` in ``num_stages``."""
    if isinstance(partition, Partition):
        rs = partition.ranges
    else:
        items = list(partition)
        if items and all(isinstance(x, int) for x in items):
            if any(x < 1 for x in items):
                raise PartitionError(f"every stage needs at least one layer, got counts "
                                     f"{items}")
            rs = _ranges(items)
        else:
            rs = tuple((int(s), int(e)) for s, e in items)
    if len(rs) != num_stages:
        raise PartitionError(f"partition has {len(rs)} stages, expected {num_stages}")
    pos = 0
    for i, (s, e) in enumerate(rs):
        if s != pos or e <= s:
            raise PartitionError(f"partition stage {i} range ({s}, {e}) is not contiguous "
                                 f"and non-empty (expected start {pos})")
        pos = e
    if pos != num_layers:
        raise PartitionError(f"partition covers {pos} layers, model has {num_layers}")
    return rs
