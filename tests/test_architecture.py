"""House rules of the package layout, checked on the source (AST) of every module.

- ``merak_sim`` never imports torch, transformers or ``merak_exec``: not at module
  level, not inside functions, not through ``importlib.import_module("...")``.
- No import cycle among the project's modules. The graph counts every import a module
  can execute (inside functions too), with relative imports resolved, and the imports
  under ``if TYPE_CHECKING:`` too; the implicit imports of a module's own parent
  packages are left out (``a.b.c`` always runs ``a/__init__`` and ``a/b/__init__``).
- No function over 80 lines (files split by meaning, not by a line count).
- ParallelConfig is a plain value: no method takes a cost table or builds a schedule.
- No monkey-patching of project modules: no ``mod.attr = ...``, ``setattr(mod, ...)``,
  ``del mod.attr`` or ``Class.method = ...`` where ``mod`` / ``Class`` is an imported
  project module or class.
- No use of another module's private (``_x``) names: no ``from x import _y`` and no
  ``x._y`` where ``x`` is an imported project module or class; nor the runtime's and
  recorder's internals through instances (``rt._...``, ``._t0``, ``._heavy``).

Each test prints every offender, one per line, so a red run is a to-do list.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("merak_sim", "merak_exec")
FORBIDDEN_IN_SIM = ("torch", "transformers", "merak_exec")
MAX_FUNCTION_LINES = 80
# Private attributes of the runtime, recorder and stage modules that other modules
# reached through instances; an instance's type is not visible in the AST, so these
# are checked by name (``self._t0`` inside the owning class is fine).
PRIVATE_INSTANCE_ATTRS = ("_t0", "_heavy")
RUNTIME_NAMES = ("rt",)


@dataclass(frozen=True)
class Import:
    """One import a module can execute: the target's dotted name and where it is."""

    target: str
    line: int
    type_checking: bool


@dataclass
class Module:
    """A parsed project module and what its imports bind."""

    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    lines: int
    imports: list[Import] = field(default_factory=list)
    # local name -> dotted project name it is bound to (a module or a module's object)
    bindings: dict[str, str] = field(default_factory=dict)

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _is_project(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve_relative(mod: Module, level: int, target: str | None) -> str:
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    parts = package.split(".")
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{target}" if target else base


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_module_target(node: ast.AST) -> str | None:
    """``importlib.import_module("x")`` / ``import_module("x")`` / ``__import__("x")``."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    arg = node.args[0]
    if name in ("import_module", "__import__") and isinstance(arg, ast.Constant) \
            and isinstance(arg.value, str) and not arg.value.startswith("."):
        return arg.value
    return None


class _ImportCollector(ast.NodeVisitor):
    def __init__(self, mod: Module, known: set[str]):
        self.mod, self.known, self.tc = mod, known, 0

    def _add(self, target: str, node: ast.AST) -> None:
        self.mod.imports.append(Import(target, node.lineno, self.tc > 0))

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self.tc += 1
            for child in node.body:
                self.visit(child)
            self.tc -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)
            if _is_project(alias.name):
                if alias.asname:
                    self.mod.bindings[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    self.mod.bindings[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve_relative(self.mod, node.level, node.module) if node.level \
            else node.module or ""
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            target = sub if sub in self.known else base
            self._add(target, node)
            if _is_project(base) and alias.name != "*":
                self.mod.bindings[alias.asname or alias.name] = sub

    def visit_Call(self, node: ast.Call) -> None:
        target = _import_module_target(node)
        if target:
            self._add(target, node)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        target = _import_module_target(node.value)
        if target and _is_project(target):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    self.mod.bindings[t.id] = target
        self.generic_visit(node)


def _load() -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            name, is_pkg = _module_name(path)
            text = path.read_text(encoding="utf-8")
            mods[name] = Module(name, path, is_pkg, ast.parse(text, filename=str(path)),
                                len(text.splitlines()))
    known = set(mods)
    for mod in mods.values():
        _ImportCollector(mod, known).visit(mod.tree)
    return mods


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    """Every module of the two packages, parsed once."""
    mods = _load()
    assert "merak_sim" in mods and "merak_exec" in mods, sorted(mods)[:5]
    return mods


def _by_place(hit: str) -> tuple[str, int, str]:
    path, _, rest = hit.partition(":")
    line, _, text = rest.partition(":")
    return (path, int(line), text) if line.isdigit() else (path, 0, rest)


def _report(title: str, offenders: list[str]) -> str:
    return f"{title} ({len(offenders)}):\n  " + "\n  ".join(sorted(offenders, key=_by_place))


def test_simulator_never_imports_the_backend_or_torch(modules):
    offenders = sorted({
        f"{m.rel}:{imp.line}: imports {imp.target}"
        for m in modules.values() if m.name.split(".")[0] == "merak_sim"
        for imp in m.imports if imp.target.split(".")[0] in FORBIDDEN_IN_SIM
    })
    assert not offenders, _report("merak_sim imports torch, transformers or merak_exec",
                                  offenders)


def _owner(target: str, known: set[str]) -> str | None:
    """The project module an import of ``target`` runs (its longest known prefix)."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in known:
            return name
    return None


def import_graph(modules: dict[str, Module], type_checking: bool = True
                 ) -> dict[str, set[str]]:
    """module -> project modules it imports (parents excluded): every import a module
    holds, the ``if TYPE_CHECKING:`` ones too unless ``type_checking`` is False (a
    cycle through an annotation is still two modules that know each other)."""
    known = set(modules)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for m in modules.values():
        ancestors = {".".join(m.name.split(".")[:i]) for i in range(1, m.name.count(".") + 1)}
        if m.is_package:
            ancestors.discard(m.name)
        for imp in m.imports:
            dst = None if imp.type_checking and not type_checking else \
                _owner(imp.target, known)
            if dst and dst != m.name and dst not in ancestors:
                graph[m.name].add(dst)
    return graph


def _shortest_cycle(graph: dict[str, set[str]], start: str, scc: set[str]) -> list[str] | None:
    prev: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & scc):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if nxt not in seen:
                seen.add(nxt)
                prev[nxt] = node
                queue.append(nxt)
    return None


