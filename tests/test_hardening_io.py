"""The audit of issue 45: saving over what is not a regular file, long file names, sockets given to
``load`` (arrayrnn/core/npzfile.py)."""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
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


# -- float fields of the spec and the nn layers: huge ints, NaN, inf, bools (issue 45, item 4) ---------------

HUGE = 10**400
_FLOAT_FIELDS = {   # field: (spec fields it needs, the start of what the error expects)
    "layer_norm_eps": ({"layer_norm": True}, r"expected a finite float > 0"),
    "dropout": ({"num_layers": 2}, r"expected a probability in \[0, 1\)"),
    "recurrent_dropout": ({}, r"expected a probability in \[0, 1\)"),
    "weight_dropout": ({}, r"expected a probability in \[0, 1\)"),
    "zoneout": ({}, r"expected a probability in \[0, 1\)"),
    "zoneout_cell": ({}, r"expected a probability in \[0, 1\)"),
    "cell_clip": ({}, r"expected (finite bounds with lo < hi|None, a positive float c, or a pair)"),
}
HUGE_TEXT = r"1\.000e\+400 \(an int of 401 digits\)"
_BAD_FLOATS = [(HUGE, HUGE_TEXT), (-HUGE, "-" + HUGE_TEXT),
               (10**5000, r"1\.000e\+5000 \(an int of 5001 digits\)"), (float("nan"), "nan"),
               (float("inf"), "inf"), (True, "True"), (np.float32("nan"), r"np\.float32\(nan\)")]


@pytest.mark.parametrize("field", list(_FLOAT_FIELDS))
@pytest.mark.parametrize("value, value_text", _BAD_FLOATS, ids=["huge", "-huge", "10**5000", "nan", "inf",
                                                                "True", "np-nan"])
def test_a_float_field_out_of_range_is_a_value_error_naming_it(field, value, value_text):
    """``RNNSpec(layer_norm_eps=10**400)`` raised ``OverflowError`` (``float(10**400)``), and a 10**5000
    anywhere raised numpy's/Python's digit-limit error instead of the field's message."""
    needs, expected = _FLOAT_FIELDS[field]
    with pytest.raises(ValueError, match=rf"^{field} = {value_text}; {expected}"):
        ar.RNNSpec("lstm", 2, 3, **needs, **{field: value})


@pytest.mark.parametrize("clip", [(HUGE, 1), (-1, HUGE), (0, float("nan"))], ids=str)
def test_a_cell_clip_pair_with_a_bound_out_of_range_is_a_value_error(clip):
    with pytest.raises(ValueError, match=r"^cell_clip = \(.*\); expected finite bounds with lo < hi"):
        ar.RNNSpec("lstm", 2, 3, cell_clip=clip)


@pytest.mark.parametrize("layer", [ar.nn.LSTM, ar.nn.GRU, ar.nn.RNN])
def test_the_nn_layers_name_layer_norm_eps(layer):
    with pytest.raises(ValueError, match=rf"^layer_norm_eps = {HUGE_TEXT}; expected"):
        layer(2, 3, layer_norm=True, layer_norm_eps=HUGE)
    with pytest.raises(ValueError, match=rf"^dropout = {HUGE_TEXT}; expected"):
        layer(2, 3, num_layers=2, dropout=HUGE)


def test_huge_sizes_and_seeds_are_named_abbreviated():
    """Past 4300 digits ``repr`` of an int raises: the messages showed Python's digit-limit error instead."""
    with pytest.raises(ValueError, match=r"^hidden_size = 1\.000e\+5000 \(an int of 5001 digits\); expected"):
        ar.RNNSpec("lstm", 2, 10**5000)
    with pytest.raises(ValueError, match=r"^seed = 9\.999e\+4999 \(an int of 5000 digits\); expected None"):
        ar.PackedParams.init(SMALL, seed=10**5000 - 1)


def test_fields_in_range_are_kept_as_floats():
    spec = ar.RNNSpec("lstm", 2, 3, layer_norm=True, layer_norm_eps=10**300, cell_clip=(-(10**300), 2),
                      dropout=np.float32(0.5), zoneout=0)
    assert spec.layer_norm_eps == 1e300 and spec.cell_clip == (-1e300, 2.0) and spec.dropout == 0.5
    assert all(type(v) is float for v in (spec.layer_norm_eps, *spec.cell_clip, spec.dropout, spec.zoneout))


