"""How ``make test`` splits the suite over its two xdist workers (tests/conftest.py):
every module naming a shared launch is in the one unit that makes it, every name the
lists give is a real module, and a module otherwise runs whole on one worker."""

import ast
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent
MODULES = {p.stem: p for p in TESTS.glob("test_*.py")}


def _asks_for_shared_launch(path: Path) -> bool:
    tree = ast.parse(path.read_text(), str(path))
    return any(a.arg in conftest.SHARED_LAUNCHES
               for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
               for a in node.args.args)


def test_every_shared_launch_user_is_in_the_shared_unit():
    users = {name for name, p in MODULES.items() if _asks_for_shared_launch(p)}
    assert users, "no module asks for a shared launch: the test reads nothing"
    assert users <= conftest.SHARED_LAUNCH_MODULES, users - conftest.SHARED_LAUNCH_MODULES


def test_every_listed_module_exists():
    named = conftest.SHARED_LAUNCH_MODULES | conftest.INDEPENDENT | \
        (set(conftest.LONGEST_FIRST) - {"shared-launches"})
    assert named <= set(MODULES), named - set(MODULES)


def test_work_units():
    unit = conftest.work_unit
    assert unit("tests/test_exec_fsdp.py::test_a") == unit("tests/test_faults.py::t[x]") \
        == "shared-launches"
    assert unit("tests/test_config.py::test_a") == unit("tests/test_config.py::test_b[1]") \
        == "tests/test_config.py"
    nb = "tests/test_notebooks.py::test_notebook_executes[01_what_if_schedules]"
    assert unit(nb) == nb
