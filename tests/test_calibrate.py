"""merak-sim calibrate: the runs CSV and its one-line errors, the bounded deterministic
fit with held-out error, profile files and --profile, run folders, and the shipped A100
profile as the command's output on data/vtrain."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from merak_sim.calibrate import RunsError, calibrate, hold_out_every, load_runs
from merak_sim.calibrate.fit import BOUNDS, FIT_PARAMS, SEARCH, PreparedRun, errors, start_values
from merak_sim.calibrate.runs import read_run_folder
from merak_sim.cli import main
from merak_sim.costs.calibrated import CALIBRATED, CalibratedCostModel
from merak_sim.costs.efficiency import Efficiency, default_efficiency
from merak_sim.costs.profiles import (
    SHIPPED,
    CostProfile,
    ProfileError,
    read_profile,
    shipped_profile,
)

ROOT = Path(__file__).resolve().parents[1]
HEADER = ["model", "cluster", "dp", "tp", "pp", "micro_batch_size", "global_batch_size",
          "schedule", "recompute", "step_time_s"]
#: Ten runs of LLaMA-3 8B on H100 nodes (docs/calibrate.md's example).
CONFIGS = [
    (8, 1, 1, 1, 64, "1f1b", "full"), (4, 2, 1, 1, 64, "1f1b", "full"),
    (2, 4, 1, 2, 64, "1f1b", "none"), (1, 8, 1, 4, 64, "1f1b", "none"),
    (2, 2, 2, 1, 64, "1f1b", "full"), (1, 2, 4, 1, 64, "1f1b", "selective"),
    (4, 1, 2, 2, 128, "1f1b", "full"), (8, 2, 1, 1, 128, "1f1b", "full"),
    (4, 4, 1, 2, 128, "1f1b", "none"), (2, 4, 2, 2, 128, "gpipe", "full")]
#: The GPU the synthetic measurements come from: inside the bounds, off the defaults.
TRUTH = default_efficiency("H100-80GB").with_(gemm_max=0.6, kernel_overhead_s=8e-6,
                                             mem_bw_eff=0.8)


def _write(path: Path, rows: list[list], header: list[str] = HEADER) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def runs10(tmp_path_factory) -> Path:
    """Ten runs whose step times the model predicts exactly under :data:`TRUTH`."""
    path = tmp_path_factory.mktemp("runs") / "runs10.csv"
    rows = [["llama3-8b", "dgx-h100", *c, 1.0] for c in CONFIGS]
    _write(path, rows)
    times = [PreparedRun.of(r).predict(TRUTH) for r in load_runs(path)]
    return _write(path, [[*r[:-1], f"{t:.6f}"] for r, t in zip(rows, times, strict=True)])


def test_runs_csv_reads_presets_shapes_and_defaults(tmp_path):
    p = _write(tmp_path / "r.csv", [["llama3-8b", "dgx-h100", 16, 1, 1, 1, 32, "", "",
                                     "2.5"]])
    (run,) = load_runs(p)
    assert run.cluster.nodes == 2 and run.cluster.world_size == 16
    assert (run.config.schedule, run.config.recompute, run.stack) == ("1f1b", "none", "default")
    assert run.step_time_s == 2.5 and run.label == "r.csv:2"
    shape = ["hidden", "heads", "layers", "seq_len", "vocab", "cluster", "dp", "tp", "pp",
             "micro_batch_size", "global_batch_size", "nodes", "stack", "step_time_s"]
    p = _write(tmp_path / "s.csv", [[1024, 16, 4, 512, 32000, "dgx-a100-80g", 2, 2, 1, 1, 4,
                                     1, "megatron", "0.1"]], shape)
    (run,) = load_runs(p)
    assert (run.model.hidden, run.model.layers, run.model.vocab) == (1024, 4, 32000)
    assert run.cluster.world_size == 8 and run.stack == "megatron"


@pytest.mark.parametrize("header, row, says", [
    (HEADER[:-1], ["llama3-8b", "dgx-h100", 8, 1, 1, 1, 64, "", ""],
     "r.csv: missing column(s) step_time_s"),
    ([*HEADER, "stepp"], ["llama3-8b", "dgx-h100", 8, 1, 1, 1, 64, "", "", 1, 2],
     "r.csv: unknown column(s) stepp"),
    (HEADER, ["llama3-8b", "dgx-h100", 8, 1, 1, 1, 64, "", "", "fast"],
     "r.csv:2: step_time_s 'fast' is not a positive number"),
    (HEADER, ["llama3-8b", "dgx-h100", 8, 1, 1, 1, 64, "", "", "-1"],
     "is not a positive number of seconds"),
    (HEADER, ["llama3-8b", "dgx-h100", "eight", 1, 1, 1, 64, "", "", 1],
     "r.csv:2: column dp: 'eight' is not a whole number"),
    (HEADER, ["llama3-8b", "dgx-h100", 8, 3, 1, 1, 64, "", "", 1],
     "r.csv:2: tp=3 does not divide 32 attention heads"),
    (HEADER, ["llama3-8b", "dgx-h100", 8, 1, 1, 3, 64, "", "", 1],
     "r.csv:2: global batch 64 is not divisible"),
    (HEADER, ["llama3-8b", "nope", 8, 1, 1, 1, 64, "", "", 1],
     "r.csv:2: unknown cluster preset 'nope'"),
    (HEADER, ["llama3-8b", "dgx-h100", 8, 1, 1, 1, 64, "", "", 1, "extra"],
     "r.csv:2: 10 columns in the header"),
    ([*HEADER, "stack"], ["llama3-8b", "dgx-h100", 8, 1, 1, 1, 64, "", "", 1, "jax"],
     "r.csv:2: unknown stack 'jax'"),
    ([*HEADER, "nodes"], ["llama3-8b", "dgx-h100", 16, 1, 1, 1, 64, "", "", 1, 1],
     "r.csv:2: the run uses 16 GPUs, 1 node(s) of dgx-h100 hold 8"),
])
def test_bad_runs_csv_is_one_line_naming_file_line_and_fix(tmp_path, capsys, header, row,
                                                            says):
    p = _write(tmp_path / "r.csv", [row], header)
    with pytest.raises(RunsError, match=None) as e:
        load_runs(p)
    assert says in str(e.value) and "\n" not in str(e.value)
    out = tmp_path / "p.json"
    assert main(["calibrate", str(p), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err
    assert not out.exists()


def test_unreadable_runs_files_are_one_line(tmp_path, capsys):
    cases = {"empty.csv": b"", "header.csv": (",".join(HEADER) + "\n").encode(),
             "latin1.csv": (",".join(HEADER) + "\nllam\xe4,x,1,1,1,1,1,,,1\n").encode("latin-1")}
    says = {"empty.csv": "empty file", "header.csv": "no runs (a header only)",
            "latin1.csv": "not UTF-8 text"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        assert main(["calibrate", str(tmp_path / name), "--out", str(tmp_path / "p.json")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says[name] in err, err
    assert main(["calibrate", str(tmp_path / "missing.csv"), "--out",
                 str(tmp_path / "p.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["calibrate", "--out", str(tmp_path / "p.json")]) == 2
    assert "give at least one runs file" in capsys.readouterr().err


def test_out_is_checked_before_any_work(tmp_path, capsys, runs10):
    assert main(["calibrate", str(runs10), "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["calibrate", str(runs10), "--out", str(tmp_path / "file" / "p.json")]) == 2
    err = capsys.readouterr()
    assert err.err.startswith("merak-sim: error: --out") and "calibrate:" not in err.out


def test_ten_runs_fit_the_gpu_that_made_them_and_score_held_out_runs(tmp_path, capsys,
                                                                     runs10):
    out = tmp_path / "h100.json"
    assert main(["calibrate", str(runs10), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "8 runs to fit, 2 held out" in text and "stopped by its rule" in text
    prof = read_profile(out)
    fit, held = prof.fit["fit"], prof.fit["held_out"]
    # Measured times come from an in-bounds curve, so the fit all but closes the
    # published defaults' error and the two runs it never saw come out as close.
    assert prof.fit["published_defaults"]["mape_pct"] > 10
    assert fit["mape_pct"] < 2.5 and held["runs"] == 2 and held["mape_pct"] < 2.5
    assert f"held out: 2 runs, MAPE {held['mape_pct']:.2f} %" in text
    assert prof.gpu == "Hopper" and set(prof.parameters) == set(FIT_PARAMS)
    for k, v in prof.parameters.items():
        assert BOUNDS[k][0] <= v <= BOUNDS[k][1], k
    assert prof.command == f"merak-sim calibrate runs10.csv --out {out.name}"
    # Deterministic: a rerun writes the same bytes.
    again = tmp_path / "again.json"
    assert main(["calibrate", str(runs10), "--out", str(again)]) == 0
    assert json.loads(again.read_text())["parameters"] == prof.parameters


def test_held_out_files_free_parameters_and_the_hold_out_rule(tmp_path, capsys, runs10):
    runs = load_runs(runs10)
    fit, held = hold_out_every(runs, 5)
    assert [r.label for r in held] == ["runs10.csv:6", "runs10.csv:11"] and len(fit) == 8
    assert hold_out_every(runs, 0) == (runs, [])
    with pytest.raises(RunsError, match="N >= 2"):
        hold_out_every(runs, 1)
    cal = calibrate(runs[:6], runs[6:], free=("gemm_max", "kernel_overhead_s"), rounds=3)
    assert cal.held_out.runs == 4 and cal.fit.runs == 6 and cal.rounds_run <= 3
    assert cal.fit.log_loss <= cal.published.log_loss
    # Parameters not freed keep the published defaults.
    assert cal.efficiency.gemm_dim_half == default_efficiency("H100-80GB").gemm_dim_half
    with pytest.raises(RunsError, match="choose from"):
        calibrate(runs, free=("warp_speed",))
    with pytest.raises(RunsError, match="at least 2"):
        calibrate(runs[:1])
    out = tmp_path / "p.json"
    assert main(["calibrate", str(runs10), "--held-out", str(runs10), "--free",
                 "gemm_max", "--rounds", "2", "--out", str(out)]) == 0
    assert "10 runs to fit, 10 held out" in capsys.readouterr().out
    assert read_profile(out).command.endswith(
        "--free gemm_max --rounds 2 --out p.json")


def test_runs_of_two_gpu_families_are_refused(tmp_path, runs10):
    rows = [["llama3-8b", "dgx-a100-80g", 8, 1, 1, 1, 64, "", "", 3.0]]
    a100 = load_runs(_write(tmp_path / "a.csv", rows))
    with pytest.raises(RunsError, match="several GPU types"):
        calibrate(load_runs(runs10), a100)


def test_profiles_drive_simulate_plan_and_costs(tmp_path, capsys, runs10):
    prof = tmp_path / "h100.json"
    assert main(["calibrate", str(runs10), "--out", str(prof)]) == 0
    capsys.readouterr()
    args = ["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--dp", "2",
            "--tp", "4", "--pp", "1", "--mbs", "1", "--global-batch-size", "16",
            "--schedule", "1f1b", "--recompute", "full", "--engine", "evaluator", "--json"]

    def step(*more: str) -> float:
        assert main([*args, *more]) == 0
        return json.loads(capsys.readouterr().out)["iteration_time_s"]

    (run,) = load_runs(_write(tmp_path / "one.csv", [
        ["llama3-8b", "dgx-h100", 2, 4, 1, 1, 16, "1f1b", "full", 1.0]]))
    assert step() != pytest.approx(step("--profile", str(prof)), rel=1e-3)
    fitted = read_profile(prof).efficiency_for("H100-80GB")[0]
    assert step("--profile", str(prof)) == pytest.approx(
        PreparedRun.of(run).predict(fitted), rel=1e-9)
    # The shipped A100 profile is what the default model serves on A100 clusters.
    a100 = [*args[:4], "dgx-a100-80g", *args[5:]]
    assert main([*a100, "--profile", str(SHIPPED["a100"])]) == 0
    with_file = json.loads(capsys.readouterr().out)["iteration_time_s"]
    assert main(a100) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] == with_file
    # Another GPU family, a foreign file, --trace beside it: one line, exit 2.
    assert main([*a100, "--profile", str(prof)]) == 2
    assert "describes Hopper GPUs, the cluster has A100-80GB" in capsys.readouterr().err
    (tmp_path / "x.json").write_text('{"format": "merak-plan/1"}')
    for cmd in (["costs", "--model", "llama3-8b", "--cluster", "dgx-h100"],
                ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100",
                 "--global-batch-size", "16", "--out", str(tmp_path / "plan.json")]):
        assert main([*cmd, "--profile", str(tmp_path / "x.json")]) == 2
        assert "expected 'merak-cost-profile/1'" in capsys.readouterr().err
    assert main(["costs", "--model", "llama3-8b", "--cluster", "dgx-h100", "--json",
                 "--profile", str(prof)]) == 0
    assert json.loads(capsys.readouterr().out)["stages"]


def test_profile_files_are_checked(tmp_path):
    good = {"format": "merak-cost-profile/1", "gpu": "A100", "parameters": {"gemm_max": 0.7}}
    for change, says in (({"parameters": {"warp": 1.0}}, "unknown profile parameter"),
                         ({"parameters": {"gemm_max": 1.5}}, "must be <= 1"),
                         ({"parameters": {"gemm_max": "x"}}, "finite number"),
                         ({"gpu": 3}, "needs a \"gpu\""),
                         ({"format": "merak-run/1"}, "expected 'merak-cost-profile/1'")):
        (tmp_path / "p.json").write_text(json.dumps({**good, **change}))
        with pytest.raises(ProfileError, match=None) as e:
            read_profile(tmp_path / "p.json")
        assert says in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "p.json").write_text("{")
    with pytest.raises(ProfileError, match="not a readable JSON file"):
        read_profile(tmp_path / "p.json")
    p = CostProfile("A100", {"gemm_max": 0.7, "flash_max_fwd": 0.5})
    eff, kern = p.efficiency_for("A100-40GB")
    assert eff.gemm_max == 0.7 and kern.flash_max_fwd == 0.5
    assert read_profile(_save(tmp_path, p)) == p


def _save(tmp_path: Path, p: CostProfile) -> Path:
    (tmp_path / "saved.json").write_text(p.to_json())
    return tmp_path / "saved.json"


def test_run_folders_are_runs(tmp_path, capsys):
    runs_dir = ROOT / "benchmarks" / "results" / "cpu_validation_runs"
    run = read_run_folder(runs_dir / "dp2")
    assert run.cluster.gpu.name.startswith("CPU") and run.config.dp == 2
    assert run.step_time_s > 0 and run.model.layers == 8
    folders = ["dp2", "pp2-1f1b-none", "pp2-gpipe-none", "tp2-plain", "pp2-zbh1-none"]
    out = tmp_path / "cpu.json"
    argv = ["calibrate", "--hold-out-every", "0", "--out", str(out)]
    for f in folders:
        argv += ["--run-dir", str(runs_dir / f)]
    assert main(argv) == 0
    assert "5 runs to fit, 0 held out" in capsys.readouterr().out
    assert read_profile(out).gpu == "CPU-2core"
    (tmp_path / "bad").mkdir()
    assert main(["calibrate", "--run-dir", str(tmp_path / "bad"), "--out", str(out)]) == 2


def test_shipped_a100_profile_is_the_commands_output_on_data_vtrain():
    prof = shipped_profile("a100")
    assert prof.command == ("merak-sim calibrate data/vtrain/ground_truth_single.csv "
                            "--held-out data/vtrain/ground_truth_multi.csv "
                            "--out merak_sim/costs/profiles/a100.json")
    assert CALIBRATED["A100"] == prof.parameters
    rec = prof.fit
    assert rec["start"] == start_values("A100-80GB", FIT_PARAMS, BOUNDS)
    assert rec["search"] == SEARCH and rec["stopped_by_rule"] and rec["rounds_run"] == 14
    assert rec["stacks"] == ["megatron-deepspeed"] and rec["fit"]["runs"] == 1440
    # The recorded errors are the shipped values' errors on the files named.
    eff = Efficiency(**{**Efficiency().to_dict(), **prof.parameters})
    for key, name in (("fit", "single"), ("held_out", "multi")):
        runs = load_runs(ROOT / "data" / "vtrain" / f"ground_truth_{name}.csv")
        e = errors([PreparedRun.of(r) for r in runs], eff)
        assert e.runs == rec[key]["runs"]
        assert e.mape_pct == pytest.approx(rec[key]["mape_pct"], rel=1e-9)
        assert e.signed_pct == pytest.approx(rec[key]["signed_pct"], rel=1e-9)
    assert round(rec["fit"]["mape_pct"], 2) == 6.35
    assert round(rec["held_out"]["mape_pct"], 2) == 7.40
    assert CalibratedCostModel()  # the default model builds from the shipped file
