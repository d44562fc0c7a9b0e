"""Replicated parameters agree across tensor-parallel ranks from the start."""


def test_replicated_parameters_synced_across_tp_ranks(two_rank_scenarios):
    codes, res, _ = two_rank_scenarios["scenario_tp_replicas"]
    assert codes == [0, 0], res
    assert "exception" not in res[0], res[0]
    assert len(res[0]) >= 6 and res[0] == res[1]  # per-rank seeds differed
