"""The open-data fidelity report (``merak-sim fidelity``): one markdown document over
every dataset in the repository's data/ folder.

First the targets (per public-runs source, its held-out H100 / A100 bf16 rows: MAPE
against 10 %; peak memory within 10 % where published), then per dataset and role
(vTrain single-node = the A100 fit; llm-foundry H100 MPT-1b/7b/30b and NeMo H100 GPT-3
/ LLaMA-2 / Nemotron = the two Hopper fits; llm-foundry A100 MPT-1b/7b = the A100
PyTorch fit; every other row held out) and per group (GPU type, software stack, GPUs,
tp, pp, cp, ZeRO stage, precision): rows, MAPE, mean signed error, worst row, and the
peak-memory error where the data publishes peak memory; then every public-runs row
the model cannot express, with its reason (:mod:`merak_sim.validation.fidelity`,
:mod:`merak_sim.validation.public_runs`). Uses the shipped calibration
(:mod:`merak_sim.costs.calibrated`, :mod:`merak_sim.costs.calibrated_hopper`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from merak_sim.validation.fidelity import (
    FIT_SPLIT,
    PUBLIC_GROUPS,
    TARGET,
    TARGET_MAPE_PCT,
    VTRAIN_GROUPS,
    GroupStats,
    Outcome,
    Skipped,
    public_run_outcomes,
    summarise,
    vtrain_outcomes,
)

__all__ = ["TARGET_MEM_PCT", "FidelityReport", "check_data", "fidelity_report"]

#: Peak memory target: within this share of the published figure, per source.
TARGET_MEM_PCT = 10.0


def _table(stats) -> list[str]:
    out = ["| dataset | role | group | rows | MAPE % | mean signed % | worst % | worst row | "
           "memory rows | memory MAPE % |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in stats:
        mem = "-" if s.mem_mape_pct is None else f"{s.mem_mape_pct:.1f}"
        out.append(f"| {s.dataset} | {s.role} | {s.group} | {s.rows} | {s.mape_pct:.2f} | "
                   f"{s.signed_pct:+.2f} | {s.worst_pct:+.1f} | {s.worst_label} | "
                   f"{s.mem_rows} | {mem} |")
    return out


def _target(stats) -> list[str]:
    """The target's rows: per source, its held-out H100 / A100 bf16 group."""
    out = [f"## Target: held-out {TARGET} rows, MAPE <= {TARGET_MAPE_PCT:g} % per source",
           "", "| dataset | rows | MAPE % | mean signed % | worst % | target |",
           "|---|---|---|---|---|---|"]
    cells = {s.dataset: s for s in stats if s.group == f"target={TARGET}"}
    for ds in dict.fromkeys(s.dataset for s in stats if s.dataset.startswith("public-runs")
                            and s.role == "held out"):
        s = cells.get(ds)
        if s is None:
            out.append(f"| {ds} | 0 | - | - | - | no held-out {TARGET} rows |")
            continue
        met = "met" if s.mape_pct <= TARGET_MAPE_PCT else "missed"
        out.append(f"| {ds} | {s.rows} | {s.mape_pct:.2f} | {s.signed_pct:+.2f} "
                   f"| {s.worst_pct:+.1f} | {met} |")
    return out + [""]


def _memory_target(stats) -> list[str]:
    """Per source with published peak memory: its rows' memory MAPE against the target."""
    out = [f"## Target: peak memory within {TARGET_MEM_PCT:g} % where published (MAPE per "
           "source)", "", "| dataset | memory rows | memory MAPE % | target |", "|---|---|---|---|"]
    for s in stats:
        if s.group == "all" and s.mem_rows:
            met = "met" if s.mem_mape_pct <= TARGET_MEM_PCT else "missed"
            out.append(f"| {s.dataset} | {s.mem_rows} | {s.mem_mape_pct:.2f} | {met} |")
    return out + [""]


def _by_role(outs: list[Outcome]) -> list[Outcome]:
    """Outcomes with the dataset split by role, so fitted and held-out rows of one file
    are reported apart."""
    return [Outcome(f"{o.dataset} ({o.role})", o.role, o.label, o.groups, o.measured_s,
                    o.predicted_s, o.mem_err) for o in outs]


