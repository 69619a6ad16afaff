import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from support.forged_npz import count_inflated, npy_bytes, write_zip

import arrayrnn as ar
from arrayrnn import optim
from arrayrnn.core import io as arrayrnn_io

SMALL = ar.RNNSpec(mode="lstm", input_size=2, hidden_size=3)

SPECS = [
    ar.RNNSpec("lstm", 3, 5, num_layers=2, bidirectional=True, proj_size=2, cell_clip=(-2, 3), dropout=0.1),
    ar.RNNSpec("gru", 3, 5, bias="single_rec", reset_after=False, dtype="float64"),
    ar.RNNSpec("rnn_relu", 1, 1, bias=False),
    ar.RNNSpec("lstm", 3, 4, num_layers=2, bidirectional=True, proj_size=2, peepholes=True, zoneout=0.1,
               zoneout_cell=0.2, recurrent_dropout=0.3, weight_dropout=0.4),
]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_save_load_round_trip_is_bit_exact(tmp_path, spec):
    params = ar.PackedParams.init(spec, seed=1)
    path = tmp_path / "model.npz"
    ar.save(path, params)
    loaded = ar.load(path)
    assert loaded.spec == spec and loaded.format == "canonical"
    assert loaded.data.dtype == params.data.dtype and loaded.data.tobytes() == params.data.tobytes()


def test_file_holds_no_pickle_and_a_json_header(tmp_path):
    path = tmp_path / "m.npz"
    ar.save(path, ar.PackedParams.init(SPECS[0]))
    with np.load(path, allow_pickle=False) as npz:
        header = json.loads(npz["header"].tobytes())
    assert header["format"] == "arrayrnn.PackedParams" and header["version"] == 1
    assert ar.RNNSpec.from_dict(header["spec"]) == SPECS[0]


def _rewrite(path, header=None, data=None):
    with np.load(path, allow_pickle=False) as npz:
        members = {"header": npz["header"], "data": npz["data"]}
    if header is not None:
        members["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    if data is not None:
        members["data"] = data
    with open(path, "wb") as f:
        np.savez(f, **members)


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "m.npz"
    params = ar.PackedParams.init(SPECS[0], seed=0)
    ar.save(path, params)
    with np.load(path) as npz:
        header = json.loads(npz["header"].tobytes())
    return path, header, params


def test_truncated_file(saved):
    path = saved[0]
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="not a readable arrayrnn.PackedParams file"):
        ar.load(path)


def test_flipped_byte_in_the_buffer(saved):
    path = saved[0]
    with zipfile.ZipFile(path) as z:
        data_info = z.getinfo("data.npy")
    raw = bytearray(path.read_bytes())
    raw[data_info.header_offset + 200] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"damaged|unreadable|not a readable"):
        ar.load(path)


def test_tampered_buffer_fails_the_checksum(saved):
    path, _, params = saved
    data = params.data.copy()
    data[3] += 1
    _rewrite(path, data=data)
    with pytest.raises(ValueError, match="SHA-256 does not match"):
        ar.load(path)


@pytest.mark.parametrize(("change", "message"), [
    (dict(version=2), r"arrayrnn.PackedParams file version = 2; this arrayrnn reads versions 1..1"),
    (dict(version="1"), r"file version = '1'"),
    (dict(version=True), r"file version = True"),
    (dict(format="other"), r"file kind = 'other'; expected 'arrayrnn.PackedParams'"),
    (dict(spec={"mode": "lstm"}), r"invalid spec in header"),
    (dict(spec=dict(mode="lstm", input_size=3, hidden_size=0)), r"invalid spec in header: hidden_size = 0"),
    (dict(dtype="float64"), r"header dtype = 'float64' and data dtype = float32"),
    (dict(length=3), r"header length = 3"),
])
def test_damaged_header_fields(saved, change, message):
    path, header, _ = saved
    _rewrite(path, header=header | change)
    with pytest.raises(ValueError, match=message):
        ar.load(path)


def test_header_not_json(saved):
    path = saved[0]
    with np.load(path) as npz:
        data = npz["data"]
    with open(path, "wb") as f:
        np.savez(f, header=np.frombuffer(b"{not json", dtype=np.uint8), data=data)
    with pytest.raises(ValueError, match="header is not valid JSON"):
        ar.load(path)


@pytest.mark.parametrize("write", [
    lambda p: np.savez(p, weights=np.zeros(3)),
    lambda p: np.save(p, np.zeros(3)),
    lambda p: p.write_bytes(b"hello, not an npz file at all"),
    lambda p: np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True),
])
def test_foreign_files(tmp_path, write):
    path = tmp_path / "foreign.npz"
    write(path)
    if not path.exists():
        os.rename(str(path) + ".npy", path)
    with pytest.raises(ValueError):
        ar.load(path)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        ar.load(tmp_path / "absent.npz")


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(saved, monkeypatch):
    path, _, params = saved
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(arrayrnn_io.np, "savez", crash)
    with pytest.raises(OSError, match="disk full"):
        ar.save(path, ar.PackedParams.init(SPECS[1]))
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == [path.name]


