"""merak-sim input handling: memory margin, bounded work, values and output paths
checked before any work, one flag vocabulary, 80-column output, the Python API."""

import json
import time

import pytest
from rich.console import Console

from merak_sim.cli import main

SIM = ["simulate", "--model", "gpt-1.5b", "--cluster", "paper-3090", "--dp", "16", "--tp",
       "1", "--pp", "4", "--global-batch-size", "128", "--schedule", "1f1b"]
SMALL_PLAN = ["plan", "--model", "gpt-1.5b", "--cluster", "paper-3090",
              "--global-batch-size", "32", "--tp", "1", "--pp", "4", "--schedules", "1f1b",
              "--micro-batch-sizes", "1", "--top", "1", "--no-confirm"]


def run(capsys, *args):
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_line_error(rc, err, needle=""):
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("merak-sim: error:"), err
    assert needle in lines[0], lines[0]


# -- item 2: memory margin ---------------------------------------------------------------


def test_plan_cli_honours_memory_margin(tmp_path, capsys):
    peaks = []
    for margin in ("0", "0.8"):
        # Unfused attention keeps the s x s scores: the plan needs more than 20 %.
        rc, out, _ = run(capsys, *SMALL_PLAN, "--attention", "unfused", "--memory-margin",
                         margin, "--json", "--out", str(tmp_path / f"p{margin}.json"))
        assert rc == 0
        d = json.loads(out)
        peaks.append(max(d["plan"]["predicted"]["peak_memory_bytes"]) / 2**30)
    # paper-3090 GPUs offer 22.4 GiB: a 0.8 margin plans against 20 % of it.
    assert peaks[1] <= 22.4 * 0.2 < peaks[0], peaks


@pytest.mark.parametrize("margin", ["1", "1.5", "-0.5", "x"])
def test_plan_memory_margin_out_of_range(tmp_path, capsys, margin):
    rc, _, err = run(capsys, *SMALL_PLAN, "--memory-margin", margin,
                     "--out", str(tmp_path / "p.json"))
    one_line_error(rc, err, "--memory-margin")
    assert not (tmp_path / "p.json").exists()


# -- item 4: bounded work ----------------------------------------------------------------


