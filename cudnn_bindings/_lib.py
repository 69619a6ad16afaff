"""Finding and loading libcudnn v9, lazily, once.

Search order (the first usable library wins):

1. ``ARRAYRNN_CUDNN_LIB``: a library file or a directory holding it. When set it is the only place
   tried, so a wrong value is an error rather than a silent fallback.
2. ``CUDNN_PATH``: a cuDNN install root (``lib/``, ``lib64/``, ``bin/`` are tried) or a library file.
3. The ``nvidia-cudnn-cu*`` wheel: ``site-packages/nvidia/cudnn/lib`` (``bin`` on Windows).
4. cuda-pathfinder (``cuda.pathfinder.load_nvidia_dynamic_lib("cudnn")``), when installed.
5. The system loader (``LD_LIBRARY_PATH``, rpath, ``ldconfig``) by soname.

A library older than 9.0 is skipped (and reported). Nothing is loaded at import time.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from .errors import CudnnLibraryError
from .prototypes import OPTIONAL, PROTOTYPES

__all__ = ["library", "library_path", "version", "function", "find_library", "MIN_VERSION", "LIB_NAMES"]

MIN_VERSION = 90000
ENV_LIB = "ARRAYRNN_CUDNN_LIB"
ENV_ROOT = "CUDNN_PATH"
LIB_NAMES: tuple[str, ...] = ("cudnn64_9.dll",) if sys.platform == "win32" else ("libcudnn.so.9",)
_SUBDIRS = ("", "lib", "lib64", "bin", os.path.join("lib", "x64"))

_lock = threading.Lock()
_state: dict[str, object] = {"lib": None, "path": None}


def _files_in(where: Path, subdirs: tuple[str, ...] = ("",)) -> list[Path]:
    if not where.is_dir():  # a library file (or a missing path, reported as such)
        return [where]
    return [where / sub / name for sub in subdirs for name in LIB_NAMES]


def _wheel_dirs() -> list[Path]:
    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) / sub for p in spec.submodule_search_locations for sub in ("lib", "bin")]


def _decode_version(v: int) -> str:
    if v >= 90000:  # cuDNN 9 encodes MAJOR*10000 + MINOR*100 + PATCH
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return f"{v // 1000}.{v // 100 % 10}.{v % 100}"  # cuDNN 8 and older: MAJOR*1000 + MINOR*100 + PATCH


def _open(path: str) -> tuple[ctypes.CDLL | None, str]:
    """Load one candidate; return (library, "") or (None, why it was rejected)."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        return None, f"cannot load: {exc}"
    try:
        fn = lib.cudnnGetVersion
    except AttributeError:
        return None, "loaded, but it has no cudnnGetVersion (not a cuDNN library)"
    fn.restype, fn.argtypes = ctypes.c_size_t, []
    v = int(fn())
    if v < MIN_VERSION:
        return None, f"cuDNN {_decode_version(v)} ({v}) is too old; cudnn_bindings needs cuDNN >= 9.0"
    return lib, ""


def _pathfinder_candidate(tried: list[str]) -> str | None:
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # optional dependency
    except Exception:
        tried.append("cuda-pathfinder: not installed")
        return None
    try:
        return str(load_nvidia_dynamic_lib("cudnn").abs_path)
    except Exception as exc:
        tried.append(f"cuda-pathfinder: {type(exc).__name__}: {exc}")
        return None


def _loaded_path(lib: ctypes.CDLL, fallback: str) -> str:
    """The file the dynamic loader actually opened (Linux: via dladdr), else ``fallback``."""
    if sys.platform != "linux":
        return fallback

    class _DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

    try:
        dladdr = ctypes.CDLL(None).dladdr
        dladdr.argtypes, dladdr.restype = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)], ctypes.c_int
        info = _DlInfo()
        addr = ctypes.cast(lib.cudnnGetVersion, ctypes.c_void_p).value
        if dladdr(addr, ctypes.byref(info)) and info.fname:
            return os.path.realpath(info.fname.decode())
    except Exception:
        pass
    return fallback