def test_save_rejects_non_params(tmp_path):
    with pytest.raises(TypeError, match="params has type ndarray"):
        ar.save(tmp_path / "x.npz", np.zeros(3))


def test_save_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    import os
    import stat
    path = tmp_path / "m.npz"
    params = ar.PackedParams.init(ar.RNNSpec(mode="gru", input_size=2, hidden_size=2), seed=0)
    ar.save(path, params)
    os.chmod(path, 0o644)
    ar.save(path, params)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    opt = optim.SGD(params)
    opt.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_load_of_byte_flipped_files_is_always_a_value_error(tmp_path):
    path = tmp_path / "m.npz"
    original = ar.PackedParams.init(SMALL, seed=0)
    ar.save(path, original)
    raw = path.read_bytes()
    for where in range(0, len(raw), 5):
        for mask in (0x01, 0xFF):
            flipped = bytearray(raw)
            flipped[where] ^= mask
            path.write_bytes(bytes(flipped))
            try:
                loaded = ar.load(path)
            except ValueError:
                continue
            # a flip in a field nobody reads (a zip timestamp, npy header padding) is harmless
            assert loaded.spec == original.spec
            np.testing.assert_array_equal(loaded.data, original.data)


def test_load_of_a_deeply_nested_header(tmp_path):
    path = tmp_path / "deep.npz"
    deep = "[" * 100_000 + "]" * 100_000
    np.savez(path, header=np.frombuffer(deep.encode(), dtype=np.uint8), data=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="header is not valid JSON"):
        ar.load(path)


# ---------------------------------------------------------------- sizes checked before reading; save paths
def _forge_data_member(path, data_npy, method=zipfile.ZIP_STORED):
    """Rewrite ``path`` keeping its header member and replacing ``data.npy`` by raw .npy bytes."""
    with zipfile.ZipFile(path) as z:
        header = z.read("header.npy")
    write_zip(path, [("header.npy", header), ("data.npy", data_npy)], method)


def test_a_data_member_declaring_4_tib_is_a_value_error(saved):
    """The old reader allocated the declared shape before any check: MemoryError."""
    path = saved[0]
    _forge_data_member(path, npy_bytes(np.zeros(8, np.float32), (2**40,)))
    with pytest.raises(ValueError, match=r"member 'data' declares shape \(1099511627776,\)"):
        ar.load(path)


def test_a_deflated_data_member_is_not_inflated_past_the_spec_size(saved, monkeypatch):
    """64 MiB of zeros (~64 KiB deflated) where the spec says a few hundred floats: refused unread."""
    path, _, params = saved
    _forge_data_member(path, npy_bytes(np.zeros(1 << 24, np.float32)), zipfile.ZIP_DEFLATED)
    inflated = count_inflated(monkeypatch)
    with pytest.raises(ValueError, match=rf"member 'data' declares shape \(16777216,\) and dtype float32; "
                                         rf"expected shape \({params.data.size},\) and dtype float32"):
        ar.load(path)
    assert inflated[0] < 1 << 16


def test_a_data_member_of_another_dtype_is_refused_before_reading(saved):
    path, _, params = saved
    _forge_data_member(path, npy_bytes(params.data.astype(np.float64)))
    with pytest.raises(ValueError, match=r"member 'data' declares shape \(\d+,\) and dtype float64"):
        ar.load(path)


@pytest.mark.parametrize(("target", "exc", "message"), [
    ("newdir/", IsADirectoryError, r"path = 'newdir/' names a directory"),
    ("", ValueError, r"path is empty"),
    (".", IsADirectoryError, r"path = '\.' names a directory"),
    ("m.npz/", IsADirectoryError, r"path = 'm.npz/' names a directory"),
])
def test_save_refuses_a_directory_and_keeps_the_old_file(tmp_path, monkeypatch, target, exc, message):
    """``save("newdir/", p)`` wrote a file named ``newdir``; ``""`` and ``"."`` failed with EBUSY."""
    monkeypatch.chdir(tmp_path)
    params = ar.PackedParams.init(SMALL, seed=0)
    ar.save("m.npz", params)
    before = (tmp_path / "m.npz").read_bytes()
    with pytest.raises(exc, match=message):
        ar.save(target, ar.PackedParams.init(SMALL, seed=1))
    assert os.listdir(tmp_path) == ["m.npz"] and (tmp_path / "m.npz").read_bytes() == before
    with pytest.raises(exc, match=message):
        optim.SGD(params).save(target)
    assert os.listdir(tmp_path) == ["m.npz"]


def test_a_header_written_before_the_cell_variants_existed_still_loads(saved):
    """Files from before issue 24 have no recurrent_dropout ... peepholes in their spec: defaults apply."""
    path, header, params = saved
    old_fields = ("mode", "input_size", "hidden_size", "num_layers", "bidirectional", "bias", "proj_size",
                  "cell_clip", "dropout", "reset_after", "dtype")
    assert set(header["spec"]) == set(old_fields)  # a plain spec writes exactly the old header
    loaded = ar.load(path)
    assert loaded.spec == params.spec and loaded.spec.variants == ()


