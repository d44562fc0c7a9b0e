"""Fitting a GPU's efficiency curve to measured runs, within physical bounds, and
scoring it on runs it never saw.

Protocol (no peeking): the parameters of :class:`~merak_sim.costs.efficiency.Efficiency`
named in ``free`` (default :data:`FIT_PARAMS`, all of them) are fitted to the fit runs
only; the held-out runs are predicted afterwards with the fitted values and reported,
never used to choose anything. Links are not fitted: collectives come from the
cluster's measured NCCL table where it has one, and each run is priced as its software
stack ran it (:mod:`merak_sim.calibrate.stacks`), so the curve describes the GPU.

The loss is the mean absolute log error of the predicted step times (a symmetric
relative error). The search (:func:`~merak_sim.calibrate.search.coordinate_search`)
is a fixed point of its inputs: it starts from declared values (:func:`start_values`:
the GPU's published defaults clipped into the bounds; a parameter whose default is 0,
switched off, at the geometric middle of its bounds), never from an earlier fit, and
stops by a stated rule (:data:`SEARCH`: first step x2; after each round a pattern move
repeats the round's whole move if that helps; a round that gains no more than ``tol``
takes the step's square root; the first such round at a step at or below
``min_step`` ends the search; ``rounds`` caps it). Rerunning it on the same runs gives
the same constants exactly. Each run's schedule is built once (:class:`PreparedRun`),
so one loss evaluation costs a cost table and an evaluator pass per run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from merak_sim.calibrate.measured import MeasuredRun, RunsError
from merak_sim.calibrate.search import coordinate_search
from merak_sim.calibrate.stacks import stack_cost_model
from merak_sim.costs.base import CostTable
from merak_sim.costs.efficiency import Efficiency, default_efficiency
from merak_sim.costs.profiles import CostProfile, gpu_family
from merak_sim.costs.protocol import CostModel
from merak_sim.schedule.ir import Schedule
from merak_sim.sim.api import schedule_of
from merak_sim.sim.evaluator import evaluate
from merak_sim.sim.from_config import recompute_fractions
from merak_sim.sim.program import compile_program

__all__ = ["BOUNDS", "CPU_BOUNDS", "FIT_PARAMS", "SEARCH", "Calibration", "Errors",
           "PreparedRun", "bounds_for", "calibrate", "errors", "fit_loss", "hold_out_every",
           "start_values"]

#: Efficiency parameters a fit moves by default (the others keep their defaults).
FIT_PARAMS = ("gemm_max", "gemm_dim_half", "gemm_flops_half", "attn_factor", "mem_bw_eff",
              "kernel_overhead_s", "host_op_s")
#: Physical limits of the parameters on a GPU, fixed before looking at any result:
#: - gemm_max <= 0.80: cuBLAS fp16 GEMMs of 4k-8k sizes on A100 reach about 250 of
#:   312 TFLOP/s (NVIDIA's "Matrix Multiplication Background" guide); >= 0.3.
#: - attn_factor <= 1: attention GEMMs (head dim 64-128) are no faster than the others.
#: - mem_bw_eff <= 0.92: STREAM-like copies reach about 90 % of HBM bandwidth.
#: - kernel_overhead_s in [1, 10] us: the device-side gap between back-to-back kernels
#:   (launch latency and tail); the host's cost per operation is host_op_s, not this.
#: - host_op_s in [10, 100] us: host seconds per modelled kernel of an eager framework
#:   (eager PyTorch's per-op dispatch alone is about 10 us; a modelled kernel stands
#:   for up to about five framework ops of 20 us).
#: - gemm_dim_half / gemm_flops_half: tile (a few to 256) and wave quantisation (up to
#:   a full-device wave of 108 SMs x 256^3-tile GEMMs, ~1e11 FLOPs).
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_max": (0.3, 0.80), "attn_factor": (0.1, 1.0), "mem_bw_eff": (0.2, 0.92),
    "gemm_dim_half": (1.0, 256.0), "gemm_flops_half": (1e6, 1e11),
    "kernel_overhead_s": (1e-6, 1e-5), "host_op_s": (1e-5, 1e-4)}
#: The limits on a CPU "device" (the ``local-cpu`` preset of merak-exec's gloo runs):
#: a CPU BLAS reaches anywhere from a few percent to all of its nominal peak, eager
#: per-op dispatch costs 5-100 us, and the host that issues the kernels is the device
#: that runs them (host_op_s stays below the per-kernel cost).
CPU_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_max": (0.02, 1.0), "attn_factor": (0.1, 1.0), "mem_bw_eff": (0.05, 1.0),
    "gemm_dim_half": (1.0, 256.0), "gemm_flops_half": (1e3, 1e10),
    "kernel_overhead_s": (5e-6, 1e-4), "host_op_s": (1e-6, 1e-4)}
#: The search's stopping rule (module docstring; the keywords of
#: :func:`~merak_sim.calibrate.search.coordinate_search`): tol is in mean |log error|
#: (1e-4: a hundredth of a percent of relative error).
SEARCH: dict[str, float] = {"step": 2.0, "tol": 1e-4, "min_step": 1.02, "rounds": 40,
                            "pattern": True}


def bounds_for(gpu_name: str) -> dict[str, tuple[float, float]]:
    """The physical bounds of the parameters on ``gpu_name`` (:data:`BOUNDS`, or
    :data:`CPU_BOUNDS` for the CPU preset)."""
    return CPU_BOUNDS if gpu_name.startswith("CPU") else BOUNDS


def start_values(gpu_name: str, free: Sequence[str],
                 bounds: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Where the search starts (module docstring): published defaults, clipped; a
    default of 0 at the geometric middle of its bounds."""
    base = default_efficiency(gpu_name)
    out = {}
    for k in free:
        lo, hi = bounds[k]
        v = getattr(base, k)
        out[k] = math.sqrt(lo * hi) if v == 0 else min(max(v, lo), hi)
    return out


