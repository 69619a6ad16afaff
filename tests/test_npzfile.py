"""arrayrnn.core.npzfile: atomic write (old file intact on failure, mode kept), validated read."""

import contextlib
import json
import os
import stat
import zipfile

import numpy as np
import pytest
from support.forged_npz import count_inflated, npy_bytes, write_zip

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


# ---------------------------------------------------------------- declared sizes, before any data is read
def _header_npy(kind="t"):
    return npy_bytes(np.frombuffer(json.dumps({"format": kind, "version": 1}).encode(), np.uint8))


@pytest.fixture
def inflated(monkeypatch):
    return count_inflated(monkeypatch)


def _assert_refused_before_inflating(path, members, method, message, inflated):
    """An archive of ``members`` at ``path``: reading it raises ``message`` with next to nothing inflated."""
    write_zip(path, members, method)
    with pytest.raises(ValueError, match=message):
        npzfile.read(path, "t", range(1, 2))
    assert inflated[0] < 4096


def test_a_member_declaring_4_tib_is_refused_before_allocation(tmp_path, inflated):
    """The old reader allocated the declared shape first: MemoryError for 4 TiB."""
    path = tmp_path / "f.npz"
    members = [("header.npy", _header_npy()), ("a.npy", npy_bytes(np.zeros(4, np.float32), (2**40,)))]
    _assert_refused_before_inflating(path, members, zipfile.ZIP_STORED,
                                     rf"^{path}: member 'a' declares shape \(1099511627776,\) of float32 "
                                     r"\(4398046511104 bytes\) but the archive records 16 bytes", inflated)


def test_a_zip_directory_declaring_more_than_the_file_holds(tmp_path):
    path = tmp_path / "f.npz"
    write_zip(path, [("header.npy", _header_npy()), ("a.npy", npy_bytes(np.zeros(4, np.float32)))])
    raw = bytearray(path.read_bytes())
    central = raw.index(b"PK\x01\x02", raw.rindex(b"a.npy") - 46)
    raw[central + 24:central + 28] = (2**32 - 1).to_bytes(4, "little")  # uncompressed size: 4 GiB
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"member 'a.npy' declares 4294967295 bytes from \d+ compressed"):
        npzfile.read(path, "t", range(1, 2))


def test_a_deflate_bomb_is_refused_by_the_expected_size_before_inflating(tmp_path, inflated):
    """64 MiB of zeros deflate to ~64 KiB; the caller expects 3 floats: nothing past the headers inflates."""
    path = tmp_path / "f.npz"
    write_zip(path, [("header.npy", _header_npy()), ("a.npy", npy_bytes(np.zeros(1 << 24, np.float32)))],
              zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(ValueError, match=r"member 'a' declares shape \(16777216,\) and dtype float32; "
                                         r"expected shape \(3,\) and dtype float64"):
        npzfile.read(path, "t", range(1, 2), expect=lambda header: {"a": ("float64", (3,))})
    assert inflated[0] < 4096


def test_no_inflate_goes_past_the_declared_size(tmp_path, inflated):
    """A member whose directory and .npy header say 40 bytes, but whose deflate stream holds 64 MiB."""
    path = tmp_path / "f.npz"
    big = npy_bytes(np.zeros(1 << 24, np.float32), (10,))  # header says (10,): 40 bytes of data
    write_zip(path, [("header.npy", _header_npy()), ("a.npy", big)], zipfile.ZIP_DEFLATED)
    raw = bytearray(path.read_bytes())
    declared = (len(big) - (1 << 26) + 40).to_bytes(4, "little")
    local = raw.index(b"PK\x03\x04", raw.index(b"a.npy") - 30)
    central = raw.index(b"PK\x01\x02", raw.rindex(b"a.npy") - 46)
    raw[local + 22:local + 26] = declared
    raw[central + 24:central + 28] = declared
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"member 'a' is (unreadable|not a readable \.npy) .*Bad CRC-32"):
        npzfile.read(path, "t", range(1, 2))
    assert inflated[0] < 1 << 16


def test_expected_members_missing_or_unexpected(tmp_path):
    path = tmp_path / "f.npz"
    _write_sample(path)
    with pytest.raises(ValueError, match=r"missing: \['b'\], unexpected: \['a'\]"):
        npzfile.read(path, "t", range(1, 2), expect=lambda header: {"b": ("float64", (3,))})
    header, arrays = npzfile.read(path, "t", range(1, 2), expect=lambda header: {"a": ("float64", (3,))})
    np.testing.assert_array_equal(arrays["a"], np.arange(3.0))


