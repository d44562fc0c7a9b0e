"""benchmarks/speedup_repeats.py: options and the pooled report (its figures are never
asserted here: they are the shared machine's)."""

import json
import statistics

import pytest


@pytest.fixture(scope="module")
def mod(load_benchmark):
    return load_benchmark("speedup_repeats")


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--steps", "2", "--blocks", "3"]])
def test_bad_options_exit_2_before_measuring(mod, argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        mod.main([*argv, "--out", str(tmp_path)])
    assert e.value.code == 2 and "must be positive" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


NAMES = ("pp2-1f1b-full", "pp2-scp-stage-aware")


def _entry(date, base_err, merak_err, meas, pred):
    def run(ms, err):
        return {"measured_ms": ms, "predicted_ms": ms * (1 + err), "error": err}
    return {"date": date, NAMES[0]: run(200.0, base_err), NAMES[1]: run(150.0, merak_err),
            "speedup_measured": meas, "speedup_predicted": pred,
            "gap_points": 100 * (pred - meas), "cpu_share_min": 0.99}


def test_pooled_report_gives_the_mean_gap_and_its_standard_error(mod):
    assert (mod.BASELINE, mod.MERAK) == NAMES
    entries = [_entry("a", -0.02, 0.01, 0.35, 0.30), _entry("b", 0.0, 0.0, 0.30, 0.32),
               _entry("c", -0.04, 0.02, 0.40, 0.33)]
    lines = mod.pooled_text(entries)
    assert len([x for x in lines if x.startswith("| a ") or x.startswith("| b ")
                or x.startswith("| c ")]) == 3
    gaps = [-5.0, 2.0, -7.0]
    se = statistics.stdev(gaps) / 3 ** 0.5
    assert f"speed-up gap {statistics.fmean(gaps):+.1f} points on average, standard error " \
           f"{se:.1f}" in lines[-1]
    assert "pp2-1f1b-full -2.0 %" in lines[-1]
    assert "median -5.0; within the 5-point limit in 2 of 3 repeats" in lines[-1]
    # one repeat: its row, no pooled line
    assert len(mod.pooled_text(entries[:1])) == 3


def test_report_only_needs_recorded_repeats(mod, tmp_path, capsys):
    assert mod.main(["--no-measure", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not exist; measure first" in err and "\n" not in err
    assert not any(tmp_path.iterdir())
    rows = [_entry("a", -0.02, 0.01, 0.35, 0.30), _entry("b", 0.0, 0.0, 0.30, 0.32)]
    (tmp_path / mod.HISTORY).write_text("".join(json.dumps(e) + "\n" for e in rows))
    assert mod.main(["--no-measure", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "speedup_repeats.md").read_text()
    assert "Over 2 repeats" in text and "| a |" in text


def test_decomposition_pools_replay_and_action_errors_of_the_repeats_that_recorded_them(mod):
    def rec(entry, replay, fwd):
        for name in NAMES:
            entry[name].update(replay_error=replay, contract_error=replay / 2,
                               actions={"1 FORWARD": fwd, "0 BACKWARD": 0.01})
        return entry
    old = _entry("old", -0.5, 0.0, 0.3, 0.3)   # recorded before the decomposition
    entries = [old, rec(_entry("a", -0.02, 0.0, 0.3, 0.3), -0.01, -0.04),
               rec(_entry("b", -0.04, 0.0, 0.3, 0.3), -0.03, -0.06)]
    lines = mod.decomposition_text(entries)
    assert "every backward priced with fresh gradients (2 repeats;" in lines[1]
    se = statistics.stdev([-2.0, -4.0]) / 2 ** 0.5   # the old entry is left out
    assert f"| pp2-1f1b-full | -3.0 % ({se:.1f}) | -2.0 % ({se:.1f}) | -1.0 % " in "\n".join(lines)
    assert any(x.startswith("| pp2-1f1b-full | 1 FORWARD | -5.0 % (") and x.endswith("| 2 |")
               for x in lines)
    assert mod.decomposition_text(entries[:2]) == []  # one recorded repeat: nothing pooled


def test_decomposition_has_one_section_per_backward_pricing(mod):
    def rec(entry, pricing):
        for name in NAMES:
            entry[name].update(replay_error=0.0, contract_error=0.0, actions={"1 FORWARD": 0.0})
        return dict(entry, backward_pricing=pricing) if pricing else entry
    entries = [rec(_entry("a", 0.0, 0.0, 0.3, 0.3), None),
               rec(_entry("b", 0.0, 0.0, 0.3, 0.3), "fresh"),
               rec(_entry("c", 0.0, 0.0, 0.3, 0.32), "accumulating"),
               rec(_entry("d", 0.0, 0.0, 0.3, 0.34), "accumulating"),
               rec(_entry("e", 0.0, 0.0, 0.3, 0.3), "paired-delta"),
               rec(_entry("f", 0.0, 0.0, 0.3, 0.3), "paired-delta"),
               dict(rec(_entry("g", 0.0, 0.0, 0.3, 0.3), "paired-delta"), post_probe_runs=4),
               dict(rec(_entry("h", 0.0, 0.0, 0.3, 0.3), "paired-delta"), post_probe_runs=4)]
    heads = [x for x in mod.decomposition_text(entries) if x.startswith("Where")]
    assert len(heads) == 4
    assert "fresh gradients (2 repeats" in heads[0] and "gap +0.0 points" in heads[0]
    assert "separate profile" in heads[1] and "gap +3.0 points" in heads[1]
    assert "(paired differences) (2 repeats" in heads[2]
    assert "(paired differences); posting probed before every round of blocks (2 repeats" \
        in heads[3]
