"""The launch environment is checked before any connection: one ExecError line each,
and through ``merak-exec train`` one stderr line with exit status 2 (no traceback)."""

import json
import os
import subprocess
import sys

import pytest

from merak_exec.mesh import ExecError, check_launch_env, default_timeout_s

GOOD = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500", "MERAK_TIMEOUT_S": "30"}


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-1", "abc", "", "1e7"])
def test_timeout_must_be_finite_and_positive(monkeypatch, value):
    monkeypatch.setenv("MERAK_TIMEOUT_S", value)
    with pytest.raises(ExecError, match="MERAK_TIMEOUT_S=") as e:
        default_timeout_s()
    assert "\n" not in str(e.value) and repr(value) in str(e.value)


def test_a_good_timeout_and_the_default(monkeypatch):
    monkeypatch.setenv("MERAK_TIMEOUT_S", "2.5")
    assert default_timeout_s() == 2.5
    monkeypatch.delenv("MERAK_TIMEOUT_S")
    assert default_timeout_s() == 60.0


@pytest.mark.parametrize("change, words", [
    ({"RANK": "3"}, "RANK=3 is not below WORLD_SIZE=2"),
    ({"RANK": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"RANK": "-1"}, "RANK='-1'"),
    ({"RANK": "one"}, "RANK='one'"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0'"),
    ({"LOCAL_RANK": "x"}, "LOCAL_RANK='x'"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
    ({"MASTER_PORT": "0"}, "MASTER_PORT='0'"),
    ({"MASTER_ADDR": ""}, "MASTER_ADDR is not set"),
    ({"MASTER_ADDR": "no-such-host.invalid"}, "MASTER_ADDR='no-such-host.invalid' does not "
                                              "resolve"),
    ({"MERAK_TIMEOUT_S": "inf"}, "MERAK_TIMEOUT_S='inf'"),
    ({"MERAK_FAULT": "1:explode:startup"}, "MERAK_FAULT='1:explode:startup'"),
])
def test_a_bad_launch_environment_is_one_line(monkeypatch, change, words):
    env = {**GOOD, **change}
    monkeypatch.setenv("MERAK_TIMEOUT_S", env["MERAK_TIMEOUT_S"])
    monkeypatch.setenv("MERAK_FAULT", env.get("MERAK_FAULT", ""))
    monkeypatch.setattr("merak_exec.mesh._FAULT", {})  # parse this MERAK_FAULT afresh
    with pytest.raises(ExecError) as e:
        check_launch_env(env)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_good_environments_pass(monkeypatch):
    monkeypatch.setenv("MERAK_TIMEOUT_S", "30")
    monkeypatch.setattr("merak_exec.mesh._FAULT", {})
    monkeypatch.delenv("MERAK_FAULT", raising=False)
    check_launch_env(GOOD)
    check_launch_env({"MASTER_ADDR": "localhost"})  # no launcher: a world of one
    # srun's variables stand for torchrun's
    check_launch_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
                      "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "7"})


@pytest.mark.parametrize("spec, parsed", [
    ("1:kill:startup", (1, "kill", "startup", 1)),
    ("0:stall:step@3", (0, "stall", "step@3", 1)),
    ("3:kill:op:checkpoint@2", (3, "kill", "op:checkpoint", 2)),
    ("2:stall:op:the gradient-norm all-reduce", (2, "stall", "op:the gradient-norm all-reduce",
                                                  1)),
])
def test_fault_specs(monkeypatch, spec, parsed):
    from merak_exec import mesh

    monkeypatch.setenv("MERAK_FAULT", spec)
    monkeypatch.setattr(mesh, "_FAULT", {})
    assert mesh.fault_spec() == parsed
    mesh.fault_point("somewhere else")  # not this rank's place (or rank): nothing happens
    mesh.fault_point("checkpoint", op=False)


_DRIVER = r"""
import json, os, sys
import torch, torch._dynamo  # what each command would import: paid once, before forking
import merak_exec.__main__, merak_exec.builders, merak_exec.trainer
cases = json.loads(sys.argv[1])
out = []
for env in cases:
    r_out, w_out = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r_out)
        os.dup2(w_out, 2)
        os.environ.update(env)
        os.chdir(sys.argv[2])
        merak_exec.__main__.main(["train", "--layers", "1", "--hidden", "8", "--heads", "2",
                                  "--vocab", "16", "--seq", "4", "--steps", "1"])
        os._exit(0)
    os.close(w_out)
    with os.fdopen(r_out) as f:
        err = f.read()
    _, status = os.waitpid(pid, 0)
    out.append([os.waitstatus_to_exitcode(status), err])
print(json.dumps(out))
"""


def test_the_cli_refuses_them_in_one_line_exit_2(tmp_path):
    bad = [{"MERAK_TIMEOUT_S": v} for v in ("inf", "0", "-1")] + [
        {**GOOD, "RANK": "3"}, {**GOOD, "RANK": "0", "MASTER_ADDR": "no-such-host.invalid"}]
    env = {k: v for k, v in os.environ.items() if k not in GOOD and k != "MERAK_FAULT"}
    p = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(bad), str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    results = json.loads(p.stdout.splitlines()[-1])
    for case, (code, err) in zip(bad, results, strict=True):
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1, (case, code, err[-1500:])
        assert lines[0].startswith("merak-exec: error: ") and "Traceback" not in err
        key = "MASTER_ADDR" if "MASTER_ADDR" in case and case["MASTER_ADDR"] != "127.0.0.1" \
            else "RANK" if "RANK" in case else "MERAK_TIMEOUT_S"
        assert key in lines[0], lines[0]
