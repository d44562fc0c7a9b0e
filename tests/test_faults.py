"""A killed or stalled rank: every other rank ends within MERAK_TIMEOUT_S + 10 s with
exactly one line, naming itself, what it was doing and a peer, and no traceback.

A representative part of the fault matrix (``benchmarks/fault_matrix.py`` runs all of
it: pp2, tp2, dp2, pp2xtp2, ZeRO-3; kill and stall; start-up, mid-step, checkpoint
save), every layout, fault and phase at least once and the hard paths (FSDP's hooks,
a multi-peer timeout, the rendezvous naming the absent rank, the store's host lost),
in one driver launch whose ranks are forked from one interpreter, beside which one
more scenario stops a real ``python -m merak_exec`` process from outside (SIGSTOP), no
fault hook involved.
"""

import pytest

TIMEOUT_S = 3.0

#: (layout, mode, phase, victim, store) -> (what every survivor's line says, what one
#: survivor's line at least says: after a multi-peer timeout the first to time out
#: names the rank that never reported; the others may see its connection close first)
SUBSET = {  # the real processes first: their interpreter starts take longest
    ("tp2", "stall", "outside", "last", "launcher"): ("with rank 1", ""),
    ("pp2", "stall", "mid-step", "last", "launcher"): ("from rank 1", ""),
    ("pp2", "kill", "checkpoint", "last", "launcher"): ("checkpoint", ""),
    ("tp2", "kill", "mid-step", "last", "launcher"): ("with rank 1", ""),
    ("dp2", "stall", "checkpoint", "last", "launcher"): ("checkpoint", ""),
    ("dp2", "stall", "load", "last", "launcher"): ("before loading with rank 1", ""),
    ("pp2xtp2", "stall", "startup", "last", "launcher"): ("rank 3 of 4 never arrived", ""),
    ("pp2xtp2", "stall", "checkpoint", "last", "launcher"):
        ("checkpoint", "; rank 3 did not report in"),
    ("pp2xtp2", "kill", "mid-step", "last", "launcher"): ("rank", ""),
    ("zero3", "stall", "mid-step", "last", "launcher"): ("(FSDP) with rank 1", ""),
    ("zero3", "kill", "mid-step", "last", "launcher"): ("(FSDP) with rank 1", ""),
    ("dp2", "kill", "startup", "0", "rank0"): ("could not reach rank 0", ""),
}


def _id(key) -> str:
    lay, mode, phase, victim, store = key
    return f"{lay}-{mode}-{phase}" + ("" if victim == "last" else f"-victim{victim}-{store}")


@pytest.fixture(scope="module")
def matrix(load_benchmark):
    """(the fault_matrix module, {SUBSET key: its finished case}), one driver launch."""
    fm = load_benchmark("fault_matrix")
    cases = [fm.scenarios([lay], [mode], [phase], victim, store)[0]
             for lay, mode, phase, victim, store in SUBSET]
    return fm, dict(zip(SUBSET, fm.run_matrix(cases, TIMEOUT_S, jobs=4), strict=True))


@pytest.mark.parametrize("key", list(SUBSET), ids=_id)
def test_every_survivor_ends_with_one_line_naming_rank_action_and_peer(matrix, key):
    fm, results = matrix
    case = results[key]
    assert fm.judge(case, TIMEOUT_S) == [], case
    assert case["ranks"], case  # there were survivors to judge
    each, some = SUBSET[key]
    lines = [got["stderr"][0] for got in case["ranks"].values()]
    for r, line in zip(case["ranks"], lines, strict=True):
        assert f"rank {r} " in line and each in line, line
        assert "/__w/" not in line and ".cc:" not in line, line  # no torch source paths
        if "did not report in" in line:  # never a live rank accused
            assert line.endswith(f"; rank {case['victim']} did not report in (dead or "
                                 "stalled)"), line
    assert any(some in line for line in lines), lines


def test_judge_refuses_what_the_promise_rules_out(load_benchmark):
    fm = load_benchmark("fault_matrix")
    line = "merak-exec: error: merak_exec: rank 0 failed in x with rank 1 (timeout 3 s): y"
    good = {"fired": 1.0, "ranks": {"0": {"code": 1, "after_s": 3.1, "stderr": [line]}}}
    assert fm.judge(good, 3.0) == []
    slow = {**good, "ranks": {"0": {**good["ranks"]["0"], "after_s": 13.5}}}
    two = {**good, "ranks": {"0": {**good["ranks"]["0"], "stderr": [line, "Traceback"]}}}
    assert fm.judge(slow, 3.0) and fm.judge(two, 3.0)
    assert fm.judge({**good, "fired": None}, 3.0) == ["the fault never fired"]
