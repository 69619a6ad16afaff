"""The numba engine's compile off the caller's path (arrayrnn.engines.numba.warmup): ``"auto"`` never
waits for numba, the background compile's child process, fork and exit, compiling ahead.

The suite runs with ``ARRAYRNN_BACKGROUND_COMPILE=0`` (conftest.py); the tests of the background compile
itself start fresh Python processes with an empty numba cache directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.fresh_process import run_fresh as _run

import arrayrnn as ar
from arrayrnn import __main__ as cli
from arrayrnn.engines import forget_choices, probe_call, select_engine, thresholds
from arrayrnn.engines.numba import warmup as W
from arrayrnn.frontend import compile_ahead

ROOT = Path(__file__).resolve().parents[1]


# -- families and bad input ---------------------------------------------------------------------------
def test_family_text_round_trip():
    for family in (W.Family("lstm", "float32", True), W.Family("rnn", "float64", False)):
        assert W.Family.parse(family.text()) == family
    spec = ar.RNNSpec(mode="rnn_relu", input_size=2, hidden_size=3, dtype="float64")
    assert W.family_of(spec, training=False) == W.Family("rnn", "float64", False)


@pytest.mark.parametrize("text", ["lstm:float16:forward", "lsmt:float32:training", "gru:float32:train",
                                  "gru"])
def test_bad_family_text(text):
    with pytest.raises(ValueError, match="family = "):
        W.Family.parse(text)


@pytest.mark.parametrize("modes, dtypes, match", [
    (["lsmt"], ["float32"], "modes contains 'lsmt'"),
    (["lstm"], ["float16"], "dtypes contains 'float16'"),
    (["lstm"], ["bogus"], "dtypes contains 'bogus'"),
    ([], ["float32"], "at least one of each"),
    (["gru"], [], "at least one of each"),
])
def test_warmup_bad_arguments(modes, dtypes, match):
    with pytest.raises(ValueError, match=match):
        ar.warmup(modes, dtypes, progress=False)


def test_warmup_bad_training_flag():
    with pytest.raises(TypeError, match="training = 'yes'"):
        ar.warmup("lstm", "float32", training="yes", progress=False)


def test_cli_bad_mode_exits_2(capsys):
    assert cli.main(["warmup", "--modes", "lsmt", "--quiet"]) == 2
    assert "modes contains 'lsmt'" in capsys.readouterr().err


def test_families_from_specs_and_names():
    spec = ar.RNNSpec(mode="gru", input_size=2, hidden_size=3)
    got = W.families([spec, "rnn_tanh", "rnn_relu"], "float64", training=False)
    assert got == [W.Family("gru", "float64", False), W.Family("rnn", "float64", False)]


def test_bad_environment_value(monkeypatch):
    monkeypatch.setenv("ARRAYRNN_BACKGROUND_COMPILE", "yes")
    with pytest.raises(ValueError, match="ARRAYRNN_BACKGROUND_COMPILE='yes'"):
        W.background_enabled()


# -- "auto" declines the numba engine while the family is not loaded --------------------------------
def test_auto_declines_numba_until_loaded(monkeypatch):
    asked = []
    monkeypatch.setenv("ARRAYRNN_BACKGROUND_COMPILE", "1")
    monkeypatch.setattr(W._queue, "ask", asked.append)
    monkeypatch.setattr(W, "_loaded", set())
    forget_choices()
    spec = ar.RNNSpec(mode="lstm", input_size=2, hidden_size=3, dtype="float64")
    call = probe_call(spec, training=True)
    assert select_engine("auto", call).name == "reference"
    path = W.path_of(call, ar.get_num_threads())   # the call's own loops first, then the family's
    assert asked == [path, W.Family("lstm", "float64", True)]
    assert path.family() == W.Family("lstm", "float64", True)
    assert select_engine("numba", call).name == "numba"       # named: never declines
    W._loaded.add(W.Family("lstm", "float64", True))
    forget_choices()                                          # what the background thread does
    assert select_engine("auto", call).name == "numba"
    forget_choices()


def test_switched_off_auto_takes_numba(monkeypatch):
    monkeypatch.setenv("ARRAYRNN_BACKGROUND_COMPILE", "0")
    monkeypatch.setattr(W, "_loaded", set())
    forget_choices()
    spec = ar.RNNSpec(mode="gru", input_size=2, hidden_size=3, dtype="float64")
    assert select_engine("auto", probe_call(spec)).name == "numba"
    forget_choices()


# -- the probes reach every compiled function a family's calls use ------------------------------------
def _variety(kind: str, dtype: str):
    """Calls unlike the probes: other sizes, lengths, thread counts, variants and options."""
    mode = {"lstm": "lstm", "gru": "gru", "rnn": "rnn_relu"}[kind]
    rng = np.random.default_rng(1)
    for options, T, B, threads in [
        (dict(num_layers=3), 7, 20, 2),
        (dict(bidirectional=True, recurrent_dropout=0.3), 5, 9, 1),
        (dict(zoneout=0.2, bias="single_rec"), 6, 4, 2),
        (dict(hidden_size=320, reset_after=False), 3, 8, 2),
        (dict(hidden_size=360), 3, 12, 2),
        (dict(weight_dropout=0.4, num_layers=2, dropout=0.5), 4, 17, 2),
        (dict(layer_norm=True, num_layers=2), 6, 12, 2),
        (dict(layer_norm=True, bidirectional=True, recurrent_dropout=0.2), 5, 20, 2),
        (dict(layer_norm=True, hidden_size=360), 3, 12, 2),      # layer norm's column split
        (dict(num_layers=2), 1, 9, 2),                           # the one-step path
        (dict(), 1, 20, 2),
    ]:
        if kind != "gru":
            options.pop("reset_after", None)
        if kind == "lstm" and B == 4:
            options |= dict(proj_size=2, peepholes=True, cell_clip=2.0, zoneout_cell=0.3)
        spec = ar.RNNSpec(mode=mode, input_size=5, **{"hidden_size": 6, **options}, dtype=dtype)
        yield spec, rng.standard_normal((T, B, 5)).astype(dtype), rng.integers(0, T + 1, B), threads


@pytest.mark.parametrize("kind, dtype", [("lstm", "float64"), ("gru", "float64"), ("rnn", "float64"),
                                         ("lstm", "float32")])
def test_probes_cover_the_family(kind, dtype, monkeypatch):
    compile_ahead.compile_family(W.Family(kind, dtype, True))
    # the variety's small calls split as large ones do: the probes must reach every loop a large call runs
    monkeypatch.setattr(thresholds, "MIN_SPLIT_CALL_FMAS", 0)
    before = W.compiled_signatures()
    threads = ar.get_num_threads()
    try:
        for spec, x, lengths, n in _variety(kind, dtype):
            ar.set_num_threads(n)
            res = ar.rnn_forward(ar.PackedParams.init(spec, seed=0), x, lengths, training=True, seed=3,
                                 engine="numba")
            ar.rnn_backward(res, dy=np.ones_like(res.y))
            ar.rnn_forward(ar.PackedParams.init(spec, seed=0), x, lengths, engine="numba")
            res = ar.rnn_forward(ar.PackedParams.init(spec, seed=0), x, lengths, training=True,
                                 return_all_states=True, engine="numba")
            ar.rnn_backward(res, dy=np.ones_like(res.y), dh_all=np.ones_like(res.h_all))
        for B, n in [(1, 1), (9, 2), (20, 2)]:                    # the cells' step, forward and backward
            spec = ar.RNNSpec(mode={"rnn": "rnn_tanh"}.get(kind, kind), input_size=5, hidden_size=7,
                              dtype=dtype)
            ar.set_num_threads(n)
            res = ar.cell_step(ar.PackedParams.init(spec, seed=0), np.ones((B, 5), dtype), training=True,
                               engine="numba")
            ar.cell_step_backward(res, dh=np.ones_like(res.h))
            ar.cell_step(ar.PackedParams.init(spec, seed=0), np.ones((B, 5), dtype), engine="numba")
            res = ar.rnn_forward(ar.PackedParams.init(spec.replace(num_layers=2, bidirectional=True), seed=0),
                                 np.ones((1, B, 5), dtype), engine="numba")  # one step per layer-direction
            assert res.engine == "numba"
    finally:
        ar.set_num_threads(threads)
    assert W.new_signatures(before, W.compiled_signatures()) == {}


# -- fresh processes, empty cache ---------------------------------------------------------------------
_COMMON = """
    import os
    import numpy as np
    import torch
    import arrayrnn as ar
    from arrayrnn.engines.numba import warmup as W

    spec = ar.RNNSpec(mode="rnn_tanh", input_size=3, hidden_size=5, dtype="float64")
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(0).standard_normal((4, 2, 3))
    oracle = torch.nn.RNN(3, 5, dtype=torch.float64)
    oracle.load_state_dict({k: torch.as_tensor(v) for k, v in ar.to_torch_state_dict(params).items()})
    expected = oracle(torch.as_tensor(x))[0].detach().numpy()
    family = W.family_of(spec, training=False)
