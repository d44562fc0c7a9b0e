"""A user-given rank order (``ParallelConfig.order``, ``--order``): the cost models,
the planner and the commands place groups by it; bad orders are one-line errors.
(The backend runs other orders in tests/test_exec_parallel.py.)"""

import itertools
import json

import pytest

from merak_sim.cli import main
from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.comm import group_shape
from merak_sim.hardware import get_cluster
from merak_sim.layout import AXES, DEFAULT_ORDER, RankLayout
from merak_sim.model import get_model
from merak_sim.planner import SearchSpace, search

CLUSTER = get_cluster("dgx-h100", nodes=2)
MODEL = get_model("llama3-8b")


def _cfg(order=DEFAULT_ORDER, **kw):
    kw = {"dp": 2, "tp": 8, "pp": 1, "micro_batch_size": 1, "global_batch_size": 8, **kw}
    return ParallelConfig(order=order, **kw)


def test_default_order_is_megatrons_and_explicit_default_prices_the_same():
    assert ParallelConfig().order == "tp-cp-dp-pp" == DEFAULT_ORDER
    cm = AnalyticCostModel()
    a = cm.cost_table(MODEL, CLUSTER, _cfg())
    b = cm.cost_table(MODEL, CLUSTER, ParallelConfig(dp=2, tp=8, micro_batch_size=1,
                                                     global_batch_size=8))
    assert a.stages == b.stages


def test_an_order_with_dp_fastest_moves_tp_across_nodes_and_dp_into_one():
    cm = AnalyticCostModel()
    megatron = cm.cost_table(MODEL, CLUSTER, _cfg()).stages[0]
    dp_first = cm.cost_table(MODEL, CLUSTER, _cfg("dp-tp-cp-pp")).stages[0]
    # tp=8 over ranks 0, 2, ..., 14: two nodes of four; dp=2 over ranks 0 and 1: one node.
    assert dp_first.tp_comm_fwd_s > 1.5 * megatron.tp_comm_fwd_s
    assert dp_first.grad_allreduce_s < 0.5 * megatron.grad_allreduce_s
    assert dp_first.flops == megatron.flops
    notes = cm.cost_table(MODEL, CLUSTER, _cfg("dp-tp-cp-pp")).notes
    assert any("ranks placed dp-tp-cp-pp" in n for n in notes)
    assert not any("ranks placed" in n for n in cm.cost_table(MODEL, CLUSTER, _cfg()).notes)


def test_pipeline_peers_follow_the_order():
    cm = AnalyticCostModel()
    cfg = dict(dp=2, tp=4, pp=2, global_batch_size=8)
    # Megatron: the two stages are 8 ranks apart, on two nodes; pp fastest: neighbours.
    far = cm.cost_table(MODEL, CLUSTER, _cfg(**cfg)).stages[0]
    near = cm.cost_table(MODEL, CLUSTER, _cfg("pp-tp-cp-dp", **cfg)).stages[0]
    assert near.send_activation_s < far.send_activation_s


@pytest.mark.parametrize("order", ["-".join(p) for p in itertools.permutations(AXES)])
def test_groups_of_one_kind_are_congruent_for_powers_of_two(order):
    # What lets the cost model price a stage by the group of its first rank.
    lay = RankLayout(dp=4, tp=4, pp=2, cp=2, order=order)
    cluster = get_cluster("dgx-h100", nodes=8)
    for kind in AXES:
        shapes = {group_shape(g, cluster) for g in lay.groups(kind)}
        assert len(shapes) == 1, (order, kind, shapes)


def test_planner_searches_in_the_given_order():
    kw = dict(tp=(8,), pp=(1,), micro_batch_sizes=(1,), schedules=("1f1b",),
              recompute=("none",), sequence_parallel=(False,), tp_overlap=("none",),
              zero=(0,))
    res = {o: search(MODEL, CLUSTER, 8, space=SearchSpace(order=o, **kw), top_k=1,
                     confirm=False) for o in (DEFAULT_ORDER, "dp-tp-cp-pp")}
    for o, r in res.items():
        assert r.best.parallel.order == o
    assert (res["dp-tp-cp-pp"].best_result.iteration_time_s
            > res[DEFAULT_ORDER].best_result.iteration_time_s)


def test_search_space_rejects_a_bad_order():
    with pytest.raises(ValueError, match="search space: order must list"):
        SearchSpace(order="tp-dp-pp")


SIM = ["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2",
       "--dp", "2", "--tp", "8", "--pp", "1", "--global-batch-size", "8",
       "--micro-batch-size", "1", "--schedule", "1f1b", "--recompute", "none",
       "--engine", "evaluator", "--json"]


def _run(capsys, *args):
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_simulate_and_plan_commands_take_the_order(tmp_path, capsys):
    times = {}
    for o in (DEFAULT_ORDER, "dp-tp-cp-pp"):
        rc, out, _ = _run(capsys, *SIM, "--order", o)
        assert rc == 0
        d = json.loads(out)
        assert d["config"]["order"] == o
        times[o] = d["iteration_time_s"]
    assert times["dp-tp-cp-pp"] > times[DEFAULT_ORDER]
    plan = tmp_path / "plan.json"
    rc, _, err = _run(capsys, "plan", "--model", "llama3-8b", "--cluster", "dgx-h100",
                      "--nodes", "2", "--global-batch-size", "8", "--tp", "8", "--pp", "1",
                      "--schedules", "1f1b", "--micro-batch-sizes", "1", "--top", "1",
                      "--no-confirm", "--order", "dp-tp-cp-pp", "--out", str(plan))
    assert rc == 0, err
    assert json.loads(plan.read_text())["parallel"]["order"] == "dp-tp-cp-pp"
    rc, out, _ = _run(capsys, "simulate", "--plan", str(plan), "--engine", "evaluator",
                      "--json")
    assert rc == 0 and json.loads(out)["config"]["order"] == "dp-tp-cp-pp"
    rc, _, err = _run(capsys, "simulate", "--plan", str(plan), "--order", DEFAULT_ORDER)
    assert rc == 2 and "--plan fixes --order" in err


@pytest.mark.parametrize("cmd", [
    SIM,
    ["costs", "--model", "llama3-8b", "--cluster", "dgx-h100", "--tp", "8"],
    ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch-size", "8",
     "--no-confirm"],
])
@pytest.mark.parametrize("bad", ["tp-dp-pp", "tp-tp-dp-pp", "tp-cp-dp-ep"])
def test_bad_order_is_one_line_naming_the_value_and_the_fix(tmp_path, capsys, cmd, bad):
    args = [*cmd, "--order", bad]
    if cmd[0] == "plan":
        args += ["--out", str(tmp_path / "p.json")]
    rc, _, err = _run(capsys, *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, err
    assert repr(bad) in lines[0] and "'tp-cp-dp-pp'" in lines[0], lines[0]
    assert not (tmp_path / "p.json").exists()