# -- links, devices, pipes and killed writers (issue 34) -------------------------------------------------


@pytest.mark.parametrize("relative", [False, True], ids=["absolute-link", "relative-link"])
def test_save_through_a_symlink_writes_its_target_like_np_savez(tmp_path, relative):
    """``ar.save`` replaced the link with a file and left the target with the old weights."""
    target = tmp_path / "store" / "model.npz"
    target.parent.mkdir()
    old, new = ar.PackedParams.init(SMALL, seed=0), ar.PackedParams.init(SMALL, seed=1)
    ar.save(target, old)
    link = tmp_path / "latest.npz"
    link.symlink_to(Path("store") / "model.npz" if relative else target)
    ar.save(link, new)
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert ar.load(target).data.tobytes() == new.data.tobytes()
    opt = optim.Adam(new, lr=0.25)
    opt.save(link)
    assert link.is_symlink()
    restored = optim.Adam(ar.PackedParams.init(SMALL))
    restored.load(target)
    assert restored.lr == 0.25
    assert sorted(os.listdir(tmp_path)) == ["latest.npz", "store"]
    assert os.listdir(target.parent) == ["model.npz"]


def test_save_through_a_dangling_symlink_creates_its_target(tmp_path):
    target = tmp_path / "model.npz"
    link = tmp_path / "latest.npz"
    link.symlink_to(target)
    params = ar.PackedParams.init(SMALL, seed=2)
    ar.save(link, params)
    assert link.is_symlink() and ar.load(target).data.tobytes() == params.data.tobytes()


_LOAD_IN_A_BOUNDED_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))   # a read that never ends fails here, not the host
sys.path.insert(0, {root!r})
import numpy as np
import arrayrnn as ar
from arrayrnn import optim

for load in (ar.load, optim.Adam(np.ones(3)).load):
    try:
        load({path!r})
    except ValueError as err:
        print("ValueError:", err)
"""


def _load_in_a_bounded_child(path: Path) -> str:
    """``ar.load`` and ``Optimizer.load`` of ``path`` in a child with 2 GiB of address space and a minute:
    /dev/zero was read until the machine ran out of memory; opening a FIFO waits for a writer."""
    root = str(Path(__file__).resolve().parent.parent)
    try:
        code = _LOAD_IN_A_BOUNDED_CHILD.format(root=root, path=str(path))
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {path} did not end within 60 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.npz"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("make, kind", [(lambda _: Path("/dev/zero"), "a character device"),
                                        (_fifo, "a FIFO")], ids=["dev-zero", "fifo"])
def test_load_refuses_what_is_not_a_regular_file_before_reading_it(tmp_path, make, kind):
    path = make(tmp_path)
    said = _load_in_a_bounded_child(path).splitlines()
    assert said == [f"ValueError: {path}: is not a regular file ({kind}); expected an .npz {what} file"
                    for what in ("arrayrnn.PackedParams", "arrayrnn-optimizer")], said


_KILLED_WRITER = """
import os, signal, sys
sys.path.insert(0, {root!r})
import numpy as np
from arrayrnn.core import npzfile

def write_half_then_die(f):
    f.write(b"PK" + bytes(1 << 20))
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)     # kill -9 in the middle of the save

npzfile.atomic_write({path!r}, write_half_then_die)
"""


def _killed_save(path: Path) -> None:
    """A process killed (SIGKILL) half-way through a save of ``path``."""
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER.format(root=root, path=str(path))],
                          capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_the_next_save_removes_the_temporary_files_of_killed_saves(tmp_path):
    """Each kill -9 during a save left a hidden temporary file of the model's size; nothing removed them."""
    path = tmp_path / "model.npz"
    params = ar.PackedParams.init(SMALL, seed=0)
    ar.save(path, params)
    for _ in range(2):
        _killed_save(path)
    assert len(os.listdir(tmp_path)) >= 2          # a killed save's temporary is there ...
    ar.save(path, params)
    assert os.listdir(tmp_path) == ["model.npz"]   # ... until the next save of the same file
    assert ar.load(path).data.tobytes() == params.data.tobytes()


def test_a_save_leaves_the_temporary_file_of_a_save_in_progress_alone(tmp_path):
    """Two processes saving the same file: the second save must not remove the first one's temporary."""
    from arrayrnn.core import npzfile

    path = tmp_path / "model.npz"
    params = ar.PackedParams.init(SMALL, seed=0)
    seen = []

    def write_meanwhile(f):
        f.write(b"partial")
        seen.extend(os.listdir(tmp_path))
        ar.save(path, params)       # another save of the same file while this one is half-way
        assert set(seen) <= set(os.listdir(tmp_path)) | {"model.npz"}, "the first save's temporary is gone"
        f.seek(0)
        f.truncate()
        np.savez(f, header=np.frombuffer(b"{}", np.uint8))

    npzfile.atomic_write(path, write_meanwhile)
    assert os.listdir(tmp_path) == ["model.npz"]
