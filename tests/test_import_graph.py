"""The import graph of arrayrnn, counting every import a module can execute (at import time or inside a
function; only ``if TYPE_CHECKING`` blocks are left out): every module imports in a fresh interpreter,
there is no cycle, and each folder imports only its own layer and the layers below it::

    core  <  engines  <  frontend  <  autodiff  <  training  <  adapters  <  the package root, its
                                                                             public aliases and the demo

Adapters are written against the public API (``import arrayrnn as ar``), as user code is; the package
root never imports an adapter, so that edge makes no cycle.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import arrayrnn

ROOT = Path(arrayrnn.__file__).parent
LAYERS = ("core", "engines", "frontend", "autodiff", "training", "adapters")


def module_files() -> dict[str, Path]:
    files = {}
    for info in pkgutil.walk_packages([str(ROOT)], prefix="arrayrnn."):
        path = ROOT.joinpath(*info.name.split(".")[1:])
        files[info.name] = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
    files["arrayrnn"] = ROOT / "__init__.py"
    return files


def layer(module: str) -> int:
    """The rank of ``module``'s folder; the root package, its aliases and the demo rank above them all."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _executable_imports(tree: ast.Module):
    """Every import node that can run: at module level or in a function body, not under TYPE_CHECKING."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in _executable_imports(ast.parse(path.read_text())):
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


def _is_package_edge(module: str, target: str) -> bool:
    """A module importing its own parent package's ``__init__`` (Python imports it first anyway); not a
    package further up, and not the package root: ``from ... import rnn_forward`` deep in an engine is an
    arrow back up."""
    return module.rpartition(".")[0] == target


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
    optional = {"numba", "cupy", "torch", "jax"}  # a module may fail only for want of an optional dependency
    assert all(any(dep in msg for dep in optional) for msg in failed.values()), failed


def test_imports_form_no_cycle_even_counting_imports_inside_functions():
    graph = import_graph()
    graph = {m: {t for t in edges if not _is_package_edge(m, t)} for m, edges in graph.items()}
    for module in graph:
        assert module not in reachable(graph, module), f"import cycle through {module}"


def test_each_layer_imports_only_itself_and_the_layers_below():
    for module, edges in import_graph().items():
        for target in edges:
            if _is_package_edge(module, target) or (layer(module) == LAYERS.index("adapters")
                                                    and target == "arrayrnn"):
                continue
            assert layer(target) <= layer(module), f"{module} imports {target}, a layer above it"


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking():
    # the checks above would pass by construction if they read only module-level imports
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from .hidden import A\n"
              "class K:\n    def method(self):\n        from ..engines import load_engine\n"
              "def f():\n    try:\n        import mpi4py\n    except ImportError:\n        pass\n")
    found = {ast.unparse(n) for n in _executable_imports(ast.parse(source))}
    assert found == {"from typing import TYPE_CHECKING", "from ..engines import load_engine", "import mpi4py"}


WINGS = ("arrayrnn.engines.numba", "arrayrnn.engines.cupy", "arrayrnn.engines.cudnn")


def wing_of(module: str) -> str | None:
    """The engine wing (a folder of engines/) that ``module`` belongs to, or None."""
    return next((w for w in WINGS if module == w or module.startswith(w + ".")), None)


def test_the_wings_are_the_engines_folders():
    # every folder under engines/ is a wing listed here, so the checks below see each one
    folders = {p.parent for p in (ROOT / "engines").glob("*/__init__.py")}
    assert {"arrayrnn.engines." + f.name for f in folders} == set(WINGS)
    graph = import_graph()
    assert {"arrayrnn.engines.numba.engine", "arrayrnn.engines.numba.lstm_loops",
            "arrayrnn.engines.cupy.engine", "arrayrnn.engines.cupy.kernels",
            "arrayrnn.engines.cudnn.engine"} <= set(graph)


def test_each_wing_stands_on_the_shared_driver_and_no_shared_module_imports_a_wing():
    # an engine wing (arrayrnn/engines/numba/, cupy/, cudnn/) may import the engines' shared modules; no
    # shared engine module imports a wing (the registry names each engine as a string), so the driver, the
    # other engines and the data model never load an engine's compiled code or its GPU libraries
    for module, edges in import_graph().items():
        if not module.startswith("arrayrnn.engines") or wing_of(module) is not None:
            continue
        wings = {t for t in edges if wing_of(t) is not None}
        assert not wings, f"{module}, a shared engines module, imports a wing: {sorted(wings)}"


def test_no_wing_imports_another():
    for module, edges in import_graph().items():
        own = wing_of(module)
        if own is None:
            continue
        others = {t for t in edges if wing_of(t) not in (None, own)}
        assert not others, f"{module} ({own}) imports another wing: {sorted(others)}"


# what the layers above the engines may take from them (docs/guide/layout.md): the seam, the data types,
# the shared helpers, the math custom cells are written in (cellmath), and, for compile_ahead alone, the
# numba engine's background-compile jobs it runs
ENGINES_SEAM = {"arrayrnn.engines", "arrayrnn.engines.base", "arrayrnn.engines.thread_count",
                "arrayrnn.engines.numba_cache", "arrayrnn.engines.pointwise", "arrayrnn.engines.determinism",
                "arrayrnn.engines.cellmath"}
SEAM_EXCEPTIONS = {"arrayrnn.frontend.compile_ahead": {"arrayrnn.engines.numba.warmup"}}


def test_the_layers_above_reach_the_engines_through_their_seam():
    for module, edges in import_graph().items():
        if layer(module) <= LAYERS.index("engines"):
            continue
        inside = {t for t in edges if t.startswith("arrayrnn.engines")}
        allowed = ENGINES_SEAM | SEAM_EXCEPTIONS.get(module, set())
        assert inside <= allowed, f"{module} reaches into the engines: {sorted(inside - allowed)}"
