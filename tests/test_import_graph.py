"""The import graph of arrayrnn: every module imports in a fresh interpreter, module-level imports form
no cycle, engines never import the tape (``arrayrnn.autodiff``), and spec / layout / params never
import an engine (a format's engine is reached only at call time, inside a function)."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import arrayrnn

ROOT = Path(arrayrnn.__file__).parent


def module_files() -> dict[str, Path]:
    files = {}
    for info in pkgutil.walk_packages([str(ROOT)], prefix="arrayrnn."):
        path = ROOT.joinpath(*info.name.split(".")[1:])
        files[info.name] = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
    files["arrayrnn"] = ROOT / "__init__.py"
    return files


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _module_level(tree: ast.Module):
    """Import nodes executed at import time: not inside functions, not under ``if TYPE_CHECKING``."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in _module_level(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                target = _resolve(module, is_package, node)
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in files else target
                           for a in node.names]
            edges |= {t for t in targets if t in files and t != module}
        graph[module] = edges
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(module_files())
    code = ("import importlib, json, sys\n"
            f"names = {names!r}\n"
            "failed = {}\n"
            "for n in names:\n"
            "    try:\n"
            "        importlib.import_module(n)\n"
            "    except ImportError as e:\n"
            "        failed[n] = str(e)\n"
            "print(json.dumps(failed))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT.parent)
    failed = json.loads(out.stdout)
    optional = {"numba", "cupy"}  # a module may fail only for want of an optional dependency
    assert all(any(dep in msg for dep in optional) for msg in failed.values()), failed


def test_module_level_imports_form_no_cycle():
    graph = import_graph()
    for module in graph:
        # a package's own __init__ is imported first by its submodules, so an edge back to an ancestor
        # package is what Python does anyway; every other path back to the start is a cycle
        assert module not in reachable(graph, module), f"import cycle through {module}"


def test_engines_never_import_the_tape():
    graph = import_graph()
    for module in graph:
        if module.startswith("arrayrnn.engines"):
            tape = {m for m in reachable(graph, module) if m.startswith("arrayrnn.autodiff")}
            assert not tape, f"{module} imports {tape}"


def test_spec_layout_and_params_never_import_an_engine():
    graph = import_graph()
    for module in ("arrayrnn.core.spec", "arrayrnn.core.layout", "arrayrnn.core.params",
                   "arrayrnn.frontend.dropout"):
        engines = {m for m in reachable(graph, module) if m.startswith("arrayrnn.engines")}
        assert not engines, f"{module} imports {engines}"


def test_cells_moved_under_engines():
    assert "arrayrnn.cells" not in module_files() and "arrayrnn.engines.cells" in module_files()
    assert "arrayrnn.formats" not in module_files()
