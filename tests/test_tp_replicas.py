"""Replicated parameters agree across tensor-parallel ranks from the start."""

from support.workers import launch_scenario


def test_replicated_parameters_synced_across_tp_ranks(tmp_path):
    codes, res = launch_scenario(2, "scenario_tp_replicas", {}, str(tmp_path))
    assert codes == [0, 0], res
    assert "exception" not in res[0], res[0]
    assert len(res[0]) >= 6 and res[0] == res[1]  # per-rank seeds differed