@pytest.mark.parametrize("args,limit", [
    (["schedule", "--schedule", "1f1b", "--pp", "100000", "--microbatches", "8"], "16,384"),
    (["schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "10000000"], "16,384"),
    (["schedule", "--schedule", "interleaved-1f1b", "--pp", "64", "--microbatches", "256",
      "--virtual-stages", "4"], "16,384"),
    ([*SIM, "--micro-batch-size", "1", "--recompute", "full", "--global-batch-size",
      "20000000"], "1,048,576"),  # beyond the evaluator: no engine does it
    ([*SIM, "--micro-batch-size", "1", "--recompute", "full", "--mode", "full",
      "--global-batch-size", "65536"], "131,072"),  # full mode is SimPy's
    (["costs", "--model", "gpt-1.5b", "--cluster", "paper-3090", "--pp", "4",
      "--global-batch-size", "20000000"], "16,384"),
])
def test_huge_inputs_refused_at_once(capsys, args, limit):
    """Each command's bound (the engine's for simulate) refuses at once in one line."""
    t0 = time.perf_counter()
    rc, _, err = run(capsys, *args)
    assert time.perf_counter() - t0 < 30
    one_line_error(rc, err, f"limit of {limit}")


def test_plan_huge_batch_prunes_and_finishes(tmp_path, capsys):
    t0 = time.perf_counter()
    rc, _, err = run(capsys, "plan", "--model", "gpt-1.5b", "--cluster", "paper-3090",
                     "--global-batch-size", "20000000", "--out", str(tmp_path / "p.json"))
    assert time.perf_counter() - t0 < 30
    # Off a terminal the search reports progress lines before the error.
    lines = [ln for ln in err.splitlines() if not ln.startswith("planning gpt-1.5b")]
    one_line_error(rc, "\n".join(lines), "work limit")


# -- item 5: values and output paths before work -----------------------------------------


@pytest.mark.parametrize("value", ["-1", "2.5", "stage-aware:1.5", "stage-aware:0.5,-1",
                                   "bogus", "full:0.5", "selective"])
def test_schedule_recompute_checked(capsys, value):
    rc, _, err = run(capsys, "schedule", "--schedule", "1f1b", "--pp", "4",
                     "--microbatches", "8", f"--recompute={value}")
    one_line_error(rc, err, "--recompute")


def test_schedule_recompute_shared_syntax(capsys):
    outs = {}
    for v in ("none", "0", "full", "1", "stage-aware:0.75"):
        rc, out, _ = run(capsys, "schedule", "--schedule", "1f1b", "--pp", "4",
                         "--microbatches", "8", f"--recompute={v}")
        assert rc == 0
        outs[v] = [ln for ln in out.splitlines() if "makespan" in ln][0].split(": ")[1]
    assert outs["none"] == outs["0"] and outs["full"] == outs["1"]
    assert outs["none"].startswith("33") and outs["full"].startswith("44")


@pytest.mark.parametrize("value", ["stage-aware:1.5", "stage-aware:x", "half"])
def test_costs_and_simulate_recompute_checked(capsys, value):
    for cmd in (["costs", "--model", "gpt-1.5b", "--cluster", "paper-3090"],
                [*SIM, "--micro-batch-size", "1"]):
        rc, _, err = run(capsys, *cmd, "--recompute", value)
        one_line_error(rc, err, "--recompute")


@pytest.mark.parametrize("flag,value", [("--global-batch-size", "0"),
                                        ("--micro-batch-size", "-2"), ("--dp", "0"),
                                        ("--nodes", "0")])
def test_batch_sizes_and_degrees_positive(capsys, flag, value):
    argv = [*SIM, "--micro-batch-size", "1", "--recompute", "full"]
    if flag in argv:
        i = argv.index(flag)
        argv[i + 1] = value
    else:
        argv += [flag, value]
    rc, _, err = run(capsys, *argv)
    one_line_error(rc, err, "must be a positive integer")


@pytest.mark.parametrize("flag", ["--out", "--csv", "--json-out"])
def test_plan_unwritable_outputs_fail_before_the_search(tmp_path, capsys, flag):
    argv = [*SMALL_PLAN, "--out", str(tmp_path / "p.json")]
    argv += [flag, "/proc/nope/x.json"]
    t0 = time.perf_counter()
    rc, _, err = run(capsys, *argv)
    assert time.perf_counter() - t0 < 3  # no search ran
    one_line_error(rc, err, f"{flag} /proc/nope/x.json: cannot write there")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cmd,flag", [
    (["schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8"], "--gantt"),
    (["schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8"], "--csv"),
    (["schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8"], "--json-out"),
    ([*SIM, "--micro-batch-size", "1", "--recompute", "full"], "--chrome-trace"),
    ([*SIM, "--micro-batch-size", "1", "--recompute", "full"], "--gantt"),
    ([*SIM, "--micro-batch-size", "1", "--recompute", "full"], "--json-out"),
    (["costs", "--model", "gpt-1.5b", "--cluster", "paper-3090"], "--json-out"),
])
def test_unwritable_outputs_one_line(tmp_path, capsys, cmd, flag):
    good = tmp_path / "ok.csv"
    extra = [] if flag == "--csv" or cmd[0] != "schedule" else ["--csv", str(good)]
    rc, _, err = run(capsys, *cmd, *extra, flag, "/proc/nope/out.file")
    one_line_error(rc, err, "cannot write there")
    assert not good.exists()  # nothing written before the check failed


def test_output_that_is_a_folder(tmp_path, capsys):
    rc, _, err = run(capsys, *SMALL_PLAN, "--out", str(tmp_path))
    one_line_error(rc, err, "is a directory")


