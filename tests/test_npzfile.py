"""arrayrnn.core.npzfile: atomic write (old file intact on failure, mode kept), validated read."""

import json
import os
import stat
import zipfile

import numpy as np
import pytest

from arrayrnn.core import npzfile


def _write_sample(path):
    npzfile.write(path, "t", 1, {"n": 3}, {"a": np.arange(3.0)})


def test_round_trip(tmp_path):
    path = tmp_path / "f.npz"
    _write_sample(path)
    header, arrays = npzfile.read(path, "t", range(1, 2))
    assert header == {"format": "t", "version": 1, "n": 3}
    np.testing.assert_array_equal(arrays["a"], np.arange(3.0))
    assert not [p for p in os.listdir(tmp_path) if p != "f.npz"]  # no temporary file left behind


def test_failing_write_leaves_the_old_file_intact(tmp_path):
    path = tmp_path / "f.npz"
    _write_sample(path)
    before = path.read_bytes()

    class Boom:
        def __array__(self, *args, **kwargs):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        npzfile.atomic_write(path, lambda f: (f.write(b"partial"), np.asarray(Boom())))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["f.npz"]


def test_replacing_keeps_the_target_mode(tmp_path):
    path = tmp_path / "f.npz"
    _write_sample(path)
    os.chmod(path, 0o644)
    _write_sample(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    os.chmod(path, 0o640)
    _write_sample(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_a_new_file_gets_the_umask_default(tmp_path):
    old = os.umask(0o027)
    try:
        _write_sample(tmp_path / "new.npz")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new.npz").st_mode) == 0o640


def test_reserved_member_name(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        npzfile.write(tmp_path / "f.npz", "t", 1, {}, {"header": np.zeros(1)})


@pytest.mark.parametrize("offset", range(0, 400, 7))
def test_every_byte_flip_is_a_value_error_or_harmless(tmp_path, offset):
    path = tmp_path / "f.npz"
    _write_sample(path)
    raw = bytearray(path.read_bytes())
    for where in (offset, len(raw) - 1 - offset):
        flipped = bytearray(raw)
        flipped[where % len(raw)] ^= 0xFF
        path.write_bytes(bytes(flipped))
        try:
            header, arrays = npzfile.read(path, "t", range(1, 2))
        except ValueError:
            continue  # any other exception type fails the test
        # an undetected flip must have hit a byte nobody reads (a zip timestamp, header padding)
        assert header == {"format": "t", "version": 1, "n": 3}
        assert set(arrays) == {"a"}
        np.testing.assert_array_equal(arrays["a"], np.arange(3.0))


@pytest.mark.parametrize("header", ["[" * 100_000 + "]" * 100_000, "[1, 2]", "not json", '"a string"'])
def test_bad_headers_are_value_errors(tmp_path, header):
    path = tmp_path / "f.npz"
    np.savez(path, header=np.frombuffer(header.encode(), dtype=np.uint8))
    with pytest.raises(ValueError, match="header"):
        npzfile.read(path, "t", range(1, 2))


def test_foreign_files(tmp_path):
    bare = tmp_path / "bare.npy"
    np.save(bare, np.zeros(3))
    with pytest.raises(ValueError, match="bare"):
        npzfile.read(bare, "t", range(1, 2))
    no_header = tmp_path / "nh.npz"
    np.savez(no_header, a=np.zeros(3))
    with pytest.raises(ValueError, match="no 'header'"):
        npzfile.read(no_header, "t", range(1, 2))
    text = tmp_path / "t.npz"
    text.write_text("hello")
    with pytest.raises(ValueError, match="not a readable"):
        npzfile.read(text, "t", range(1, 2))
    with zipfile.ZipFile(tmp_path / "z.npz", "w") as z:
        z.writestr("header.npy", b"garbage")
    with pytest.raises(ValueError):
        npzfile.read(tmp_path / "z.npz", "t", range(1, 2))


def test_legacy_unicode_header_is_read(tmp_path):
    path = tmp_path / "old.npz"
    np.savez(path, header=np.array(json.dumps({"format": "t", "version": 1})), a=np.zeros(2))
    header, arrays = npzfile.read(path, "t", range(1, 2))
    assert header == {"format": "t", "version": 1} and set(arrays) == {"a"}


@pytest.mark.parametrize("kind, version, message", [
    ("other", 1, r"file kind = 'other'; expected 't'"),
    ("t", 2, r"t file version = 2; this arrayrnn reads versions 1..1 \(written by a newer arrayrnn\?"),
    ("t", 0, r"t file version = 0"),
])
def test_another_kind_or_version_is_a_value_error_naming_the_file(tmp_path, kind, version, message):
    path = tmp_path / "f.npz"
    npzfile.write(path, kind, version, {}, {"a": np.zeros(1)})
    with pytest.raises(ValueError, match=rf"^{path}: {message}"):
        npzfile.read(path, "t", range(1, 2))
