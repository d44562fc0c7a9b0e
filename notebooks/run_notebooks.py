"""Execute every notebooks/*.ipynb in place with nbclient and store the outputs
(``make notebooks``), so the committed notebooks show their tables and figures.
Run: ``python notebooks/run_notebooks.py [NAME.ipynb ...]``.

:func:`execute` is how both this script and tests/test_notebooks.py run a notebook: its
headline numbers (the expression in its metadata, ``merak.result``) are evaluated in
its kernel by one more cell after the last, which is removed again, so the reader
never sees test plumbing; this script stores them in ``merak.result_value``."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


#: What the extra cell prints before the JSON of the headline numbers.
RESULT_PREFIX = "NOTEBOOK_RESULT "


def execute(nb, workdir: str, timeout_s: int = 600) -> dict:
    """Run notebook ``nb`` (in place, outputs kept) in ``workdir`` and return its
    headline numbers (module docstring); ``nb`` ends as it began, without the extra
    cell."""
    expr = nb.metadata.get("merak", {}).get("result")
    if not expr:
        raise ValueError("the notebook's metadata holds no merak.result expression "
                         "(notebooks/build_notebooks.py)")
    nb.cells.append(nbformat.v4.new_code_cell(
        f"import json as _json\nprint({RESULT_PREFIX!r} + _json.dumps({expr}))"))
    try:
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                       resources={"metadata": {"path": workdir}}).execute()
        text = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    finally:
        nb.cells.pop()
    line = next((ln for ln in text.splitlines() if ln.startswith(RESULT_PREFIX)), None)
    if line is None:
        raise ValueError("the notebook's headline numbers printed nothing")
    return json.loads(line[len(RESULT_PREFIX):])


def run(path: Path, timeout_s: int = 600) -> float:
    """Execute one notebook in a scratch directory, write it back with its outputs
    and its headline numbers (atomically) and return the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="merak-nb-") as tmp:
        nb.metadata["merak"]["result_value"] = execute(nb, tmp, timeout_s)
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
