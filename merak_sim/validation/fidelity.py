"""One fidelity table over every open dataset in data/: measured vs predicted, per group.

Datasets and their role (the split between fitted and held-back rows):
- ``vtrain-single`` (data/vtrain/ground_truth_single.csv, 1,440 A100 rows of 1-8 GPUs):
  the calibration set; the A100 efficiency curve is fitted to these rows only
  (``merak-sim calibrate``, :mod:`merak_sim.calibrate`). Reported as "fit".
- ``vtrain-multi`` (ground_truth_multi.csv, 109 rows of 64-512 GPUs): held out, never
  fitted to.
- ``public-runs/*`` (torchtitan, NeMo / Megatron-Bridge, llm-foundry, Sailor): the rows
  of the Hopper fits' declared subsets are "fit"
  (:data:`FIT_SPLIT`: llm-foundry H100 MPT-1b / 7b /
  30b for the PyTorch stack, NeMo H100 GPT-3 / LLaMA-2 / Nemotron for Megatron with
  Transformer Engine, llm-foundry A100 MPT-1b / 7b for PyTorch on A100); every other
  row is held out. A row is predicted only if the model can express
  it (:mod:`merak_sim.validation.public_runs` maps it: FSDP / HSDP as ZeRO 3,
  Megatron's distributed optimizer as ZeRO 1, context parallelism, FP8 on Hopper,
  Blackwell presets with MXFP8 / NVFP4; no Blackwell row is fitted);
  every other row is listed as skipped with its one-line reason (MoE, fine-tuning,
  heterogeneous clusters, unstated precision...), never dropped.

Errors are relative, (predicted - measured) / measured, of the iteration time; memory
error where the row publishes peak memory (torchtitan GiB, Sailor bytes), against the
quantity the column measures
(:func:`merak_sim.validation.public_runs.comparable_peak_bytes`: allocator-level
peaks, so the backward working set is added to the simulated stash peak). Per dataset
and group (GPU type, tp, pp, cp, ZeRO stage, precision, GPU type with precision, ...):
rows, MAPE, mean signed error and the worst row (:func:`summarise`). The group
``target=H100/A100 bf16`` (:func:`target_group`) holds a source's held-out bf16 rows
on H100 and A100 GPUs: the rows of the public-runs target (MAPE <= 10 % per source).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from merak_sim.calibrate.fit import PreparedRun
from merak_sim.calibrate.vtrain import vtrain_runs
from merak_sim.costs.calibrated import CALIBRATED, CalibratedCostModel
from merak_sim.costs.calibrated_hopper import (
    A100_PROFILES,
    HOPPER_PROFILES,
    a100_cost_model,
    hopper_cost_model,
    is_hopper,
)
from merak_sim.costs.efficiency import Efficiency
from merak_sim.costs.protocol import CostModel
from merak_sim.sim.api import simulate
from merak_sim.validation.public_runs import (
    activation_profile,
    comparable_peak_bytes,
    load_rows,
    measured_step_s,
    published_peak_bytes,
    row_label,
    row_setup,
    skip_reason,
    stage_layers,
)

__all__ = ["FIT_MODELS", "FIT_SPLIT", "MOE_FIT", "is_moe_row",  # noqa: RUF022
           "fit_profile_of", "fit_rows", "profile_of", "role_of",
           "Outcome", "Skipped", "GroupStats", "vtrain_outcomes", "public_run_outcomes",
           "summarise", "VTRAIN_GROUPS", "PUBLIC_GROUPS", "TARGET", "TARGET_GPUS",
           "TARGET_MAPE_PCT", "target_group"]

#: Group keys reported for each kind of dataset.
VTRAIN_GROUPS = ("gpu", "gpus", "tp", "pp")
PUBLIC_GROUPS = ("target", "moe", "gpu", "stack", "tp", "pp", "cp", "zero", "precision",
                 "gpu+precision")
#: The public-runs accuracy target's rows: held out, on these GPUs, in this precision
#: (its group value, :func:`target_group`).
TARGET = "H100/A100 bf16"
TARGET_GPUS = ("H100", "A100")
TARGET_MAPE_PCT = 10.0


def target_group(role: str, gpu: str, dtype: str) -> str | None:
    """``target=`` group value of a public-runs row: :data:`TARGET` for a held-out
    bf16 row on an H100 or A100 (the rows the <= 10 % MAPE target is about), else
    None (no such group)."""
    if role == "held out" and gpu.startswith(TARGET_GPUS) and dtype == "bf16":
        return TARGET
    return None


#: Per fitted profile: (dataset, GPU-type prefix, model-name prefixes) of the rows the
#: fit sees.
FIT_MODELS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "pytorch": ("public-runs/llmfoundry", "H100", ("MPT-1b", "MPT-7b", "MPT-30b")),
    "megatron-te": ("public-runs/nemo_perf", "H100", ("GPT3-", "LLAMA2-", "Nemotron-")),
    "a100-pytorch": ("public-runs/llmfoundry", "A100", ("MPT-1b", "MPT-7b")),
}
#: The split in words (printed with the fidelity table).
FIT_SPLIT = ("Hopper fits: pytorch on llm-foundry H100 MPT-1b / 7b / 30b, megatron-te on "
             "NeMo H100 GPT-3 / LLaMA-2 / Nemotron; A100 PyTorch fit (a100-pytorch) on "
             "llm-foundry A100 MPT-1b / 7b; MoE: the expert all-to-all overlap chosen on "
             "NeMo H100 Qwen3-30B-A3B pp1 (no constant fitted); every other public-runs "
             "row is held out")


#: The MoE rows' declared fit subset: (dataset, GPU prefix, model prefix, pp). One
#: choice was made on them, the expert all-to-all overlap of the NeMo / Megatron-Bridge
#: MoE mapping (:mod:`merak_sim.validation.public_runs`); no cost constant is fitted to
#: MoE rows (the Hopper fits never see them: :func:`fit_rows`). Every other MoE row is
#: held out.
MOE_FIT = ("public-runs/nemo_perf", "H100", "Qwen3_30B_a3B", "1")


def is_moe_row(row: dict) -> bool:
    """Whether a public-runs row trains a mixture of experts."""
    return bool(row.get("num_experts", "").strip()) or (row.get("ep") or "1").strip() not in (
        "", "1")


def profile_of(row: dict) -> str:
    """The Hopper profile of a row's software stack (NeMo / Megatron-Bridge:
    ``megatron-te``; everything else: ``pytorch``)."""
    fw = row.get("framework", "").lower()
    return "megatron-te" if ("nemo" in fw or "megatron-bridge" in fw) else "pytorch"


def fit_profile_of(row: dict) -> str | None:
    """The fitted profile that prices a row: ``a100-pytorch`` for an A100 row of a
    PyTorch stack, None for other A100 rows (vTrain's Megatron fit), else the row's
    Hopper profile (:func:`profile_of`)."""
    stack = profile_of(row)
    if row.get("gpu_type", "").startswith("A100"):
        return "a100-pytorch" if stack == "pytorch" else None
    return stack


def role_of(dataset: str, row: dict) -> str:
    """"fit" for a row of its profile's fit set (:data:`FIT_MODELS`), else "held out"."""
    if is_moe_row(row):
        ds, gpu, prefix, pp = MOE_FIT
        return "fit" if (dataset == ds and row.get("gpu_type", "").startswith(gpu)
                         and row.get("model", "").startswith(prefix)
                         and (row.get("pp") or "1") == pp) else "held out"
    key = fit_profile_of(row)
    if key is None:
        return "held out"
    ds, gpu, prefixes = FIT_MODELS[key]
    if (dataset == ds and row.get("gpu_type", "").startswith(gpu)
            and row.get("model", "").startswith(prefixes)):
        return "fit"
    return "held out"


def fit_rows(rows_by_dataset: dict[str, Sequence[dict]], profile: str
             ) -> list[dict]:
    """The expressible rows of ``profile``'s fit set."""
    return [r for ds, rows in rows_by_dataset.items() for r in rows
            if role_of(ds, r) == "fit" and fit_profile_of(r) == profile
            and skip_reason(r) is None and not is_moe_row(r)]


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
                    progress: Callable[[str], None] | None = None,
                    limit: int | None = None) -> list[Outcome]:
    """Predict every vTrain row (single-node: "fit", multi-node: "held out"; the first
    ``limit`` of each file when given) with the calibrated A100 efficiency (default
    :data:`~merak_sim.costs.calibrated.CALIBRATED`)."""
    eff = efficiency or Efficiency(**{**Efficiency().to_dict(), **CALIBRATED["A100"]})
    out = []
    for name, role in (("single", "fit"), ("multi", "held out")):
        runs = vtrain_runs(Path(data_dir) / f"ground_truth_{name}.csv")[:limit]
        for r in runs:
            c = r.config
            out.append(Outcome(f"vtrain-{name}", role, r.label,
                               {"gpu": "A100", "gpus": str(c.world_size), "tp": str(c.tp),
                                "pp": str(c.pp)},
                               r.step_time_s, PreparedRun.of(r).predict(eff)))
        if progress:
            progress(f"vtrain-{name}: {len(runs)} runs")
    return out


