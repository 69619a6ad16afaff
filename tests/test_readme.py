"""Every Python example in README.md runs as written (each in a fresh namespace and folder)."""

import re
from pathlib import Path

import pytest

from arrayrnn.engines import thread_count

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("source", BLOCKS, ids=[b.splitlines()[0][:40] for b in BLOCKS])
def test_readme_example_runs(source, tmp_path, monkeypatch):
    if "cudnn_bindings" in source:
        cb = pytest.importorskip("cudnn_bindings")
        if not cb.is_available():
            pytest.skip("libcudnn v9 is not installed (pip install --no-deps nvidia-cudnn-cu13)")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(thread_count, "_explicit", thread_count._explicit)  # an example sets the threads
    exec(compile(source, str(README), "exec"), {"__name__": "readme_example"})
