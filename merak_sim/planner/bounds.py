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

__all__ = ["lower_bound"]


def lower_bound(c: Candidate, arr: dict[str, np.ndarray]) -> float:
    """Lower bound on the iteration time of ``c`` priced by ``arr`` (stage arrays).

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
    S, v, M = c.pp, c.virtual_stages, c.microbatches
    spec = SCHEDULES[c.schedule]
    F, B, BI = arr["forward_s"], arr["backward_s"], arr["backward_input_s"]

    grid = rank_grid(spec.placement, S, v)

    def per_rank(x):
        return x[grid].sum(axis=0)

    # With the DP synchronisation overlapped (overlap_param_gather) the gradient
    # reduction runs beside the backwards, so only the optimizer step must follow.
    tail = per_rank(arr["optimizer_s"])
    if not c.overlap_param_gather:
        tail = tail + per_rank(arr["grad_allreduce_s"])
    bwd = M * per_rank(B)
    fwd = M * per_rank(F)
    if c.recompute == "full":
        rc = M * np.minimum(per_rank(arr["recompute_s"]), per_rank(F))
        rc[sorted(spec.never_recompute(S))] = 0.0
        fwd = fwd + rc
        if not spec.explicit_recompute:
            bwd = bwd + rc
    prefix = np.concatenate([[0.0], np.cumsum(F[:S - 1])])
    a = prefix + fwd + M * per_rank(B) + tail
    # Stages after rank r's deepest model stage (grid.max(axis=0)[r]).
    rev = np.concatenate([np.cumsum(BI[::-1])[::-1][1:], [0.0]])  # sum over g' > g
    chain = F.sum() + rev[grid.max(axis=0)]
    b = chain + bwd + tail
    return float(np.maximum(a, b).max()) * (1 - 1e-9)