@dataclass(frozen=True)
class PreparedRun:
    """A run with its schedule built once, for repeated pricing (the fit)."""

    run: MeasuredRun
    schedule: Schedule
    recompute: tuple[float, ...]

    @classmethod
    def of(cls, run: MeasuredRun) -> PreparedRun:
        """Prepare ``run`` (its schedule does not depend on the costs being fitted)."""
        sched = schedule_of(run.config)
        return cls(run, sched, recompute_fractions(run.config, sched))

    def cost_model(self, efficiency: Efficiency | None) -> CostModel:
        """The model pricing this run under ``efficiency`` (its stack's)."""
        return stack_cost_model(self.run.stack, self.run.cluster, efficiency)

    def cost_table(self, efficiency: Efficiency | None) -> CostTable:
        """The run's cost table under ``efficiency``."""
        r = self.run
        return self.cost_model(efficiency).cost_table(r.model, r.cluster, r.config)

    def predict(self, efficiency: Efficiency | None) -> float:
        """Predicted step seconds (the exact evaluator, no contention)."""
        table = self.cost_table(efficiency)
        return evaluate(compile_program(self.schedule, table, self.recompute)).makespan


@dataclass(frozen=True)
class Errors:
    """How well predictions match measured step times over some runs.

    Attributes:
        runs: how many runs.
        log_loss: mean |log(predicted / measured)| (what the fit minimises).
        mape_pct: mean absolute percentage error.
        signed_pct: mean signed percentage error (negative: predicted too fast).
        worst_pct / worst_label: the run furthest off, and which it is.
    """

    runs: int
    log_loss: float
    mape_pct: float
    signed_pct: float
    worst_pct: float
    worst_label: str


def errors(prepared: Sequence[PreparedRun], efficiency: Efficiency) -> Errors:
    """Errors of ``efficiency``'s predictions on ``prepared``."""
    rel = [(p.predict(efficiency) / p.run.step_time_s - 1, p.run.label) for p in prepared]
    worst = max(rel, key=lambda e: abs(e[0]))
    n = len(rel)
    return Errors(n, sum(abs(math.log1p(e)) for e, _ in rel) / n,
                  100 * sum(abs(e) for e, _ in rel) / n, 100 * sum(e for e, _ in rel) / n,
                  100 * worst[0], worst[1])


def fit_loss(prepared: Sequence[PreparedRun], base: Efficiency
             ) -> Callable[[dict[str, float]], float]:
    """The fit's loss: parameter changes to ``base`` -> mean absolute log error on
    ``prepared`` (a combination :class:`Efficiency` rejects scores infinity, so the
    search never picks it)."""
    meas = [p.run.step_time_s for p in prepared]

    def loss_of(x: dict[str, float]) -> float:
        try:
            e = base.with_(**x)
        except ValueError:
            return math.inf
        return sum(abs(math.log(p.predict(e) / m))
                   for p, m in zip(prepared, meas, strict=True)) / len(meas)
    return loss_of


