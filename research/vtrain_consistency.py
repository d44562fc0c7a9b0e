"""A consistency check of measured iteration times against their sibling runs.

Some vTrain rows contradict their siblings in ways no cost of per-GPU work, bubble
and communication produces. This module states the criterion such a model must meet
and lists the rows that break it (a diagnostic: the targets still count every row).

Time model (assumptions, each a property of any fixed-order pipeline schedule whose
durations are per-GPU work and blocking communication):

- T1. An iteration is the longest path of the schedule's dependency graph plus a
  per-iteration cost C >= 0 that does not depend on the micro-batch count (the
  data-parallel all-reduce, the optimizer step, the host's step work). Its length is
  monotone in every duration.
- T2. Hence, with m micro-batches on p stages, stage g taking f_g (forward) and
  b_g (recompute + backward) per micro-batch, t_g = f_g + b_g, tau = max_g t_g at
  stage k, lambda = sum_{g<k} t_g / tau (the stages k waits for before its first forward
  and after its last backward) and t* = max_g f_g + max_g b_g, rho = t* / tau:
  ``(m + lambda) tau <= T - C <= (m + p - 1) t*``. The lower bound is the path
  through stage k; the upper bound is 1F1B with every stage raised to the slowest
  forward and backward. lambda and rho describe the stage balance only (layers per
  stage, embedding on the first, logits and loss on the last); they are read from
  the project's cost table.

Assumptions on how durations scale between two runs (E1-E3):

- E1 (one family: same model, tp, dp, pp and global batch; micro-batch b_i < b_j,
  r = b_j / b_i): every per-micro-batch duration scales as ``r`` times an efficiency
  factor in ``[1 / G, H]``: larger micro-batches make kernels no worse per sample
  (H = 1) and better by at most G. G and H are the project's cost model's own
  per-sample ratio of the two rows' stage times, its departure from 1 multiplied by
  ``slack`` (default 3) and clipped to include 1. Where the model has a per-sample
  cost rising with b (Megatron's fused-softmax availability rule), H > 1 follows.
- E2 (across families: same model, micro-batch, global batch and GPU count,
  tp_A | tp_B, pp_A | pp_B, k = tp_B pp_B / (tp_A pp_A) > 1, so dp_B = dp_A / k and
  m_B = k m_A): a stage of A holds the layers of pp_B / pp_A stages of B, each with
  GEMMs tp_B / tp_A times wider, so A's per-micro-batch durations are at most k
  times B's: its GEMMs have k times B's FLOPs at no lower efficiency (the
  efficiency of a GEMM does not fall as it grows), its split kernels k times the
  bytes, its replicated ones (layer norm, residual, dropout without sequence
  parallelism) no more than B's times k, its tensor-parallel and pipeline traffic no
  more than k times B's per GPU. No efficiency slack is needed.
- E3: C lies in ``[0, C_max]``, ``C_max = c_slack * C_model + c_add`` (the cost
  model's data-parallel all-reduce and optimizer step of the row, default 3x, plus
  100 ms of host step work).

Bounds (each on one row, from one sibling; in a family, whose rows share C,
``T <= F * T_other + max(0, 1 - F) * C`` at the worst C, which is 0 when F >= 1 and
C_max otherwise; across families ``split`` below):

- ``bubble``: in a family, the larger micro-batch j is bounded by the smaller i:
  ``F = H rho_i (m_i + r (p - 1)) / (m_i + lambda_i)``. With uniform stages and H = 1
  this is the bubble ratio ``(S + (p - 1) b_j) / (S + (p - 1) b_i)`` (S = samples per
  replica): fewer, larger micro-batches can only be slower by their larger bubble.
- ``gain``: in a family, the smaller micro-batch i is bounded by the larger j:
  ``F = G rho_j (m_i + p - 1) / (m_i + r lambda_j)``: more, smaller micro-batches can
  only be slower by their efficiency loss, less their smaller bubble.
- ``split``: across families (E2), the less split row A is bounded by B:
  ``T_A <= F T_B + C_max(A)``, ``F = rho_B (m_B + k (p_A - 1)) / (m_B + lambda_B)``
  (B's lower bound, A's upper bound, A's durations at most k times B's).

A row exceeding a bound by more than ``tol`` (default 1 %: twenty times the 0.05 %
spread of the repeated 175B run) is flagged: it is slower than one of its siblings
allows. Which of the two is off cannot be told from the pair alone; the flagged row is
the one the bound caps. Not modelled, and so the natural suspects where a bound
breaks: allocator pressure near memory capacity, stragglers, a run-to-run change of
placement or software.

:func:`consistent_floor` lowers the flagged rows, and the rows their caps depend on,
until no bound breaks: a set of runs the criterion accepts, and how near the data such
a set lies (so whether the bounds alone keep a model away from the targets).

Also here, for the fit-row checks of two further hypotheses recorded in
:mod:`merak_sim.costs.deepspeed_pipe`: :func:`per_step_fit` and
:func:`with_step_cost` (a cost per pipeline step, as per-instruction host work would
leave) and :func:`layer_gemm_flops` (where the efficiency curve puts a row's GEMMs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from merak_sim.costs.base import CostTable
from merak_sim.costs.efficiency import Efficiency
from research.lines import least_squares_line
from research.vtrain import VTrainRow

__all__ = ["KINDS", "Bound", "Limits", "RowShape", "StepFit", "bounds", "consistent_floor",
           "flagged", "layer_gemm_flops", "model_as_data", "needed_slack", "per_step_fit",
           "row_shape", "with_step_cost"]

#: The bound kinds (module docstring).
KINDS = ("bubble", "gain", "split")


@dataclass(frozen=True, slots=True)
class Limits:
    """The check's stated allowances (module docstring, E1 and E3, and ``tol``)."""

    slack: float = 3.0
    c_slack: float = 3.0
    c_add_s: float = 0.1
    tol: float = 0.01

    def __post_init__(self) -> None:
        if not (self.slack >= 1 and self.c_slack >= 0 and self.c_add_s >= 0
                and self.tol >= 0):
            raise ValueError("limits need slack >= 1 and c_slack, c_add_s, tol >= 0")


