"""Shared test helpers."""

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def load_benchmark():
    """``load_benchmark("name")``: the script ``benchmarks/name.py`` imported as a module
    (the scripts are not a package; they import the installed package only)."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            loaded[name] = mod
        return loaded[name]
    return load
