"""Per-iteration fixed costs of very large runs, each from physics, each its own note.

Four terms, once per iteration, independent of the micro-batch count:

- Optimizer step (already charged as ``StageCost.optimizer_s`` by
  :mod:`merak_sim.costs.analytic`; this module only names it): Adam is elementwise, at
  most a few FLOPs per byte, so memory-bound (roofline: Williams, Waterman and Patterson,
  CACM 2009): per parameter of the GPU's (ZeRO-sharded) shard it reads and writes the
  fp32 master weight, m and v (24 bytes) and reads the 16-bit gradient and writes the
  16-bit weight (4 bytes), at the HBM bandwidth.
- Global gradient-norm all-reduce (gradient clipping; Megatron-core
  ``clip_grads.get_grad_norm_fp32``: each rank's sum of squares is all-reduced over the
  model-parallel group and, with the distributed optimizer, the data-parallel group, so
  over every rank): one fp32 (4 bytes) among all N ranks, priced by the cost model's
  collective (latency-bound: the cheapest of ring, hierarchical ring and tree:
  :mod:`merak_sim.costs.comm`, 2 ceil(log2 k) latencies over k domains for the tree).
- Pipeline fill and drain: 2 (pp - 1) stage-boundary transfers lie on the critical
  path of every schedule, each at least one link latency (alpha of the alpha-beta
  model; Hockney 1994). The schedule already charges them in ``send_activation_s``;
  the note gives the latency share.
- Slowest of N: a synchronous step ends when the slowest of its N GPUs does. With each
  GPU's iteration compute T (1 + cv Z), Z independent standard normal, the expected
  maximum obeys E[max] <= mu + sigma sqrt(2 ln N) (the Gaussian maximal inequality,
  Boucheron, Lugosi and Massart, Concentration Inequalities, 2013, sec. 2.5; tight to
  leading order as N grows, the Gumbel limit), so the step grows by
  cv T sqrt(2 ln N): +4.3 cv T at N = 10 000. ``cv`` is the cluster's
  ``gpu_jitter_cv``.

Charging: ``Cluster.gpu_jitter_cv`` None (every preset's default) prices nothing new,
so no committed figure moves, and the notes state what the terms are; a number (0
included) adds the gradient-norm all-reduce and the slowest-of-N term to every stage's
optimizer step (divided over a rank's virtual stages, so a rank's step grows once).
No published per-GPU jitter figure is wired in as a default: take cv from the spread
of measured per-rank step times of the cluster in question.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from merak_sim.layout import RankLayout
from merak_sim.sim.from_config import stage_rank

__all__ = ["FixedCosts", "fixed_costs", "slowest_of_n_s", "charge_fixed", "fixed_notes"]

Comm = Callable[[str, float, tuple[int, ...], Any], float]

#: Bytes of the gradient-norm all-reduce: one fp32 sum of squares.
GRAD_NORM_BYTES = 4.0


@dataclass(frozen=True, slots=True)
class FixedCosts:
    """Per-iteration fixed costs of one configuration (module docstring), seconds."""

    optimizer_s: float
    grad_norm_s: float
    pipeline_latency_s: float
    compute_s: float
    slowest_of_n_s: float
    ranks: int
    jitter_cv: float | None


def slowest_of_n_s(compute_s: float, cv: float, n: int) -> float:
    """Expected extra seconds the slowest of ``n`` GPUs adds to a step of ``compute_s``
    with per-GPU jitter ``cv`` (module docstring: cv T sqrt(2 ln n))."""
    if cv < 0 or not math.isfinite(cv):
        raise ValueError(f"gpu jitter cv must be a finite number >= 0, got {cv!r}")
    if n <= 1 or cv == 0:
        return 0.0
    return cv * compute_s * math.sqrt(2.0 * math.log(n))


def fixed_costs(comm: Comm, cluster: Any, config: Any, stages: tuple) -> FixedCosts:
    """The four terms of the module docstring for ``stages`` (a cost table's)."""
    n = config.world_size
    grad_norm = comm("all-reduce", GRAD_NORM_BYTES, _all_ranks(n), cluster) if n > 1 else 0.0
    lat = 0.0
    if config.pp > 1:
        lay = RankLayout.of(config)
        lat = cluster.link_between(lay.rank(0), lay.rank(1)).latency_s
    per_rank = [0.0] * config.pp
    for g, st in enumerate(stages):
        per_rank[stage_rank(config, g)] += st.forward_s + st.backward_s
    compute = config.num_microbatches * max(per_rank)
    cv = getattr(cluster, "gpu_jitter_cv", None)
    return FixedCosts(
        optimizer_s=max(st.optimizer_s for st in stages), grad_norm_s=grad_norm,
        pipeline_latency_s=2 * (config.pp - 1) * lat, compute_s=compute,
        slowest_of_n_s=slowest_of_n_s(compute, cv or 0.0, n), ranks=n, jitter_cv=cv)


@lru_cache(maxsize=64)
def _all_ranks(n: int) -> tuple[int, ...]:
    """Ranks 0..n-1, one tuple object per n (the collective memo keys on identity)."""
    return tuple(range(n))


def charge_fixed(fc: FixedCosts, config: Any, stages: tuple) -> tuple:
    """``stages`` with the gradient-norm all-reduce and the slowest-of-N term added to
    each optimizer step (spread over a rank's virtual stages); unchanged when the
    cluster's jitter is None (module docstring)."""
    if fc.jitter_cv is None:
        return stages
    extra = (fc.grad_norm_s + fc.slowest_of_n_s) / config.virtual_stages
    return tuple(replace(st, optimizer_s=st.optimizer_s + extra) for st in stages)


def fixed_notes(fc: FixedCosts) -> tuple[str, ...]:
    """One note per fixed cost (module docstring), saying whether it is charged."""
    charged = fc.jitter_cv is not None
    how = "charged in the optimizer step" if charged else \
        "not charged: the cluster's gpu_jitter_cv is unset"
    k = math.sqrt(2.0 * math.log(fc.ranks)) if fc.ranks > 1 else 0.0
    return (
        f"fixed: optimizer step {fc.optimizer_s * 1e3:.3f} ms on the busiest stage "
        "(Adam memory-bound: 28 bytes per sharded parameter at HBM bandwidth; in the step)",
        f"fixed: gradient-norm all-reduce of one fp32 over {fc.ranks} ranks "
        f"{fc.grad_norm_s * 1e6:.1f} us ({how})",
        f"fixed: pipeline fill/drain latency 2 (pp-1) x alpha = "
        f"{fc.pipeline_latency_s * 1e6:.1f} us (in the schedule's sends)",
        f"fixed: slowest of {fc.ranks} GPUs: cv x {fc.compute_s * 1e3:.1f} ms x sqrt(2 ln N)"
        f" = {k:.2f} cv x compute; cv {fc.jitter_cv if charged else 'unset'}: "
        f"+{fc.slowest_of_n_s * 1e3:.3f} ms ({how})",
    )