def _try_files(source: str, files: list[Path], tried: list[str]) -> tuple[ctypes.CDLL, str] | None:
    for f in files:
        if not f.exists():
            tried.append(f"{source}: {f} (no such file)")
            continue
        lib, why = _open(str(f))
        if lib is not None:
            return lib, str(f.resolve())
        tried.append(f"{source}: {f} ({why})")
    return None


def find_library(environ: Mapping[str, str] | None = None, *, wheel: bool = True, pathfinder: bool = True,
                 system: bool = True) -> tuple[ctypes.CDLL, str]:
    """Search for libcudnn >= 9.0 (order in the module docstring) and return ``(library, path)``.

    Raises `CudnnLibraryError` listing every place tried. The keyword switches exist for tests and tools.
    """
    env = os.environ if environ is None else environ
    tried: list[str] = []
    if env.get(ENV_LIB):
        found = _try_files(f"${ENV_LIB}", _files_in(Path(env[ENV_LIB])), tried)
        if found:
            return found
        raise _not_found(tried, strict=True)
    if env.get(ENV_ROOT):
        found = _try_files(f"${ENV_ROOT}", _files_in(Path(env[ENV_ROOT]), _SUBDIRS), tried)
        if found:
            return found
    else:
        tried.append(f"${ENV_ROOT}: not set")
    if wheel:
        dirs = _wheel_dirs()
        if not dirs:
            tried.append("nvidia-cudnn wheel (nvidia.cudnn): not installed")
        files = [d / n for d in dirs if d.is_dir() for n in LIB_NAMES]
        found = _try_files("nvidia-cudnn wheel", files, tried)
        if found:
            return found
    if pathfinder:
        path = _pathfinder_candidate(tried)
        if path:
            found = _try_files("cuda-pathfinder", [Path(path)], tried)
            if found:
                return found
    if system:
        for name in LIB_NAMES:
            lib, why = _open(name)
            if lib is not None:
                return lib, _loaded_path(lib, name)
            tried.append(f"system loader: {name} ({why})")
    raise _not_found(tried, strict=False)


def _not_found(tried: list[str], strict: bool) -> CudnnLibraryError:
    lines = "\n  ".join(tried) or "(nothing)"
    how = (f"${ENV_LIB} is set, so only it was tried; fix or unset it." if strict else
           f"Install it with `pip install nvidia-cudnn-cu13` (or -cu12), or set ${ENV_LIB} to the "
           f"library file, or ${ENV_ROOT} to a cuDNN install root.")
    return CudnnLibraryError(f"cuDNN >= 9.0 library ({', '.join(LIB_NAMES)}) not found. Searched:\n  "
                             f"{lines}\n{how}")


def _apply_prototypes(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            if name in OPTIONAL:
                continue
            raise CudnnLibraryError(f"{name} is missing from the cuDNN library at {_state['path']}") from None
        fn.restype, fn.argtypes = restype, list(argtypes)


def library() -> ctypes.CDLL:
    """The loaded libcudnn (loaded and prototyped on first use). Raises `CudnnLibraryError`."""
    lib = _state["lib"]
    if lib is not None:
        return lib  # type: ignore[return-value]
    with _lock:
        if _state["lib"] is None:
            lib, path = find_library()
            _state["path"] = path
            _apply_prototypes(lib)
            _state["lib"] = lib
    return _state["lib"]  # type: ignore[return-value]


def library_path() -> str:
    """Full path of the loaded libcudnn (loads it if needed)."""
    library()
    return str(_state["path"])


def version() -> int:
    """``cudnnGetVersion()``: cuDNN's own encoding, e.g. 9.24.0 -> 92400. See `cudnnGetVersion`."""
    return int(library().cudnnGetVersion())


def has_function(name: str) -> bool:
    """Whether the loaded library exports ``name``."""
    return hasattr(library(), name)


def function(name: str):
    """The prototyped ctypes function ``name`` (which must be in `PROTOTYPES`)."""
    if name not in PROTOTYPES:
        raise KeyError(f"{name} is not in cudnn_bindings.prototypes.PROTOTYPES")
    try:
        return getattr(library(), name)
    except AttributeError:
        raise CudnnLibraryError(f"{name} is missing from the cuDNN library at {_state['path']} "
                                f"(cuDNN {_decode_version(version())})") from None
