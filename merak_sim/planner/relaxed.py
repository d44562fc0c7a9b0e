"""Relaxed stage arrays: lower bounds on time and memory without a candidate's cost table.

Pricing a cost table is the expensive step of a large search (the data-parallel and
ZeRO-3 collectives of every stage are placed on the cluster), and most candidates of a
full space lose by far. The planner therefore bounds them first from a *relaxed* table
that every candidate sharing (tp, cp, ep, micro-batch, sequence parallelism, TP overlap,
selective recompute, attention) can reuse:

- One three-stage *probe* table per such key (dp = 1, or the fewest replicas an MoE
  model's ep folds onto; ZeRO 0) gives, per field, the
  cost of one transformer layer (the middle stage over its layer count) and the extras
  of the first stage (embedding) and the last (head) (a one-stage pipeline drops
  the smaller end's extra model state: a tied embedding is stored once there). A
  stage's forward, backward, re-forward, activation and checkpoint bytes are affine
  in its layer count under the cost models of this package
  (``AnalyticCostModel.stage_cost``), so the arrays of any (pp, virtual stages) are
  rebuilt with numpy over the cost model's uniform partition.
- What the relaxation drops only adds time or memory: the data-parallel gradient
  reduction and optimizer step (tail), the exposed ZeRO-3 gathers (inside forward and
  backward), the sharded part of the model state (ZeRO 1 keeps at least the weights
  and gradients, 2 the weights, 3 nothing whole). So the bound of :func:`~merak_sim.planner.bounds.lower_bound`
  on relaxed arrays never exceeds the one on the exact table.

The planner checks that claim on every exact table it prices (:func:`admissible`);
a cost model breaking it (another partition, stage costs not affine in the layers)
makes the search price every candidate exactly, as the exhaustive search does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from merak_sim.config import ParallelConfig
from merak_sim.partition import uniform

from .space import Candidate
from .templates import stage_arrays

__all__ = ["RelaxedPricer", "relaxed_key", "admissible", "TIME_FIELDS", "MEMORY_FIELDS"]

#: Fields the time bound reads; the tail fields are zero in relaxed arrays.
TIME_FIELDS = ("forward_s", "backward_s", "backward_input_s", "recompute_s")
#: Fields the one-micro-batch memory bound reads.
MEMORY_FIELDS = ("activation_bytes", "checkpoint_bytes")
_TOL = 1e-9


def relaxed_key(c: Candidate) -> tuple:
    """What a candidate's relaxed arrays depend on besides (pp, virtual stages)."""
    return (c.tp, c.cp, c.micro_batch_size, c.sequence_parallel, c.tp_overlap,
            c.recompute == "selective", c.attention, c.ep)


