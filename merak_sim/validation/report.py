"""The accuracy report of one validated run: headline figures, markdown and JSON.

:class:`AccuracyReport` holds a run's prediction against its measurement (built by
:func:`merak_sim.validation.compare.compare_run`): the iteration time, the per-action,
per-rank and per-stage memory tables, the per-block errors and the CPU shares.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from merak_sim.config import ParallelConfig
from merak_sim.validation.history import spread
from merak_sim.validation.profile import profile_cpu_share
from merak_sim.validation.rundir import MeasuredRun

__all__ = ["AccuracyReport", "COMPUTE_KINDS", "relative_error"]

#: The compute-stream action kinds (what the per-action error pools).
COMPUTE_KINDS = ("FORWARD", "FORWARD_NOGRAD", "RECOMPUTE", "BACKWARD", "BACKWARD_INPUT",
                 "BACKWARD_WEIGHT", "OPTIMIZER")


def relative_error(pred: float, meas: float) -> float:
    """(predicted - measured) / measured (NaN when nothing was measured)."""
    return (pred - meas) / meas if meas else float("nan")


def _finite(x):
    """``x`` with NaN and infinities as null (JSON has no NaN)."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


@dataclass(frozen=True)
class AccuracyReport:
    """Prediction versus measurement of one run
    (:func:`merak_sim.validation.compare.compare_run`).

    Attributes:
        name: run name (directory name).
        config: the configuration simulated (effective checkpoint fractions).
        measured_iteration_s / predicted_iteration_s: schedule makespans.
        contract_iteration_s: prediction with the StageCost contract only.
        replay_iteration_s: the same simulation with every compute action at its
            measured duration (a diagnostic: what the schedule, communication and
            posting model alone get wrong; the rest of the error is the profile's).
        measured_wall_s: median wall time of a step (rank 0).
        actions: per-action table (DataFrame).
        ranks: per-rank breakdown table (DataFrame).
        memory: per-stage memory table (DataFrame).
        sim: the SimResult; run: the MeasuredRun; step: the step drawn in charts.
        measured_makespans_s: makespan of every timed iteration (the spread is the
            measurement's own noise).
        blocks: per block of timed iterations, its measured and predicted iteration
            and error (DataFrame, empty when the run kept no blocks; see
            :func:`merak_sim.validation.compare.block_errors`).
        cpu: per timed iteration and rank, CPU seconds against busy seconds
            (DataFrame, empty for runs without CPU times; see
            :func:`merak_sim.validation.measured.cpu_shares`).
    """

    name: str
    config: ParallelConfig
    measured_iteration_s: float
    predicted_iteration_s: float
    contract_iteration_s: float
    measured_wall_s: float
    replay_iteration_s: float
    actions: Any
    ranks: Any
    memory: Any
    sim: Any = field(repr=False)
    run: MeasuredRun = field(repr=False)
    step: int = 0
    measured_makespans_s: tuple[float, ...] = ()
    statistic: str = "mean"
    blocks: Any = None
    cpu: Any = None

    @property
    def iteration_error(self) -> float:
        """Relative error of the predicted iteration time."""
        return relative_error(self.predicted_iteration_s, self.measured_iteration_s)

    @property
    def action_abs_errors(self) -> list[float]:
        """|relative error| of every compute-stream action (AR excluded: it includes the
        wait for the slower peer)."""
        a = self.actions
        return [abs(x) for x in a[a["kind"].isin(COMPUTE_KINDS)]["error"].dropna()]

    def kind_errors(self) -> dict[str, float]:
        """Median relative error of each stage's actions of one kind, keyed
        ``"<stage> <KIND>"`` (the report's per-action table; AR included, where it holds
        the wait for the slower peer)."""
        return {f"{st} {kind}": float(g["error"].median())
                for (st, kind), g in self.actions.groupby(["stage", "kind"])}

    def _iteration_figures(self) -> dict:
        meas = self.measured_iteration_s
        return {"run": self.name, "schedule": self.config.schedule,
                "statistic": self.statistic,
                "measured_ms": meas * 1e3,
                "predicted_ms": self.predicted_iteration_s * 1e3,
                "error": self.iteration_error,
                "contract_error": relative_error(self.contract_iteration_s, meas),
                "replay_error": relative_error(self.replay_iteration_s, meas),
                "wall_ms": self.measured_wall_s * 1e3,
                # spread of the timed iterations: how noisy the measurement itself was
                "measured_min_ms": min(self.measured_makespans_s, default=float("nan")) * 1e3,
                "measured_max_ms": max(self.measured_makespans_s, default=float("nan")) * 1e3}

    def _table_figures(self) -> dict:
        ae = self.action_abs_errors
        m, rk = self.memory, self.ranks
        return {"action_median_abs_error": statistics.median(ae) if ae else float("nan"),
                "activation_max_abs_error": float(m["activation_error"].abs().max()),
                "param_max_abs_error": float(m["param_error"].abs().max()),
                "bubble_error_ms": float((rk["predicted_bubble_s"]
                                          - rk["measured_bubble_s"]).mean() * 1e3),
                "comm_error_ms": float((rk["predicted_comm_s"]
                                        - rk["measured_comm_s"]).mean() * 1e3)}

    def _block_figures(self) -> dict:
        be = ([] if self.blocks is None or not len(self.blocks)
              else list(self.blocks["error"]))
        nan = float("nan")
        return {"blocks": len(be),
                "block_error_min": min(be, default=nan),
                "block_error_median": statistics.median(be) if be else nan,
                "block_error_max": max(be, default=nan),
                # How far the run's error can stray by the machine's drift alone: the
                # standard error of a mean over the blocks (each block priced from its
                # own profiles, so a model bias shifts them all and does not count here).
                "block_error_se": spread(be)[2] if be else nan}

    def _machine_figures(self) -> dict:
        share = [] if self.cpu is None else self.cpu["share"]
        nan = float("nan")
        stages = self.run.profile["stages"]
        # near 1: the ranks had their cores whenever they computed
        return {"cpu_share_min": float(share.min()) if len(share) else nan,
                "cpu_share_median": float(share.median()) if len(share) else nan,
                "profile_cpu_share": profile_cpu_share(self.run.profile),
                # "paired-delta": the profile measured the extra cost of a backward adding
                # into existing gradients and the pricing used it (older profiles: "fresh")
                "backward_pricing": "paired-delta" if all(
                    "backward_accum_delta_s" in st for st in stages) else "fresh"}

    def summary(self) -> dict:
        """Headline numbers as a flat dict."""
        return {**self._iteration_figures(), **self._table_figures(),
                **self._block_figures(), **self._machine_figures()}

    def to_markdown(self) -> str:
        """A readable report (markdown tables)."""
        s = self.summary()
        lines = _headline_lines(s, self.name, self.blocks)
        lines += _action_lines(self.actions, self.kind_errors())
        lines += _rank_lines(self.ranks) + _memory_lines(self.memory)
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        """One JSON object: the summary, the configuration and the tables (NaN as
        null)."""
        out = {"summary": self.summary(), "config": self.config.to_dict(),
               "actions": self.actions.to_dict(orient="records"),
               "ranks": self.ranks.to_dict(orient="records"),
               "memory": self.memory.to_dict(orient="records"),
               "blocks": self.blocks.to_dict(orient="records")}
        return json.dumps(_finite(out), default=float)

    def plot(self, path: str | Path | None = None):
        """Gantt charts on one time axis (:func:`merak_sim.timeline.plot_side_by_side`):
        the measured step closest to the median above, drawn at its effective starts,
        the simulation below. Saves to ``path`` if given; returns the Figure."""
        from merak_sim import timeline
        from merak_sim.validation.measured import step_frame

        meas = step_frame(self.run, self.step).assign(start_s=lambda d: d["eff_start_s"])
        return timeline.plot_side_by_side(meas, self.sim.events(), name=self.name, path=path)


