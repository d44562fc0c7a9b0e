"""The runtime's extension points fire once per action and posting of the program."""


def test_hooks_see_every_action_and_posting_and_are_removed(two_rank_scenarios):
    codes, res, _ = two_rank_scenarios["scenario_hooks"]
    assert codes == [0, 0], res
    kinds = set()
    for r in res:
        assert "exception" not in r, r.get("exception")
        assert r["got"] == r["want"]
        assert r["hooks_left"] == 0
        assert r["peak"] > 0
        kinds |= set(r["got"])
    # the shifted schedule's F* and R on some rank, a checkpointed layer somewhere
    assert {"start FORWARD_NOGRAD", "start RECOMPUTE", "nograd", "post_start"} <= kinds
