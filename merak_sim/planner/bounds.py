"""Stage 3 of the planner: a lower bound on a candidate's iteration time.

A rank runs its actions one after another, so the iteration lasts at least the busiest
rank's sum of forwards, backwards (with the recompute the policy forces), gradient
reduction and optimizer step. The planner visits candidates in increasing bound order
and stops once the bound exceeds the K-th best exact time (branch and bound).
"""

from __future__ import annotations

import numpy as np

from merak_sim.schedule import SCHEDULES

from .grid import rank_grid
from .space import Candidate

__all__ = ["lower_bound", "bound_parts", "bound_values"]


def bound_parts(arr: dict[str, np.ndarray], placement: str, num_stages: int,
                virtual_stages: int) -> tuple:
    """What :func:`lower_bound` reads of ``arr`` for one placement, whatever the
    schedule, recompute policy and micro-batch count: the grid and the per-rank sums
    (a planner bounds many candidates on one set of arrays). The arrays may carry
    leading axes (one row per set of stage arrays); every part then has them too, and
    each row equals the part of that row alone."""
    S = num_stages
    F, B, BI = arr["forward_s"], arr["backward_s"], arr["backward_input_s"]
    grid = rank_grid(placement, S, virtual_stages)

    def per_rank(x):
        return x[..., grid].sum(axis=-2)

    zero = np.zeros(F.shape[:-1] + (1,))
    prefix = np.concatenate([zero, np.cumsum(F[..., :S - 1], axis=-1)], axis=-1)
    # Stages after rank r's deepest model stage (grid.max(axis=0)[r]).
    rev = np.concatenate([np.cumsum(BI[..., ::-1], axis=-1)[..., ::-1][..., 1:], zero],
                         axis=-1)  # sum over g' > g
    chain = F.sum(axis=-1)[..., None] + rev[..., grid.max(axis=0)]
    return (per_rank(F), per_rank(B), per_rank(arr["recompute_s"]),
            per_rank(arr["optimizer_s"]), per_rank(arr["grad_allreduce_s"]), prefix, chain)


def bound_values(parts: tuple, microbatches: int, full: np.ndarray | bool,
                 overlap: np.ndarray | bool, never: frozenset[int], explicit: bool
                 ) -> np.ndarray:
    """The bound of :func:`lower_bound` from :func:`bound_parts` ``parts`` (leading axes
    allowed), per row: ``full`` whether the row's policy is full recompute,
    ``overlap`` whether its DP synchronisation is overlapped (both broadcast against
    the leading axes), ``never`` the schedule's never-recompute ranks, ``explicit``
    whether it re-forwards explicitly."""
    pF, pB, pR, p_opt, p_ar, prefix, chain = parts
    M = microbatches
    full = np.asarray(full)[..., None]
    # With the DP synchronisation overlapped (overlap_param_gather) the gradient
    # reduction runs beside the backwards, so only the optimizer step must follow.
    tail = np.where(np.asarray(overlap)[..., None], p_opt, p_opt + p_ar)
    bwd = M * pB
    fwd = M * pF
    if full.any():
        rc = M * np.minimum(pR, pF)
        rc[..., sorted(never)] = 0.0
        fwd = np.where(full, fwd + rc, fwd)
        if not explicit:
            bwd = np.where(full, bwd + rc, bwd)
    a = prefix + fwd + M * pB + tail
    b = chain + bwd + tail
    return np.maximum(a, b).max(axis=-1) * (1 - 1e-9)


def lower_bound(c: Candidate, arr: dict[str, np.ndarray], parts: tuple | None = None
                ) -> float:
    """Lower bound on the iteration time of ``c`` priced by ``arr`` (stage arrays);
    ``parts``: :func:`bound_parts` of ``arr`` for ``c``'s placement, when known.

    Per rank r, the larger of (a) the forward of one micro-batch through the model
    stages before r (r cannot start earlier) plus all of r's work, and (b) one
    micro-batch's forward through every model stage and input-gradient pass back
    through the stages after r's last chunk (r's first backward cannot start earlier)
    plus all of r's backward work, gradient reduction and optimizer step. Transfers
    only add time, so both are valid bounds; (b) is what sees the pipeline bubble.
    The gradient reduction counts only when it is not overlapped with the backwards.
    Recompute counts only where it must follow the gradient (inside B under 1F1B-style
    full recompute); a schedule with explicit re-forwards may re-forward while waiting.
    """
    S, v = c.pp, c.virtual_stages
    spec = SCHEDULES[c.schedule]
    if parts is None:
        parts = bound_parts(arr, spec.placement, S, v)
    return float(bound_values(parts, c.microbatches, c.recompute == "full",
                              c.overlap_param_gather, spec.never_recompute(S),
                              spec.explicit_recompute))