"""


def test_first_call_does_not_wait_for_numba(tmp_path):
    out = _run(_COMMON + """
    first = ar.rnn_forward(params, x)
    assert family not in W._loaded, "the first call returned after the compile finished"
    assert first.engine == "reference", first.engine
    np.testing.assert_allclose(first.y, expected, rtol=0, atol=1e-12)
    assert W.wait(spec, training=False, timeout=800)
    later = ar.rnn_forward(params, x)
    assert later.engine == "numba", later.engine
    np.testing.assert_allclose(later.y, first.y, rtol=0, atol=1e-14)
    print("ok")
    """, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert out.stderr == ""  # warning-free (and -W error)
    assert list((tmp_path / "cache").rglob("*.nbi")), "the child process filled no cache"


def test_a_call_runs_compiled_once_its_own_loops_are_loaded(tmp_path):
    """The first compile is the call's own path (issue 45): once it is loaded, calls of that path (other
    lengths of sequence and of rows) run on numba and compile nothing more in this process; the path
    loaded before its family."""
    out = _run(_COMMON + """
    from arrayrnn.engines import probe_call

    order = []
    mark = W.mark_loaded
    W.mark_loaded = lambda job: (order.append(job), mark(job))
    first = ar.rnn_forward(params, x)
    assert first.engine == "reference", first.engine
    path = W.path_of(probe_call(spec, seq_len=4, batch=2), ar.get_num_threads())
    assert W.wait_path(probe_call(spec, seq_len=4, batch=2), timeout=800)
    before = W.compiled_signatures()
    for T, lengths in [(4, None), (7, np.array([7, 2])), (2, np.array([1, 2]))]:
        xs = np.random.default_rng(T).standard_normal((T, 2, 3))
        res = ar.rnn_forward(params, xs, lengths)
        assert res.engine == "numba", res.engine
        want = ar.rnn_forward(params, xs, lengths, engine="reference").y
        np.testing.assert_allclose(res.y, want, rtol=0, atol=1e-12)
    assert W.new_signatures(before, W.compiled_signatures()) == {}
    assert order[0] == path, order
    print("ok")
    """, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_path_text_round_trip_and_bad_text():
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=5, proj_size=2, cell_clip=2.0)
    path = W.path_of(probe_call(spec, training=True, seq_len=1, batch=7), 3)
    assert W.Path.parse(path.text()) == path
    assert path.family() == W.Family("lstm", "float32", True) and path.one_step and path.batch == 7
    for text in ["{}", "[1]", "not json", '{"spec": "{}", "training": true}']:
        with pytest.raises(ValueError, match=r"^path = .*expected the JSON of a warmup.Path"):
            W.Path.parse(text)


def test_fork_during_the_background_compile(tmp_path):
    out = _run(_COMMON + """
    first = ar.rnn_forward(params, x)                 # starts the background compile
    assert family not in W._loaded
    pid = os.fork()
    if pid == 0:                                      # the child: calls still run, on an engine that is ready
        res = ar.rnn_forward(params, x)
        os._exit(0 if np.allclose(res.y, expected, rtol=0, atol=1e-12) else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    print("ok")
    """, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_exit_while_compiling_is_clean(tmp_path):
    out = _run(_COMMON + """
    ar.rnn_forward(params, x)
    assert family not in W._loaded
    print("ok")
    """, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok" and out.stderr == "", out.stderr


# -- numba's cache corrupt or nowhere to write (issue 45) ---------------------------------------------
_CHECKED_CALLS = _COMMON + """
    for _ in range(2):
        res = ar.rnn_forward(params, x)
        np.testing.assert_allclose(res.y, expected, rtol=0, atol=1e-12)
    waiting = os.environ["ARRAYRNN_BACKGROUND_COMPILE"] == "0"   # "auto" took numba from the first call
    assert waiting or W.wait(spec, training=False, timeout=600)
    res = ar.rnn_forward(params, x)
    np.testing.assert_allclose(res.y, expected, rtol=0, atol=1e-12)
    print(res.engine)
"""


@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory) -> Path:
    """numba's cache holding the compiled loops of _COMMON's family (RNN, float64, inference)."""
    where = tmp_path_factory.mktemp("filled")
    out = _run("""
    import arrayrnn as ar
    ar.warmup("rnn_tanh", "float64", training=False, progress=False)
    """, where, ARRAYRNN_BACKGROUND_COMPILE="0")
    assert out.returncode == 0, out.stderr
    return where / "cache"


@pytest.mark.parametrize("background", ["1", "0"])
@pytest.mark.parametrize("damage", ["index", "data"])
def test_a_corrupt_cache_file_is_compiled_again_and_overwritten(filled_cache, tmp_path, damage, background):
    """Before, a truncated index or data file made every call that reached it raise UnpicklingError."""
    shutil.copytree(filled_cache, tmp_path / "cache")
    # the loop's every entry (one signature per layer norm on or off): the call reaches one of them
    pattern = f"rnn_loops.rnn_forward_loop-*.{'nbi' if damage == 'index' else 'nbc'}"
    targets = sorted((tmp_path / "cache").rglob(pattern))
    assert targets, pattern
    truncated = {}
    for target in targets:
        truncated[target] = target.read_bytes()[:target.stat().st_size // 2]
        target.write_bytes(truncated[target])
    out = _run(_CHECKED_CALLS, tmp_path, timeout=600, ARRAYRNN_BACKGROUND_COMPILE=background)
    assert out.returncode == 0 and out.stdout.strip() == "numba", out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("corrupt entry in numba's cache") <= 1, out.stderr
    rewritten = [t for t in targets if t.exists() and t.read_bytes() != truncated[t]]
    assert rewritten, "the corrupt entry was not written anew"


@pytest.mark.parametrize("background, first_engine", [("1", "reference"), ("0", "numba")])
def test_no_writable_cache_location_imports_and_runs(tmp_path, background, first_engine):
    """A read-only package, HOME and NUMBA_CACHE_DIR (each under a regular file: root writes anywhere
    else): before, ``import arrayrnn`` raised numba's "no locator available"."""
    package = tmp_path / "package"
    shutil.copytree(ROOT / "arrayrnn", package / "arrayrnn",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for folder in [package / "arrayrnn", *(package / "arrayrnn").rglob("*")]:
        if folder.is_dir():
            (folder / "__pycache__").write_text("")   # numba's in-tree cache folder cannot be made
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    out = _run(_COMMON + f"""
    first = ar.rnn_forward(params, x)
    assert first.engine == "{first_engine}" and W._queue.thread is None, (first.engine, W._queue.thread)
    np.testing.assert_allclose(first.y, expected, rtol=0, atol=1e-12)
    named = ar.rnn_forward(params, x, engine="numba")       # compiled here, kept nowhere
    np.testing.assert_allclose(named.y, expected, rtol=0, atol=1e-12)
    print("ok")
    """, tmp_path, timeout=600, root=package, NUMBA_CACHE_DIR=str(blocked / "cache"), HOME=str(blocked),
        XDG_CACHE_HOME=str(blocked / "xdg"), PYTHONDONTWRITEBYTECODE="1",
        ARRAYRNN_BACKGROUND_COMPILE=background)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("numba has no writable cache directory") == 1, out.stderr
    assert "Set NUMBA_CACHE_DIR to a writable directory" in out.stderr


# -- exit, Ctrl-C and fork while the reference engine runs and numba compiles (issue 45) --------------
_LONG_CALLS = """
    import faulthandler, os, signal, sys, threading, time
    import numpy as np
    import arrayrnn as ar

    signal.signal(signal.SIGINT, signal.default_int_handler)   # a runner may start us with it ignored
    spec = ar.RNNSpec(mode="lstm", input_size=64, hidden_size=256, dtype="float32")
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(0).standard_normal((200, 64, 64)).astype(np.float32)
    small = ar.PackedParams.init(ar.RNNSpec(mode="gru", input_size=8, hidden_size=32), seed=0)
    xs = np.ones((3, 16, 8), np.float32)
    expected = ar.rnn_forward(small, xs, engine="reference").y

    def long_calls():
        while True:
            assert ar.rnn_forward(params, x).engine == "reference"
"""

_SCENARIOS = {
    # the interpreter exits while a daemon thread is inside a long forward
    "exit": """
    threading.Thread(target=long_calls, daemon=True).start()
    time.sleep(0.5)
    print("ok")
    """,
    # Ctrl-C during a long forward: the KeyboardInterrupt ends it, the next call is correct
    "interrupt": """
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        long_calls()
    except KeyboardInterrupt:
        pass
    np.testing.assert_allclose(ar.rnn_forward(small, xs).y, expected, rtol=1e-5, atol=1e-6)
    print("ok")
    """,
    # forks while another thread calls (its first call imports the numba engine); each child calls
    "fork": """
    threading.Thread(target=long_calls, daemon=True).start()
    for k in range(3):
        time.sleep(0.05 * k)
        pid = os.fork()
        if pid == 0:
            faulthandler.dump_traceback_later(30, exit=True)   # a hung child ends (status 1)
            same = np.allclose(ar.rnn_forward(small, xs).y, expected, rtol=1e-5, atol=1e-6)
            os._exit(0 if same else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"fork {k}: the child ended with status {status}"
    print("ok")
    """,
}


def _end_compiles(cache: Path) -> None:
    """End the background compiles a test process left running (they outlive it, filling ``cache``)."""
    marker = f"NUMBA_CACHE_DIR={cache}\0".encode()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes():
                os.kill(int(environ.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@pytest.mark.skipif(sys.platform != "linux", reason="os.fork with threads, /proc: Linux")
@pytest.mark.parametrize("scenario", sorted(_SCENARIOS))
def test_exit_interrupt_and_fork_in_a_new_process_never_hang(tmp_path, scenario):
    """A fresh process, an empty cache, the background compile on: the reference engine runs the calls and
    the child process compiles. Before, a fork while another thread called hung the child (2 runs of 3:
    the reference engine's products were not waited for, nor the numba engine's import in flight)."""
    for run in range(5):
        where = tmp_path / str(run)
        where.mkdir()
        try:
            out = _run(_LONG_CALLS + _SCENARIOS[scenario], where, timeout=60)
        except subprocess.TimeoutExpired as err:
            pytest.fail(f"{scenario}, run {run}: hung (killed after 60 s): {err.stderr!r}")
        finally:
            _end_compiles(where / "cache")
        assert out.returncode == 0 and out.stdout.strip() == "ok", f"{scenario}, run {run}: {out.stderr}"
