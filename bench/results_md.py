"""bench/RESULTS.md sections between HTML-comment markers, shared by the bench scripts that write there."""

from __future__ import annotations

from pathlib import Path


def write_block(path: Path, start: str, end: str, section: str) -> None:
    """Put ``section`` between the ``start`` and ``end`` markers of ``path``, replacing what was there, or
    append it with its markers when they are absent (creating the file with a title if need be)."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{start}\n{section.rstrip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
