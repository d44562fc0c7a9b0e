"""Calibration of the analytic cost model against measured runs (vTrain ground truth).

vTrain (Bang et al., MICRO 2024) publishes measured iteration times of Megatron GPT
training on A100 clusters: 1,440 single-node runs (1-8 GPUs) and 109 multi-node runs
(64, 256, 512 GPUs). Protocol (no peeking): the efficiency parameters of
:class:`merak_sim.costs.efficiency.Efficiency` are fitted to the single-node file only
(:func:`fit`), then every multi-node row is predicted without refitting
(benchmarks/vtrain_validation.py runs both; the fitted values are served by
:mod:`merak_sim.costs.calibrated`).

How a row becomes a simulation (assumptions, as stated in vTrain's description of its
data): GPT with the row's layers, hidden size, heads and sequence length, vocabulary
51,200 (Megatron's padded GPT-2 BPE), fp16; cluster ``vtrain-a100`` (8 A100 per node,
vTrain's link figures); 1F1B, full recomputation, no overlap of the data-parallel
all-reduce.

The fit minimises the mean absolute log error (a symmetric relative error) with a
derivative-free coordinate search in log space (scipy is not a dependency): each
round tries multiplying every parameter by ``step`` and ``1 / step``, keeps
improvements, and halves the step (in log) when nothing improves. Besides the
efficiency curve the fit moves the intra-node link's bandwidth and latency
(single-node runs exercise NVLink only); the inter-node network keeps vTrain's stated
800 Gb/s per node.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.calibrated import with_intra_link
from merak_sim.costs.efficiency import Efficiency
from merak_sim.hardware import Cluster, get_cluster
from merak_sim.model import ModelSpec
from merak_sim.sim.api import simulate

__all__ = ["FIT_PARAMS", "LINK_PARAMS", "VTrainRow", "load_vtrain", "row_setup",
           "predict_row", "fit"]

#: Efficiency parameters the fit may move (the others keep their published defaults).
FIT_PARAMS = ("gemm_max", "gemm_dim_half", "gemm_flops_half", "attn_factor", "mem_bw_eff",
              "kernel_overhead_s")
#: Intra-node link parameters the fit may move (single-node runs exercise only NVLink;
#: the inter-node network keeps vTrain's stated figure).
LINK_PARAMS = ("intra_bandwidth_Bps", "intra_latency_s")

# Physical limits fixed before looking at any result: no GEMM reaches more than 90 % of
# the A100's tensor peak, attention GEMMs are no faster than the others, memory-bound
# kernels stay below 95 % of HBM bandwidth, NVLink3 carries at most 300 GB/s per
# direction.
_BOUNDS = {"gemm_max": (0.3, 0.9), "attn_factor": (0.1, 1.0), "mem_bw_eff": (0.2, 0.95),
           "gemm_dim_half": (1.0, 1024.0), "gemm_flops_half": (1e6, 1e11),
           "kernel_overhead_s": (0.0, 1e-3), "intra_bandwidth_Bps": (10e9, 300e9),
           "intra_latency_s": (1e-7, 1e-3)}


@dataclass(frozen=True, slots=True)
class VTrainRow:
    """One measured run."""

    gpus: int
    global_batch: int
    micro_batch: int
    hidden: int
    heads: int
    layers: int
    seq_len: int
    tp: int
    dp: int
    pp: int
    time_ms: float
    params_b: float | None = None


def load_vtrain(path: str | Path) -> list[VTrainRow]:
    """Read a vTrain ground-truth CSV (either file; UTF-8 with byte-order mark)."""
    rows = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        for d in csv.DictReader(f):
            rows.append(VTrainRow(
                gpus=int(d["# GPUs"]), global_batch=int(d["global batch"]),
                micro_batch=int(d["micro batch"]), hidden=int(d["hidden size"]),
                heads=int(d["attention heads"]), layers=int(d["# layers"]),
                seq_len=int(d["sequence length"]), tp=int(d["tensor parallelism"]),
                dp=int(d["data parallelism"]), pp=int(d["pipeline parallelism"]),
                time_ms=float(d["iteration time (ms)"]),
                params_b=float(d["Parameters (billion)"]) if "Parameters (billion)" in d
                else None))
    return rows


def row_setup(row: VTrainRow, link: dict[str, float] | None = None
              ) -> tuple[ModelSpec, Cluster, ParallelConfig]:
    """(ModelSpec, Cluster, ParallelConfig) of a vTrain row (module docstring); ``link``
    overrides the intra-node link's ``intra_bandwidth_Bps`` / ``intra_latency_s``."""
    model = ModelSpec(name=f"vtrain-h{row.hidden}-L{row.layers}", family="gpt",
                      layers=row.layers, hidden=row.hidden, heads=row.heads,
                      seq_len=row.seq_len, vocab=51200, dtype="fp16",
                      source="vTrain ground truth row (vocab 51200 assumed)")
    nodes = max(1, math.ceil(row.gpus / 8))
    cluster = get_cluster("vtrain-a100", nodes=nodes)
    if link:
        cluster = with_intra_link(cluster, link)
    cfg = ParallelConfig(dp=row.dp, tp=row.tp, pp=row.pp, micro_batch_size=row.micro_batch,
                         global_batch_size=row.global_batch, schedule="1f1b",
                         recompute="full", dtype="fp16")
    return model, cluster, cfg


