"""Checkpoint resume and bad input on 2 gloo processes (a lost rank: tests/test_faults.py)."""

import pytest

from support.workers import launch_scenario


@pytest.mark.parametrize("layout", [{"pp": 2}, {"tp": 2, "dp": 2}], ids=["pp2", "tp2xdp2"])
def test_resume_reproduces_uninterrupted_losses_and_bad_checkpoints_fail(tmp_path, layout,
                                                                        two_rank_scenarios):
    world = layout.get("pp", 1) * layout.get("tp", 1) * layout.get("dp", 1)
    if world == 2:  # pp2: one of the scenarios of the shared two-rank launch
        codes, res, arg = two_rank_scenarios["scenario_resume"]
        assert arg["layout"] == layout
    else:
        codes, res = launch_scenario(world, "scenario_resume",
                                     {"dir": str(tmp_path), "layout": layout}, str(tmp_path))
    assert codes == [0] * world, res
    for r in res:
        assert "exception" not in r, r.get("exception")
        assert r["first"] == r["full"][:2]
        # the resumed run starts from a different random init: only the checkpoint
        # (weights, AdamW state, RNG with dropout 0.1, step) can make these equal
        assert r["resumed"] == pytest.approx(r["full"][2:], rel=1e-6)
        assert "no checkpoint at" in r["errors"]["missing"]
        assert "truncated or replaced" in r["errors"]["corrupt"]
        assert all("\n" not in m for m in r["errors"].values())


def test_bad_input_is_a_one_line_error_on_every_rank(two_rank_scenarios):
    codes, res, _ = two_rank_scenarios["scenario_bad_input"]
    assert codes == [0, 0]
    assert res[0] == res[1]
    msgs = res[0]
    assert "does not match the world size 2" in msgs["degrees"]
    assert "n_head=3 is not divisible" in msgs["heads"] and "tp=2" in msgs["heads"]
    assert msgs["capture"] is not None and "split points" in msgs["capture"]
    assert "torch.export could not capture _DataDependent" in msgs["capture"]
    assert "workers.py" in msgs["capture"]  # points at the offending line
    assert all("\n" not in m for m in msgs.values())


def test_cli_bad_degrees_exit_2_with_one_line(tmp_path):
    import os

    from support.cli_runs import run_commands

    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    bad, r = run_commands([
        (["train", "--pp", "2"], str(tmp_path)),
        (["train", "--steps", "2", "--layers", "2", "--hidden", "16", "--seq", "8", "--vocab",
          "32", "--trace", str(tmp_path / "t.json")], str(tmp_path))], env, timeout_s=120)
    assert bad.returncode == 2
    lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert lines == ["merak-exec: error: dp*tp*pp = 1*1*2 = 2 does not match the world size "
                     "1; launch 2 processes or change the degrees"]
    assert r.returncode == 0, r.stderr
    assert "final loss" in r.stdout and (tmp_path / "t.json").exists()


def test_tp_replicas_stay_identical_with_dropout(two_rank_scenarios):
    codes, res, _ = two_rank_scenarios["scenario_tp_dropout"]
    assert codes == [0, 0], res
    assert "exception" not in res[0], res[0]
    # sub-pipelined TP refuses dropout (one mask per part, not per micro-batch)
    assert "sub-pipelined TP needs dropout 0" in res[0]["subpipelined_error"]
    a, b = res[0]["replicated"], res[1]["replicated"]
    assert len(a) >= 10 and a.keys() == b.keys()
    assert a == b