def test_probe_leaves_nothing_behind(tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "s.csv"
    rc, _, _ = run(capsys, "schedule", "--schedule", "1f1b", "--pp", "2",
                   "--microbatches", "2", "--csv", str(out))
    assert rc == 0 and out.exists()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["deeper", "new", "s.csv"]


# -- item 6: one vocabulary --------------------------------------------------------------


def test_aliases_give_the_same_result(tmp_path, capsys):
    model = tmp_path / "m.json"
    from merak_sim.model import get_model

    model.write_text(json.dumps(get_model("gpt-1.5b").to_dict()))
    base = [a for a in SIM if a not in ("--model", "gpt-1.5b")]
    runs = [["--model", "gpt-1.5b", "--micro-batch-size", "1"],
            ["--model", str(model), "--mbs", "1"],
            ["--model-json", str(model), "--micro-batch-size", "1"]]
    times = []
    for extra in runs:
        rc, out, _ = run(capsys, *base, *extra, "--recompute", "full", "--json",
                         "--engine", "evaluator")
        assert rc == 0
        times.append(json.loads(out)["iteration_time_s"])
    assert times[0] == pytest.approx(times[1]) == pytest.approx(times[2])


def test_hidden_aliases_not_in_help(capsys):
    rc, out, _ = run(capsys, "simulate", "--help")
    assert rc == 0
    assert "--model-json" not in out and "--mbs" not in out and "--plot" not in out
    assert "--micro-batch-size" in out and "--gantt" in out and "--plan" in out


def test_json_prints_and_json_out_writes(tmp_path, capsys):
    f = tmp_path / "s.json"
    rc, out, _ = run(capsys, "schedule", "--schedule", "1f1b", "--pp", "2",
                     "--microbatches", "4", "--json")
    assert rc == 0 and json.loads(out)["format"] == "merak-schedule/1"
    rc, out, _ = run(capsys, "schedule", "--schedule", "1f1b", "--pp", "2",
                     "--microbatches", "4", "--json-out", str(f))
    assert rc == 0 and "makespan" in out
    assert json.loads(f.read_text())["format"] == "merak-schedule/1"


def test_simulate_plan_resimulates(tmp_path, capsys):
    plan = tmp_path / "p.json"
    rc, out, _ = run(capsys, *SMALL_PLAN, "--out", str(plan), "--json")
    assert rc == 0
    predicted = json.loads(out)["plan"]["predicted"]["iteration_time_s"]
    rc, out, _ = run(capsys, "simulate", "--plan", str(plan), "--engine", "evaluator",
                     "--json")
    assert rc == 0
    assert json.loads(out)["iteration_time_s"] == pytest.approx(predicted, rel=1e-9)
    rc, _, err = run(capsys, "simulate", "--plan", str(plan), "--dp", "2")
    one_line_error(rc, err, "--plan fixes --dp")


@pytest.mark.parametrize("argv", [["--version"], ["-h"], ["simulate", "-h"]])
def test_version_and_short_help(capsys, argv):
    rc, out, _ = run(capsys, *argv)
    assert rc == 0 and out.strip()


# -- item 7: 80 columns ------------------------------------------------------------------


def _lines_at_80(renderable) -> list[str]:
    con = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    con.print(renderable)
    return con.export_text().splitlines()


def test_plan_table_reads_at_80_columns():
    from merak_sim.planner import SearchSpace, search

    res = search("gpt-1.5b", "paper-3090", 32, confirm=False,
                 space=SearchSpace().with_(pp=(4,), micro_batch_sizes=(1,)))
    lines = _lines_at_80(res.rich_table(10, width=80))
    assert max(len(ln) for ln in lines) <= 80
    text = "\n".join(lines)
    # Schedule names, configurations and figures are never broken inside a word.
    for name in set(res.table.schedule):
        if name in text.replace("\n", " "):
            assert any(name in ln for ln in lines), name
    best = res.best_config
    assert f"{best.dp}.{best.tp}.{best.pp} v{best.virtual_stages}" in text
    assert "why each lost:" in text
    assert repr(res).startswith("PlanResult(gpt-1.5b on paper-3090, best dp=")


def test_costs_fit_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, _ = run(capsys, "costs", "--model", "gpt-8.3b", "--cluster", "paper-3090",
                     "--tp", "4", "--pp", "4", "--dp", "4", "--micro-batch-size", "2",
                     "--recompute", "stage-aware:0.5")
    assert rc == 0
    assert max(len(ln) for ln in out.splitlines()) <= 80
    for needle in ("fwd", "act MiB", "source", "grad-AR", "in-flight", "peak memory"):
        assert needle in out


def test_plan_progress_counts_every_candidate():
    import io

    from merak_sim.planner import SearchSpace, search
    from merak_sim.progress import Progress

    prog = Progress("lines", "planning", stream=io.StringIO())
    res = search("gpt-1.5b", "paper-3090", 32, confirm=False, progress=prog,
                 space=SearchSpace().with_(pp=(4,)))
    n = res.counts["considered"]
    assert (prog.done, prog.total) == (n, n) and prog.fraction == 1.0
    assert n == sum(res.counts[k] for k in ("pruned_rule", "pruned_memory", "bounded",
                                             "evaluated"))


def test_progress_lines_off_a_terminal():
    import io

    from merak_sim.progress import Progress

    buf = io.StringIO()
    p = Progress("lines", "planning x", stream=buf, after_s=0.0)
    p.start(10)
    p.advance(5)
    assert buf.getvalue().startswith("planning x: 5/10 (50%), ")


# -- item 8: API -------------------------------------------------------------------------


def test_dir_and_all():
    import merak_sim

    assert {"simulate", "search", "SimResult", "PlanResult", "ParallelConfig",
            "Plan"} <= set(merak_sim.__all__)
    assert set(merak_sim.__all__) <= set(dir(merak_sim))
    for name in merak_sim.__all__:
        assert getattr(merak_sim, name) is not None


def test_sim_result_repr_and_rank_check():
    import merak_sim

    res = merak_sim.simulate("gpt-1.5b", "paper-3090", dp=16, tp=1, pp=4,
                             micro_batch_size=1, global_batch_size=64, schedule="1f1b",
                             recompute="full")
    text = repr(res)
    assert len(text) < 200 and "ms/iteration" in text and "MFU" in text
    assert "fits in memory" in text
    with pytest.raises(ValueError, match="rank 999 was not simulated"):
        res.memory_timeline(rank=999)
    assert len(res.memory_timeline(rank=0)) > 0
