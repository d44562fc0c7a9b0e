"""benchmarks/h200_validation.py, rehearsed on CPU: the GPU run gets one try in a
15-minute lease, so its whole path is exercised here (``--dry-run``: tiny shapes,
gloo, fp32, the one-GPU checks included), with SimPy hidden as on the device's
image, and a failing shape must not lose the others' results. The figures are the shared machine's and never asserted."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]
_PATH = _ROOT / "benchmarks" / "h200_validation.py"

# Imported first on the child's path, it makes ``import simpy`` fail as on the device.
_NO_SIMPY = '''import sys
class _NoSimpy:
    def find_spec(self, name, path=None, target=None):
        if name == "simpy" or name.startswith("simpy."):
            raise ModuleNotFoundError("No module named 'simpy'")
        return None
sys.meta_path.insert(0, _NoSimpy())
'''


@pytest.fixture(scope="module")
def mod(load_benchmark):
    return load_benchmark("h200_validation")


def test_smoke_run_without_simpy_writes_one_archive_of_everything(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(_NO_SIMPY)
    # the benchmark imports the package: the repository root goes on the child's path
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim), str(_ROOT)]),
               MASTER_ADDR="127.0.0.1",
               GLOO_SOCKET_IFNAME="lo")
    probe = subprocess.run([sys.executable, "-c", "import simpy"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "simpy" in probe.stderr  # the shim works
    out, archive = tmp_path / "out", tmp_path / "back" / "h200.tar.gz"
    p = subprocess.run([sys.executable, str(_PATH), "--dry-run", "--out", str(out),
                        "--archive", str(archive)], env=env, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert [ln.split(":")[0] for ln in p.stdout.splitlines() if "predicted" in ln] == \
        ["smoke-a", "smoke-b"]
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        summary = json.load(tar.extractfile("summary.json"))
        report = tar.extractfile("report.md").read().decode()
    for shape in ("smoke-a", "smoke-b"):
        assert {f"{shape}/run.json", f"{shape}/events.csv", f"{shape}/profile.json",
                f"gpt-{shape}.json", f"{shape}.png"} <= names
        assert f"| {shape} | " in report
    assert not any(Path(n).name.startswith(".") for n in names)  # no runs' status files
    assert len(summary["shapes"]) == 2 and summary["missing"] == []
    checks = summary["checks"]
    assert checks["amp"]["ok"] and checks["amp"]["bf16_param_dtypes"] == ["torch.float32"]
    assert [r["recompute"] for r in checks["memory"]] == ["none", "selective"]
    assert all(r["ok"] for r in checks["memory"]), checks["memory"]
    assert "needs 2+ GPUs" in checks["multi_rank_nccl"]
    assert "## One-GPU checks" in report and "bf16 autocast step vs fp32" in report
    for s in summary["shapes"]:
        assert s["measured_ms"] > 0 and s["predicted_ms"] > 0
        assert abs(s["error"] - (s["predicted_ms"] / s["measured_ms"] - 1)) < 1e-6


def test_a_failing_shape_is_reported_and_the_others_kept(mod, tmp_path, monkeypatch,
                                                          capsys):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    bad = mod.small_gpt(layers=2, hidden=30, heads=4, vocab=64, seq=16)  # 4 does not divide 30
    monkeypatch.setattr(mod, "SMOKE", [("bad", bad, 2, 2), mod.SMOKE[0]])
    rc = mod.main(["--dry-run", "--out", str(tmp_path)])
    assert rc == 1
    printed = capsys.readouterr().out
    assert "bad: FAILED (" in printed and "smoke-a: measured" in printed
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["run"] for s in summary["shapes"]] == ["smoke-a"]
    assert summary["missing"][0]["shape"] == "bad"
    assert summary["missing"][0]["why"].startswith("failed: ")
    report = (tmp_path / "report.md").read_text()
    assert "| bad | - | - | failed: " in report and "| smoke-a | " in report


def test_bad_budget_exits_2_before_measuring(mod, tmp_path, capsys):
    assert mod.main(["--dry-run", "--budget-s", "0", "--out", str(tmp_path / "o")]) == 2
    assert "--budget-s must be positive" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_without_a_gpu_it_refuses_in_one_line_with_exit_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(_ROOT), CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, str(_PATH), "--out", str(tmp_path / "o")], env=env,
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "h200_validation: no CUDA device; use --dry-run for a CPU rehearsal"]
    assert not (tmp_path / "o").exists()