# -- thread counts from the environment (issue 45, item 5) ---------------------------------------------------

_THREAD_VARIABLES = ("ARRAYRNN_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")


@pytest.fixture
def environment_default(monkeypatch):
    """``get_num_threads()``'s default read afresh from the given variables (the others unset)."""
    from arrayrnn.engines import thread_count

    def read(**env: str) -> int:
        for name in _THREAD_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(thread_count, "_explicit", None)
        monkeypatch.setattr(thread_count, "_environment", {})   # the read-once cache
        return ar.get_num_threads()
    return read


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "NUMBA_NUM_THREADS"])
@pytest.mark.parametrize("value", ["²", "٣", "0", "-1", "4,", "1.5", "four"])
def test_an_unreadable_host_limit_is_ignored_with_a_warning(environment_default, name, value):
    """``OMP_NUM_THREADS='²'`` (``'²'.isdigit()`` is True, ``int('²')`` fails) raised from every numba call;
    libgomp ignores an invalid value with a warning, and so does arrayrnn now."""
    said = (rf"^{name} = {re.escape(repr(value))} is not a thread count \(expected an int >= 1 or a list "
            r"such as '4,2'\); arrayrnn ignores it")
    with pytest.warns(RuntimeWarning, match=said):
        assert environment_default(**{name: value}) == _cpus()
    with pytest.warns(RuntimeWarning, match=name):
        assert environment_default(**{name: value, "NUMBA_NUM_THREADS" if name[0] == "O" else
                                      "OMP_NUM_THREADS": "1"}) == 1   # the other limit still applies


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "NUMBA_NUM_THREADS"])
@pytest.mark.parametrize("value, expected", [(" 1 ", 1), ("1,3", 1), (" 1 , 2 ", 1), ("", None),
                                             ("  ", None)])
def test_readable_host_limits(environment_default, recwarn, name, value, expected):
    assert environment_default(**{name: value}) == (_cpus() if expected is None else expected)
    assert not [w for w in recwarn if "thread count" in str(w.message)]


@pytest.mark.parametrize("value", ["²", "٣", "0", "-1", "4,2", "", " ", "+2"])
def test_a_bad_arrayrnn_num_threads_stays_a_clear_error(environment_default, value):
    expected = rf"^ARRAYRNN_NUM_THREADS = {re.escape(repr(value))}; expected an int >= 1 \(or unset\)"
    with pytest.raises(ValueError, match=expected):
        environment_default(ARRAYRNN_NUM_THREADS=value)


def test_arrayrnn_num_threads_may_have_spaces_around_it(environment_default, recwarn):
    assert environment_default(ARRAYRNN_NUM_THREADS=" 3 ", OMP_NUM_THREADS="²") == 3
    assert not recwarn.list, "the host's limits are not read when ARRAYRNN_NUM_THREADS is set"


def _numba_call_in_a_new_process(**env_vars: str) -> subprocess.CompletedProcess:
    """Import, the first read of the environment and a numba call in a fresh process under ``env_vars``;
    prints the thread count, the output's shape and whether NUMBA_NUM_THREADS is still set."""
    root = Path(__file__).resolve().parent.parent
    code = ("import os, numpy as np, arrayrnn as ar\n"
            "p = ar.PackedParams.init(ar.RNNSpec('gru', 2, 3))\n"
            "y = ar.rnn_forward(p, np.ones((2, 1, 2), np.float32), engine='numba').y\n"
            "print(ar.get_num_threads(), y.shape, 'NUMBA_NUM_THREADS' in os.environ)\n")
    env = {k: v for k, v in os.environ.items() if k not in _THREAD_VARIABLES}
    env.update(PYTHONPATH=str(root), **env_vars)
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_a_numba_call_runs_under_an_unreadable_omp_num_threads():
    """The whole path in a fresh process: import, the first read of the environment, a numba call."""
    pytest.importorskip("numba")
    proc = _numba_call_in_a_new_process(OMP_NUM_THREADS="²", NUMBA_NUM_THREADS="1")
    assert proc.stdout.split() == ["1", "(2,", "1,", "3)", "True"]
    assert "OMP_NUM_THREADS = '²' is not a thread count" in proc.stderr


