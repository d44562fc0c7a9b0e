"""Execute every notebooks/*.ipynb in place with nbclient and store the outputs
(``make notebooks``), so the committed notebooks show their tables and figures.
Run: ``python notebooks/run_notebooks.py [NAME.ipynb ...]``."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def run(path: Path, timeout_s: int = 600) -> float:
    """Execute one notebook in a scratch directory, write it back with its outputs
    (atomically) and return the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="merak-nb-") as tmp:
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                       resources={"metadata": {"path": tmp}}).execute()
    tmp_path = path.with_suffix(".tmp")
    tmp_path.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
    tmp_path.replace(path)
    return time.perf_counter() - t0


if __name__ == "__main__":
    names = sys.argv[1:] or sorted(p.name for p in HERE.glob("*.ipynb"))
    unknown = [n for n in names if not (HERE / n).is_file() or not n.endswith(".ipynb")]
    if unknown:
        print(f"run_notebooks.py: no notebook {unknown[0]!r} in notebooks/; give names "
              "like 03_planner_175b.ipynb, or none for every notebook", file=sys.stderr)
        sys.exit(2)
    for name in names:
        print(f"{name}: executed in {run(HERE / name):.0f} s", flush=True)
