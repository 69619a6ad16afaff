"""Owning objects refuse copy, deepcopy and pickle; every module imports alone (no import cycle)."""

from __future__ import annotations

import ast
import copy
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from support.cudnn import requires_cudnn

import cudnn_bindings as cb
from cudnn_bindings.descriptors import _Owned

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p.stem for p in (ROOT / "cudnn_bindings").glob("*.py") if p.stem != "__init__")

REFUSALS = [
    (copy.copy, "cannot be copied"),
    (copy.deepcopy, "cannot be deep-copied"),
    (pickle.dumps, "cannot be pickled"),
    (lambda obj: pickle.dumps(obj, protocol=0), "cannot be pickled"),
]


def _descriptors() -> list[_Owned]:
    return [cb.TensorDescriptor((2, 3, 1)), cb.RNNDescriptor(cb.RNNConfig(input_size=2, hidden_size=3)),
            cb.RNNDataDescriptor(cb.SeqDataConfig(max_seq_length=3, batch_size=2, vector_size=4,
                                                  seq_lengths=[3, 1])),
            cb.DropoutDescriptor()]


@requires_cudnn
@pytest.mark.parametrize(("refuse", "words"), REFUSALS)
def test_descriptors_refuse_duplication(refuse, words: str) -> None:
    for desc in _descriptors():
        with desc, pytest.raises(TypeError, match=f"{type(desc).__name__} owns a cuDNN object and {words}"):
            refuse(desc)
        assert desc.closed


@pytest.mark.parametrize(("refuse", "words"), REFUSALS)
def test_handle_refuses_duplication(refuse, words: str) -> None:
    """A Handle needs a GPU to exist; its refusal is the shared one, checked on an unopened instance."""
    handle = cb.Handle.__new__(cb.Handle)
    _Owned.__init__(handle)
    with pytest.raises(TypeError, match=f"Handle owns a cuDNN object and {words}"):
        refuse(handle)


@pytest.mark.parametrize("module", ["cudnn_bindings", *(f"cudnn_bindings.{m}" for m in MODULES)])
def test_each_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    """Importing any module first must work: an import cycle shows up as a partially initialised module."""
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_errors_does_not_import_raw() -> None:
    """``check`` lives in raw.py; errors.py is a leaf (the old errors -> raw -> _lib -> errors circle)."""
    tree = ast.parse((ROOT / "cudnn_bindings" / "errors.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert not {"raw", "_lib", "descriptors", "rnn"} & {m.lstrip(".") for m in imported if m}, imported
    assert cb.check is cb.raw.check
