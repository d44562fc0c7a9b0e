"""Cutting a layer chain into stages (single process)."""

import pytest

from merak_exec.capture import to_chain
from merak_exec.mesh import ExecError
from merak_exec.stages import partition_split, split_from_points
from support.models import build_model


@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama", "custom"])
def test_partitions_cover_the_chain_contiguously(kind):
    chain, _ = to_chain(build_model(kind, 6), 8)
    n = len(chain.layers)
    for method, extra in (("uniform", None), ("parameters", None), ("time", (0.5, 1.0, 2.0))):
        for S in (1, 2, 3, 6):
            rs = partition_split(chain, S, method, extra)
            assert rs[0].start == 0 and rs[-1].stop == n
            assert all(a.stop == b.start for a, b in zip(rs, rs[1:], strict=False))
            assert all(len(r) > 0 for r in rs)
    # the simulator's uniform rule: 6 blocks on 4 stages -> 1, 2, 2, 1 blocks
    assert [len(r) for r in partition_split(chain, 4)] == [2, 2, 2, 2]
    # a slow head pushes blocks away from the last stage
    rs = partition_split(chain, 2, "time", (0.0, 1.0, 4.0))
    assert len(rs[0]) > len(rs[1])


def test_bad_splits_are_one_line_errors():
    chain, _ = to_chain(build_model("gpt", 2), 8)
    with pytest.raises(ExecError, match="cannot cut 2 blocks into 3"):
        partition_split(chain, 3)
    with pytest.raises(ExecError, match="split points"):
        split_from_points(chain, [0], 2)
    with pytest.raises(ExecError, match="unknown partition method"):
        partition_split(chain, 2, "random")
    with pytest.raises(ExecError, match="needs layer_times_s"):
        partition_split(chain, 2, "time")
