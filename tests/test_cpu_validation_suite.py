"""The CPU validation suite's case list and options (benchmarks/cpu_validation.py);
its figures are never asserted here (a shared 2-core machine is too noisy)."""

import json
import statistics

import pytest


@pytest.fixture(scope="module")
def suite_mod(load_benchmark):
    return load_benchmark("cpu_validation")


def test_pairs_option_adds_named_repeats_of_the_baseline_and_merak(suite_mod):
    names = [c.name for c in suite_mod.suite(pairs=4)]
    b, m = suite_mod.BASELINE, suite_mod.MERAK
    assert [n for n in names if "~" in n] == [f"{x}~{i}" for i in (1, 2, 3) for x in (b, m)]
    assert len(names) == len(set(names)) == 9 + 6
    by = {c.name: c.config for c in suite_mod.suite(pairs=4)}
    assert by[f"{b}~3"] == by[b] and by[f"{m}~3"] == by[m]
    assert not [n for n in (c.name for c in suite_mod.suite(pairs=1)) if "~" in n]


@pytest.mark.parametrize("argv", [["--pairs", "0"], ["--steps", "3", "--blocks", "6"]])
def test_bad_options_exit_2_before_measuring(suite_mod, argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        suite_mod.main([*argv, "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "must be positive" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


def test_history_appends_one_entry_per_run(suite_mod, tmp_path):
    ok = {"iteration_median_abs_error": 0.04, "iteration_worst_abs_error": 0.08,
          "iteration_worst_run": "b", "action_median_abs_error": 0.05,
          "activation_worst_abs_error": 0.01, "speedup_pairs": 3, "speedup_gap_points": 1.0}
    path = tmp_path / "h.jsonl"
    first = suite_mod.record_history(path, ok, "d1", "cmd", 600.4)
    second = suite_mod.record_history(path, {**ok, "speedup_gap_points": -7.0}, "d2", "cmd",
                                      601)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == [first, second]
    assert first["iteration_worst_run"] == "b" and first["all_met"] and first["seconds"] == 600
    assert not second["all_met"]  # a speed-up gap over 5 points is a miss


def _rep(name, measured, predicted):
    """A stand-in report with per-block measured and predicted iterations."""
    from types import SimpleNamespace

    import pandas as pd

    err = [p / m - 1 for m, p in zip(measured, predicted, strict=True)]
    blocks = pd.DataFrame({"block": range(len(measured)), "measured_s": measured,
                           "predicted_s": predicted, "error": err})
    se = pd.Series(err).std() / len(err) ** 0.5
    return SimpleNamespace(name=name, blocks=blocks, summary=lambda: {"block_error_se": se})


def test_speedup_rounds_pair_block_b_with_block_b_and_give_the_noise(suite_mod):
    reps = [_rep("base", [2.0, 3.0, 2.0], [2.0, 2.0, 2.0]),
            _rep("new", [1.0, 1.0, 2.0], [1.0, 1.0, 1.0])]
    r = suite_mod.speedup_rounds(reps, [("base", "new"), ("missing", "new")])
    assert r["measured"] == pytest.approx([1.0, 2.0, 0.0])
    assert r["predicted"] == pytest.approx([1.0, 1.0, 1.0])
    assert r["gaps"] == pytest.approx([0.0, -100.0, 100.0])
    assert r["sd_points"] == pytest.approx(100.0)
    assert r["se_points"] == pytest.approx(100.0 / 3 ** 0.5)
    s = suite_mod.add_noise({"iteration_worst_run": "new"}, reps, [("base", "new")])
    assert s["iteration_worst_se"] == reps[1].summary()["block_error_se"] > 0
    assert s["speedup_se_points"] == pytest.approx(r["se_points"])
    assert suite_mod.speedup_rounds(reps, [("x", "y")]) is None


def test_pooled_errors_separate_a_bias_from_drift(suite_mod, tmp_path):
    path = tmp_path / "h.jsonl"
    base = {"iteration_median_abs_error": 0.04, "iteration_worst_abs_error": 0.08,
            "iteration_worst_run": "a", "action_median_abs_error": 0.05,
            "activation_worst_abs_error": 0.01}
    # "a" is biased (+10 % every run), "b" drifts around zero; "b~1" is a repeat of "b"
    # in the same run, averaged with it before pooling
    for i, (eb, gap) in enumerate([(0.05, 4.0), (-0.07, -8.0), (0.02, 1.0)]):
        suite_mod.record_history(path, {**base, "speedup_gap_points": gap}, f"d{i}", "cmd",
                                 1.0, {"a": 0.10, "b": eb, "b~1": eb + 0.02})
    assert suite_mod.read_history(tmp_path / "missing.jsonl") == []
    p = suite_mod.pooled(suite_mod.read_history(path))
    a, b = p["configurations"]["a"], p["configurations"]["b"]
    assert p["runs"] == 3 and a["n"] == 3 and b["n"] == 3 and b["measurements"] == 6
    assert a["mean"] == pytest.approx(0.10) and a["sd"] == pytest.approx(0.0)
    # per-run means of "b": +0.06, -0.06, +0.03
    assert b["mean"] == pytest.approx(0.01) and b["se"] == pytest.approx(
        statistics.stdev([0.06, -0.06, 0.03]) / 3 ** 0.5)
    assert p["worst_abs_mean_error"] == pytest.approx(0.10)
    assert p["speedup_gap_mean_points"] == pytest.approx(-1.0)
    assert p["speedup_gap_se_points"] == pytest.approx(6.245 / 3 ** 0.5, rel=1e-3)
    text = "\n".join(suite_mod.pooled_text(p))
    assert "| a | 3 (3) | +10.0 % |" in text and "| b | 3 (6) | +1.0 % |" in text
    assert "Pooled over the 3 suite runs recorded in `cpu_validation_history.jsonl` (a" in text
    # the way the backwards were priced is recorded and said
    suite_mod.record_history(path, {**base, "speedup_gap_points": 0.0}, "d3", "cmd", 1.0,
                             {"a": 0.10}, backward_pricing="paired-delta")
    hist = suite_mod.read_history(path)
    assert hist[-1]["backward_pricing"] == "paired-delta"
    assert "backward_pricing" not in hist[0]
    text = "\n".join(suite_mod.pooled_text(suite_mod.pooled(hist), hist))
    assert "Pooled over the 4 suite runs recorded in `cpu_validation_history.jsonl` (1 of " \
           "them with every backward after a rank's first priced adding into existing " \
           "gradients, the others with fresh gradients throughout; a configuration's" in text


def test_revalidating_where_nothing_was_measured_is_a_one_line_error(suite_mod, tmp_path,
                                                                    capsys):
    assert suite_mod.main(["--no-measure", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cpu_validation.py: error: run directory") and "\n" not in err
    assert not (tmp_path / "cpu_validation.md").exists()


def test_recorded_command_hides_scratch_paths_outside_the_repository(suite_mod, tmp_path):
    cmd = suite_mod.recorded_command(["--out", str(tmp_path / "v5"), "--quick"])
    assert cmd == "python benchmarks/cpu_validation.py --out DIR --quick"
    # relative paths and paths inside the repository are kept as given
    assert suite_mod.recorded_command(["--out", "benchmarks/results"]).endswith(
        "--out benchmarks/results")
