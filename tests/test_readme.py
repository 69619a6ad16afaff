"""Every Python example in README.md and in the user guide (docs/guide/*.md) runs as written, each in a fresh
namespace and folder; and no topic of the README that the guide replaced is dropped silently."""

import re
from pathlib import Path

import pytest

from arrayrnn.engines import thread_count

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"
DOCUMENTS = [README, *sorted(GUIDE.glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


BLOCKS = [(path, i, source) for path in DOCUMENTS for i, source in enumerate(python_blocks(path))]
README_BLOCKS = [source for path, _, source in BLOCKS if path == README]
GUIDE_BLOCKS = [source for path, _, source in BLOCKS if path != README]

# The README had 17 python blocks when the guide took its content over (issue 48); each moved to a guide page.
README_BLOCKS_BEFORE_THE_GUIDE = 17
# The pages that received them, and how many each has at least (a page may gain blocks, never lose one).
GUIDE_BLOCKS_PER_PAGE = {
    "sequences.md": 1, "cells.md": 2, "training.md": 1, "layer_norm.md": 1, "saving.md": 2, "engines.md": 1,
    "cudnn_bindings.md": 1, "pytorch.md": 3, "onnx.md": 1, "jax.md": 1, "distributed.md": 1, "threads.md": 2,
}

# Every `## ` section of README.md before the guide took its content over (issue 48), with the guide page it
# moved to, where a heading of the same text stands; so removing a topic from the guide fails here instead of
# passing unnoticed. A heading renamed on its page is written in RENAMED (README heading -> its new text).
README_SECTIONS = {
    "Set up": "install.md",
    "Fused sequences: `rnn_forward` / `rnn_backward`": "sequences.md",
    "One step of one cell: `cell_step` / `cell_step_backward`": "cells.md",
    "Cell variants: recurrent dropout, DropConnect, zoneout, peepholes, every layer's states": "cells.md",
    "Training: autodiff, fused bias+activation, scan, layers and optimizers": "training.md",
    "Layer normalisation inside the recurrence (`layer_norm=True`)": "layer_norm.md",
    "The demo": "demo.md",
    "Packed parameters": "saving.md",
    "Engines and weight formats": "engines.md",
    "CuPy engine": "gpu.md",
    "cuDNN engine": "gpu.md",
    "cudnn_bindings": "cudnn_bindings.md",
    "Save, load and PyTorch interop": "saving.md",
    "Inside PyTorch: `arrayrnn.torch` (a drop-in `nn.LSTM` / `nn.GRU` / `nn.RNN`)": "pytorch.md",
    "ONNX export: `arrayrnn.onnx`": "onnx.md",
    "Inside JAX: `arrayrnn.jax.rnn`": "jax.md",
    "Data-parallel training": "distributed.md",
    "Threads, concurrent callers, Ctrl-C and fork": "threads.md",
    "The first call: numba compiles in the background": "first_call.md",
    "CPU speed": "performance.md",
    "How the package is laid out": "layout.md",
    "Arrays and devices": "engines.md",
}
RENAMED: dict[str, str] = {}


def _id(entry: tuple[Path, int, str]) -> str:
    path, i, source = entry
    first = source.splitlines()[0][:40] if source.strip() else "(empty)"
    return f"{path.relative_to(ROOT)}[{i}] {first}"


def headings(path: Path) -> set[str]:
    """The Markdown headings of ``path`` (any level), outside fenced code blocks."""
    found, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6} (.+?)\s*$", line)):
            found.add(m.group(1))
    return found


def test_readme_has_examples():
    assert len(README_BLOCKS) >= 1


def test_guide_kept_the_readmes_examples():
    assert len(GUIDE_BLOCKS) >= README_BLOCKS_BEFORE_THE_GUIDE
    for page, count in GUIDE_BLOCKS_PER_PAGE.items():
        assert len(python_blocks(GUIDE / page)) >= count, page


@pytest.mark.parametrize("section", README_SECTIONS, ids=[s[:40] for s in README_SECTIONS])
def test_every_readme_section_has_a_home_in_the_guide(section):
    page = GUIDE / README_SECTIONS[section]
    assert page.is_file(), page
    heading = RENAMED.get(section, section)
    assert heading in headings(page), f"README section {section!r}: no {heading!r} in docs/guide/{page.name}"


def test_the_guide_index_lists_every_page():
    index = (GUIDE / "index.md").read_text()
    for page in GUIDE.glob("*.md"):
        if page.name != "index.md":
            assert re.search(rf"^{re.escape(page.stem)}$", index, flags=re.M), f"{page.name}: not in toctree"


@pytest.mark.parametrize("path", DOCUMENTS, ids=[str(p.relative_to(ROOT)) for p in DOCUMENTS])
def test_relative_links_name_existing_files(path):
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        assert (path.parent / target.split("#")[0]).exists(), f"{path.name} links to a missing {target}"


def test_readme_holds_the_commands_ci_runs():
    text = README.read_text()
    assert re.search(r"^python3 -m venv .* -m pytest", text, flags=re.M)  # .ci/run's test command
    assert re.search(r"^python3 -m venv .* -m sphinx", text, flags=re.M)  # .ci/run's docs command


@pytest.mark.parametrize("entry", BLOCKS, ids=[_id(b) for b in BLOCKS])
def test_example_runs(entry, tmp_path, monkeypatch):
    path, _, source = entry
    if "cudnn_bindings" in source:
        cb = pytest.importorskip("cudnn_bindings")
        if not cb.is_available():
            pytest.skip("libcudnn v9 is not installed (pip install --no-deps nvidia-cudnn-cu13)")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(thread_count, "_explicit", thread_count._explicit)  # an example sets the threads
    exec(compile(source, str(path), "exec"), {"__name__": "readme_example"})
