"""``merak_sim`` works where torch, transformers and ``merak_exec`` cannot be imported.

A fresh interpreter gets a meta-path finder that refuses those three names, then
imports every ``merak_sim`` module and runs the ``merak-sim`` command line
(``--help``, ``python -m merak_sim --help``, a small ``schedule`` and ``simulate``).
This is the install without the ``exec`` extra, checked without building a second
virtual environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import contextlib, importlib, importlib.abc, io, json, pkgutil, runpy, sys

    BLOCKED = ("torch", "transformers", "merak_exec")
    attempts = []

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                attempts.append(name)
                raise ImportError(f"{name} is blocked (simulator-only install)")
            return None

    sys.meta_path.insert(0, Refuse())
    out = {"failed": [], "modules": 0, "cli": {}}

    import merak_sim

    def failed(name):
        out["failed"].append(f"{name}: {sys.exc_info()[0].__name__}: {sys.exc_info()[1]}")

    for info in pkgutil.walk_packages(merak_sim.__path__, "merak_sim.", onerror=failed):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # runs the command line on import; run below through runpy
        try:
            importlib.import_module(info.name)
            out["modules"] += 1
        except Exception:
            failed(info.name)

    from merak_sim.cli import main

    def run(key, argv):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(argv)
        out["cli"][key] = {"rc": rc, "stdout": buf.getvalue()}

    run("help", ["--help"])
    run("schedule", ["schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8"])
    run("simulate", ["simulate", "--model", "gpt-1.5b", "--cluster", "paper-3090",
                     "--nodes", "1", "--dp", "1", "--tp", "1", "--pp", "4",
                     "--micro-batch-size", "1", "--global-batch-size", "8",
                     "--schedule", "1f1b", "--recompute", "full", "--json"])
    buf = io.StringIO()
    sys.argv = ["merak-sim", "--help"]
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_module("merak_sim", run_name="__main__")
            rc = None
        except SystemExit as e:
            rc = e.code
    out["cli"]["module"] = {"rc": rc, "stdout": buf.getvalue()}
    out["attempts"] = sorted(set(attempts))
    out["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps(out))
''')


def _run_blocked() -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_simulator_imports_and_runs_without_torch():
    out = _run_blocked()
    assert not out["failed"], "merak_sim modules that need a blocked package:\n  " + \
        "\n  ".join(out["failed"])
    assert out["modules"] > 40, out["modules"]  # walk_packages really walked the tree
    assert not out["loaded"], out["loaded"]
    # Even a guarded ``try: import torch`` counts: the simulator never asks for them.
    assert not out["attempts"], out["attempts"]
    cli = out["cli"]
    for key in ("help", "module"):
        assert cli[key]["rc"] == 0, (key, cli[key])
        assert "simulate" in cli[key]["stdout"] and "schedule" in cli[key]["stdout"]
    assert cli["schedule"]["rc"] == 0, cli["schedule"]
    assert "validated: deadlock-free" in cli["schedule"]["stdout"]
    assert "makespan (f=1, b=2, recompute=1): 44" in cli["schedule"]["stdout"]
    assert cli["simulate"]["rc"] == 0, cli["simulate"]
    summary = json.loads(cli["simulate"]["stdout"])
    assert summary["iteration_time_s"] > 0 and summary["fits_in_memory"] in (True, False)


EXEC_SCRIPT = textwrap.dedent('''
    import importlib.abc, sys

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "transformers"):
                raise ImportError(f"{name} is blocked (simulator-only install)")
            return None

    sys.meta_path.insert(0, Refuse())
    from merak_exec.__main__ import main
    main(["--help"])
''')


def test_merak_exec_without_torch_says_so_in_one_line():
    """Without the ``exec`` extra, ``merak-exec`` exits 2 with one line naming it."""
    p = subprocess.run([sys.executable, "-c", EXEC_SCRIPT], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines == ["merak-exec: error: torch is not installed; install the backend with "
                     "pip install 'merak[exec]'"], p.stderr
