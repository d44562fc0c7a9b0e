"""End to end on this machine: profile, run for real on 2 gloo processes, validate.

Structure and exact facts only (the accuracy targets are figures printed by
benchmarks/cpu_validation.py, never asserted on a shared, noisy machine): every
compute action of the schedule is measured and predicted, parameter bytes match the
analytic count exactly, activation memory and iteration time are in a generous band.
"""

from __future__ import annotations

import pytest

from merak_exec.profiling.cases import Case, MeasureError, small_gpt
from merak_exec.profiling.measure import measure_cases
from merak_sim.cli import main as cli_main
from merak_sim.schedule.ir import iter_actions
from merak_sim.sim.from_config import schedule_for
from merak_sim.validation.compare import compare_run
from merak_sim.validation.rundir import read_run
from merak_sim.validation.suite import summarize

TINY = small_gpt(layers=4, hidden=32, heads=4, vocab=64, seq=16)
BASE = dict(micro_batch_size=2, global_batch_size=8, dtype="fp32")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    cases = [Case("scp", dict(BASE, pp=2, schedule="shifted-critical-path",
                              recompute="stage-aware"), TINY),
             Case("sub", dict(BASE, tp=2, tp_overlap="sub-pipelined"), TINY)]
    return measure_cases(cases, out, steps=2, blocks=2, warmup_steps=1, repeats=2, warmup=1,
                         timeout_s=600)


def test_measured_runs_validate(runs, tmp_path):
    reps = [compare_run(d) for d in runs]
    for rep in reps:
        run = read_run(rep.run.path)
        assert run.steps == [0, 1] and len(run.wall_s) == 2
        # two blocks of one timed step: profiled before, between and after them
        assert all(s["profiles_combined"] == 3 for s in run.profile["stages"])
        # each profiler step kept, each timed step's block recorded, one error per block
        assert len(run.profile["samples"]) == 3 and run.step_block == (0, 1)
        # every rank's main-thread CPU time of each timed step, against its busy time
        assert len(run.cpu_s) == 2 and all(len(c) == 2 and min(c) > 0 for c in run.cpu_s)
        if rep.config.tp == 1:
            assert len(rep.cpu) == 4 and (rep.cpu["share"] > 0).all()
        else:  # TP compute actions wait for their collectives inside: no share
            assert rep.cpu.empty
        assert list(rep.blocks["block"]) == [0, 1] and (rep.blocks["steps"] == 1).all()
        assert rep.summary()["blocks"] == 2
        assert sorted(rep.blocks["measured_s"]) == sorted(rep.measured_makespans_s)
        probe = run.profile["machine"]["p2p_post_probe"]  # posts timed in the runtime
        # probed before each round of blocks and after the last, postings pooled
        assert probe["runs"] == len(rep.blocks) + 1
        assert probe["plain"] > 0 and probe["blocked"] + probe["plain"] >= 8 * 2 * probe["runs"]
        assert {m["rank"] for m in run.memory} == {0, 1}
        sched = schedule_for(rep.config)
        tokens = {(a.stage, str(a)) for p in sched.programs for a in iter_actions(p)
                  if not a.kind.is_comm and a.kind.name != "ALL_REDUCE"}
        got = set(zip(rep.actions["stage"], rep.actions["action"], strict=True))
        assert tokens <= got, tokens - got
        assert (rep.actions["measured_s"] > 0).all()
        assert (rep.actions["predicted_s"] > 0).all()
        assert rep.memory["param_error"].abs().max() == 0
        assert rep.memory["activation_error"].abs().max() < 0.25
        assert 0.2 < rep.predicted_iteration_s / rep.measured_iteration_s < 5
    scp = reps[0]
    kinds = set(scp.actions["kind"])
    assert {"FORWARD_NOGRAD", "RECOMPUTE"} <= kinds  # the shifted schedule's F* and R
    s = summarize(reps)
    assert s["runs"] == 2 and s["iteration_worst_abs_error"] >= s["iteration_median_abs_error"]
    png = tmp_path / "g.png"
    assert cli_main(["validate", "--run", str(runs[0]), "--gantt", str(png)]) == 0
    assert png.stat().st_size > 1000


def test_world_mismatch_is_a_clear_error(tmp_path):
    with pytest.raises(MeasureError, match="dp\\*tp\\*pp = 4"):
        measure_cases([Case("bad", dict(BASE, pp=2, tp=2), TINY)], tmp_path, timeout_s=300)
