"""The public surface is documented: every public name has a docstring and an entry in the API reference.

The surface is computed by importing the modules: a module's ``__all__`` where it has one, else the names not
starting with ``_`` that the module itself defines (classes and functions whose ``__module__`` is the module,
constants assigned in its source); re-exported stdlib, NumPy and typing objects are not part of it. Public
methods and properties of the public classes need docstrings too. A reference entry is an ``autosummary`` line
or an ``auto*::`` directive in a page under ``docs/api/`` (resolved against the page's ``currentmodule``).
No Sphinx build runs here (``python -m sphinx -W --keep-going -b html docs docs/_build/html`` does that).
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import re
import types
from pathlib import Path

import pytest

from arrayrnn.engines import thread_count

API_DIR = Path(__file__).resolve().parents[1] / "docs" / "api"

# module -> (page under docs/api that documents it, the optional package its import needs)
MODULES = {
    "arrayrnn": ("arrayrnn.rst", None),
    "arrayrnn.ops": ("ops.rst", None),
    "arrayrnn.activations": ("activations.rst", None),
    "arrayrnn.cellmath": ("cellmath.rst", None),
    "arrayrnn.nn": ("nn.rst", None),
    "arrayrnn.optim": ("optim.rst", None),
    "arrayrnn.distributed": ("distributed.rst", None),
    "arrayrnn.torch": ("torch.rst", "torch"),
    "arrayrnn.jax": ("jax.rst", "jax"),
    "arrayrnn.onnx": ("onnx.rst", "onnx"),
    "cudnn_bindings": ("cudnn_bindings.rst", None),
}


def _import(modname: str) -> types.ModuleType:
    """Import a documented module; skip (with the reason) only when its optional package is missing."""
    if modname == "arrayrnn.ops":  # an attribute of the package (``ar.ops``), not an importable submodule
        import arrayrnn
        return arrayrnn.ops
    needs = MODULES[modname][1]
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as error:
        if needs is None or (error.name or "").split(".")[0] != needs:
            raise
        pytest.skip(f"{modname} needs the optional package {needs!r}, which is not installed")


def _attribute_docs(module: types.ModuleType) -> dict[str, str | None]:
    """Names assigned at module level in ``module``'s source -> their attribute docstring (the string literal
    right after the assignment, or ``#:`` comment lines right above it, as autodoc reads them), else None."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    body = ast.parse(source).body
    docs: dict[str, str | None] = {}
    for i, node in enumerate(body):
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        else:
            continue
        doc = None
        after = body[i + 1] if i + 1 < len(body) else None
        if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            doc = after.value.value.strip() or None
        comments = []
        j = node.lineno - 2
        while j >= 0 and lines[j].lstrip().startswith("#:"):
            comments.insert(0, lines[j].lstrip()[2:].strip())
            j -= 1
        doc = doc or " ".join(comments).strip() or None
        for name in targets:
            docs[name] = doc
    return docs


def _is_alias(value: object) -> bool:
    """Typing constructs (``Callable[...]`` aliases and the like) are annotations, not API."""
    return isinstance(value, types.GenericAlias) or type(value).__module__ in ("typing", "collections.abc")


def _public_names(module: types.ModuleType) -> list[str]:
    """``__all__`` where the module has one, else what the module itself defines without a leading ``_``."""
    explicit = getattr(module, "__all__", None)
    if explicit is not None:
        return list(explicit)
    assigned = _attribute_docs(module)
    names = []
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value) or _is_alias(value):
            continue
        if inspect.isclass(value) or callable(value):
            if getattr(value, "__module__", None) == module.__name__:
                names.append(name)
        elif name in assigned:
            names.append(name)
    return names


def _docstring(module: types.ModuleType, name: str) -> str | None:
    value = getattr(module, name)
    if inspect.ismodule(value) or inspect.isclass(value) or callable(value):
        return inspect.getdoc(value)
    owner = module  # a constant: its attribute docstring in the module that assigns it
    docs = _attribute_docs(owner)
    return docs.get(name)


def _undocumented_members(cls: type) -> list[str]:
    """Public methods and properties defined in ``cls`` itself without a docstring."""
    missing = []
    for attr, member in vars(cls).items():
        if attr.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if (inspect.isfunction(member) or isinstance(member, property)) and not inspect.getdoc(member):
            missing.append(attr)
    return missing