@dataclass(frozen=True)
class FidelityReport:
    """The report's parts.

    Attributes:
        stats: per dataset / role / group statistics (vTrain, then public runs).
        public: every predicted public-runs row; skipped: every row not expressible.
        seconds: how long the predictions took.
    """

    stats: tuple[GroupStats, ...]
    public: tuple[Outcome, ...]
    skipped: tuple[Skipped, ...]
    seconds: float

    def summary_lines(self, command: str) -> list[str]:
        """The summary: targets, the per-group table, the reasons rows were skipped
        (``command``: how the report was made, for its first line)."""
        reasons = Counter((s.dataset, s.reason) for s in self.skipped)
        n = len(self.skipped) + len(self.public)
        return [
            "# Fidelity over the open data", "",
            f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, {self.seconds:.0f} s). "
            "Calibration: merak_sim/costs/profiles/a100.json (A100 under Megatron, fitted "
            "by merak-sim calibrate to vTrain's single-node rows only) and "
            f"merak_sim/costs/calibrated_hopper.py ({FIT_SPLIT}); role \"fit\" marks the "
            "rows a fit saw, every other row is held out (never fitted to). Error = "
            "predicted / measured iteration time - 1; memory error = predicted / published "
            "peak memory - 1 (the memory model, not fitted; compared with what each "
            "source's column measures: torchtitan the caching allocator's peak reserved "
            "memory, live tensors plus the allocator's documented reservations "
            "(merak_sim/allocator_memory.py), Sailor the device's used memory, both "
            "including backward's transient tensors).", "",
            *_target(self.stats), *_memory_target(self.stats), *_table(self.stats), "",
            f"## Public-runs rows not expressible ({len(self.skipped)} of {n} rows, none "
            "dropped)", "", "| dataset | reason | rows |", "|---|---|---|",
            *[f"| {d} | {r} | {k} |" for (d, r), k in sorted(reasons.items())], ""]

    def row_lines(self) -> list[str]:
        """Every predicted and every skipped public-runs row."""
        return [
            "## Every predicted public-runs row", "",
            "| dataset | role | row | measured s | predicted s | error % | memory error % |",
            "|---|---|---|---|---|---|---|",
            *[f"| {o.dataset} | {o.role} | {o.label} | {o.measured_s:.4g} | "
              f"{o.predicted_s:.4g} | {100 * o.err:+.1f} | "
              f"{'-' if o.mem_err is None else f'{100 * o.mem_err:+.1f}'} |"
              for o in self.public],
            "", "## Every skipped row", "", "| dataset | row | reason |", "|---|---|---|",
            *[f"| {s.dataset} | {s.label.replace('|', '/')} | {s.reason} |"
              for s in self.skipped], ""]


def check_data(data: str | Path) -> None:
    """ValueError (one line naming the fix) unless ``data`` holds the open data
    (vtrain/ and public-runs/ as in the repository's data/ folder)."""
    d = Path(data)
    for sub in ("vtrain", "public-runs"):
        if not (d / sub).is_dir():
            raise ValueError(f"{d / sub} not found; pass --data with the repository's data "
                             "folder (vtrain/ and public-runs/)")


def fidelity_report(data: str | Path, limit: int | None = None,
                    progress: Callable[[str], None] | None = None) -> FidelityReport:
    """Predict every dataset of ``data`` (the first ``limit`` rows per file when given)
    and gather the report (module docstring)."""
    check_data(data)
    t0 = time.perf_counter()
    stats = summarise(vtrain_outcomes(Path(data) / "vtrain", progress=progress, limit=limit),
                      VTRAIN_GROUPS)
    public: list[Outcome] = []
    skipped: list[Skipped] = []
    for path in sorted((Path(data) / "public-runs").glob("*.csv")):
        done, sk = public_run_outcomes(path, limit=limit)
        public += done
        skipped += sk
        if progress:
            progress(f"{path.stem}: {len(done)} predicted, {len(sk)} skipped "
                     f"({time.perf_counter() - t0:.0f} s)")
    stats += summarise(_by_role(public), PUBLIC_GROUPS)
    return FidelityReport(tuple(stats), tuple(public), tuple(skipped), time.perf_counter() - t0)
