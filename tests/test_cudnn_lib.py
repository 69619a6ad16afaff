"""Finding and loading libcudnn: search order, version, the search-path error, lazy import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cudnn import LIBRARY_ERROR, include_dir, parse_headers, requires_cudnn

import cudnn_bindings as cb
from cudnn_bindings import _lib

ROOT = Path(__file__).resolve().parent.parent
NOTHING = {"wheel": False, "pathfinder": False, "system": False}


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


@requires_cudnn
def test_version_is_cudnn_9_or_newer() -> None:
    v = cb.version()
    assert isinstance(v, int) and v >= 90000
    assert v == cb.raw.get_version()


@requires_cudnn
def test_version_matches_shipped_header() -> None:
    if include_dir() is None:
        pytest.skip("cuDNN headers not found")
    d = parse_headers().defines
    want = int(d["CUDNN_MAJOR"]) * 10000 + int(d["CUDNN_MINOR"]) * 100 + int(d["CUDNN_PATCHLEVEL"])
    assert cb.version() == want


@requires_cudnn
def test_library_path_is_the_loaded_file() -> None:
    path = Path(cb.library_path())
    assert path.is_file() and path.name.startswith(_lib.LIB_NAMES[0].split(".")[0])
    assert cb.is_available()


@requires_cudnn
def test_env_var_points_at_a_specific_library(tmp_path: Path) -> None:
    real = cb.library_path()
    for value in (real, str(Path(real).parent)):  # a file or the directory holding it
        lib, path = _lib.find_library({_lib.ENV_LIB: value}, **NOTHING)
        assert Path(path) == Path(real).resolve()
        assert lib.cudnnGetVersion() == cb.version()


def test_missing_cudnn_path_falls_through(tmp_path: Path) -> None:
    with pytest.raises(cb.CudnnLibraryError) as info:
        _lib.find_library({_lib.ENV_ROOT: str(tmp_path / "gone")}, **NOTHING)
    assert f"$CUDNN_PATH: {tmp_path / 'gone'} (no such file)" in str(info.value)
    if not LIBRARY_ERROR:  # with the other sources enabled, the search goes on and finds the library
        _, path = _lib.find_library({_lib.ENV_ROOT: str(tmp_path / "gone")})
        assert Path(path).is_file()


@requires_cudnn
def test_cudnn_path_install_root_is_searched() -> None:
    root = Path(cb.library_path()).parent.parent  # .../nvidia/cudnn with lib/ below it
    _, path = _lib.find_library({_lib.ENV_ROOT: str(root)}, **NOTHING)
    assert Path(path) == Path(cb.library_path()).resolve()


def test_strict_env_var_gives_search_path_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "libcudnn.so.9"
    with pytest.raises(cb.CudnnLibraryError) as info:
        _lib.find_library({_lib.ENV_LIB: str(missing)})
    text = str(info.value)
    assert f"{missing} (no such file)" in text
    assert "ARRAYRNN_CUDNN_LIB is set, so only it was tried" in text


def test_nothing_found_lists_every_place(tmp_path: Path) -> None:
    with pytest.raises(cb.CudnnLibraryError) as info:
        _lib.find_library({_lib.ENV_ROOT: str(tmp_path)}, **NOTHING)
    text = str(info.value)
    assert "not found. Searched:" in text
    assert str(tmp_path / "lib" / _lib.LIB_NAMES[0]) in text
    assert "pip install nvidia-cudnn-cu13" in text and "ARRAYRNN_CUDNN_LIB" in text


def test_unset_cudnn_path_is_reported() -> None:
    with pytest.raises(cb.CudnnLibraryError, match=r"\$CUDNN_PATH: not set"):
        _lib.find_library({}, **NOTHING)


def test_system_loader_is_last_resort() -> None:
    try:
        _, path = _lib.find_library({}, wheel=False, pathfinder=False, system=True)
    except cb.CudnnLibraryError as exc:
        assert f"system loader: {_lib.LIB_NAMES[0]}" in str(exc)
    else:
        assert Path(path).name.startswith("libcudnn") or path == _lib.LIB_NAMES[0]


def test_file_that_is_not_a_library(tmp_path: Path) -> None:
    fake = tmp_path / _lib.LIB_NAMES[0]
    fake.write_text("not a shared object")
    with pytest.raises(cb.CudnnLibraryError, match="cannot load"):
        _lib.find_library({_lib.ENV_LIB: str(fake)})


class _FakeFn:
    def __init__(self, value: int) -> None:
        self.value, self.restype, self.argtypes = value, None, None

    def __call__(self) -> int:
        return self.value


class _FakeLib:
    def __init__(self, version: int) -> None:
        self.cudnnGetVersion = _FakeFn(version)


def test_too_old_library_is_rejected(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    old = tmp_path / _lib.LIB_NAMES[0]
    old.write_bytes(b"")
    monkeypatch.setattr(_lib.ctypes, "CDLL", lambda path: _FakeLib(8907))
    with pytest.raises(cb.CudnnLibraryError, match=r"cuDNN 8\.9\.7 \(8907\) is too old; .* >= 9\.0"):
        _lib.find_library({_lib.ENV_LIB: str(old)})


def test_version_decoding() -> None:
    assert _lib._decode_version(92400) == "9.24.0"
    assert _lib._decode_version(90100) == "9.1.0"
    assert _lib._decode_version(8907) == "8.9.7"


def test_import_never_loads_the_library_nor_arrayrnn() -> None:
    code = ("import sys, cudnn_bindings, cudnn_bindings._lib as L; assert L._state['lib'] is None\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'arrayrnn'], 'imports arrayrnn'\n"
            "print('ok')")
    out = _run(code)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_missing_library_end_to_end(tmp_path: Path) -> None:
    code = ("import cudnn_bindings as cb\n"
            "assert not cb.is_available()\n"
            "try:\n    cb.version()\nexcept cb.CudnnLibraryError as e:\n    print(e)\n")
    out = _run(code, ARRAYRNN_CUDNN_LIB=str(tmp_path / "missing.so"))
    assert out.returncode == 0, out.stderr
    assert "not found. Searched:" in out.stdout and str(tmp_path / "missing.so") in out.stdout


@requires_cudnn
def test_env_var_used_end_to_end() -> None:
    code = "import cudnn_bindings as cb; print(cb.library_path()); print(cb.version())"
    out = _run(code, ARRAYRNN_CUDNN_LIB=cb.library_path())
    assert out.returncode == 0, out.stderr
    path, version = out.stdout.split()
    assert Path(path) == Path(cb.library_path()) and int(version) == cb.version()
