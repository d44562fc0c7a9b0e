"""One fidelity table over every open dataset in data/: measured vs predicted, per group.

Datasets and their role (the split between fitted and held-back rows):
- ``vtrain-single`` (data/vtrain/ground_truth_single.csv, 1,440 A100 rows of 1-8 GPUs):
  the calibration set; the A100 efficiency curve is fitted to these rows only
  (:mod:`merak_sim.experiments.vtrain`). Reported as "fit".
- ``vtrain-multi`` (ground_truth_multi.csv, 109 rows of 64-512 GPUs): held out, never
  fitted to.
- ``public-runs/*`` (torchtitan, NeMo / Megatron-Bridge, llm-foundry, Sailor): held out,
  never fitted to. A row is predicted only if the model can express it
  (:func:`skip_reason`); every other row is listed as skipped with its reason (FP8,
  MoE, context parallelism, FSDP / sharded data parallelism, GPUs or clusters without a
  preset, fine-tuning, unstated precision or shape), never dropped silently.

Errors are relative, (predicted - measured) / measured, of the iteration time; memory
error (predicted peak memory vs published) where the row publishes peak memory
(torchtitan GiB, Sailor bytes). Per dataset and group (GPU type, tp, pp, GPUs, ...):
rows, MAPE, mean signed error and the worst row (:func:`summarise`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from merak_sim.config import ParallelConfig
from merak_sim.costs.calibrated import CALIBRATED, CalibratedCostModel
from merak_sim.costs.efficiency import Efficiency
from merak_sim.experiments.vtrain import load_vtrain, predict_row
from merak_sim.hardware import Cluster, get_cluster
from merak_sim.model import ModelSpec
from merak_sim.sim.api import simulate

__all__ = ["Outcome", "Skipped", "GroupStats", "vtrain_outcomes", "public_run_outcomes",
           "skip_reason", "public_run_setup", "summarise", "VTRAIN_GROUPS", "PUBLIC_GROUPS"]

GiB = 1 << 30

#: Group keys reported for each kind of dataset.
VTRAIN_GROUPS = ("gpu", "gpus", "tp", "pp")
PUBLIC_GROUPS = ("gpu", "tp", "pp", "precision")


@dataclass(frozen=True)
class Outcome:
    """One predicted row.

    Attributes:
        dataset: dataset name (``vtrain-multi``, ``public-runs/torchtitan``, ...).
        role: "fit" (the calibration set) or "held out".
        label: what the row is, for the worst-row column.
        groups: group key -> value (gpu, gpus, tp, pp, precision, ...).
        measured_s, predicted_s: iteration time.
        mem_err: relative peak-memory error, None where the row publishes none.
    """

    dataset: str
    role: str
    label: str
    groups: dict[str, str] = field(hash=False)
    measured_s: float
    predicted_s: float
    mem_err: float | None = None

    @property
    def err(self) -> float:
        """Relative time error (predicted / measured - 1)."""
        return self.predicted_s / self.measured_s - 1


@dataclass(frozen=True)
class Skipped:
    """A row the model cannot express yet, with the reason."""

    dataset: str
    label: str
    reason: str


@dataclass(frozen=True)
class GroupStats:
    """Error statistics of one (dataset, group) cell."""

    dataset: str
    role: str
    group: str
    rows: int
    mape_pct: float
    signed_pct: float
    worst_pct: float
    worst_label: str
    mem_rows: int
    mem_mape_pct: float | None


def vtrain_outcomes(data_dir: Path, efficiency: Efficiency | None = None,
                    progress: Callable[[str], None] | None = None) -> list[Outcome]:
    """Predict every vTrain row (single-node: "fit", multi-node: "held out") with the
    calibrated A100 efficiency (default :data:`~merak_sim.costs.calibrated.CALIBRATED`)."""
    eff = efficiency or Efficiency(**{**Efficiency().to_dict(), **CALIBRATED["A100"]})
    out = []
    for name, role in (("single", "fit"), ("multi", "held out")):
        rows = load_vtrain(Path(data_dir) / f"ground_truth_{name}.csv")
        for r in rows:
            label = (f"h{r.hidden} L{r.layers} s{r.seq_len} gpus{r.gpus} tp{r.tp} dp{r.dp} "
                     f"pp{r.pp} mbs{r.micro_batch} gbs{r.global_batch}")
            out.append(Outcome(f"vtrain-{name}", role, label,
                               {"gpu": "A100", "gpus": str(r.gpus), "tp": str(r.tp),
                                "pp": str(r.pp)},
                               r.time_ms / 1e3, predict_row(r, eff)))
        if progress:
            progress(f"vtrain-{name}: {len(rows)} rows")
    return out


def _int(v: str, default: int = 1) -> int:
    v = (v or "").strip()
    return int(float(v)) if v else default


def _cluster_name(gpu_type: str) -> str | None:
    g = gpu_type.upper()
    if "H100" in g and "GH" not in g:
        return "dgx-h100"
    if "A100" in g:
        return "dgx-a100-40g" if "40" in g else "dgx-a100-80g"
    return None


def _precision(p: str) -> str | None:
    p = p.lower()
    if "bf16" in p:
        return "bf16"
    if "fp16" in p:
        return "fp16"
    return None


def skip_reason(row: dict) -> str | None:
    """Why the model cannot express a public-runs row yet (None: it can)."""
    prec = row.get("precision", "").lower()
    if row.get("task", "pretrain") != "pretrain":
        return f"task {row['task']} (fine-tuning is not modelled)"
    if row.get("num_experts") or _int(row.get("ep", ""), 1) > 1:
        return "MoE (experts / expert parallelism not modelled)"
    if "fp8" in prec or "fp4" in prec or "mx" in prec:
        return f"precision {row['precision']} (FP8 / FP4 GEMMs not modelled)"
    if _int(row.get("cp", ""), 1) > 1:
        return "context parallelism (cp > 1) not modelled"
    if _int(row.get("dp_shard", ""), 1) > 1 or "fsdp" in row.get("other_flags", "").lower():
        return "FSDP / sharded data parallelism not modelled"
    if _cluster_name(row.get("gpu_type", "")) is None:
        return f"no multi-GPU cluster preset for {row.get('gpu_type', '?')}"
    if _precision(prec) is None:
        return f"precision {row.get('precision') or 'not stated'}"
    for k in ("n_layers", "hidden_size", "n_heads", "seq_len", "vocab_size", "num_gpus",
              "micro_batch_size", "global_batch_size"):
        if not row.get(k, "").strip():
            return f"{k} not stated"
    if _measured_s(row) is None:
        return "no measured step time or throughput"
    if _int(row.get("tp", ""), 1) * _int(row.get("pp", ""), 1) * _int(row.get("dp", ""), 1) \
            != _int(row["num_gpus"]):
        return "tp x pp x dp does not equal the GPU count"
    return None


def _measured_s(row: dict) -> float | None:
    if row.get("step_time_s", "").strip():
        return float(row["step_time_s"])
    tps = row.get("tokens_per_sec_per_gpu", "").strip()
    if tps and row.get("global_batch_size") and row.get("seq_len") and row.get("num_gpus"):
        return (_int(row["global_batch_size"]) * _int(row["seq_len"])
                / (float(tps) * _int(row["num_gpus"])))
    return None


def public_run_setup(row: dict) -> tuple[ModelSpec, Cluster, ParallelConfig]:
    """(ModelSpec, Cluster, ParallelConfig) of an expressible public-runs row."""
    h, heads = _int(row["hidden_size"]), _int(row["n_heads"])
    llama = "llama" in row.get("model", "").lower()
    model = ModelSpec(name=row.get("model", "run"), family="llama" if llama else "gpt",
                      layers=_int(row["n_layers"]), hidden=h, heads=heads,
                      seq_len=_int(row["seq_len"]), vocab=_int(row["vocab_size"]),
                      ffn_hidden=_int(row.get("ffn_hidden", ""), 0),
                      kv_heads=_int(row.get("n_kv_heads", ""), 0),
                      dtype=_precision(row["precision"]), source="public-runs row")
    gpus = _int(row["num_gpus"])
    cluster = get_cluster(_cluster_name(row["gpu_type"]), nodes=max(1, math.ceil(gpus / 8)))
    vp = _int(row.get("vp", ""), 1)
    rc = row.get("activation_recompute", "").lower()
    recompute = "full" if "full" in rc else "selective" if "selective" in rc else "none"
    cfg = ParallelConfig(dp=_int(row["dp"]), tp=_int(row["tp"]), pp=_int(row["pp"]),
                         virtual_stages=vp,
                         schedule="interleaved-1f1b" if vp > 1 else "1f1b",
                         micro_batch_size=_int(row["micro_batch_size"]),
                         global_batch_size=_int(row["global_batch_size"]),
                         recompute=recompute, dtype=model.dtype)
    return model, cluster, cfg


def _published_mem_bytes(row: dict) -> float | None:
    if row.get("peak_mem_gib", "").strip():
        return float(row["peak_mem_gib"]) * GiB
    if row.get("peak_mem_bytes", "").strip():
        return float(row["peak_mem_bytes"])
    return None


def public_run_outcomes(path: Path) -> tuple[list[Outcome], list[Skipped]]:
    """Predict the expressible rows of one public-runs CSV; list the rest as skipped."""
    dataset = f"public-runs/{Path(path).stem}"
    done, skipped = [], []
    cost_model = CalibratedCostModel()
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            label = f"{row.get('model', '?')} | {row.get('source_section', '')}"
            why = skip_reason(row)
            if why is None:
                try:
                    model, cluster, cfg = public_run_setup(row)
                    res = simulate(model, cluster, cfg, cost_model=cost_model,
                                   engine="evaluator", sub_cluster=True, keep_trace=False)
                except ValueError as e:
                    why = f"configuration rejected: {e}"
            if why is not None:
                skipped.append(Skipped(dataset, label, why))
                continue
            pub = _published_mem_bytes(row)
            mem_err = None if pub is None else max(res.peak_memory_bytes) / pub - 1
            done.append(Outcome(dataset, "held out", label,
                                {"gpu": cluster.gpu.name, "tp": str(cfg.tp), "pp": str(cfg.pp),
                                 "precision": cfg.dtype},
                                _measured_s(row), res.iteration_time_s, mem_err))
    return done, skipped


def _stats(dataset: str, role: str, group: str, outs: Sequence[Outcome]) -> GroupStats:
    errs = [o.err for o in outs]
    worst = max(outs, key=lambda o: abs(o.err))
    mem = [o.mem_err for o in outs if o.mem_err is not None]
    return GroupStats(dataset, role, group, len(outs),
                      100 * sum(abs(e) for e in errs) / len(errs),
                      100 * sum(errs) / len(errs), 100 * worst.err, worst.label, len(mem),
                      100 * sum(abs(e) for e in mem) / len(mem) if mem else None)


def summarise(outcomes: Sequence[Outcome], keys: Sequence[str]) -> list[GroupStats]:
    """Per dataset: one "all" row, then one row per value of every key in ``keys``."""
    by_ds: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_ds.setdefault(o.dataset, []).append(o)
    out = []
    for ds, outs in by_ds.items():
        out.append(_stats(ds, outs[0].role, "all", outs))
        for k in keys:
            vals: dict[str, list[Outcome]] = {}
            for o in outs:
                if k in o.groups:
                    vals.setdefault(o.groups[k], []).append(o)
            for v in sorted(vals, key=lambda x: (len(x), x)):
                out.append(_stats(ds, outs[0].role, f"{k}={v}", vals[v]))
    return out
