"""The data-parallel sync group of merak_sim.costs.sharded_dp, built from the layout's
strides, is every (data, context) coordinate of its (pipeline, tensor) rank, as
RankLayout.rank numbers them."""

import itertools

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs.sharded_dp import sync_groups
from merak_sim.layout import RankLayout


@pytest.mark.parametrize("dp,tp,pp,cp", list(itertools.product([1, 2, 3], [1, 2, 4],
                                                                [1, 3], [1, 2])))
def test_sync_group_is_every_data_and_context_coordinate(dp, tp, pp, cp):
    c = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch_size=1,
                       global_batch_size=dp * 8)
    lay = RankLayout.of(c)
    for p, t in itertools.product(range(pp), range(tp)):
        ranks, _shard, _rep = sync_groups(c, p, t)
        want = sorted(lay.rank(p, d, t, x) for d in range(dp) for x in range(cp))
        assert ranks == tuple(want) and all(type(r) is int for r in ranks)
    with pytest.raises(ValueError, match="pp index"):
        sync_groups(c, pp, 0)