@pytest.mark.parametrize("value", ["0", "-2", " 0 "])
def test_import_under_a_numba_num_threads_numba_refuses(value):
    """``NUMBA_NUM_THREADS=0`` makes ``import numba`` raise (numba/np/ufunc/parallel.py,
    ``get_thread_count``): ``import arrayrnn`` raised with it; now the variable is dropped with a warning."""
    proc = _numba_call_in_a_new_process(NUMBA_NUM_THREADS=value, OMP_NUM_THREADS="1")
    assert proc.stdout.split() == ["1", "(2,", "1,", "3)", "False"]
    assert f"NUMBA_NUM_THREADS = {value!r} is not a thread count" in proc.stderr


# -- layer norm of float32 rows near 1e20 (issue 45, item 6) ------------------------------------------------

_LN_SPECS = [dict(mode="lstm", proj_size=2), dict(mode="gru"), dict(mode="gru", reset_after=False),
             dict(mode="rnn_tanh", bidirectional=True)]


def _run(params, x, engine):
    res = ar.rnn_forward(params, x, engine=engine, training=True)
    dy = np.linspace(-1, 1, res.y.size).reshape(res.y.shape).astype(res.y.dtype)
    g = ar.rnn_backward(res, dy=dy)
    return {"y": res.y, "h_n": res.h_n, "dx": g.dx, "dparams": g.dparams.data}


@pytest.mark.parametrize("fields", _LN_SPECS, ids=lambda f: "-".join(map(str, f.values())))
@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_float32_layer_norm_of_rows_near_1e20_equals_float64(fields, engine):
    """The reference engine squared float32 deviations near 1e20: the variance overflowed to inf and the
    outputs were off by 1.0-1.8 (the numba loops reduce in float64, so ``"auto"`` answered differently
    before and after numba loaded)."""
    if engine == "numba":
        pytest.importorskip("numba")
    spec = ar.RNNSpec(input_size=4, hidden_size=3, layer_norm=True, **fields)
    params = ar.PackedParams.init(spec, seed=1)
    scale = np.geomspace(1e19, 1e20, 4)
    x = (np.random.default_rng(0).standard_normal((3, 2, 4)) * scale).astype(np.float32)
    assert np.isfinite(x).all() and np.abs(x).max() > 1e19
    with np.errstate(over="raise", invalid="raise"):
        got = _run(params, x, engine)
    want = _run(params.astype("float64"), x.astype(np.float64), "reference")
    for name, value in got.items():
        assert value.dtype == np.float32 and np.isfinite(value).all(), name
        bound = 1e-4 * np.abs(want[name]).max()
        np.testing.assert_allclose(value, want[name], rtol=1e-3, atol=bound, err_msg=name)


_HUGE = 2.0 ** 660  # ~5e198: deviations square past float64's range; a power of two, so scaling is exact


