"""ZB-V and DualPipeV in the runtime train exactly like one process (gloo, CPU).

The V placement puts model stages r and 2S-1-r on rank r: rank 0 runs the embedding
and the loss (a tied head stays local), and the turn at rank S-1 hands chunk 0's
output to chunk 1 in memory. Each case compares 3 steps' losses, the last gradients
and the final parameters with a single-process run (relative error <= 1e-5, fp32),
for the built-in GPT and HuggingFace GPT-2, with pp 2 and pp 4.
"""

import pytest

from support.shared_launch import register
from support.workers import assert_equivalent


def C(name, model, pp, schedule, n_layer):
    # DualPipeV needs M >= 2 pp; ZB-V runs any M (one micro-batch per sample here).
    cfg = dict(pp=pp, schedule=schedule, virtual_stages=2, dtype="fp32", micro_batch_size=1,
               global_batch_size=2 * pp)
    return {"name": name, "model": model, "config": cfg, "n_layer": n_layer}


TWO = [C(f"{m} pp2 {s}", m, 2, s, 4) for m in ("gpt", "gpt2") for s in ("zb-v", "dualpipev")]
FOUR = [C(f"{m} pp4 {s}", m, 4, s, 8) for m in ("gpt", "gpt2") for s in ("zb-v", "dualpipev")]
register(2, TWO, 300)  # launched together with the other modules' cases of each world
register(4, FOUR, 300)


@pytest.mark.parametrize("world,cases", [(2, TWO), (4, FOUR)], ids=["pp2", "pp4"])
def test_v_schedules_train_like_one_process(world, cases, equivalence):
    assert_equivalent(equivalence(world, cases), cases)
