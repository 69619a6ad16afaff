"""Shared helpers for the cudnn_bindings tests: skip markers and a small parser of the shipped C headers.

Imported by the tests (``from support.cudnn import ...``).
"""

from __future__ import annotations

import os
import re
from ctypes import (
    POINTER,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_size_t,
    c_uint32,
    c_ulonglong,
    c_void_p,
)
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

import cudnn_bindings as cb


def _library_error() -> str:
    try:
        cb.version()
    except cb.CudnnLibraryError as exc:
        return " ".join(str(exc).split())  # one line, for skip reasons
    return ""


LIBRARY_ERROR = _library_error()
requires_cudnn = pytest.mark.skipif(bool(LIBRARY_ERROR),
                                    reason=f"cuDNN library not installed: {LIBRARY_ERROR}")


def gpu_reason() -> str:
    """Why GPU tests cannot run here ("" when they can)."""
    if LIBRARY_ERROR:
        return f"cuDNN library not installed: {LIBRARY_ERROR}"
    if cb.device_count() == 0:
        from cudnn_bindings import _cuda

        return f"no CUDA device: {_cuda.diagnose()}"
    return ""


# ---------------------------------------------------------------- headers
def include_dir() -> Path | None:
    """The cuDNN include directory: $CUDNN_INCLUDE_DIR, else ../include next to the loaded library."""
    candidates = []
    if os.environ.get("CUDNN_INCLUDE_DIR"):
        candidates.append(Path(os.environ["CUDNN_INCLUDE_DIR"]))
    if not LIBRARY_ERROR:
        lib = Path(cb.library_path()).resolve()
        candidates += [lib.parent.parent / "include", lib.parent / "include"]
    if os.environ.get("CUDNN_PATH"):
        candidates.append(Path(os.environ["CUDNN_PATH"]) / "include")
    candidates.append(Path("/usr/include"))
    for c in candidates:
        if (c / "cudnn_adv.h").is_file() and (c / "cudnn_graph.h").is_file():
            return c
    return None


def requires_headers():
    return pytest.mark.skipif(include_dir() is None, reason="cuDNN headers (cudnn_adv.h) not found next to "
                              "the library, in $CUDNN_INCLUDE_DIR or $CUDNN_PATH/include")


@dataclass
class Param:
    base: str  # type words without const and '*', e.g. "int32_t", "unsigned long long"
    depth: int  # number of '*'
    array: bool  # declared as name[]
    name: str


@dataclass
class Headers:
    functions: dict[str, tuple[Param, list[Param]]] = field(default_factory=dict)  # name -> (return, params)
    enums: dict[str, dict[str, int]] = field(default_factory=dict)  # typedef name -> {C member: value}
    opaque: set[str] = field(default_factory=set)  # typedef struct X *name
    defines: dict[str, str] = field(default_factory=dict)


_HEADER_FILES = ("cudnn_graph.h", "cudnn_ops.h", "cudnn_cnn.h", "cudnn_adv.h", "cudnn_version.h")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _param(decl: str) -> Param:
    decl = " ".join(decl.replace("*", " * ").split())
    array = decl.endswith("[ ]") or decl.endswith("[]")
    decl = re.sub(r"\[\s*\]$", "", decl).strip()
    words = [w for w in decl.split() if w not in ("const", "CUDNN_DEPRECATED")]
    depth = words.count("*")
    words = [w for w in words if w != "*"]
    if len(words) >= 2 and not (words[-1] in ("long", "int", "char") and words[0] in ("unsigned", "long")):
        name, words = words[-1], words[:-1]
    else:
        name = ""
    return Param(" ".join(words), depth, array, name)


def _eval(expr: str, names: dict[str, int]) -> int:
    """An integer constant expression of a header (literals, earlier members, << | + - and parentheses)."""
    expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: str(names[m.group(0)]), expr)
    expr = re.sub(r"(\d+)[uUlL]+\b", r"\1", expr)
    if not re.fullmatch(r"[\d\sx<>|()+\-a-fA-F]+", expr):
        raise ValueError(f"cannot evaluate enum expression {expr!r}")
    return int(eval(expr, {"__builtins__": {}}))  # noqa: S307 - checked to be digits and operators only


