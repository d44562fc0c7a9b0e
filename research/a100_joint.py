"""An experiment: one A100 GEMM curve fitted jointly to the Megatron and PyTorch fit rows.

Today the A100 has two separate fits (:mod:`research.vtrain` on vTrain's
1,440 single-node Megatron rows; ``a100-pytorch`` of
:mod:`research.hopper_fit` on llm-foundry's 36 A100 rows of MPT-1b /
MPT-7b). Both describe the same tensor cores under the same library (cuBLAS), yet they
disagree on the GEMM curve's shape (half-points 27.8 vs 137), and the vTrain fit cannot
pin it: its loss is flat along ``gemm_dim_half`` / ``gemm_flops_half``, since its small
models (hidden 1,024 / 2,048, sequence 1,024) never reach the GEMM sizes of the
held-out rows. This module fits the curve to both fit sets at once and keeps the rest
per stack:

- shared (:data:`SHARED`): ``gemm_max``, ``gemm_dim_half``, ``gemm_flops_half``, within
  the intersection of the two fits' bounds (:func:`shared_bounds`; today the two
  agree on all three);
- per stack, as each separate fit has them, with the same bounds
  (:data:`VTRAIN_OWN`: attention factor, memory efficiency, per-kernel overhead, host
  time per kernel; :data:`PYTORCH_OWN`: memory efficiency, per-kernel overhead, host
  time per kernel, flash ceilings forward and backward).

Loss: the mean of the two sets' mean absolute log errors, each set weighted equally
(:func:`joint_loss`), so the 1,440 vTrain rows do not drown the 36 llm-foundry rows;
a row-weighted mean would give the llm-foundry rows 2.4 % of the weight. Start: the
declared starts, never an earlier fit (:func:`declared_start`: vTrain's
:data:`~research.vtrain.START` for the shared and the Megatron
parameters; for the PyTorch parameters the published A100 defaults, the start
hopper_fit's cross-validation uses,
:func:`~research.hopper_fit.published_values`, clipped into their bounds;
the committed ``a100-pytorch`` values were fitted from vTrain's earlier values instead).
Search and stopping rule: vTrain's (:data:`~research.vtrain.SEARCH`,
:func:`merak_sim.calibrate.search.coordinate_search`).

A stack's loss depends only on the shared parameters and its own, so each is memoised
on exactly those inputs (:class:`JointObjective`): a step on a PyTorch parameter does
not reprice the 1,440 vTrain rows (0.4-1.2 s per evaluation here), and a step on a
Megatron parameter does not reprice the llm-foundry rows.

Result of 2026-12-02 (``research/studies/a100_joint_fit.py``, research/results/a100_joint_fit.md;
37 rounds, stopped by the rule, 148 s): gemm_max 0.80, gemm_dim_half 8.1,
gemm_flops_half 1.23e10; fit rows vTrain single-node MAPE 6.33 % (separate 6.35 %),
llm-foundry A100 2.35 % (separate 3.17 %, but 2.35 % also when a100-pytorch is refitted
alone under the same start and rule: the gain is the protocol's, not the sharing's).
The shape is still weakly pinned: holding (gemm_dim_half, gemm_flops_half) at the vTrain
fit's (27.8, 8.9e9) gives a lower joint loss (0.04209 against 0.04247; the search ends
on a flat ridge), at a100-pytorch-alone's (1.14, 6.6e9) 0.04305, but at the committed
a100-pytorch shape (137, 2.08e10) the vTrain rows rule it out (vTrain MAPE 57 %).

Nothing here changes the committed constants: ``research/studies/a100_joint_fit.py`` runs the
fit and compares it with the separate fits, on the fit rows (the pre-declared
adoption criterion, :data:`ADOPTION`) and, after the fit, on the held-out rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from merak_sim.calibrate.search import SearchResult, coordinate_search
from merak_sim.costs.efficiency import Efficiency
from research import hopper_fit, vtrain

__all__ = ["SHARED", "VTRAIN_OWN", "PYTORCH_OWN", "PYTORCH_PROFILE", "ADOPTION",
           "ADOPTION_POINTS", "Stack", "JointObjective", "JointResult", "shared_bounds",
           "declared_start",
           "joint_loss", "joint_search", "vtrain_stack", "pytorch_stack", "pytorch_start",
           "vtrain_efficiency", "pytorch_params", "error_stats", "adoption_holds"]

#: The GEMM efficiency curve: the A100's tensor cores under cuBLAS, one in both stacks.
SHARED = ("gemm_max", "gemm_dim_half", "gemm_flops_half")
#: The Megatron (vTrain) stack's own parameters (:data:`research.vtrain.FIT_PARAMS`
#: less the shared ones).
VTRAIN_OWN = tuple(p for p in vtrain.FIT_PARAMS if p not in SHARED)
#: The PyTorch (llm-foundry) stack's own parameters (the ``a100-pytorch`` profile's keys
#: less the shared ones).
PYTORCH_OWN = ("mem_bw_eff", "kernel_overhead_s", "host_op_s", "flash_max_fwd",
               "flash_max_bwd")
#: The A100 PyTorch profile of :mod:`merak_sim.costs.calibrated_hopper`.
PYTORCH_PROFILE = "a100-pytorch"
#: Fit-row MAPE (percentage points) each stack may lose against its separate fit.
ADOPTION_POINTS = 0.5
#: The adoption criterion, declared by the lead before any result.
ADOPTION = ("adopt the joint fit if, on the FIT rows, the vTrain single-node MAPE rises "
            f"by no more than {ADOPTION_POINTS:g} points and the llm-foundry A100 fit-row "
            f"MAPE rises by no more than {ADOPTION_POINTS:g} points, each against its "
            "separate fit")


def shared_bounds(*bound_sets: Mapping[str, tuple[float, float]],
                  names: Sequence[str] = SHARED) -> dict[str, tuple[float, float]]:
    """Per shared parameter, the intersection of its bounds in every set (default: the
    vTrain fit's :data:`~research.vtrain.BOUNDS` and the A100 PyTorch
    fit's :data:`~research.hopper_fit.A100_BOUNDS`); raises ValueError
    when an intersection is empty."""
    sets = bound_sets or (vtrain.BOUNDS, hopper_fit.A100_BOUNDS)
    out = {}
    for n in names:
        lo = max(b[n][0] for b in sets)
        hi = min(b[n][1] for b in sets)
        if lo > hi:
            raise ValueError(f"the fits' bounds of {n} do not overlap: "
                             f"{[b[n] for b in sets]}")
        out[n] = (lo, hi)
    return out


@dataclass(frozen=True)
class Stack:
    """One fit set: its own parameters, their bounds and start, and its loss.

    ``loss`` takes a dict of the shared and this stack's own parameters (plain names)
    and returns the set's mean absolute log error. In the joint search the own
    parameters are named ``"<name>.<param>"`` (:meth:`key`) so two stacks may each have
    a ``mem_bw_eff``."""

    name: str
    own: tuple[str, ...]
    bounds: dict[str, tuple[float, float]] = field(hash=False)
    start: dict[str, float] = field(hash=False)
    loss: Callable[[dict[str, float]], float] = field(hash=False, compare=False)

    def key(self, param: str) -> str:
        """The joint search's name of an own parameter."""
        return f"{self.name}.{param}"

    def inputs(self, x: Mapping[str, float], shared: Sequence[str]) -> dict[str, float]:
        """The shared and own values of a joint point ``x``, by their plain names."""
        return {**{s: x[s] for s in shared}, **{p: x[self.key(p)] for p in self.own}}


def joint_loss(losses: Sequence[float]) -> float:
    """The joint objective: the plain mean of the sets' losses (each set weighted
    equally, whatever its row count)."""
    return sum(losses) / len(losses)


@dataclass(frozen=True)
class JointResult:
    """What :func:`joint_search` found.

    Attributes:
        shared: the shared parameters.
        own: per stack name, its own parameters (plain names).
        losses: per stack name, its loss at the result.
        search: the coordinate search's result (joint point, joint loss, rounds, rule).
        evaluations: per stack name, how many times its loss was actually computed
            (the memo's misses).
    """

    shared: dict[str, float]
    own: dict[str, dict[str, float]]
    losses: dict[str, float]
    search: SearchResult
    evaluations: dict[str, int]

    def values(self, stack: str) -> dict[str, float]:
        """The shared and ``stack``'s own parameters (plain names)."""
        return {**self.shared, **self.own[stack]}


class JointObjective:
    """The joint loss of ``stacks`` at a point of the joint search (shared parameters by
    name, own ones as ``"<stack>.<param>"``), with each stack's loss memoised on exactly
    its inputs (the shared values and its own): a stack is priced once per distinct
    input, and a change to any of its inputs is never served an old value. A callable
    with a cache, not a value."""

    def __init__(self, stacks: Sequence[Stack], shared: Sequence[str]) -> None:
        names = [s.name for s in stacks]
        if not names or len(set(names)) != len(names) or any("." in n for n in names):
            raise ValueError(f"stack names must be distinct and free of '.': {names}")
        self.stacks = tuple(stacks)
        self.shared = tuple(shared)
        self._memo: dict[str, dict[tuple[float, ...], float]] = {n: {} for n in names}

    def stack_loss(self, stack: Stack, x: Mapping[str, float]) -> float:
        """``stack``'s loss at the joint point ``x`` (memoised)."""
        inp = stack.inputs(x, self.shared)
        key = tuple(inp[n] for n in (*self.shared, *stack.own))
        memo = self._memo[stack.name]
        if key not in memo:
            memo[key] = stack.loss(inp)
        return memo[key]

    def __call__(self, x: Mapping[str, float]) -> float:
        return joint_loss([self.stack_loss(s, x) for s in self.stacks])

    @property
    def evaluations(self) -> dict[str, int]:
        """Per stack, how many times its loss was computed (distinct inputs)."""
        return {n: len(m) for n, m in self._memo.items()}


def joint_search(stacks: Sequence[Stack], shared_start: Mapping[str, float],
                 bounds: Mapping[str, tuple[float, float]], *,
                 log: Callable[[str], None] | None = None, **search: float
                 ) -> JointResult:
    """Minimise :func:`joint_loss` of ``stacks`` over the shared parameters (those of
    ``shared_start``, within ``bounds``) and each stack's own, by
    :func:`~merak_sim.calibrate.search.coordinate_search` with ``search``'s keywords
    (shared parameters first, then each stack's in order; :class:`JointObjective`
    prices each stack only when its inputs change)."""
    objective = JointObjective(stacks, tuple(shared_start))
    shared = objective.shared
    start = {**{n: shared_start[n] for n in shared},
             **{s.key(p): s.start[p] for s in stacks for p in s.own}}
    all_bounds = {**{n: bounds[n] for n in shared},
                  **{s.key(p): s.bounds[p] for s in stacks for p in s.own}}
    res = coordinate_search(objective, start, all_bounds, log=log, **search)
    x = res.params
    return JointResult({n: x[n] for n in shared},
                       {s.name: {p: x[s.key(p)] for p in s.own} for s in stacks},
                       {s.name: objective.stack_loss(s, x) for s in stacks}, res,
                       objective.evaluations)


def vtrain_stack(rows: Sequence[vtrain.VTrainRow]) -> Stack:
    """The Megatron stack on vTrain rows (the single-node fit rows): each row prepared
    once (:class:`~research.vtrain.PreparedRow`), priced as the vTrain fit
    prices it, from its declared start."""
    loss = vtrain.fit_loss(rows, vtrain.start_efficiency())
    return Stack("vtrain", VTRAIN_OWN, {p: vtrain.BOUNDS[p] for p in VTRAIN_OWN},
                 {p: vtrain.START[p] for p in VTRAIN_OWN}, loss)


def pytorch_start() -> dict[str, float]:
    """The PyTorch stack's declared start: the published A100 defaults of its own
    parameters (the start of hopper_fit's cross-validation) clipped into
    :data:`~research.hopper_fit.A100_BOUNDS` (host_op_s, 0 by default,
    to its floor)."""
    pub = hopper_fit.published_values(PYTORCH_PROFILE, PYTORCH_OWN)
    b = hopper_fit.A100_BOUNDS
    return {p: min(max(v, b[p][0]), b[p][1]) for p, v in pub.items()}


def pytorch_stack(rows: Sequence[dict]) -> Stack:
    """The PyTorch stack on llm-foundry A100 rows (the ``a100-pytorch`` fit rows), priced
    as :func:`research.hopper_fit.mean_log_error` prices them."""

    def loss(x: dict[str, float]) -> float:
        return hopper_fit.mean_log_error(rows, hopper_fit.HopperParams(x, PYTORCH_PROFILE))

    return Stack("pytorch", PYTORCH_OWN, {p: hopper_fit.A100_BOUNDS[p] for p in PYTORCH_OWN},
                 pytorch_start(), loss)


def declared_start() -> dict[str, float]:
    """The shared parameters' declared start: vTrain's
    :data:`~research.vtrain.START` (the published A100 defaults, gemm_max
    clipped to 0.80; also what the PyTorch start would give them)."""
    return {n: vtrain.START[n] for n in SHARED}


def vtrain_efficiency(result: JointResult) -> Efficiency:
    """The joint fit's Efficiency for the vTrain rows (as the vTrain fit's result)."""
    return vtrain.start_efficiency().with_(**result.values("vtrain"))


def pytorch_params(result: JointResult) -> hopper_fit.HopperParams:
    """The joint fit's ``a100-pytorch`` point."""
    return hopper_fit.HopperParams(result.values("pytorch"), PYTORCH_PROFILE)


def error_stats(pred: Sequence[float], meas: Sequence[float]) -> tuple[float, float]:
    """(MAPE %, mean signed error %) of predicted against measured."""
    errs = [p / m - 1 for p, m in zip(pred, meas, strict=True)]
    return (100 * sum(abs(e) for e in errs) / len(errs), 100 * sum(errs) / len(errs))


def adoption_holds(separate: Mapping[str, float], joint: Mapping[str, float],
                   points: float = ADOPTION_POINTS) -> bool:
    """Whether :data:`ADOPTION` holds: every fit set's MAPE (percent, by set name) under
    the joint fit is at most ``points`` above its separate fit's."""
    if set(separate) != set(joint):
        raise ValueError(f"the same fit sets are needed: {sorted(separate)} vs {sorted(joint)}")
    return all(joint[k] - separate[k] <= points for k in separate)
