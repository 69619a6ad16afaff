"""Load a script of bench/ as a module, for the tests that run it (tests/test_bench_*.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_bench(monkeypatch, path: Path) -> ModuleType:
    """The script at ``path`` as a module, registered in ``sys.modules`` for the test's duration (dataclasses
    look their module up there)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, path.stem, bench)
    spec.loader.exec_module(bench)
    return bench
