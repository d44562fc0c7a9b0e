"""``merak-sim simulate``: JSON contract, summary, files, one-line errors with exit 2."""

import json

import pytest

from merak_sim.cli import main

BASE = ["simulate", "--model", "gpt-2.5b", "--cluster", "paper-3090", "--nodes", "2",
        "--dp", "2", "--tp", "2", "--pp", "2", "--micro-batch-size", "2",
        "--global-batch-size", "16", "--schedule", "1f1b", "--recompute", "full"]


def test_json_contract(capsys):
    assert main(BASE + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("iteration_time_s", "tflops_per_gpu", "mfu", "bubble_fraction",
                "throughput_samples_per_s", "peak_memory_bytes", "fits_in_memory",
                "breakdown"):
        assert key in out
    assert len(out["peak_memory_bytes"]) == 2
    assert out["iteration_time_s"] > 0 and 0 < out["mfu"] < 1
    assert {"rank", "compute_s", "recompute_s", "exposed_comm_s", "bubble_s"} <= set(
        out["breakdown"][0])
    assert out["throughput_samples_per_s"] == pytest.approx(16 / out["iteration_time_s"])


def test_summary_and_files(capsys, tmp_path):
    ct, png = tmp_path / "t.json", tmp_path / "g.png"
    argv = BASE[:]
    argv[argv.index("1f1b")] = "shifted-critical-path"
    argv[argv.index("16")] = "32"
    assert main(argv + ["--recompute", "stage-aware:0.5", "--chrome-trace", str(ct),
                        "--plot", str(png), "--engine", "evaluator"]) == 0
    text = capsys.readouterr().out
    assert "iteration time" in text and "bubble" in text
    doc = json.loads(ct.read_text())
    assert any(e["ph"] == "X" for e in doc["traceEvents"])
    assert png.exists() and (tmp_path / "g-memory.png").exists()


def test_full_mode_and_what_if(capsys):
    assert main(BASE + ["--json", "--mode", "full"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert main(BASE + ["--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert full["iteration_time_s"] == pytest.approx(rep["iteration_time_s"], rel=1e-9)
    assert len(full["breakdown"]) == 8
    assert main(BASE + ["--json", "--mode", "full", "--slow-gpu", "3:2"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert slow["iteration_time_s"] > full["iteration_time_s"]


def test_out_of_memory_is_a_result(capsys):
    argv = BASE[:]
    argv[argv.index("gpt-2.5b")] = "gpt-20b"
    argv[argv.index("full")] = "none"
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits_in_memory"] is False
    assert out["oom"]["overflow_bytes"] > 0


@pytest.mark.parametrize("change, msg", [
    (("--dp", "4"), "GPUs"),
    (("--global-batch-size", "15"), "not divisible"),
    (("--schedule", "nope"), "nope"),
    (("--model", "gpt-unknown"), "unknown model"),
    (("--cluster", "nowhere"), "unknown cluster"),
    (("--recompute", "sometimes"), "recompute"),
])
def test_bad_input_one_line_exit_2(capsys, change, msg):
    argv = BASE[:]
    i = argv.index(change[0])
    argv[i + 1] = change[1]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("merak-sim: error:") and msg in err
    assert "Traceback" not in err


def test_malformed_model_json(capsys, tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text("{not json")
    argv = BASE[:]
    i = argv.index("--model")
    argv[i:i + 2] = ["--model-json", str(bad)]
    assert main(argv) == 2
    assert "merak-sim: error:" in capsys.readouterr().err


def test_schedule_requirement_violated(capsys):
    argv = BASE[:]
    argv[argv.index("1f1b")] = "shifted-critical-path"  # M = 4 >= max(2, 4) is fine
    argv[argv.index("16")] = "8"  # M = 2 < 4
    assert main(argv) == 2
    assert "microbatches >= max" in capsys.readouterr().err


def test_trace_driven_costs(capsys, tmp_path):
    from pathlib import Path

    trace = Path(__file__).resolve().parents[1] / "traces" / "cpu-gpt-tiny.json"
    model = json.loads(trace.read_text())["model"]
    mj = tmp_path / "tiny.json"
    mj.write_text(json.dumps(model))
    argv = ["simulate", "--model-json", str(mj), "--cluster", "local-cpu", "--dp", "1",
            "--tp", "1", "--pp", "2", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--schedule", "1f1b", "--recompute", "none", "--dtype", "fp32", "--sub-cluster",
            "--json"]
    assert main(argv + ["--trace", str(trace)]) == 0
    traced = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    analytic = json.loads(capsys.readouterr().out)
    assert traced["iteration_time_s"] > 0
    assert traced["iteration_time_s"] != analytic["iteration_time_s"]