@dataclass(frozen=True, slots=True)
class RowShape:
    """A row's stage balance and per-micro-batch durations from a cost table (T2).

    Attributes:
        f_max / b_max: slowest stage's forward and (recompute + backward), seconds.
        tau: the bottleneck stage's per-micro-batch time, seconds.
        lam: seconds of stages before the bottleneck, in units of tau.
        c_model_s: the table's per-iteration cost (all-reduce + optimizer, slowest
            stage), seconds.
    """

    f_max: float
    b_max: float
    tau: float
    lam: float
    c_model_s: float

    @property
    def rho(self) -> float:
        """t* / tau (1 for uniform stages)."""
        return (self.f_max + self.b_max) / self.tau


def row_shape(table: CostTable, recompute: Sequence[float]) -> RowShape:
    """:class:`RowShape` of a one-chunk-per-rank table, recompute fraction per stage."""
    st = table.stages
    f = [s.forward_s for s in st]
    b = [c * s.recompute_s + s.backward_s for s, c in zip(st, recompute, strict=True)]
    t = [x + y for x, y in zip(f, b, strict=True)]
    tau = max(t)
    # Any bottleneck stage gives a valid lower bound; take the one waiting longest.
    lam = max(sum(t[:k]) for k in range(len(t)) if t[k] == tau) / tau
    c = max(s.grad_allreduce_s + s.optimizer_s for s in st)
    return RowShape(max(f), max(b), tau, lam, c)


@dataclass(frozen=True, slots=True)
class Bound:
    """One bound on row ``row`` (index) from sibling ``other``: ``limit_s`` seconds,
    factor ``factor``; ``model_ratio`` is the model's per-sample ratio used by E1
    (1 for ``split``)."""

    kind: str
    row: int
    other: int
    factor: float
    limit_s: float
    measured_s: float
    model_ratio: float

    @property
    def excess(self) -> float:
        """Measured over the limit, minus 1 (positive: the row is too slow)."""
        return self.measured_s / self.limit_s - 1.0


def _family(r: VTrainRow) -> tuple:
    return (r.hidden, r.layers, r.heads, r.seq_len, r.tp, r.dp, r.pp, r.global_batch)


def _model(r: VTrainRow) -> tuple:
    return (r.hidden, r.layers, r.heads, r.seq_len, r.global_batch, r.gpus, r.micro_batch)


