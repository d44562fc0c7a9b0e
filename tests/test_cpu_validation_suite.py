"""The CPU validation suite's case list and options (benchmarks/cpu_validation.py);
its figures are never asserted here (a shared 2-core machine is too noisy)."""

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_validation.py"


@pytest.fixture(scope="module")
def suite_mod():
    spec = importlib.util.spec_from_file_location("cpu_validation", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
