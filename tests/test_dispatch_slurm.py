"""Launch scripts an HPC engineer would submit: the generated sbatch file run through a
stand-in ``srun`` (a script that starts the tasks locally with Slurm's variables set),
quoting of paths with spaces, a relative ``--script`` resolved at dispatch time,
arguments after ``--``, the environment step and a port per job.

The quoting tests put a stand-in ``torchrun`` on PATH that records the words it was
given, so they check exactly what the shell passed without starting torch; one test
runs the real torchrun and ``merak-exec train`` on two CPU ranks.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from merak_sim.cli import main
from merak_sim.config import ParallelConfig
from merak_sim.dispatch import DispatchError, write_launch
from merak_sim.plan import Plan

MODEL = {"family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128}

# srun: skip its options, start SLURM_NNODES tasks of the command locally, each with
# the variables srun sets, and exit with the first failure.
SRUN = """#!/usr/bin/env bash
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
n=${SLURM_NNODES:-1}; pids=()
for ((i = 0; i < n; i++)); do
  SLURM_PROCID=$i SLURM_NODEID=$i SLURM_LOCALID=0 SLURM_NTASKS=$n SLURM_STEP_ID=0 "$@" &
  pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
"""
# scontrol: the job's node list is one host; `show job` knows no job (the sbatch file
# then falls back to the folder it was written to, as when Slurm keeps no record).
SCONTROL = """#!/usr/bin/env bash
if [ "$1 $2" = "show hostnames" ]; then echo "$3"; exit 0; fi
exit 1
"""
# torchrun stand-in: records its words (one JSON list per call) and exits 0.
FAKE_TORCHRUN = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["TORCHRUN_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


def _plan(**kw) -> Plan:
    cfg = dict(pp=2, micro_batch_size=2, global_batch_size=8, schedule="1f1b", dtype="fp32")
    cfg.update(kw)
    return Plan(model=MODEL, cluster={"preset": "local-cpu"}, parallel=ParallelConfig(**cfg))


def _tools(folder: Path, **scripts: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in scripts.items():
        p = folder / name
        p.write_text(text)
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return folder


def _job_id_with_free_port() -> int:
    """A job id whose port (29500 + id mod 1000, as the sbatch file derives it) is free."""
    for job in range(7000, 8000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 29500 + job % 1000))
            except OSError:
                continue
            return job
    pytest.fail("no free port in 29500-30499 for the sbatch file's port rule; free one")


def _path_without(tool: str, folder: Path) -> str:
    """A PATH of one folder linking every program of /usr/bin and /bin but ``tool``, so
    the script sees no ``tool`` whatever this machine has installed."""
    folder.mkdir()
    for d in ("/usr/bin", "/bin"):
        for exe in Path(d).iterdir():
            link = folder / exe.name
            if exe.name != tool and not link.exists() and os.access(exe, os.X_OK):
                link.symlink_to(exe)
    return str(folder)


def _slurm_env(tools: Path, job: int, extra_path: str = "") -> dict[str, str]:
    """What sbatch gives the batch script, with the stand-ins first on PATH."""
    path = os.pathsep.join(p for p in (str(tools), extra_path, os.environ["PATH"]) if p)
    return dict(os.environ, PATH=path, SLURM_JOB_ID=str(job), SLURM_JOB_NODELIST="localhost",
                SLURM_NNODES="1", SLURM_CPUS_PER_TASK="2", GLOO_SOCKET_IFNAME="lo",
                MERAK_TIMEOUT_S="60")


def _recorded(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_sbatch_through_a_stand_in_srun_trains_two_cpu_ranks(tmp_path):
    """From a plan to a training job: the generated sbatch file, run as Slurm would run
    it (its variables set, srun and scontrol stand-ins), activates the venv, starts
    torchrun and merak-exec train with the arguments after -- on a token file: the
    loss falls, it evaluates, checkpoints, and merak-exec export of the checkpoint gives
    a folder transformers loads whose held-out loss is the job's last evaluation."""
    import numpy as np

    rng = np.random.default_rng(0)
    np.tile(rng.integers(0, MODEL["vocab"], 96, dtype=np.uint16), 40).tofile(
        tmp_path / "tokens.bin")
    plan_file = tmp_path / "p.json"
    _plan().save(plan_file)
    out = tmp_path / "job dir"
    assert main(["dispatch", str(plan_file), "--launcher", "slurm", "--out", str(out),
                 "--cpus-per-task", "2", "--venv", sys.prefix, "--",
                 "--data", "tokens.bin", "--steps", "4", "--lr", "3e-3", "--eval-every", "2",
                 "--eval-fraction", "0.1", "--save-dir", "ck"]) == 0
    tools = _tools(tmp_path / "bin", srun=SRUN, scontrol=SCONTROL)
    # The venv comes from the environment step alone: PATH does not hold it.
    env = _slurm_env(tools, _job_id_with_free_port())
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if Path(p) != Path(sys.executable).parent)
    proc = subprocess.run(["bash", str(out / "job.sbatch")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "parameters: " in proc.stdout
    first, final = re.search(r"first loss ([\d.]+), final loss ([\d.]+)", proc.stdout).groups()
    assert float(final) < float(first), proc.stdout[-2000:]
    evals = [float(x) for x in re.findall(r"eval step \d+ loss ([\d.]+)", proc.stdout)]
    assert len(evals) == 2 and evals[-1] < evals[0]
    assert (tmp_path / "ck" / "checkpoint-4" / "manifest.json").is_file()
    export = subprocess.run([sys.executable, "-m", "merak_exec", "export", "ck/checkpoint-4",
                             "--hf", "hf"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=200)
    assert export.returncode == 0, export.stderr
    assert _held_out_loss(tmp_path / "hf", tmp_path / "tokens.bin") == \
        pytest.approx(evals[-1], rel=1e-4)


def _held_out_loss(folder: Path, tokens: Path) -> float:
    """transformers' own loss on the job's held-out windows (global batches of 8)."""
    import torch
    from transformers import AutoModelForCausalLM

    from merak_exec.data import load_data
    from merak_exec.models.gpt import lm_loss

    ev = load_data(str(tokens), MODEL["seq_len"], MODEL["vocab"], eval_fraction=0.1).eval
    hf = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    losses = []
    with torch.no_grad():
        for start in range(0, len(ev) - 7, 8):
            ids = torch.stack([ev[i]["input_ids"] for i in range(start, start + 8)])
            losses += [float(lm_loss(hf(x[None]).logits, x[None])) for x in ids]
    return sum(losses) / len(losses)


def test_paths_with_spaces_and_arguments_reach_torchrun_intact(tmp_path, monkeypatch):
    """A relative --script (with spaces) resolved at dispatch time, arguments after --
    (with spaces and quotes), and an out folder with spaces: torchrun receives each as
    one word, from any folder the script is started in."""
    (tmp_path / "my scripts").mkdir()
    (tmp_path / "my scripts" / "train me.py").write_text("print('hi')\n")
    _plan().save(tmp_path / "p.json")
    monkeypatch.chdir(tmp_path)
    args = ["--steps", "100", "--note", "it's a \"test\" $HOME", "--data", "my data.bin"]
    for launcher in ("torchrun", "slurm"):
        assert main(["dispatch", "p.json", "--launcher", launcher, "--out",
                     f"out {launcher}", "--script", "my scripts/train me.py", "--",
                     *args]) == 0
    monkeypatch.chdir("/")
    log = tmp_path / "torchrun.log"
    tools = _tools(tmp_path / "bin", srun=SRUN, scontrol=SCONTROL, torchrun=FAKE_TORCHRUN)
    env = dict(_slurm_env(tools, 4321), TORCHRUN_LOG=str(log))
    for script in ("out torchrun/launch.sh", "out slurm/job.sbatch"):
        r = subprocess.run(["bash", str(tmp_path / script)], cwd=tmp_path / "my scripts",
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    standalone, slurm = _recorded(log)
    for words, folder in ((standalone, "out torchrun"), (slurm, "out slurm")):
        i = words.index(str(tmp_path / "my scripts" / "train me.py"))
        assert words[i + 1:] == ["--plan", str(tmp_path / folder / "plan.json"), *args]
    assert "--standalone" in standalone  # one node: torchrun picks its own port
    assert f"--rdzv-endpoint=localhost:{29500 + 4321 % 1000}" in slurm


def test_a_port_per_job_and_the_sbatch_options(tmp_path):
    """Two jobs get two rendezvous ports; --output with a space reads back as one value
    the way sbatch parses #SBATCH lines (quotes, backslash escapes); --cpus-per-task
    (default 4 per GPU) reaches srun too, and --exclusive is written."""
    f = write_launch(_plan(), "slurm", out_dir=tmp_path / "o", output='logs/my "run" %j.out',
                     exclusive=True)
    text = f.launcher.read_text()
    sbatch = dict(shlex.split(ln[len("#SBATCH "):])[0].split("=", 1) if "=" in ln
                  else (ln.split()[1], "") for ln in text.splitlines()
                  if ln.startswith("#SBATCH "))
    assert sbatch["--output"] == 'logs/my "run" %j.out'
    assert sbatch["--cpus-per-task"] == "8" and "--exclusive" in sbatch
    assert "srun --ntasks-per-node=1 --cpus-per-task=8 " in text
    assert "29500" not in f.node_commands[0]
    log = tmp_path / "torchrun.log"
    tools = _tools(tmp_path / "bin", srun=SRUN, scontrol=SCONTROL, torchrun=FAKE_TORCHRUN)
    for job in (1001, 1002):
        r = subprocess.run(["bash", str(f.launcher)], env=dict(_slurm_env(tools, job),
                                                               TORCHRUN_LOG=str(log)),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    ports = {next(w for w in words if w.startswith("--rdzv-endpoint=")).rsplit(":", 1)[1]
             for words in _recorded(log)}
    assert ports == {"29501", "29502"}


def test_environment_step_is_stated_and_checked(tmp_path):
    """--setup lines run first, in order, and are named in the header; without an
    environment step a missing torchrun is one line naming --venv and --setup."""
    f = write_launch(_plan(), "slurm", out_dir=tmp_path / "o",
                     setup=("export MERAK_A=1", "export MERAK_B=$((MERAK_A + 1))"))
    text = f.launcher.read_text()
    assert "# Environment: 2 setup line(s) from --setup." in text
    assert text.index("export MERAK_A=1") < text.index("export MERAK_B") < text.index("srun ")
    g = write_launch(_plan(), "torchrun", out_dir=tmp_path / "t")
    assert "# Environment: none given" in g.launcher.read_text()
    path = _path_without("torchrun", tmp_path / "bare-bin")
    r = subprocess.run([shutil.which("bash"), str(g.launcher)],
                       env={"PATH": path, "HOME": str(tmp_path)}, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "torchrun is not on PATH" in r.stderr and "--venv" in r.stderr


@pytest.mark.parametrize("kw, fragment", [
    ({"script": "missing.py"}, "no such file"),
    ({"venv": "nowhere"}, "no bin/activate"),
    ({"args": ("--plan", "x.json")}, "--plan is what dispatch passes"),
    ({"setup": ("a\nb",)}, "line break"),
    ({"cpus_per_task": 0}, "--cpus-per-task must be a positive integer"),
])
def test_bad_job_options_are_refused_before_writing(tmp_path, kw, fragment):
    with pytest.raises(DispatchError, match=fragment):
        write_launch(_plan(), "slurm", out_dir=tmp_path / "x", **kw)
    assert not (tmp_path / "x").exists()


def test_script_with_arguments_and_options_before_the_separator(tmp_path, capsys,
                                                                 monkeypatch):
    """`--script "train.py --steps 100"` and `dispatch p.json --steps 100` are one line
    each, naming `--` as the fix; sbatch options with --launcher torchrun are refused."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    _plan().save(tmp_path / "p.json")
    for argv, fragment in ((["--script", "train.py --steps 100"], "-- --steps 100"),
                           (["--steps", "100"], "go after --"),
                           (["--exclusive"], "--launcher slurm"),
                           (["--cpus-per-task", "4"], "--launcher slurm")):
        assert main(["dispatch", "p.json", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "out").exists()