def _limit(factor: float, other_s: float, c_max: float) -> float:
    return factor * other_s + max(0.0, 1.0 - factor) * c_max


def bounds(rows: Sequence[VTrainRow], shapes: Sequence[RowShape],
           limits: Limits = Limits()) -> list[Bound]:
    """Every bound of the module docstring among ``rows`` (``shapes`` in the same
    order)."""
    if len(rows) != len(shapes):
        raise ValueError("one shape per row")
    out: list[Bound] = []
    s = limits.slack

    def c_max(i: int) -> float:
        return limits.c_slack * shapes[i].c_model_s + limits.c_add_s

    fams: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        fams.setdefault(_family(r), []).append(i)
    for idx in fams.values():
        for i in idx:
            for j in idx:
                ri, rj = rows[i], rows[j]
                if ri.micro_batch >= rj.micro_batch:
                    continue
                r = rj.micro_batch / ri.micro_batch
                p = ri.pp
                m_i = ri.global_batch / ri.dp / ri.micro_batch
                si, sj = shapes[i], shapes[j]
                # The model's per-sample ratio (j over i) of both durations of T2.
                e = (sj.tau / (r * si.tau), (sj.f_max + sj.b_max) / (r * (si.f_max + si.b_max)))
                hi = max(1.0, 1.0 + s * (max(e) - 1.0))
                lo = min(1.0, 1.0 - s * (1.0 - min(e)))
                g = 1.0 / lo if lo > 0 else float("inf")
                cm = max(c_max(i), c_max(j))
                fb = hi * si.rho * (m_i + r * (p - 1)) / (m_i + si.lam)
                out.append(Bound("bubble", j, i, fb, _limit(fb, ri.time_ms / 1e3, cm),
                                 rj.time_ms / 1e3, max(e)))
                fg = g * sj.rho * (m_i + p - 1) / (m_i + r * sj.lam)
                out.append(Bound("gain", i, j, fg, _limit(fg, rj.time_ms / 1e3, cm),
                                 ri.time_ms / 1e3, 1.0 / min(e)))
    by_model: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        by_model.setdefault(_model(r), []).append(i)
    for idx in by_model.values():
        for a in idx:
            for b in idx:
                ra, rb = rows[a], rows[b]
                if (a == b or rb.tp % ra.tp or rb.pp % ra.pp
                        or (ra.tp, ra.pp) == (rb.tp, rb.pp)):
                    continue
                k = rb.tp * rb.pp / (ra.tp * ra.pp)
                m_b = rb.global_batch / rb.dp / rb.micro_batch
                sb = shapes[b]
                f = sb.rho * (m_b + k * (ra.pp - 1)) / (m_b + sb.lam)
                out.append(Bound("split", a, b, f, f * rb.time_ms / 1e3 + c_max(a),
                                 ra.time_ms / 1e3, 1.0))
    return out


def flagged(all_bounds: Sequence[Bound], tol: float) -> Mapping[int, Bound]:
    """Rows exceeding one of their bounds by more than ``tol``, each with its most
    exceeded bound."""
    out: dict[int, Bound] = {}
    for bd in all_bounds:
        if bd.excess > tol and (bd.row not in out or bd.excess > out[bd.row].excess):
            out[bd.row] = bd
    return out


def consistent_floor(rows: Sequence[VTrainRow], all_bounds: Sequence[Bound], tol: float,
                     rounds: int = 100) -> tuple[list[float], int]:
    """The largest times (seconds), none above its row's measurement, that exceed no
    bound of ``all_bounds`` by more than ``tol``: each row capped at its bounds' limits,
    the limits recomputed from the capped siblings, until nothing moves (at most
    ``rounds`` passes; returns the times and the passes taken). A set of runs no
    sibling contradicts, as near the data as lowering the flagged rows gets: the bounds
    alone cannot hold a model of the criterion's kind further from the data than the
    floor is (the floor meets them all; a nearer set may exist)."""
    t = [r.time_ms / 1e3 for r in rows]
    meas = list(t)
    # Each bound is factor * T_other + constant in the sibling's time.
    lin = [(b.row, b.other, b.factor, b.limit_s - b.factor * meas[b.other]) for b in all_bounds]
    for n in range(1, rounds + 1):
        moved = False
        for row, other, f, c in lin:
            cap = (1.0 + tol) * (f * t[other] + c)
            if cap < t[row] * (1.0 - 1e-12):
                t[row] = cap
                moved = True
        if not moved:
            return t, n
    return t, rounds


