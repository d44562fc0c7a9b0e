"""The README's Python snippets run as written (the simulator's), or at least compile
and name only real API (the backend's, which needs torchrun and 8 processes)."""

import ast
import importlib
import re

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_both_snippets():
    blocks = _python_blocks()
    assert any("import merak_sim" in b for b in blocks)
    assert any("import merak_exec" in b for b in blocks)


def test_merak_sim_snippets_run(capsys):
    ran = 0
    for code in _python_blocks():
        if "merak_exec" in code:
            continue
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102
        ran += 1
    assert ran >= 1
    out = capsys.readouterr().out.split()
    assert out and float(out[0]) > 0


def _attribute_uses(tree: ast.AST, module: str) -> set[str]:
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == module}


def test_merak_exec_snippet_names_real_api():
    pytest.importorskip("torch")
    import merak_exec

    code = next(b for b in _python_blocks() if "merak_exec" in b)
    tree = ast.parse(code)  # compiles
    assert _attribute_uses(tree, "merak_exec") <= set(merak_exec.__all__)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module.startswith("merak_exec"):
            mod = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(mod, alias.name), f"{node.module}.{alias.name}"
    # Every name the snippet reads is bound in it or imported.
    bound = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
             if isinstance(t, ast.Name)}
    bound |= {a.asname or a.name.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    bound |= {n.target.id for n in ast.walk(tree) if isinstance(n, ast.comprehension)
              and isinstance(n.target, ast.Name)}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)}
    assert read - bound - set(dir(__builtins__)) == set()