def _sccs(graph: dict[str, set[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each import cycle as ``a -> b -> a``: the shortest one through every module of
    every strongly connected component, rotations removed."""
    cycles: list[str] = []
    seen: set[frozenset] = set()
    for scc in _sccs(graph):
        for start in sorted(scc):
            cyc = _shortest_cycle(graph, start, scc)
            key = frozenset(zip(cyc, cyc[1:], strict=False)) if cyc else None
            if cyc and key not in seen:
                seen.add(key)
                cycles.append(" -> ".join(cyc))
    return cycles


def test_cycle_finder_reports_each_cycle_once():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}
    assert sorted(find_cycles(graph)) == ["a -> b -> a", "c -> d -> c"]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_relative_imports_resolve(tmp_path):
    """``from .x import y`` in a module and in a package ``__init__``; ``from .. import``."""
    known = {"merak_sim.planner", "merak_sim.planner.search", "merak_sim.planner.space",
             "merak_sim.costs", "merak_sim.costs.analytic"}
    cases = [("merak_sim.planner.search", False, "from .space import X", "merak_sim.planner.space"),
             ("merak_sim.planner", True, "from .search import X", "merak_sim.planner.search"),
             ("merak_sim.planner.search", False, "from ..costs import analytic",
              "merak_sim.costs.analytic"),
             ("merak_sim.planner.search", False, "from ..costs import Y", "merak_sim.costs")]
    for name, is_pkg, src, want in cases:
        mod = Module(name, tmp_path / "m.py", is_pkg, ast.parse(src), 1)
        _ImportCollector(mod, known).visit(mod.tree)
        assert [i.target for i in mod.imports] == [want], (name, src)


def test_no_import_cycles(modules):
    cycles = find_cycles(import_graph(modules))
    assert not cycles, _report("import cycles", cycles)


def test_no_function_over_80_lines(modules):
    """A function a reader can hold: none over MAX_FUNCTION_LINES lines from its first
    decorator to its end (a command's options count: long groups live beside it)."""
    offenders = []
    for m in modules.values():
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                n = node.end_lineno - first + 1
                if n > MAX_FUNCTION_LINES:
                    offenders.append(f"{m.rel}:{node.lineno}: {node.name} has {n} lines")
    assert not offenders, _report(f"functions over {MAX_FUNCTION_LINES} lines", offenders)


def test_parallel_config_is_a_plain_value(modules):
    """ParallelConfig holds fields, validation and serialisation: no method takes a cost
    table, builds a schedule or places a stage (merak_sim.sim.from_config does)."""
    tree = modules["merak_sim.config"].tree
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name ==
               "ParallelConfig")
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    offenders = [f"ParallelConfig.{f.name}" for f in methods
                 if any("table" in a.arg or "schedule" == a.arg for a in f.args.args)
                 or f.name in ("build_schedule", "recompute_per_stage", "rank_of_stage",
                               "engine_zero")]
    assert not offenders, _report("ParallelConfig methods beyond a value", offenders)
    imported = {i.target for i in modules["merak_sim.config"].imports}
    assert not any(t.startswith(("merak_sim.costs", "merak_sim.sim")) for t in imported)


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound_project_root(mod: Module, node: ast.expr) -> str | None:
    root = _root_name(node)
    return mod.bindings.get(root) if root else None


def _patches(mod: Module) -> list[str]:
    found = []

    def check(target: ast.expr, how: str, line: int) -> None:
        bound = _bound_project_root(mod, target)
        if bound:
            found.append(f"{mod.rel}:{line}: {how} {ast.unparse(target)} ({bound})")

    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for t in targets:
                for sub in ast.walk(t):  # tuple targets: a, m.x = ...
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store | ast.Del):
                        check(sub, "assigns" if not isinstance(node, ast.Delete) else "deletes",
                              node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("setattr", "delattr") and node.args:
            check(node.args[0], node.func.id, node.lineno)
    return found


def test_no_monkey_patching_of_project_modules(modules):
    offenders = [hit for m in modules.values() for hit in _patches(m)]
    assert not offenders, _report("monkey-patching of project modules or classes", offenders)


def _private_uses(mod: Module) -> list[str]:
    found = []
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve_relative(mod, node.level, node.module) if node.level \
                else node.module or ""
            if _is_project(base):
                found += [f"{mod.rel}:{node.lineno}: from {base} import {a.name}"
                          for a in node.names if _is_private(a.name)]
        elif isinstance(node, ast.Import):
            found += [f"{mod.rel}:{node.lineno}: import {a.name}" for a in node.names
                      if _is_project(a.name) and any(_is_private(p) for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = node.value
            root = _root_name(owner)
            text = f"{mod.rel}:{node.lineno}: {ast.unparse(node)}"
            if root and root in mod.bindings:
                found.append(f"{text} ({mod.bindings[root]} is another module's)")
            elif isinstance(owner, ast.Name) and owner.id in RUNTIME_NAMES:
                found.append(f"{text} (the runtime's private state)")
            elif node.attr in PRIVATE_INSTANCE_ATTRS and not (
                    isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append(f"{text} (another object's private state)")
    return found


def test_no_private_names_across_modules(modules):
    offenders = [hit for m in modules.values() for hit in _private_uses(m)]
    assert not offenders, _report("use of another module's private names", offenders)


def test_checks_catch_what_they_claim():
    """The collectors on a synthetic module: each rule sees its pattern."""
    src = (
        "import importlib\n"
        "import merak_exec.runtime as rt_mod\n"
        "from merak_sim.sim import engine\n"
        "from merak_sim.schedule.ir import _private, Action\n"
        "def f(rt):\n"
        "    import torch\n"
        "    importlib.import_module('transformers')\n"
        "    rt_mod.PipelineRuntime.run = None\n"
        "    setattr(engine, 'x', 1)\n"
        "    Action.parse = None\n"
        "    rt._post = None\n"
        "    return rt.recorder._t0, engine._helper\n"
    )
    mod = Module("merak_sim.fake", ROOT / "merak_sim" / "fake.py", False, ast.parse(src), 12)
    _ImportCollector(mod, {"merak_sim.sim.engine", "merak_sim.schedule.ir"}).visit(mod.tree)
    targets = {i.target for i in mod.imports}
    assert {"torch", "transformers", "merak_exec.runtime", "merak_sim.sim.engine"} <= targets
    patches = _patches(mod)
    assert sorted(p.split(": ", 1)[1].split(" (")[0] for p in patches) == [
        "assigns Action.parse", "assigns rt_mod.PipelineRuntime.run", "setattr engine"]
    private = [p.split(": ", 1)[1].split(" (")[0] for p in _private_uses(mod)]
    assert sorted(private) == sorted(["from merak_sim.schedule.ir import _private",
                                      "rt._post", "rt.recorder._t0", "engine._helper"])


def test_cli_reference_names_every_command_and_option():
    """docs/cli.md documents every command and option of merak-sim and merak-exec."""
    import click

    from merak_exec.__main__ import cli as exec_cli
    from merak_sim.cli import cli as sim_cli

    doc = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    missing = []
    for prog, group in (("merak-sim", sim_cli), ("merak-exec", exec_cli)):
        for name in group.list_commands(None):
            cmd = group.get_command(None, name)
            head = f"### `{prog} {name}`"
            if head not in doc:
                missing.append(head)
                continue
            section = doc.split(head, 1)[1].split("\n### ", 1)[0]
            missing += [f"{prog} {name} {opt}" for p in cmd.params
                        if isinstance(p, click.Option) for opt in p.opts + p.secondary_opts
                        if f"`{opt}`" not in section]
    assert not missing, _report("docs/cli.md misses", missing)