@pytest.mark.parametrize("fields", _LN_SPECS, ids=lambda f: "-".join(map(str, f.values())))
@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_float64_layer_norm_of_rows_near_1e198_is_scale_invariant(fields, engine):
    """Layer norm is scale-invariant (where ``eps`` is negligible): inputs (and, where ``h`` enters only
    through the normalised product, initial states) times 2**660 give the outputs and parameter gradients of
    the same times 2**100, which square within range, and ``dx`` scaled alike. Before, the float64 variance
    of those rows overflowed to inf (rstd 0) on both engines: outputs off by 0.7-1.2 with no error."""
    if engine == "numba":
        pytest.importorskip("numba")
    spec = ar.RNNSpec(input_size=4, hidden_size=3, layer_norm=True, dtype="float64", **fields)
    params = ar.PackedParams.init(spec, seed=1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 4))
    h0 = None if spec.mode == "gru" else rng.standard_normal((spec.num_directions, 2, spec.output_size))

    def run(scale):
        res = ar.rnn_forward(params, x * scale, h0=None if h0 is None else h0 * scale, engine=engine,
                             training=True)
        g = ar.rnn_backward(res, dy=np.linspace(-1, 1, res.y.size).reshape(res.y.shape))
        return {"y": res.y, "dx": g.dx * scale, "dparams": g.dparams.data}

    with np.errstate(invalid="raise"):
        huge = run(_HUGE)
    plain = run(2.0 ** 100)
    for name, value in huge.items():
        assert np.isfinite(value).all(), name
        np.testing.assert_allclose(value, plain[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_float64_layer_norm_statistics_are_unchanged():
    """The float64 path is the one it was: the statistics of a float64 row are computed as before."""
    from arrayrnn.engines.layer_norm import row_stats
    v = np.random.default_rng(2).standard_normal((5, 7)) * 1e3 + 10
    stats = row_stats(np, v, 1e-5)
    centred = v - v.mean(axis=-1)[..., None]
    assert np.array_equal(stats[..., 0], v.mean(axis=-1))
    assert np.array_equal(stats[..., 1], 1.0 / np.sqrt((centred * centred).mean(axis=-1) + 1e-5))


# -- warmup's progress bar without a usable stderr (issue 45, item 7) ---------------------------------------

_FAKE_COMPILE = '''
from arrayrnn.frontend import compile_ahead as W
compiled = []

def compile_family(family, progress=None):   # the probe calls stand for a 100-second compile
    for _ in W.probe_calls(family):
        if progress is not None:
            progress.update(1)
    compiled.append(family.text())
    return {}
'''


def _fake_compile(monkeypatch) -> dict:
    """warmup's compile step replaced for the test by the probe count; ``["compiled"]``: the families."""
    namespace: dict = {}
    exec(_FAKE_COMPILE, namespace)
    monkeypatch.setattr(namespace["W"], "compile_family", namespace["compile_family"])
    return namespace


class _ClosedDescriptor:
    """A stream whose descriptor was closed under it (``os.close(2)`` after start-up)."""

    closed = False

    def __init__(self):
        read, write = os.pipe()
        os.close(read)
        os.close(write)
        self.fd, self.written = write, []

    def fileno(self) -> int:
        return self.fd

    def write(self, text: str) -> int:
        self.written.append(text)
        raise OSError(9, "Bad file descriptor")

    def flush(self) -> None:
        raise OSError(9, "Bad file descriptor")


def _closed_stringio():
    import io
    stream = io.StringIO()
    stream.close()
    return stream


@pytest.mark.parametrize("make_stderr", [lambda: None, _closed_stringio, _ClosedDescriptor],
                         ids=["none", "closed", "closed-descriptor"])
def test_warmup_without_a_usable_stderr_skips_the_bar_and_compiles(monkeypatch, make_stderr):
    """With ``sys.stderr = None`` (pythonw, a daemon) tqdm's first write raised ``AttributeError`` and
    warmup compiled nothing."""
    pytest.importorskip("tqdm")
    namespace = _fake_compile(monkeypatch)
    stderr = make_stderr()
    monkeypatch.setattr(sys, "stderr", stderr)
    ar.warmup(["rnn_tanh", "gru"], "float64", training=False)
    assert namespace["compiled"] == ["rnn:float64:forward", "gru:float64:forward"]
    assert not getattr(stderr, "written", [])


def test_warmup_shows_its_bar_on_a_usable_stderr(monkeypatch):
    import io
    pytest.importorskip("tqdm")
    namespace = _fake_compile(monkeypatch)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    ar.warmup("rnn_tanh", "float64", training=False)
    assert "arrayrnn warmup" in sys.stderr.getvalue() and namespace["compiled"] == ["rnn:float64:forward"]


def test_the_warmup_command_with_stderr_closed_compiles():
    """``python -m arrayrnn warmup 2>&-``: Python starts with ``sys.stderr = None``; the bar failed."""
    pytest.importorskip("tqdm")
    root = Path(__file__).resolve().parent.parent
    code = _FAKE_COMPILE + ("W.compile_family = compile_family\n"
                            "from arrayrnn.__main__ import main\n"
                            "rc = main(['warmup', '--modes', 'rnn_tanh', '--dtypes', 'float64', "
                            "'--inference-only'])\n"
                            "print(rc, compiled)\n")
    proc = subprocess.run(["sh", "-c", 'exec "$0" -c "$1" 2>&-', sys.executable, code], cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout.splitlines() == ["0 ['rnn:float64:forward']"], (proc.returncode, proc.stdout)
