"""TraceCostModel: per-layer costs from profiled ``merak-trace/1`` files.

For each layer kind ("embedding", "block", "head") the model looks up the trace
records with the configuration's tensor-parallel degree and a matching model shape,
and estimates forward / backward / recompute seconds and activation bytes at the
requested (micro-batch size, sequence length):

1. exact record if there is one;
2. otherwise, at each measured sequence length, piecewise-linear interpolation in the
   micro-batch size (linear extrapolation from the two nearest sizes outside the
   measured range; proportional scaling from a single size);
3. then piecewise-linear interpolation across the measured sequence lengths
   (proportional scaling in tokens from a single length, linear extrapolation from the
   two nearest outside the range).

Every estimate that is not an exact record, and every layer kind the trace lacks
(wrong tp, another model shape), is listed in ``CostTable.notes``; missing kinds fall
back to :class:`~merak_sim.costs.analytic.AnalyticCostModel`. Collectives use the
trace's timings (linear interpolation in bytes, same collective, group size and
placement) when present, the analytic alpha-beta model otherwise, both in
:meth:`TraceCostModel.comm_time` and inside the cost table (TP, pipeline and
data-parallel communication). Everything else
(model state, pipeline sends, data-parallel reduction, optimizer) is priced exactly as
the analytic model does, so the two are interchangeable behind
:class:`~merak_sim.costs.base.CostModel`.

Trace times of a record with tp > 1 already include its TP communication (they were
measured on a real TP group), so no TP collective is added on top of them and the
table's ``tp_*`` fields (:class:`~merak_sim.costs.base.StageCost`) stay 0 for those
layer kinds: the simulator then draws no separate TP collective for them. Layer kinds
priced by the analytic fallback (or traced at tp = 1 and run at tp = 1) follow the
analytic model, whose TP collectives (timed from the traces' collective records when
present) fill the ``tp_*`` fields through the shared stage assembly.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.base import CostTable
from merak_sim.costs.comm import CostModelError
from merak_sim.costs.layers import LayerCost
from merak_sim.hardware import Cluster
from merak_sim.model import ModelSpec
from merak_sim.partition import PartitionLike, as_ranges
from merak_sim.trace import LayerRecord, Trace, read_trace

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig

__all__ = ["TraceCostModel", "interpolate"]

_FIELDS = ("forward_s", "backward_s", "recompute_s", "activation_bytes")


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear ``y(x)`` through sorted points; linear extrapolation from the two
    end points outside the range; ``ys[0] * x / xs[0]`` from a single point."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return ys[i]
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _same_shape(a: ModelSpec, b: ModelSpec, kind: str) -> bool:
    core = (a.family == b.family and a.hidden == b.hidden and a.heads == b.heads
            and a.kv_heads == b.kv_heads and a.ffn_hidden == b.ffn_hidden
            and (a.dropout > 0) == (b.dropout > 0))
    if kind in ("embedding", "head"):
        return core and a.vocab == b.vocab
    return core


class TraceCostModel:
    """Cost model driven by one or more traces (module docstring).

    Args:
        traces: :class:`~merak_sim.trace.Trace` objects or paths to trace files; their
            records are pooled, and for an entry present in several the trace given
            last wins.
        fallback: analytic model for what the traces lack (default
            ``AnalyticCostModel()``).
    """

    def __init__(self, traces: Trace | str | Path | Iterable[Trace | str | Path],
                 fallback: AnalyticCostModel | None = None) -> None:
        if isinstance(traces, (Trace, str, Path)):
            traces = [traces]
        self.traces: tuple[Trace, ...] = tuple(
            t if isinstance(t, Trace) else read_trace(t) for t in traces)
        if not self.traces:
            raise CostModelError("TraceCostModel needs at least one trace")
        self.fallback = fallback or AnalyticCostModel()
        # The fallback's stage pricing, with collectives timed from the traces.
        self._priced = self.fallback.with_collectives(self.comm_time)

    # -- lookup
    def _records(self, model: ModelSpec, kind: str, tp: int) -> list[LayerRecord]:
        return [r for t in self.traces if _same_shape(t.model, model, kind)
                for r in t.layers if r.kind == kind and r.tp == tp]

    def estimate(self, model: ModelSpec, kind: str, tp: int, mbs: int,
                 seq_len: int | None = None) -> tuple[dict[str, float], str] | None:
        """(field -> value, how) for one layer kind, or None if the traces lack it.
        ``how`` is "exact" or a short description of the interpolation."""
        s = model.seq_len if seq_len is None else seq_len
        recs = self._records(model, kind, tp)
        if not recs:
            return None
        by_s: dict[int, dict[int, LayerRecord]] = {}
        for r in recs:
            by_s.setdefault(r.seq_len, {})[r.micro_batch_size] = r
        if s in by_s and mbs in by_s[s]:
            r = by_s[s][mbs]
            return {f: float(getattr(r, f)) for f in _FIELDS} | _split(r), "exact"
        seqs = sorted(by_s)
        per_s: list[dict[str, float]] = []
        for sl in seqs:
            pts = by_s[sl]
            ms = sorted(pts)
            per_s.append({f: interpolate(ms, [float(getattr(pts[m], f)) for m in ms], mbs)
                          for f in _FIELDS})
            fr = [_split(pts[m]).get("bwd_in_frac") for m in ms]
            if all(x is not None for x in fr):
                per_s[-1]["bwd_in_frac"] = interpolate(ms, fr, mbs)
        out = {f: interpolate(seqs, [d[f] for d in per_s], s) for f in _FIELDS}
        if all("bwd_in_frac" in d for d in per_s):
            out["bwd_in_frac"] = interpolate(seqs, [d["bwd_in_frac"] for d in per_s], s)
        ms_all = sorted({m for d in by_s.values() for m in d})
        how = (f"interpolated from micro-batch sizes {ms_all} at seq_len {seqs}"
               if s in by_s or len(seqs) > 1 else
               f"scaled from micro-batch sizes {ms_all} at seq_len {seqs}")
        lo_out = mbs < ms_all[0] or mbs > ms_all[-1] or s < seqs[0] or s > seqs[-1]
        if lo_out:
            how = how.replace("interpolated", "extrapolated")
        # Negative values can appear when extrapolating downward; clamp to zero.
        return {k: max(0.0, v) for k, v in out.items()}, how

    # -- CostModel protocol
    def comm_time(self, collective: str, nbytes: float, ranks: tuple[int, ...],
                  cluster: Cluster) -> float:
        """Trace timing for this collective, group size and placement if recorded,
        else the analytic alpha-beta time."""
        ranks = tuple(ranks)
        if len(ranks) >= 2:
            placement = "intra" if len({cluster.domain_of(r) for r in ranks}) == 1 else "inter"
            pts = sorted((c.bytes, c.seconds) for t in self.traces for c in t.collectives
                         if c.collective == collective and c.group_size == len(ranks)
                         and c.placement == placement)
            if len(pts) >= 2:
                return max(0.0, interpolate([p[0] for p in pts], [p[1] for p in pts], nbytes))
        return self.fallback.comm_time(collective, nbytes, ranks, cluster)

    def traced_layer_costs(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig
                           ) -> tuple[tuple[LayerCost, LayerCost, LayerCost], list[str],
                                      dict[str, str]]:
        """((layer, embedding, head) costs, notes, source per kind): trace values
        where the traces have them, analytic ones otherwise."""
        a_lay, a_emb, a_head = self.fallback.layer_costs(model, cluster, config)
        notes: list[str] = []
        used: dict[str, str] = {}
        out = []
        for kind, base in (("block", a_lay), ("embedding", a_emb), ("head", a_head)):
            est = self.estimate(model, kind, config.tp, config.micro_batch_size)
            if est is None:
                notes.append(f"trace lacks layer '{kind}' at tp={config.tp} for this model "
                             f"shape: analytic used")
                used[kind] = "analytic"
                out.append(base)
                continue
            vals, how = est
            used[kind] = f"trace ({how})"
            if how != "exact":
                notes.append(f"trace layer '{kind}' at micro-batch size "
                             f"{config.micro_batch_size}, seq_len {model.seq_len}: {how}")
            out.append(_layer_from_trace(base, vals, config))
        return (out[0], out[1], out[2]), notes, used

    def layer_breakdown(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig) -> dict:
        """Per layer kind costs as :meth:`AnalyticCostModel.layer_breakdown`, from the
        traces where they have the entry."""
        costs, _, used = self.traced_layer_costs(model, cluster, config)
        rows = self._priced.layer_breakdown(model, cluster, config, costs)
        for kind, key in (("block", "layer"), ("embedding", "embedding"), ("head", "head")):
            rows[key]["source"] = used[kind]
        return rows

    def cost_table(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
                   partition: PartitionLike | None = None) -> CostTable:
        """Per-model-stage costs with trace-based layer times (module docstring)."""
        fb = self.fallback
        fb.check(model, cluster, config)
        n_st = config.pp * config.virtual_stages
        if partition is None:
            partition = fb.default_partition(model, cluster, config)
        ranges = as_ranges(partition, model.layers, n_st)
        (lay, emb, head), notes, used = self.traced_layer_costs(model, cluster, config)
        if config.recompute == "selective":
            notes.append("selective recompute: attention-core cost from the analytic model")
        srcs = {t.provenance.device for t in self.traces}
        return self._priced.table_from_layers(model, cluster, config, ranges, lay, emb, head,
                         extra_notes=tuple(notes),
                         extra_meta={"source": "trace", "layer_sources": used,
                                     "trace_devices": sorted(srcs)})


def _split(r: LayerRecord) -> dict[str, float]:
    if r.backward_input_s is not None and r.backward_weight_s is not None and r.backward_s > 0:
        return {"bwd_in_frac": r.backward_input_s / (r.backward_input_s + r.backward_weight_s)}
    return {}


def _layer_from_trace(base: LayerCost, vals: dict[str, float], config: ParallelConfig) -> LayerCost:
    """A LayerCost from trace values; the backward split follows the trace when it was
    measured, else the analytic model's ratio."""
    bwd = vals["backward_s"]
    a_tot = base.backward_input_s + base.backward_weight_s
    frac = vals.get("bwd_in_frac", base.backward_input_s / a_tot if a_tot > 0 else 1.0)
    no_comm = config.tp > 1  # measured on a TP group: communication is inside the times
    return replace(base, forward_s=vals["forward_s"], backward_input_s=bwd * frac,
                   backward_weight_s=bwd * (1 - frac), recompute_s=vals["recompute_s"],
                   # A trace measures keep-everything activations; selective recompute
                   # keeps less, which the memory model prices.
                   activation_bytes=(None if config.recompute == "selective"
                                     else vals["activation_bytes"]),
                   tp_fwd=(0.0, 0) if no_comm else base.tp_fwd,
                   tp_bwd=(0.0, 0) if no_comm else base.tp_bwd, source="trace")
