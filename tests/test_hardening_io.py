"""The audit of issue 45: saving over what is not a regular file, long file names, sockets given to
``load`` (arrayrnn/core/npzfile.py)."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import arrayrnn as ar
from arrayrnn import optim

SMALL = ar.RNNSpec(mode="lstm", input_size=2, hidden_size=3)


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "listening.npz"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        yield path


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.npz"
    os.mkfifo(path)
    return path


def _char_device(tmp_path: Path) -> Path:
    """A node of /dev/null's device numbers (1, 3) in ``tmp_path``: the real /dev/null is never touched."""
    if os.geteuid() != 0:
        pytest.skip("os.mknod of a character device needs root (CI runs as root)")
    path = tmp_path / "null.npz"
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return path


_KINDS = [(_fifo, stat.S_ISFIFO, "a FIFO"), (_char_device, stat.S_ISCHR, "a character device")]


def _saves(path: Path) -> list[Callable[[], None]]:
    params = ar.PackedParams.init(SMALL, seed=0)
    return [lambda: ar.save(path, params), lambda: optim.Adam(params).save(path)]


@pytest.mark.parametrize("make, is_kind, kind", _KINDS, ids=["fifo", "char-device"])
@pytest.mark.parametrize("through_link", [False, True], ids=["direct", "via-symlink"])
def test_save_refuses_a_node_that_is_not_a_regular_file_and_leaves_it(tmp_path, make, is_kind, kind,
                                                                       through_link):
    """``ar.save`` renamed its temporary over a FIFO or a device node: as root, ``ar.save("/dev/null", p)``
    replaced the system's /dev/null with a regular file."""
    node = make(tmp_path)
    target = node
    if through_link:
        target = tmp_path / "latest.npz"
        target.symlink_to(node)
    for save in _saves(target):
        with pytest.raises(ValueError, match=rf"path = '{node}'.* is {kind}, not a regular file; saving "
                                             r"replaces its target"):
            save()
        assert is_kind(os.lstat(node).st_mode), f"{node} is no longer {kind}"
    assert sorted(os.listdir(tmp_path)) == sorted({node.name, target.name})  # no temporary left


def test_save_refuses_a_unix_socket_and_leaves_it(tmp_path, unix_socket):
    for save in _saves(unix_socket):
        with pytest.raises(ValueError, match=rf"path = '{unix_socket}' is a socket, not a regular file"):
            save()
        assert stat.S_ISSOCK(os.lstat(unix_socket).st_mode)


@pytest.mark.parametrize("length", [240, 255])
def test_save_takes_any_file_name_the_system_takes(tmp_path, length):
    """The temporary was named ``.<name>.arrayrnn-<8>.tmp``, 23 characters longer than the name: a valid
    240-character name failed with 'File name too long' (NAME_MAX is 255)."""
    path = tmp_path / ("m" * (length - 4) + ".npz")
    params = ar.PackedParams.init(SMALL, seed=3)
    for _ in range(2):   # a new file, then a replacement
        ar.save(path, params)
        optim.Adam(params, lr=0.5).save(tmp_path / ("o" * (length - 4) + ".npz"))
    assert ar.load(path).data.tobytes() == params.data.tobytes()
    assert sorted(len(name) for name in os.listdir(tmp_path)) == [length, length]


def test_a_temporary_of_the_older_long_form_is_still_removed(tmp_path):
    """Temporaries left by a killed save of an older arrayrnn (``.<name>.arrayrnn-<random>.tmp``) go too;
    files merely resembling ours stay."""
    path = tmp_path / "model.npz"
    left = [tmp_path / ".model.npz.arrayrnn-k1lled00.tmp", tmp_path / ".arrayrnn-k1lled01.tmp"]
    kept = [tmp_path / ".arrayrnn-notes.tmp", tmp_path / "arrayrnn-k1lled02.tmp",
            tmp_path / ".other.npz.arrayrnn-k1lled03.tmp.bak"]
    for file in left + kept:
        file.write_bytes(b"partial")
    ar.save(path, ar.PackedParams.init(SMALL))
    assert sorted(os.listdir(tmp_path)) == sorted(["model.npz", *(file.name for file in kept)])


def test_load_of_a_unix_socket_is_the_documented_value_error(unix_socket):
    """Opening a socket fails with ENXIO: ``load`` raised a bare ``OSError`` instead of the ``ValueError``
    it gives for every other file that is not a regular one."""
    with pytest.raises(ValueError, match=rf"{unix_socket}: is not a regular file \(a socket\); expected an "
                                         r"\.npz arrayrnn\.PackedParams file"):
        ar.load(unix_socket)
    with pytest.raises(ValueError, match=r"is not a regular file \(a socket\); expected an \.npz "
                                         r"arrayrnn-optimizer file"):
        optim.Adam(np.ones(3)).load(unix_socket)


def test_load_of_a_socket_object_is_a_type_error_naming_its_type():
    with socket.socket() as sock, pytest.raises(TypeError, match="path has type socket; expected a str or "
                                                                 "os.PathLike file name"):
        ar.load(sock)