@pytest.mark.parametrize(("members", "message"), [
    ([("a.npy", b"x")], r"has members \['a'\] but no 'header'"),
    ([("header.npy", _header_npy()), ("a.txt", b"x")], r"member 'a.txt' is not an .npy array"),
    ([("header.npy", _header_npy()), ("a.npy", npy_bytes(np.zeros(1))), ("a.npy", npy_bytes(np.ones(1)))],
     r"member 'a.npy' appears twice"),
    ([("header.npy", _header_npy()), ("a.npy", npy_bytes(np.zeros(2, "V4")))], r"member 'a' has dtype \|V4"),
    ([("header.npy", npy_bytes(np.zeros(2, np.float32)))], r"header has dtype float32 and shape \(2,\)"),
    ([("header.npy", b"\x93NUMPY\x09\x00" + b"\x00" * 20)], r"member 'header' is not a readable \.npy array"),
])
def test_malformed_archives(tmp_path, members, message):
    path = tmp_path / "f.npz"
    duplicates = len({n for n, _ in members}) < len(members)
    with pytest.warns(UserWarning, match="Duplicate name") if duplicates else contextlib.nullcontext():
        write_zip(path, members)
    with pytest.raises(ValueError, match=message):
        npzfile.read(path, "t", range(1, 2))


def test_a_header_beyond_16_mib_is_refused_before_inflating(tmp_path, inflated):
    members = [("header.npy", npy_bytes(np.zeros((1 << 24) + 1, np.uint8)))]
    _assert_refused_before_inflating(tmp_path / "f.npz", members, zipfile.ZIP_DEFLATED,
                                     r"header has dtype uint8 and shape \(16777217,\) \(16777217 "
                                     r"bytes\); expected at most 16777216 bytes", inflated)


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    path = tmp_path / "f.npz"
    np.savez(path, header=np.frombuffer(json.dumps({"format": "t", "version": 1}).encode(), np.uint8),
             a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(ValueError, match=r"member 'a' has dtype object; .*pickle"):
        npzfile.read(path, "t", range(1, 2))


@pytest.mark.parametrize(("path", "exc", "message"), [
    (3, TypeError, "path has type int"),  # open(3) would read file descriptor 3
    (b"f.npz", TypeError, "path has type bytes"),
    ("", ValueError, "path is empty"),
])
def test_read_refuses_what_is_not_a_file_name(path, exc, message):
    with pytest.raises(exc, match=message):
        npzfile.read(path, "t", range(1, 2))


def test_a_directory_or_a_missing_file_is_the_os_error(tmp_path):
    with pytest.raises(IsADirectoryError):
        npzfile.read(tmp_path, "t", range(1, 2))
    with pytest.raises(FileNotFoundError):
        npzfile.read(tmp_path / "absent.npz", "t", range(1, 2))


# ---------------------------------------------------------------- paths that cannot name a file
@pytest.mark.parametrize(("target", "exc", "message"), [
    ("newdir/", IsADirectoryError, r"path = 'newdir/' names a directory; expected a file name such as "
                                   r"'newdir/model.npz'"),
    ("", ValueError, r"path is empty"),
    (".", IsADirectoryError, r"path = '\.' names a directory"),
    ("sub", IsADirectoryError, r"path = 'sub' names a directory"),
    ("old.npz/", IsADirectoryError, r"path = 'old.npz/' names a directory"),
    ("newdir/.", IsADirectoryError, r"path = 'newdir/\.' names a directory"),
    ("sub/..", IsADirectoryError, r"path = 'sub/\.\.' names a directory"),
    ("missing/m.npz", FileNotFoundError, r"path = 'missing/m.npz': its folder 'missing' does not exist"),
    ("old.npz/m.npz", NotADirectoryError, r"'old.npz' is a file, not a folder"),
    (b"m.npz", TypeError, r"path has type bytes"),
    (3, TypeError, r"path has type int"),
])
def test_write_refuses_paths_that_cannot_name_a_file(tmp_path, monkeypatch, target, exc, message):
    """``newdir/`` used to create a FILE named newdir; ``""`` and ``"."`` failed with EBUSY on a temp file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    _write_sample(tmp_path / "old.npz")
    before = sorted(os.listdir(tmp_path)), (tmp_path / "old.npz").read_bytes()
    with pytest.raises(exc, match=message):
        _write_sample(target)
    assert (sorted(os.listdir(tmp_path)), (tmp_path / "old.npz").read_bytes()) == before
    assert os.listdir(tmp_path / "sub") == []
