"""The calibration's coordinate search: its result says why it ended
(merak_sim.calibrate.search)."""

from __future__ import annotations

import math

import pytest

from merak_sim.calibrate.search import SearchResult, coordinate_search

BOUNDS = {"a": (0.1, 10.0), "b": (0.1, 10.0)}


def _loss(p: dict[str, float]) -> float:
    return abs(math.log(p["a"] / 1.7)) + abs(math.log(p["b"] / 0.3))


def _search(**kw) -> tuple[SearchResult, list[str]]:
    logs: list[str] = []
    res = coordinate_search(_loss, {"a": 1.0, "b": 1.0}, BOUNDS, log=logs.append, **kw)
    return res, logs


def test_stopped_by_its_rule():
    res, logs = _search(rounds=100, step=2.0, tol=1e-3, min_step=1.02, pattern=True)
    assert res.stopped_by_rule and res.rounds_run == len(logs) < 100
    assert "stop:" in logs[-1] and not any("stop:" in m for m in logs[:-1])
    assert res.stop_reason == f"stopped by its rule after {res.rounds_run} rounds"
    assert res.params["a"] == pytest.approx(1.7, rel=0.03)
    assert res.params["b"] == pytest.approx(0.3, rel=0.03)
    assert res.loss == _loss(res.params)
    # Deterministic: the same inputs give the same result.
    assert _search(rounds=100, step=2.0, tol=1e-3, min_step=1.02, pattern=True) == (res, logs)


def test_stopped_at_the_round_limit():
    # The same search capped below the rounds its rule needs.
    full, _ = _search(rounds=100, step=2.0, tol=1e-3, min_step=1.02, pattern=True)
    cap = full.rounds_run - 1
    res, logs = _search(rounds=cap, step=2.0, tol=1e-3, min_step=1.02, pattern=True)
    assert not res.stopped_by_rule and res.rounds_run == len(logs) == cap
    assert not any("stop:" in m for m in logs)
    assert res.stop_reason == f"stopped at the round limit ({cap} rounds)"
    assert res.loss >= full.loss


def test_defaults_run_every_round_and_zero_rounds_run_none():
    res, logs = _search(rounds=7, step=2.0)
    assert (res.rounds_run, res.stopped_by_rule, len(logs)) == (7, False, 7)
    none, logs = _search(rounds=0)
    assert (none.rounds_run, none.stopped_by_rule, logs) == (0, False, [])
    assert none.params == {"a": 1.0, "b": 1.0} and none.loss == _loss(none.params)


def test_result_unpacks_as_params_and_loss_and_is_frozen():
    res, _ = _search(rounds=3)
    params, loss = res
    assert params is res.params and loss == res.loss
    with pytest.raises(AttributeError):
        res.loss = 0.0