def _enum_values(body: str) -> dict[str, int]:
    values: dict[str, int] = {}
    nxt = 0
    for item in (i.strip() for i in body.split(",")):
        if not item:
            continue
        name_part, _, expr = item.partition("=")
        name = name_part.split()[0]
        expr = expr.strip()
        if expr:
            nxt = _eval(expr, values)
        values[name] = nxt
        nxt += 1
    return values


@lru_cache(maxsize=1)
def parse_headers() -> Headers:
    """Functions, enums, opaque handle typedefs and #defines of the shipped cuDNN headers."""
    root = include_dir()
    assert root is not None
    h = Headers()
    for fname in _HEADER_FILES:
        path = root / fname
        if not path.is_file():
            continue
        raw = path.read_text(errors="replace")
        for m in re.finditer(r"^#define[ \t]+(\w+)[ \t]+(.+?)[ \t]*$", raw, flags=re.M):
            h.defines[m.group(1)] = m.group(2)
        text = _strip_comments(raw)
        text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        for m in re.finditer(r"typedef\s+enum\s*\w*\s*\{([^{}]*)\}\s*(\w+)[^;]*;", text, flags=re.S):
            h.enums[m.group(2)] = _enum_values(m.group(1))
        for m in re.finditer(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)", text):
            h.opaque.add(m.group(1))
        for stmt in text.split(";"):
            if "CUDNNWINAPI" not in stmt:
                continue
            before, _, after = stmt.partition("CUDNNWINAPI")
            before = re.split(r"[{}]", before)[-1].replace("CUDNN_DEPRECATED", " ")
            before = before.replace('extern "C"', " ")
            m = re.match(r"\s*(\w+)\s*\((.*)\)\s*$", after, flags=re.S)
            if not m:
                continue
            params = [p for p in (s.strip() for s in m.group(2).split(",")) if p and p != "void"]
            h.functions[m.group(1)] = (_param(before + " _ret"), [_param(p) for p in params])
    return h


_SCALARS = {"int": c_int, "int32_t": c_int32, "uint32_t": c_uint32, "size_t": c_size_t, "float": c_float,
            "double": c_double, "unsigned long long": c_ulonglong}


def expected_ctype(p: Param, h: Headers):
    """The ctypes type our mapping rules give a parsed C parameter (see cudnn_bindings.prototypes)."""
    if p.array:
        return c_void_p
    if p.depth == 0:
        if p.base == "void":
            return None
        if p.base in h.enums:
            return c_int
        if p.base in h.opaque or p.base == "cudaStream_t":
            return c_void_p
        return _SCALARS[p.base]
    if p.depth == 1 and p.base == "void":
        return c_void_p
    if p.depth == 1 and p.base == "char":
        return c_char_p
    if p.depth == 2 and p.base == "void":
        return POINTER(c_void_p)
    if p.depth == 1:
        return POINTER(expected_ctype(Param(p.base, 0, False, p.name), h))
    raise AssertionError(f"no mapping rule for {p}")


def shared_prefix(names: list[str]) -> str:
    """The longest common prefix of whole ``_``-separated words (``RNN_DATA_LAYOUT_`` etc.)."""
    split = [n.split("_") for n in names]
    common: list[str] = []
    for words in zip(*split, strict=False):
        if len(set(words)) != 1:
            break
        common.append(words[0])
    if any(len(s) == len(common) for s in split):  # a member would be left without a name
        common = common[:-1]
    return "_".join(common) + "_" if common else ""


def new_handles():
    """Start counting: returns a function giving the live cuDNN objects created since (per class), so the
    leak checks hold whatever other tests or caches keep alive."""
    start = cb.live_handles()

    def delta() -> dict[str, int]:
        now = cb.live_handles()
        diff = {k: now.get(k, 0) - start.get(k, 0) for k in set(now) | set(start)}
        return {k: v for k, v in diff.items() if v}

    return delta
