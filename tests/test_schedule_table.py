"""The schedule catalogue (tools/schedule_table.py) and docs/schedules.md: a row
for every registered schedule, figures that match the known unit-cost makespans."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from merak_sim.schedule import SCHEDULES

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "schedules.md"


def _tool():
    """tools/schedule_table.py imported as a module (the tools are scripts, not a
    package)."""
    spec = importlib.util.spec_from_file_location("schedule_table",
                                                  ROOT / "tools" / "schedule_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table_has_a_row_per_registered_schedule():
    bench = _tool()
    rows = bench.table().splitlines()[2:]
    assert [r.split("|")[1].strip().strip("`") for r in rows] == list(SCHEDULES)
    assert bench.figures("1f1b", 4, 8) == {"unit": 33.0, "unit_recompute": 44.0, "peak": 4.0}
    assert bench.figures("1f1b", 8, 16)["unit"] == 69.0
    assert bench.figures("interleaved-1f1b", 8, 16)["peak"] == 11.5
    assert bench.figures("interleaved-1f1b", 4, 6) is None  # M not a multiple of pp
    assert bench.requirements(SCHEDULES["1f1b"]) == "none"
    assert "microbatches_multiple_of_pp" in bench.requirements(SCHEDULES["interleaved-1f1b"])


def test_docs_name_every_registered_schedule():
    """docs/schedules.md is regenerated from the script when a schedule is added."""
    text = DOC.read_text()
    missing = [n for n in SCHEDULES if f"`{n}`" not in text]
    assert not missing, f"docs/schedules.md lacks {missing}; rerun tools/schedule_table.py"