def public_run_outcomes(path: Path, cost_model: CostModel | None = None,
                        limit: int | None = None) -> tuple[list[Outcome], list[Skipped]]:
    """Predict the expressible rows of one public-runs CSV (the first ``limit`` when
    given) with ``cost_model``, by default the calibrated model with, on Hopper GPUs,
    the profile of the row's software stack, on A100 the PyTorch profile for PyTorch
    stacks (:func:`fit_profile_of`;
    :mod:`merak_sim.validation.public_runs` maps the rows); list the rest as skipped
    with their reason. Roles follow the Hopper fits' split
    (:func:`role_of`)."""
    dataset = f"public-runs/{Path(path).stem}"
    done, skipped = [], []
    served = CalibratedCostModel()
    by_profile = {**{name: hopper_cost_model(name) for name in HOPPER_PROFILES},
                  **{name: a100_cost_model(name) for name in A100_PROFILES}}
    for row in load_rows(path)[:limit]:
        label = row_label(row)
        why = skip_reason(row)
        if why is None:
            try:
                model, cluster, cfg = row_setup(row)
                key = fit_profile_of(row)
                cm = cost_model or (by_profile[key] if key is not None and (
                    is_hopper(cluster.gpu.name) or key in A100_PROFILES) else served)
                if activation_profile(row) is not None and hasattr(cm, "with_profile"):
                    cm = cm.with_profile(activation_profile(row))
                split = stage_layers(row) if cfg.pp > 1 else None
                table = cm.cost_table(model, cluster, cfg, split)
                res = simulate(model, cluster, cfg, cost_model=cm, cost_table=table,
                               engine="evaluator", sub_cluster=True, keep_trace=False)
            except ValueError as e:
                why = f"configuration rejected: {e}"
        if why is not None:
            skipped.append(Skipped(dataset, label, why))
            continue
        pub = published_peak_bytes(row)
        mem_err = (None if pub is None else
                   comparable_peak_bytes(row, model, cluster, cfg, table,
                                         res.peak_memory_bytes)
                   / pub - 1)
        zero = f"{cfg.zero}" + (f" (HSDP {cfg.zero_group})" if cfg.zero_group else "")
        role = role_of(dataset, row)
        groups = {"gpu": cluster.gpu.name, "stack": profile_of(row), "tp": str(cfg.tp),
                  "pp": str(cfg.pp), "cp": str(cfg.cp), "zero": zero,
                  "precision": cfg.dtype, "gpu+precision": f"{cluster.gpu.name} {cfg.dtype}"}
        # MoE rows: a group of their own (issue 35's MoE target), not the dense target.
        if model.moe is not None:
            groups["moe"] = f"MoE {cluster.gpu.name}"
            del groups["gpu+precision"]  # dense rows only: the per-(GPU, precision) MAPE
        target = (target_group(role, cluster.gpu.name, cfg.dtype) if model.moe is None
                  else None)
        if target is not None:
            groups["target"] = target
        done.append(Outcome(dataset, role, label, groups, measured_step_s(row),
                            res.iteration_time_s, mem_err))
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
