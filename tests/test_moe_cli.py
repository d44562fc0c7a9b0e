"""Expert degrees on the command lines (issue 35): --ep / --etp / --moe-a2a-overlap come
from the one option vocabulary, simulate prints where an MoE step's time goes,
merak-exec refuses what it cannot run in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.executable import unsupported

QWEN = ["--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "8", "--tp", "1",
        "--pp", "1", "--dp", "64", "--micro-batch-size", "1", "--global-batch-size", "512",
        "--schedule", "1f1b", "--recompute", "full", "--zero", "1", "--engine", "evaluator"]


def _sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "merak_sim.cli", "simulate", *args],
                          capture_output=True, text=True, timeout=300)


def _value(out: str, label: str) -> float:
    line = next(ln for ln in out.splitlines() if ln.startswith(label))
    return float(line.split()[len(label.split())])


def test_simulate_qwen3_ep8_prints_where_the_time_goes():
    r = _sim(*QWEN, "--ep", "8")
    assert r.returncode == 0, r.stderr
    assert "ep=8 etp=1 edp=8 (ep group over 1 node(s))" in r.stdout
    per_step = next(ln for ln in r.stdout.splitlines() if ln.startswith("note: MoE per step"))
    assert "all-to-all" in per_step and "grouped GEMM" in per_step and "imbalance" in per_step
    over = _sim(*QWEN, "--ep", "8", "--moe-a2a-overlap")
    assert over.returncode == 0, over.stderr
    assert "(0.000 s exposed)" not in r.stdout and "(0.000 s exposed)" in over.stdout
    # Hiding the all-to-all never makes the step slower.
    assert _value(over.stdout, "iteration time") <= _value(r.stdout, "iteration time")


@pytest.mark.parametrize("args, fragment", [
    (QWEN + ["--ep", "6"], "etp x ep = 1 x 6 does not divide the tp x cp x dp = 64"),
    (QWEN[:1] + ["gpt-1.5b"] + QWEN[2:] + ["--ep", "2"], "needs an MoE model"),
    (QWEN + ["--ep", "0"], "--ep"),
])
def test_bad_expert_degrees_one_line_exit_2(args, fragment):
    r = _sim(*args)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and fragment in lines[0], r.stderr


def test_merak_exec_refuses_expert_parallelism_in_one_line(tmp_path):
    env = {**os.environ, "MERAK_TIMEOUT_S": "60"}
    r = subprocess.run([sys.executable, "-m", "merak_exec", "train", "--ep", "2", "--dp", "2",
                        "--steps", "1"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env=env)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.strip().splitlines() == [
        "merak-exec: error: cannot run this configuration: expert parallelism (ep=2) is "
        "simulated but not executed by merak-exec (no expert all-to-all in this runtime)"]
    assert list(tmp_path.iterdir()) == []


def test_capability_table_names_the_expert_options():
    assert unsupported(ParallelConfig(ep=1, etp=1)) is None
    assert "expert-tensor parallelism (etp=2)" in unsupported(
        ParallelConfig(dp=2, global_batch_size=2, etp=2))
    assert "expert all-to-all overlap" in unsupported(ParallelConfig(moe_a2a_overlap=True))
