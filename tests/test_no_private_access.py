"""No module reaches into another module's private names, and the product packages
replace none of their own functions: profilers use the runtime's public hooks.

Private names are those starting with one underscore (not dunders). A name counts as
another module's when some other project module defines it (a module-level ``_x``, a
method ``_x`` or an attribute ``self._x = ...``) and the module using it does not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["merak_sim", "merak_exec", "benchmarks", "tests", "notebooks", "scripts"]
PACKAGES = ["merak_sim", "merak_exec"]
# the accesses the runtime's hooks replaced, by pattern (a module's own ``self._x`` is
# not matched)
FORBIDDEN = [r"\brt\._[a-z]", r"\bruntime\._[a-z]", r"(?<!self)\._t0\b",
             r"(?<!self)\._heavy\b", r"\brecorder\._[a-z]"]


def _modules() -> list[Path]:
    out = []
    for d in SCANNED:
        if (ROOT / d).is_dir():
            out += [p for p in sorted((ROOT / d).rglob("*.py")) if ".venv" not in p.parts]
    # this file and the architecture test hold the forbidden patterns as test data
    skip = {Path(__file__).resolve(), (ROOT / "tests" / "test_architecture.py").resolve()}
    return [p for p in out if p.resolve() not in skip]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.AST) -> set[str]:
    """Private names a module defines: module-level and class-level ones, methods and
    ``self._x`` attributes."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if _private(n)}


def _foreign_uses(tree: ast.AST, own: set[str], others: set[str]) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) \
                and node.attr in others and node.attr not in own:
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in \
                PACKAGES:
            out += [(node.lineno, a.name) for a in node.names if _private(a.name)]
    return out


#: Cross-module uses still to be replaced, each with what replaces it; the test fails
#: when one disappears, so the list only shrinks.
KNOWN: dict[tuple[str, str], str] = {}


def test_no_module_uses_another_modules_private_names():
    trees = {p: ast.parse(p.read_text(), str(p)) for p in _modules()}
    defined = {p: _defined(t) for p, t in trees.items()}
    found = set()
    for p, tree in trees.items():
        others = set().union(*(d for q, d in defined.items() if q != p))
        found |= {(str(p.relative_to(ROOT)), name)
                  for _, name in _foreign_uses(tree, defined[p], others)}
    new, gone = sorted(found - set(KNOWN)), sorted(set(KNOWN) - found)
    assert not new, f"private names used across modules: {new}"
    assert not gone, f"no longer used, drop them from KNOWN: {gone}"


def test_no_runtime_internals_are_touched():
    bad = []
    for p in _modules():
        for i, line in enumerate(p.read_text().splitlines(), 1):
            bad += [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
                    for pat in FORBIDDEN if re.search(pat, line)]
    assert not bad, "\n".join(bad)


def test_product_packages_patch_none_of_their_own_modules():
    """No assignment to an attribute of an imported project module or class (the old
    validation profiler replaced ``merak_exec.stages.checkpoint`` and runtime methods)."""
    bad = []
    for p in _modules():
        if p.relative_to(ROOT).parts[0] not in PACKAGES:
            continue
        tree = ast.parse(p.read_text())
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {(a.asname or a.name).split(".")[0] for a in node.names
                             if a.name.split(".")[0] in PACKAGES}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] \
                    in PACKAGES:
                imported |= {a.asname or a.name for a in node.names}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                        and t.value.id in imported:
                    bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: {ast.unparse(t)}")
    assert not bad, "\n".join(bad)
