"""ParallelConfig validation and recompute fractions."""

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.sim.from_config import recompute_fractions


def test_microbatches_and_round_trip():
    c = ParallelConfig(dp=2, tp=4, pp=8, micro_batch_size=2, global_batch_size=256,
                       schedule="shifted-critical-path", recompute="stage-aware")
    assert c.num_microbatches == 64 and c.world_size == 64
    assert ParallelConfig.from_dict(c.to_dict()) == c
    frac = recompute_fractions(c)
    assert frac[0] == pytest.approx(0.75) and frac[-1] == 0.0 and frac[6] == frac[5]


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(dp=3, global_batch_size=8), "not divisible"),
        (dict(tp=0), "tp must be a positive integer"),
        (dict(schedule="nope"), "unknown schedule"),
        (dict(recompute="some"), "unknown recompute policy"),
        (dict(tp_overlap="sub-pipelined", micro_batch_size=3, global_batch_size=3),
         "not divisible"),
        (dict(sequence_parallel=True), "needs tp > 1"),
        (dict(zero=4), "zero stage 4 unknown; choose 0, 1, 2 or 3"),
        (dict(virtual_stages=2, pp=2), "interleaved"),
        (dict(pp=2, recompute="stage-aware", recompute_fractions=(0.5,)), "entries"),
    ],
)
def test_bad_configs_name_the_problem(kwargs, fragment):
    with pytest.raises(ValueError) as e:
        ParallelConfig(**kwargs)
    assert fragment in str(e.value)


def test_unknown_dict_key_named():
    with pytest.raises(ValueError, match="bogus"):
        ParallelConfig.from_dict({"dp": 1, "bogus": 3})
