"""The schedule catalogue (benchmarks/schedule_table.py) and docs/schedules.md: a row
for every registered schedule, figures that match the known unit-cost makespans."""

from __future__ import annotations

from pathlib import Path

from merak_sim.schedule import SCHEDULES

DOC = Path(__file__).resolve().parents[1] / "docs" / "schedules.md"


def test_table_has_a_row_per_registered_schedule(load_benchmark):
    bench = load_benchmark("schedule_table")
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
    assert not missing, f"docs/schedules.md lacks {missing}; rerun benchmarks/schedule_table.py"
