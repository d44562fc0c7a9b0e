"""Published runs through ``merak-sim simulate`` (issue 34): Megatron-LM's 1T model
(Narayanan et al. 2021, Table 1: tp 8, pp 64, 3,072 GPUs, batch 3,072, interleaved)
and the 530B model of the selective-recompute paper (Korthikanti et al. 2022, Table 5:
tp 8, pp 35, 280 GPUs, 3 chunks) are accepted by the exact evaluator; runs beyond an
engine's work bound are refused at once in one line naming what can do them, exit 2;
the SimPy engine reports its progress; the merak-sim process hands its output over
before it skips the interpreter's teardown."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from merak_sim.cli import main
from merak_sim.progress import EVALUATOR_BOUND, SIMPY_BOUND, Progress
from merak_sim.sim import engine as engine_mod
from merak_sim.sim import simulate

ROOT = Path(__file__).resolve().parents[1]

T1 = json.dumps(dict(name="megatron-1t", family="gpt", layers=128, hidden=25600, heads=160,
                     seq_len=2048, vocab=51200))
B530 = json.dumps(dict(name="mt-nlg-530b", family="gpt", layers=105, hidden=20480,
                       heads=128, seq_len=2048, vocab=51200))
#: (argv, micro-batch passes pp x v x M)
RUNS = {
    "1t": (["simulate", "--model", T1, "--cluster", "dgx-a100-80g", "--nodes", "384",
            "--dp", "6", "--tp", "8", "--pp", "64", "--virtual-stages", "2",
            "--micro-batch-size", "1", "--global-batch-size", "3072",
            "--schedule", "interleaved-1f1b", "--recompute", "full"], 64 * 2 * 512),
    "530b": (["simulate", "--model", B530, "--cluster", "dgx-a100-80g", "--nodes", "35",
              "--dp", "1", "--tp", "8", "--pp", "35", "--virtual-stages", "3",
              "--micro-batch-size", "1", "--global-batch-size", "280",
              "--schedule", "interleaved-1f1b", "--recompute", "selective",
              "--sequence-parallel"], 35 * 3 * 280),
}


def with_value(argv, flag, value):
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_published_run_simulates_from_the_cli(name, capsys):
    argv, passes = RUNS[name]
    assert passes > 16384  # refused before issue 34
    assert main([*argv, "--engine", "evaluator", "--json"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    pp = int(argv[argv.index("--pp") + 1])
    assert out["engine"] == "evaluator" and out["fits_in_memory"]
    assert len(out["peak_memory_bytes"]) == pp and out["iteration_time_s"] > 0
    assert 0.3 < out["mfu"] < 0.7  # the papers report 52 % (1T) and 56 % (530B)


@pytest.mark.parametrize("name", list(RUNS))
def test_published_runs_within_both_engines_bounds(name):
    _argv, passes = RUNS[name]
    assert EVALUATOR_BOUND.admits(passes) and SIMPY_BOUND.admits(passes)
    assert EVALUATOR_BOUND.passes >= 1_000_000


def one_line_refusal(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("merak-sim: error:"), err
    for n in needles:
        assert n in lines[0], lines[0]
    assert "Traceback" not in err


def test_beyond_the_evaluator_refused_in_one_line(capsys):
    argv = with_value(RUNS["1t"][0], "--global-batch-size", str(3072 * 20))
    one_line_refusal(capsys, [*argv, "--engine", "evaluator"], "1,310,720",
                     "limit of 1,048,576 for the exact evaluator", "smaller global batch")
    # beyond every engine: the default engine names the furthest one's limit
    one_line_refusal(capsys, argv, "limit of 1,048,576 for the exact evaluator")


def test_beyond_simpy_names_the_evaluator(capsys):
    argv = with_value(RUNS["1t"][0], "--global-batch-size", str(3072 * 4))  # 262,144
    one_line_refusal(capsys, argv, "262,144", "for the SimPy engine", "--engine evaluator")


def test_full_mode_beyond_simpy_names_representative_mode(capsys):
    one_line_refusal(capsys, [*RUNS["530b"][0], "--mode", "full"], "(full mode)",
                     "for the SimPy engine", "--mode representative")


def test_simpy_engine_reports_progress(monkeypatch):
    monkeypatch.setattr(engine_mod, "PROGRESS_EVERY", 16)
    stream = io.StringIO()
    prog = Progress("lines", "simulating", stream, after_s=0.0, every_s=0.0)
    cfg = dict(dp=16, tp=1, pp=4, micro_batch_size=1, global_batch_size=256,
               schedule="1f1b", recompute="full")
    res = simulate("gpt-1.5b", "paper-3090", cfg, engine="simpy", keep_trace=False,
                   progress=prog)
    quiet = simulate("gpt-1.5b", "paper-3090", cfg, engine="simpy", keep_trace=False)
    assert res.iteration_time_s == quiet.iteration_time_s
    # 4 ranks x (16 micro-batches x (F, B) + AR + OPT) compute actions
    assert prog.total == 4 * (16 * 2 + 2)
    assert 0 < prog.done <= prog.total
    lines = stream.getvalue().splitlines()
    assert lines and all(ln.startswith("simulating: ") for ln in lines)


def test_merak_sim_process_writes_everything_before_its_quick_exit():
    """The process ends with os._exit after a large run: its JSON must be whole."""
    argv, _ = RUNS["530b"]
    out = subprocess.run([sys.executable, "-m", "merak_sim.cli", *argv, "--engine",
                          "evaluator", "--json"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["config"]["pp"] == 35