@dataclass
class RelaxedPricer:
    """Probe tables per :func:`relaxed_key` and the relaxed arrays built from them.

    ``arrays(c)`` returns the relaxed stage arrays of ``c`` (times: per model stage;
    ``state_bytes``: the ZeRO-0 model state, exact for ZeRO 0 candidates;
    ``state_by_zero``: one row per ZeRO stage of what it keeps whole), or None when
    the probe cannot be priced or the cost model's stages are not the affine uniform
    ones this relaxation assumes. ``probes`` counts the probe tables priced.
    """

    model: Any
    cluster: Any
    cost_model: Any
    dtype: str
    probes: int = field(default=0, init=False)
    capacity_bytes: float = field(default=0.0, init=False)
    _per_layer: dict[tuple, Any] = field(default_factory=dict, init=False, repr=False)
    _arrays: dict[tuple, Any] = field(default_factory=dict, init=False, repr=False)
    _layers: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False)
    _clusters: dict[int, Any] = field(default_factory=dict, init=False, repr=False)

    def _probe(self, key: tuple):
        if key in self._per_layer:
            return self._per_layer[key]
        tp, cp, mbs, sp, ov, sel, att, *more = key
        ep = more[0] if more else 1  # a key without ep is a dense one's
        L = self.model.layers
        out = None
        # The fewest data-parallel ranks onto which ep folds (1 for a dense model).
        dp = ep // math.gcd(ep, tp * cp)
        if L >= 3:
            cfg = ParallelConfig(dp=dp, tp=tp, pp=3, micro_batch_size=mbs, ep=ep,
                                 global_batch_size=3 * mbs * dp, schedule="1f1b",
                                 recompute="selective" if sel else "none",
                                 sequence_parallel=sp, tp_overlap=ov, zero=0, cp=cp,
                                 attention=att, dtype=self.dtype)
            # Three stages of tp x cp GPUs may need more nodes than the cluster has;
            # only the groups' placement in a node matters to the per-layer costs.
            # Megatron's order whatever the candidates' order: it packs the tp and cp
            # groups into as few nodes as any order can, so the probe stays a bound.
            gpn = self.cluster.gpus_per_node
            nodes = max(self.cluster.nodes, -(-3 * tp * cp * dp // gpn))
            # One cluster object per size (the cluster itself when it suffices), so the
            # collective memos, which key on it, serve every probe.
            cluster = self._clusters.get(nodes)
            if cluster is None:
                cluster = self._clusters[nodes] = (
                    self.cluster if nodes == self.cluster.nodes
                    else replace(self.cluster, nodes=nodes))
            try:
                tab = self.cost_model.cost_table(self.model, cluster, cfg)
            except ValueError:
                tab = None
            self.probes += 1
            if tab is not None:
                self.capacity_bytes = float(tab.memory_capacity_bytes)
            ranges = uniform(L, 3).ranges
            meta = getattr(tab, "meta", None) or {}
            if tab is not None and tuple(map(tuple, meta.get("ranges", ()))) == ranges:
                arr = stage_arrays(tab)
                for f in ("weight_bytes", "grad_bytes"):
                    arr[f] = np.array([getattr(st, f) for st in tab.stages], dtype=float)
                n = np.array([e - s for s, e in ranges], dtype=float)
                fields = TIME_FIELDS + MEMORY_FIELDS + ("state_bytes", "weight_bytes",
                                                        "grad_bytes")
                per = {f: arr[f][1] / n[1] for f in fields}
                # As arrays over the fields: per layer, first-stage and last-stage extra.
                out = (fields, np.array([per[f] for f in fields]),
                       np.array([arr[f][0] - n[0] * per[f] for f in fields]),
                       np.array([arr[f][2] - n[2] * per[f] for f in fields]))
        self._per_layer[key] = out
        return out

    def arrays(self, c: Candidate) -> dict[str, np.ndarray] | None:
        """Relaxed stage arrays of ``c`` (class docstring)."""
        key = relaxed_key(c)
        got = self._arrays.get((key, c.pp, c.virtual_stages), False)
        # Most are built already (by the sweep); None is a known "cannot relax".
        return self.arrays_of([key], c.pp, c.virtual_stages)[0] if got is False else got

    def arrays_of(self, keys: list[tuple], pp: int, virtual_stages: int
                  ) -> list[dict[str, np.ndarray] | None]:
        """:meth:`arrays` of every :func:`relaxed_key` in ``keys`` at (pp, virtual
        stages); those not built yet are built together, on arrays stacked one row per
        key (elementwise, so each equals the key's arrays alone). The arrays are
        read-only views of the stack."""
        n_st = pp * virtual_stages
        new = [k for k in dict.fromkeys(keys) if (k, pp, virtual_stages) not in self._arrays]
        probes = [(k, self._probe(k)) for k in new]
        ok = [(k, p) for k, p in probes if p is not None]
        for k, p in probes:
            if p is None:
                self._arrays[k, pp, virtual_stages] = None
        if ok:
            n = self._layers.get(n_st)
            if n is None:
                n = self._layers[n_st] = np.array(
                    [e - s for s, e in uniform(self.model.layers, n_st).ranges], dtype=float)
            fields = ok[0][1][0]
            per, first, last = (np.array([p[i] for _k, p in ok]) for i in (1, 2, 3))
            a = n[None, None, :] * per[:, :, None]
            a[:, :, 0] += first
            a[:, :, -1] += last
            a.setflags(write=False)  # before any view is taken: the views inherit it
            at = {f: a[:, i] for i, f in enumerate(fields)}
            zeros = np.zeros((len(ok), n_st))
            # Model state each ZeRO stage keeps whole, whatever the shard group: 1
            # shards the optimizer, 2 the gradients too, 3 the weights too.
            w, g = at["weight_bytes"], at["grad_bytes"]
            by_zero = np.stack((at["state_bytes"], w + g, w, zeros), axis=1)
            if n_st == 1 and getattr(self.model, "tied_embeddings", True):
                # One stage holds the embedding and the head: a tied word embedding is
                # stored once there, not once per end as in the probe. Each end's extra
                # state holds that copy, so dropping the smaller end's extra keeps a
                # lower bound (zero here let a 175B model look 0.1 GiB short).
                ix = {f: i for i, f in enumerate(fields)}
                st, w, g = (np.maximum(at[f] - np.minimum(first[:, ix[f]],
                                                         last[:, ix[f]])[:, None], 0.0)
                            for f in ("state_bytes", "weight_bytes", "grad_bytes"))
                by_zero = np.stack((st, w + g, w, zeros), axis=1)
            for x in (zeros, by_zero):
                x.setflags(write=False)
            kept = [f for f in fields if f not in ("weight_bytes", "grad_bytes")]
            for i, (k, _p) in enumerate(ok):
                out = {f: at[f][i] for f in kept}
                out["state_by_zero"] = by_zero[i]
                out["grad_allreduce_s"] = out["optimizer_s"] = zeros[i]
                self._arrays[k, pp, virtual_stages] = out
        return [self._arrays[k, pp, virtual_stages] for k in keys]


def admissible(relaxed: dict[str, np.ndarray], exact: dict[str, np.ndarray],
               zero: int = 0) -> bool:
    """Whether the exact arrays of a ZeRO-``zero`` candidate are nowhere below the
    relaxed ones (time, activation and model-state fields, to rounding): the condition
    under which relaxed bounds are valid."""
    for f in TIME_FIELDS + MEMORY_FIELDS + ("state_bytes",):
        r, e = (relaxed["state_by_zero"][zero] if f == "state_bytes" else relaxed[f],
                exact[f])
        if r.shape != e.shape or np.any(r > e + _TOL * np.abs(e) + 1e-300):
            return False
    return True
