"""The merak-sim CLI: schedule and demo commands, one-line errors with exit code 2."""

import subprocess
import sys

import pytest

from merak_sim.cli import main


def test_schedule_command_prints_sequences_and_png(tmp_path, capsys):
    png = tmp_path / "g.png"
    rc = main(["schedule", "--schedule", "shifted-critical-path", "--pp", "4",
               "--microbatches", "8", "--gantt", str(png), "--csv", str(tmp_path / "s.csv")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "S2: rA0 F*0 sA0 rA1 F*1 rA2 F2 R0 rG0 sA1 B0" in out
    assert "makespan (f=1, b=2, recompute=1): 38" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "s.csv").read_text().startswith("# merak-schedule/1")


@pytest.mark.parametrize("name,v", [("zb-h1", 1), ("zb-v", 2), ("dualpipev", 2)])
def test_schedule_command_draws_split_backwards(tmp_path, capsys, name, v):
    png = tmp_path / "g.png"
    rc = main(["schedule", "--schedule", name, "--pp", "4", "--microbatches", "8",
               "--virtual-stages", str(v), "--recompute", "none", "--gantt", str(png)])
    out = capsys.readouterr().out
    assert rc == 0
    gantt = [ln for ln in out.splitlines() if ln.startswith("S0 |")]
    assert gantt and "I" in gantt[0] and "W" in gantt[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["schedule", "--schedule", "bogus", "--pp", "4", "--microbatches", "8"],
        ["schedule", "--schedule", "1f1b", "--pp", "0", "--microbatches", "8"],
        ["schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "-1"],
        ["schedule", "--schedule", "shifted-critical-path", "--pp", "8", "--microbatches", "4"],
        ["schedule", "--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "6",
         "--virtual-stages", "2"],
        ["schedule", "--schedule", "1f1b", "--pp", "x", "--microbatches", "8"],
    ],
)
def test_bad_input_exits_2_with_one_line(argv):
    proc = subprocess.run([sys.executable, "-m", "merak_sim.cli", *argv],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("merak-sim: error:")


def test_demo_writes_plot_and_table(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "38.00" in out and "44.00" in out
    assert (tmp_path / "schedules.png").stat().st_size > 1000


def test_import_merak_sim_does_not_import_torch():
    code = ("import sys, merak_sim, merak_sim.schedule, merak_sim.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