def model_as_data(rows: Sequence[VTrainRow], shapes: Sequence[RowShape],
                  errs: Sequence[float]) -> float:
    """The largest excess over any bound when each row's time is the cost model's own
    prediction (``errs``: relative errors in the rows' order), with no slack, C at the
    model's own and no tolerance: at most rounding for a model of the kind the
    criterion assumes, so the bounds hold and are not loose by construction."""
    pred = [replace(r, time_ms=r.time_ms * (1.0 + e)) for r, e in zip(rows, errs, strict=True)]
    strict = Limits(slack=1.0, c_slack=1.0, c_add_s=0.0, tol=0.0)
    return max((b.excess for b in bounds(pred, shapes, strict)), default=0.0)


def needed_slack(rows: Sequence[VTrainRow], shapes: Sequence[RowShape], limits: Limits,
                 top: float = 10.0, step: float = 0.05) -> float | None:
    """The smallest E1 slack (a multiple of ``step`` from 1 up to ``top``) under which
    no row of ``rows`` is flagged, the other allowances as in ``limits``; None if even
    ``top`` leaves one flagged. On the fit rows it says how much slack the measured
    data themselves need."""
    def clean(i: int) -> bool:
        lim = Limits(slack=1.0 + i * step, c_slack=limits.c_slack,
                     c_add_s=limits.c_add_s, tol=limits.tol)
        return not flagged(bounds(rows, shapes, lim), limits.tol)

    # The bounds loosen as the slack grows, so the clean slacks are an upper interval.
    lo, hi = 0, round((top - 1.0) / step)
    if not clean(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if clean(mid) else (mid + 1, hi)
    return 1.0 + lo * step


def _steps(r: VTrainRow) -> int:
    return r.global_batch // r.dp // r.micro_batch + r.pp - 1


@dataclass(frozen=True, slots=True)
class StepFit:
    """Least-squares line of a group's residual (measured minus predicted, seconds)
    against its pipeline steps m + p - 1: ``intercept_s + per_step_s * steps``."""

    rows: int
    intercept_s: float
    per_step_s: float
    r2: float


def per_step_fit(rows: Sequence[VTrainRow], errs: Sequence[float]
                 ) -> dict[tuple[int, int], StepFit]:
    """Per (tp, pp) group, the residual's line against the pipeline steps (the lead a
    per-instruction host cost would leave: :mod:`merak_sim.costs.deepspeed_pipe`);
    ``errs`` are relative prediction errors in the rows' order."""
    groups: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r, e in zip(rows, errs, strict=True):
        groups.setdefault((r.tp, r.pp), []).append((_steps(r), -e * r.time_ms / 1e3))
    out = {}
    for key, pts in groups.items():
        a, b, r2 = least_squares_line([x for x, _ in pts], [y for _, y in pts])
        out[key] = StepFit(len(pts), a, b, r2)
    return out


def with_step_cost(rows: Sequence[VTrainRow], errs: Sequence[float], step_s: float,
                   pipelined_only: bool = True) -> list[float]:
    """Relative errors after adding ``step_s`` seconds per pipeline step to each
    prediction (only rows with pp > 1 when ``pipelined_only``)."""
    out = []
    for r, e in zip(rows, errs, strict=True):
        add = step_s * _steps(r) if (r.pp > 1 or not pipelined_only) else 0.0
        out.append(e + add * 1e3 / r.time_ms)
    return out


def layer_gemm_flops(eff: Efficiency, hidden: int, seq: int, micro_batch: int, tp: int,
                     peak_flops: float) -> float:
    """FLOP/s of one Megatron layer's four weight GEMMs (QKV, projection, both MLP
    halves; 1/tp of each) under the efficiency curve ``eff``: how near its ceiling the
    curve puts a row's shapes."""
    t = micro_batch * seq
    shapes = ((t, 3 * hidden // tp, hidden), (t, hidden, hidden // tp),
              (t, 4 * hidden // tp, hidden), (t, hidden, 4 * hidden // tp))
    flops = sum(2.0 * m * n * k for m, n, k in shapes)
    return flops / sum(eff.gemm_time(m, n, k, peak_flops) for m, n, k in shapes)
