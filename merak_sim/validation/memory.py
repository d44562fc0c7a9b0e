"""Memory prediction against measurement: activation peaks and parameter bytes per
pipeline stage.

The activation peak measured in the run (saved-tensor hooks) is held against the
simulated peak minus the model state; the parameter bytes against an analytic count
of the built-in GPT's parameters on that stage, split the way the runtime splits the
model (:func:`merak_sim.partition.uniform` over the transformer blocks, the
embedding on the first stage and the head on the last).
"""

from __future__ import annotations

import pandas as pd

from merak_sim.partition import uniform
from merak_sim.validation.report import relative_error
from merak_sim.validation.rundir import MeasuredRun

__all__ = ["gpt_param_bytes", "memory_table"]


def gpt_param_bytes(model: dict, pp: int, tp: int, bytes_per_param: int = 4) -> list[int]:
    """Analytic parameter bytes per pipeline stage of the built-in GPT (pre-LN blocks
    with biases, learned positions, tied head; the last stage keeps its own copy of the
    tied embedding when it lives on another rank; TP shards qkv / fc columns with their
    biases, proj / fc2 rows without, and the vocabulary rows of the embedding). The
    blocks are split as the runtime splits them: :func:`merak_sim.partition.uniform`."""
    h, V, P, L = model["n_embd"], model["vocab_size"], model["n_positions"], model["n_layer"]
    sharded = (3 * h * h + h * h + 4 * h * h + 4 * h * h + 3 * h + 4 * h) // tp
    block = sharded + 2 * h + 4 * h  # + proj / fc2 biases and two layer norms
    # The vocabulary is split over TP ranks (vocab-parallel embedding and head).
    emb, head = (V // tp) * h + P * h, 2 * h
    out = []
    for s, (first, stop) in enumerate(uniform(L, pp).ranges):
        n = block * (stop - first)
        n += emb if s == 0 else 0
        n += head if s == pp - 1 else 0
        if s == pp - 1 and s > 0:
            n += (V // tp) * h
        out.append(n * bytes_per_param)
    return out


def memory_table(run: MeasuredRun, sim) -> pd.DataFrame:
    """Per stage: the measured and predicted activation peak and parameter bytes and
    their errors (the measured figures the largest over the stage's ranks)."""
    cfg = sim.config
    prog = sim.trace.prog
    params = gpt_param_bytes(run.model, cfg.pp, cfg.tp)
    mem = []
    for s in range(cfg.pp):
        ms = [m for m in run.memory if m["pp_rank"] == s]
        ma = max(m["activation_peak_bytes"] for m in ms)
        pa = sim.peak_memory_bytes[s] - prog.state_bytes[s]
        mp = max(m["param_bytes"] for m in ms)
        mem.append({"stage": s, "measured_activation_bytes": ma, "predicted_activation_bytes": pa,
                    "activation_error": relative_error(pa, ma), "measured_param_bytes": mp,
                    "predicted_param_bytes": params[s],
                    "param_error": relative_error(params[s], mp)})
    return pd.DataFrame(mem)