def _headline_lines(s: dict, name: str, blocks) -> list[str]:
    """The report's opening: iteration figures, per-block errors, CPU share."""
    lines = [f"## {name}", "",
             f"iteration: measured {s['measured_ms']:.2f} ms, predicted "
             f"{s['predicted_ms']:.2f} ms, error {s['error'] * 100:+.1f} % (contract-only "
             f"{s['contract_error'] * 100:+.1f} %, replay of the measured action times "
             f"{s['replay_error'] * 100:+.1f} %); wall step {s['wall_ms']:.2f} ms; timed "
             f"iterations {s['measured_min_ms']:.1f}-{s['measured_max_ms']:.1f} ms", ""]
    if s["blocks"]:
        b = blocks
        lines += [f"per block ({s['blocks']} blocks of timed iterations, each against the "
                  "profiler steps bracketing it): errors "
                  + ", ".join(f"{e * 100:+.1f} %" for e in b["error"])
                  + f"; measured {b['measured_s'].min() * 1e3:.1f}-"
                  f"{b['measured_s'].max() * 1e3:.1f} ms, predicted "
                  f"{b['predicted_s'].min() * 1e3:.1f}-{b['predicted_s'].max() * 1e3:.1f}"
                  f" ms; standard error of their mean {s['block_error_se'] * 100:.1f} %",
                  ""]
    if s["cpu_share_min"] == s["cpu_share_min"]:  # not NaN: the run kept CPU times
        prof = s["profile_cpu_share"]
        lines += ["CPU share (a rank's main-thread CPU seconds over its busy seconds, per "
                  f"timed iteration): median {s['cpu_share_median']:.3f}, lowest "
                  f"{s['cpu_share_min']:.3f}"
                  + (f"; while profiled {prof:.3f}" if prof == prof else ""), ""]
    return lines


def _table(header: str, rows: list[str]) -> list[str]:
    """A markdown table: ``header``, its separator row, then ``rows``."""
    return [header, "|" + "---|" * (header.count("|") - 1), *rows]


def _action_lines(actions, errs: dict[str, float]) -> list[str]:
    return _table("| stage | action kind | n | measured ms | predicted ms | median error |", [
        f"| {st} | {kind} | {len(g)} | {g['measured_s'].median() * 1e3:.2f} | "
        f"{g['predicted_s'].median() * 1e3:.2f} | {errs[f'{st} {kind}'] * 100:+.1f} % |"
        for (st, kind), g in actions.groupby(["stage", "kind"])])


def _rank_lines(ranks) -> list[str]:
    return [""] + _table("| rank | compute ms (meas/pred) | exposed comm ms | bubble ms |", [
        f"| {r.rank} | {r.measured_compute_s * 1e3:.1f} / {r.predicted_compute_s * 1e3:.1f} | "
        f"{r.measured_comm_s * 1e3:.1f} / {r.predicted_comm_s * 1e3:.1f} | "
        f"{r.measured_bubble_s * 1e3:.1f} / {r.predicted_bubble_s * 1e3:.1f} |"
        for r in ranks.itertuples()])


def _memory_lines(memory) -> list[str]:
    mib = 2**20
    return [""] + _table(
        "| stage | activation MiB (meas/pred) | error | params MiB (meas/pred) |", [
            f"| {r.stage} | {r.measured_activation_bytes / mib:.3f} / "
            f"{r.predicted_activation_bytes / mib:.3f} | {r.activation_error * 100:+.1f} % | "
            f"{r.measured_param_bytes / mib:.3f} / {r.predicted_param_bytes / mib:.3f} |"
            for r in memory.itertuples()])
