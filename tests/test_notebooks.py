"""Execute every notebooks/*.ipynb with nbclient (a per-notebook timeout) and assert on
what each computed.

Convention (notebooks/build_notebooks.py): a notebook asserts on its own results in its
cells, so execution failing is a test failure, and its metadata holds the expression of
its headline numbers (``merak.result``), which ``run_notebooks.execute`` evaluates in
the kernel after the last cell without leaving a cell behind: no reader sees test
plumbing. Known notebooks get extra checks on those numbers; any other notebook (added
later) must at least contain an ``assert`` and the expression.
Every notebook must show at least one figure (an ``image/png`` output) when executed,
and the committed notebooks carry their outputs (``make notebooks``).

The tests execute with ``MERAK_NOTEBOOK_QUICK=1``: notebooks 02 and 04 then run the
same cells on a smaller setting (two of the four paper models, a shorter live
measurement) and say so (``"quick": true`` in the result line). The checks of the full
setting run on the committed outputs, which ``make notebooks`` computed in full.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TIMEOUT_S = 300  # per cell; each notebook runs in a minute or two


def _runner():
    """notebooks/run_notebooks.py (a script folder, not a package)."""
    spec = importlib.util.spec_from_file_location("run_notebooks",
                                                  ROOT / "notebooks" / "run_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _result(nb) -> dict:
    """The headline numbers ``make notebooks`` stored with the committed outputs."""
    value = nb.metadata.get("merak", {}).get("result_value")
    assert value is not None, "no merak.result_value in the metadata (run make notebooks)"
    return value


def _check_01(r, quick):
    assert 1.0 < r["straggler_slowdown"] <= 1.5 + 1e-9
    assert r["dp8_network_slowdown"] > r["pp8_network_slowdown"] >= 1.0
    assert 0 < r["bubble_1f1b_pp8_M8"] < 1


#: Merak's published speed-ups (Lai et al., TPDS 2023) and the quick setting's models.
PAPER = {"gpt-1.5b": 1.42, "gpt-2.5b": 1.39, "gpt-8.3b": 1.43, "gpt-20b": 1.61}
QUICK_MODELS = ("gpt-1.5b", "gpt-8.3b")
#: Notebooks with a smaller setting under MERAK_NOTEBOOK_QUICK=1.
QUICK = {"02_paper_reproduction", "04_validation"}


def _check_02(r, quick):
    models = QUICK_MODELS if quick else tuple(PAPER)
    assert set(r["speedups"]) == set(models)
    assert all(x >= 1.0 for x in r["speedups"].values())
    assert r["paper"] == {m: PAPER[m] for m in models}
    assert r["hand_configs"] > 0 and r["hand_min_ratio"] >= 1.0 - 1e-9
    assert all(r["free"][m] < r["speedups"][m] for m in r["speedups"])


def _check_03(r, quick):
    assert r["best"]["dp"] * r["best"]["tp"] * r["best"]["pp"] == 1024
    assert r["best"]["tp"] <= 8
    assert 0 < r["mfu"] < 1
    c = r["counts"]
    assert c["considered"] > 1000 and c["simulated"] >= 1
    assert r["gain_over_megatron_like"] >= 1.0 - 1e-9


def _check_05(r, quick):
    assert 1.0 < r["straggler_2x"] <= 2.0 + 1e-9
    assert r["link_10pct"] > 1.0
    assert r["all_a100_speedup"] > 1.0


CHECKS = {"01_what_if_schedules": _check_01, "02_paper_reproduction": _check_02,
          "03_planner_175b": _check_03, "05_what_if_64gpu": _check_05}


def _images(nb) -> int:
    return sum("image/png" in out.get("data", {})
               for c in nb.cells if c.cell_type == "code" for out in c.get("outputs", []))


def test_notebooks_exist():
    names = {p.stem for p in NOTEBOOKS}
    assert set(CHECKS) <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_readers_see_no_test_plumbing(path):
    """No cell, source or output, carries the numbers the tests read (they were a
    visible last cell printing ``NOTEBOOK_RESULT {json}``)."""
    nb = nbformat.read(path, as_version=4)
    shown = [c.source for c in nb.cells] + [
        str(out.get("text", "")) + json.dumps(out.get("data", {}))
        for c in nb.cells if c.cell_type == "code" for out in c.get("outputs", [])]
    assert not [x for x in shown if "NOTEBOOK_RESULT" in x], path.name
    assert nb.metadata["merak"]["result"].lstrip().startswith("{")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_carries_outputs(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and "What it answers" in first.source
    assert _images(nb) >= 1, f"{path.name}: committed without figures (run make notebooks)"
    r = _result(nb)  # the full setting, as make notebooks ran it
    assert not r.get("quick", False), f"{path.name}: committed from a quick run"
    check = CHECKS.get(path.stem)
    if check is not None:
        check(r, quick=False)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    src = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "assert " in src, f"{path.name} asserts on nothing it computes"
    monkeypatch.setenv("MERAK_NOTEBOOK_QUICK", "1")  # the kernel inherits it
    cells = len(nb.cells)
    r = _runner().execute(nb, str(tmp_path), TIMEOUT_S)
    assert len(nb.cells) == cells  # the numbers' cell is gone again
    assert _images(nb) >= 1, f"{path.name} shows no figure"
    quick = path.stem in QUICK
    assert r.get("quick", False) == quick, f"{path.name}: quick setting not taken"
    check = CHECKS.get(path.stem)
    if check is not None:
        check(r, quick)