_DIRECTIVE = re.compile(r"^\s*\.\.\s+(?:py:)?(currentmodule|module|automodule)::\s*(\S+)")
_AUTO = re.compile(r"^\s*\.\.\s+auto(?:function|class|data|exception|attribute|method|decorator)::\s*(\S+)")
_AUTOSUMMARY = re.compile(r"^(\s*)\.\.\s+autosummary::")
_MYST_DIRECTIVE = re.compile(r"^\s*```\{(?:py:)?(currentmodule|module|automodule)\}\s*(\S+)")


def _referenced() -> dict[str, str]:
    """Fully qualified name -> the docs/api page that has an entry for it."""
    found: dict[str, str] = {}
    for page in sorted(API_DIR.glob("*.rst")) + sorted(API_DIR.glob("*.md")):
        current = ""
        in_summary: str | None = None  # indentation of the autosummary directive we are inside
        for line in page.read_text(encoding="utf-8").splitlines():
            if in_summary is not None:
                indent = len(line) - len(line.lstrip())
                if line.strip() and indent <= len(in_summary):
                    in_summary = None
                elif line.strip() and not line.strip().startswith(":"):
                    entry = line.strip().split()[0].lstrip("~")
                    found.setdefault(entry if entry.startswith(current + ".") or not current
                                     else f"{current}.{entry}", page.name)
                    continue
                else:
                    continue
            m = _DIRECTIVE.match(line) or _MYST_DIRECTIVE.match(line)
            if m:
                current = m.group(2)
                found.setdefault(current, page.name)
                continue
            m = _AUTO.match(line)
            if m:
                entry = m.group(1)
                found.setdefault(entry if not current else f"{current}.{entry}", page.name)
                continue
            m = _AUTOSUMMARY.match(line)
            if m:
                in_summary = m.group(1)
    return found


@pytest.mark.parametrize("modname", sorted(MODULES))
def test_public_names_have_docstrings(modname):
    module = _import(modname)
    assert inspect.getdoc(module), f"module {modname} has no docstring"
    missing = []
    for name in _public_names(module):
        if not _docstring(module, name):
            missing.append(f"{modname}.{name}")
        value = getattr(module, name)
        if inspect.isclass(value) and value.__module__.split(".")[0] in ("arrayrnn", "cudnn_bindings"):
            missing += [f"{modname}.{name}.{attr}" for attr in _undocumented_members(value)]
    assert not missing, "public names without a docstring: " + ", ".join(missing)


@pytest.mark.parametrize("modname", sorted(MODULES))
def test_public_names_are_in_the_api_reference(modname):
    module = _import(modname)
    page = MODULES[modname][0]
    assert (API_DIR / page).is_file(), f"docs/api/{page} (the reference page of {modname}) is missing"
    referenced = _referenced()
    missing = [f"{modname}.{name}" for name in _public_names(module) if f"{modname}.{name}" not in referenced]
    assert not missing, (f"public names with no entry in the API reference: {', '.join(missing)}; add them "
                         f"to an autosummary list in docs/api/{page}")


def test_the_reference_lists_every_documented_module():
    index = (API_DIR / "index.rst").read_text(encoding="utf-8")
    missing = [page for page, _ in MODULES.values() if Path(page).stem not in index.split()]
    assert not missing, f"docs/api/index.rst's toctree misses {', '.join(missing)}"


def _examples(modname: str) -> list[doctest.DocTest]:
    """The doctests of ``modname``'s public names and their classes' public members."""
    module = _import(modname)
    finder = doctest.DocTestFinder(recurse=False)
    tests = []
    for name in _public_names(module):
        value = getattr(module, name)
        if not (inspect.isclass(value) or callable(value)):
            continue
        objects = [(f"{modname}.{name}", value)]
        if inspect.isclass(value):
            objects += [(f"{modname}.{name}.{attr}", member) for attr, member in vars(value).items()
                        if not attr.startswith("_")]
        for qualified, obj in objects:
            if isinstance(obj, (staticmethod, classmethod)):
                obj = obj.__func__
            if isinstance(obj, property):
                obj = obj.fget
            if inspect.getdoc(obj):
                tests += [t for t in finder.find(obj, qualified, globs={}) if t.examples]
    return tests


@pytest.mark.parametrize("modname", sorted(MODULES))
def test_docstring_examples_run(modname, tmp_path, monkeypatch):
    """Every ``Examples`` section of the reference runs and prints what it shows (doctest; ``+SKIP`` only
    where an example needs an MPI launcher or a long compile)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(thread_count, "_explicit", thread_count._explicit)  # an example sets the threads
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in _examples(modname):
        runner.run(test)
    assert runner.failures == 0, f"{runner.failures} docstring example(s) of {modname} failed (output above)"
