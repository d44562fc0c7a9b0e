"""ZeRO-2/3 through torch FSDP2 trains exactly like one process.

gloo ranks on CPU, tiny GPT, fp32: ZeRO-2 (parameters kept gathered from forward to
backward) and ZeRO-3 (resharded after every forward), pairwise with the schedule
(1f1b, gpipe), the recompute policy, pipeline (pp2, tied embedding across the two
ends) and tensor parallelism (tp2): 3 steps' losses and the final parameters (full
tensors gathered from the shards) against a single-process run, relative error
<= 1e-5. (ZeRO-3's parameter memory per rank: tests/test_exec_zero.py.)
"""

import pytest

from support.shared_launch import register
from support.workers import assert_equivalent

from merak_sim.config import ParallelConfig
from merak_sim.executable import unsupported


def C(name, **kw):
    kw.update(dtype="fp32", micro_batch_size=1)
    kw.setdefault("global_batch_size", 4 * kw.get("dp", 1))
    return {"name": name, "config": kw}


TWO = [
    C("dp2 zero3 1f1b none", dp=2, zero=3),
    C("dp2 zero2 gpipe full", dp=2, zero=2, schedule="gpipe", recompute="full"),
]
FOUR = [
    C("pp2 dp2 zero3 gpipe none", pp=2, dp=2, zero=3, schedule="gpipe"),
    C("pp2 dp2 zero2 1f1b full", pp=2, dp=2, zero=2, recompute="full"),
    C("tp2 dp2 zero3 1f1b full", tp=2, dp=2, zero=3, recompute="full"),
    C("tp2 dp2 zero2 gpipe none", tp=2, dp=2, zero=2, schedule="gpipe"),
]
register(2, TWO, 400)  # launched together with the other modules' cases of each world
register(4, FOUR, 600)


def test_fsdp_dp2_equals_single_process(equivalence):
    assert_equivalent(equivalence(2, TWO), TWO)


def test_fsdp_with_pp2_and_tp2_equals_single_process(equivalence):
    assert_equivalent(equivalence(4, FOUR), FOUR)


@pytest.mark.parametrize("kw, fragment", [
    (dict(schedule="zb-h1"), "I/W actions"),
    (dict(tp=2, sequence_parallel=True), "sequence parallelism"),
])
def test_fsdp_refuses_split_backwards_and_sequence_parallel(kw, fragment):
    kw = dict(dp=2, global_batch_size=8, micro_batch_size=1, **kw)
    kw["pp"] = 2 if "schedule" in kw else 1
    why = unsupported(ParallelConfig(zero=3, **kw))
    assert why is not None and fragment in why and "ZeRO-3 (torch FSDP2)" in why
    assert unsupported(ParallelConfig(zero=1, **kw)) is None