def predict_row(row: VTrainRow, efficiency: Efficiency | None = None, *,
                engine: str = "evaluator", contention: bool | None = None,
                link: dict[str, float] | None = None) -> float:
    """Predicted iteration time (seconds) of a vTrain row with the given efficiency
    (and intra-node link parameters)."""
    model, cluster, cfg = row_setup(row, link)
    res = simulate(model, cluster, cfg, cost_model=AnalyticCostModel(efficiency=efficiency),
                   engine=engine, contention=contention if engine == "simpy" else None,
                   sub_cluster=True, keep_trace=False)
    return res.iteration_time_s


def _loss(pred: Sequence[float], meas: Sequence[float]) -> float:
    return sum(abs(math.log(p / m)) for p, m in zip(pred, meas, strict=True)) / len(meas)


def _param(eff: Efficiency, link: dict[str, float], name: str) -> float:
    return link[name] if name in LINK_PARAMS else getattr(eff, name)


def fit(rows: Sequence[VTrainRow], start: Efficiency | None = None, *, rounds: int = 12,
        step: float = 1.5, params: Sequence[str] = FIT_PARAMS + LINK_PARAMS,
        link: dict[str, float] | None = None,
        log: Callable[[str], None] | None = None
        ) -> tuple[Efficiency, dict[str, float], float]:
    """Fit efficiency and intra-node link parameters to ``rows`` (module docstring);
    returns (Efficiency, link parameters, mean absolute log error)."""
    eff = start or Efficiency()
    if link is None:
        intra = get_cluster("vtrain-a100", nodes=1).intra
        link = {"intra_bandwidth_Bps": intra.bandwidth_Bps,
                "intra_latency_s": max(intra.latency_s, 1e-6)}
    link = dict(link)
    meas = [r.time_ms / 1e3 for r in rows]

    def loss_of(e: Efficiency, lk: dict[str, float]) -> float:
        return _loss([predict_row(r, e, link=lk) for r in rows], meas)

    best = loss_of(eff, link)
    if log:
        log(f"start loss {best:.4f} {eff.to_dict()} {link}")
    s = step
    for rnd in range(rounds):
        improved = False
        for name in params:
            for mult in (s, 1.0 / s):
                old = _param(eff, link, name)
                lo, hi = _BOUNDS[name]
                v = min(max(old * mult, lo), hi)
                if v == old:
                    continue
                try:
                    cand_e = eff if name in LINK_PARAMS else eff.with_(**{name: v})
                except ValueError:
                    continue
                cand_l = {**link, name: v} if name in LINK_PARAMS else link
                c_loss = loss_of(cand_e, cand_l)
                if c_loss < best:
                    eff, link, best, improved = cand_e, cand_l, c_loss, True
                    break
        if log:
            log(f"round {rnd}: step x{s:.3f} loss {best:.4f} {eff.to_dict()} {link}")
        if not improved:
            s = math.sqrt(s)
    return eff, link, best
