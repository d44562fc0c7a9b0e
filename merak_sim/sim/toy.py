"""A tiny hand-made cost table for tests, examples and what-if sketches.

:func:`uniform_table` prices every model stage the same (unit costs by default), so
the simulator can be exercised without a model, a cluster or a cost model, and its
results compared with the closed forms of Merak's schedule analysis (Lai et al., TPDS
2023; f=1, b=2, r=1).
"""

from __future__ import annotations

from merak_sim.costs.base import CostTable, StageCost

__all__ = ["uniform_table"]


def uniform_table(
    num_model_stages: int,
    *,
    f: float = 1.0,
    b: float = 2.0,
    w: float | None = None,
    r: float | None = None,
    comm: float = 0.0,
    allreduce: float = 0.0,
    optimizer: float = 0.0,
    activation_bytes: float = 1e9,
    checkpoint_bytes: float = 1e8,
    input_bytes: float = 1e8,
    state_bytes: float = 4e9,
    p2p_bytes: float = 1e8,
    capacity: float = 80e9,
    peak_flops: float = 312e12,
    flops: float = 1e12,
    grad_bytes: float | None = None,
) -> CostTable:
    """Cost table whose every stage has forward ``f``, backward ``b`` (I = b - w,
    W = w, default w = b / 2), recompute ``r`` (default f), send time ``comm``
    (0 on the last stage), all-reduce ``allreduce`` and optimizer ``optimizer`` seconds.

    ``state_bytes`` is split as weights 1/8, gradients 1/8, optimizer 3/4 (mixed
    precision Adam: 2 + 2 + 12 bytes per parameter); ``grad_bytes`` overrides the
    gradient share (used for the all-reduce volume under contention).
    """
    ww = b / 2 if w is None else w
    rr = f if r is None else r
    g = state_bytes / 8 if grad_bytes is None else grad_bytes
    stages = tuple(
        StageCost(
            forward_s=f,
            backward_s=b,
            backward_input_s=b - ww,
            backward_weight_s=ww,
            recompute_s=rr,
            send_activation_s=comm if i < num_model_stages - 1 else 0.0,
            grad_allreduce_s=allreduce,
            optimizer_s=optimizer,
            activation_bytes=activation_bytes,
            checkpoint_bytes=checkpoint_bytes,
            input_bytes=input_bytes,
            weight_bytes=state_bytes / 8,
            grad_bytes=g,
            optimizer_bytes=state_bytes - state_bytes / 8 - g,
            p2p_bytes=p2p_bytes if i < num_model_stages - 1 else 0.0,
            flops=flops,
            layers=1,
        )
        for i in range(num_model_stages)
    )
    return CostTable(stages=stages, memory_capacity_bytes=capacity, peak_flops=peak_flops,
                     notes=("uniform toy costs",), meta={"source": "toy"})