@dataclass(frozen=True)
class Calibration:
    """A fit's outcome (:func:`calibrate`).

    Attributes:
        gpu: the GPU family fitted (:func:`~merak_sim.costs.profiles.gpu_family`).
        efficiency: the fitted curve (published defaults for parameters not free).
        free: the parameters moved; bounds / start: their limits and starting values.
        rounds_run / stopped_by_rule: how the search ended.
        published: errors on the fit runs at the published defaults (what the fit
            bought); fit: errors on the fit runs; held_out: on the held-out runs
            (None without any).
        stacks: the stacks of the fit runs.
    """

    gpu: str
    efficiency: Efficiency
    free: tuple[str, ...]
    bounds: dict[str, tuple[float, float]] = field(hash=False)
    start: dict[str, float] = field(hash=False)
    rounds_run: int
    stopped_by_rule: bool
    published: Errors
    fit: Errors
    held_out: Errors | None
    stacks: tuple[str, ...]

    @property
    def parameters(self) -> dict[str, float]:
        """The fitted values of the free parameters."""
        return {k: getattr(self.efficiency, k) for k in self.free}

    def at_bounds(self) -> list[str]:
        """Free parameters that ended at one of their bounds (the data push them
        there; worth saying next to the fit)."""
        return [k for k, v in self.parameters.items() if v in self.bounds[k]]

    def profile(self, command: str) -> CostProfile:
        """The fit as a cost profile file's content (stable: no dates or timings)."""
        rec = {"stacks": list(self.stacks), "free": list(self.free),
               "bounds": {k: list(v) for k, v in self.bounds.items()}, "start": self.start,
               "search": SEARCH, "rounds_run": self.rounds_run,
               "stopped_by_rule": self.stopped_by_rule,
               "published_defaults": _record(self.published), "fit": _record(self.fit),
               "held_out": None if self.held_out is None else _record(self.held_out)}
        return CostProfile(self.gpu, self.parameters, command, rec)


def _record(e: Errors) -> dict[str, float | int | str]:
    return {"runs": e.runs, "log_loss": e.log_loss, "mape_pct": e.mape_pct,
            "signed_pct": e.signed_pct, "worst_pct": e.worst_pct, "worst": e.worst_label}


def hold_out_every(runs: Sequence[MeasuredRun], every: int
                   ) -> tuple[list[MeasuredRun], list[MeasuredRun]]:
    """(fit, held out): every ``every``-th run (the 5th, 10th, ... for 5) held out; 0
    holds none out."""
    if every < 0 or every == 1:
        raise RunsError(f"hold out every N-th run needs N = 0 (none) or N >= 2, got {every}")
    if every == 0:
        return list(runs), []
    return ([r for i, r in enumerate(runs, 1) if i % every],
            [r for i, r in enumerate(runs, 1) if not i % every])


def _check_runs(fit_runs: Sequence[MeasuredRun], held_out: Sequence[MeasuredRun],
                free: Sequence[str]) -> str:
    if len(fit_runs) < 2:
        raise RunsError(f"{len(fit_runs)} run(s) left to fit; a fit needs at least 2 (give "
                        "more runs or hold fewer out)")
    families = sorted({gpu_family(r.cluster.gpu.name) for r in (*fit_runs, *held_out)})
    if len(families) > 1:
        raise RunsError(f"the runs are on several GPU types ({', '.join(families)}); a "
                        "profile describes one: calibrate each type's runs apart")
    bad = [k for k in free if k not in FIT_PARAMS]
    if bad or not free:
        raise RunsError(f"cannot fit {', '.join(bad) or 'no parameter'}; choose from: "
                        f"{', '.join(FIT_PARAMS)}")
    return fit_runs[0].cluster.gpu.name


def calibrate(fit_runs: Sequence[MeasuredRun], held_out: Sequence[MeasuredRun] = (), *,
              free: Sequence[str] = FIT_PARAMS, rounds: int | None = None,
              log: Callable[[str], None] | None = None) -> Calibration:
    """Fit the efficiency curve to ``fit_runs`` (module docstring) and score it on
    ``held_out``; ``rounds`` caps the search (default :data:`SEARCH`'s), ``log``
    receives the published defaults' error, then one line per round. Runs of several
    GPU families, fewer than two fit runs or an unknown parameter are one-line
    RunsErrors."""
    gpu_name = _check_runs(fit_runs, held_out, free)
    bounds = {k: bounds_for(gpu_name)[k] for k in free}
    start = start_values(gpu_name, free, bounds)
    base = default_efficiency(gpu_name)
    prepared = [PreparedRun.of(r) for r in fit_runs]
    published = errors(prepared, base)
    if log:
        log(f"published defaults: fit runs MAPE {published.mape_pct:.2f} %, mean |log "
            f"error| {published.log_loss:.4f}")
    res = coordinate_search(
        fit_loss(prepared, base), start, bounds,
        rounds=int(SEARCH["rounds"]) if rounds is None else rounds, step=SEARCH["step"],
        tol=SEARCH["tol"], min_step=SEARCH["min_step"], pattern=bool(SEARCH["pattern"]),
        log=log)
    eff = base.with_(**res.params)
    held = errors([PreparedRun.of(r) for r in held_out], eff) if held_out else None
    return Calibration(gpu_family(gpu_name), eff, tuple(free), bounds, start, res.rounds_run,
                       res.stopped_by_rule, published, errors(prepared, eff), held,
                       tuple(dict.fromkeys(r.stack for r in fit_runs)))
