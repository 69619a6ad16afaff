"""The demo: a short run learns, the same seed gives the same numbers, divergence names its step."""

import io
import math

import numpy as np
import pytest

from arrayrnn import demo

TINY = demo.Config(steps=40, hidden=48, embed=16, batch=16, seq_len=32, lr=1e-2, eval_chars=2048,
                   sample_chars=20)


def test_short_run_learns_and_reports(tmp_path):
    out = io.StringIO()
    result = demo.run(TINY, save=str(tmp_path / "model.npz"), progress=False, out=out)
    losses = result["losses"]
    assert len(losses) == TINY.steps and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-5:]) < losses[0] - 1.0
    assert result["bpc_after"] < result["bpc_before"] - 2.0
    assert result["bpc_after"] < result["unigram_entropy"]
    text = out.getvalue()
    for needle in ("unigram entropy", "bits/char before", "bits/char after 40 steps", "sample:\nThe "):
        assert needle in text
    model, vocab, cfg = demo.load_model(str(tmp_path / "model.npz"))
    assert cfg == TINY
    ids = demo.Vocabulary(demo.load_text()).encode(demo.load_text()[-3000:])
    assert math.isclose(demo.bits_per_char(model, ids), demo.bits_per_char(model, ids))


def test_same_seed_same_numbers():
    cfg = demo.Config(steps=4, hidden=16, embed=8, batch=4, seq_len=16, seed=7)
    ids = demo.Vocabulary(demo.load_text()).encode(demo.load_text()[:20000])
    runs = [demo.train(cfg, ids, demo.CharModel(100, cfg), progress=False) for _ in range(2)]
    assert runs[0] == runs[1]
    other = demo.train(demo.Config(**{**cfg.__dict__, "seed": 8}), ids, demo.CharModel(100, cfg),
                       progress=False)
    assert other != runs[0]


def test_non_finite_loss_names_the_step():
    cfg = demo.Config(steps=3, hidden=8, embed=4, batch=2, seq_len=8)
    ids = np.arange(500) % 50
    model = demo.CharModel(50, cfg)
    model.head.params[0] = np.nan
    with pytest.raises(FloatingPointError, match="step 1: the training loss is nan"):
        demo.train(cfg, ids, model, progress=False)


def test_unigram_entropy_and_vocabulary():
    assert math.isclose(demo.unigram_entropy(np.arange(8), 8), 3.0)
    vocab = demo.Vocabulary("hello")
    assert vocab.decode(vocab.encode("hole")) == "hole" and len(vocab) == 4


def test_command_line_rejects_bad_options(capsys):
    with pytest.raises(SystemExit):
        demo.main(["--steps", "0"])
    assert "--steps = 0; expected an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        demo.main(["--save", "/nonexistent-dir/model.npz"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--engine", "bogus"], "--engine = bogus; expected one of auto, reference, numba"),
    (["--engine", ""], "--engine = ; expected one of auto"),
    (["--seed", "-1"], r"--seed = -1; expected an integer in [0, 2**64)"),
    (["--seed", str(2**64)], r"--seed = 18446744073709551616; expected an integer in [0, 2**64)"),
    (["--seed", "1.5"], "argument --seed: invalid int value: '1.5'"),
    (["--lr", "nan"], "--lr = nan; expected a finite number > 0"),
    (["--lr", "inf"], "--lr = inf; expected a finite number > 0"),
    (["--lr", "0"], "--lr = 0.0; expected a finite number > 0"),
    (["--lr=-1e-3"], "--lr = -0.001; expected a finite number > 0"),
    (["--hidden", "0"], "--hidden = 0; expected an integer >= 1"),
    (["--hidden", str(10**6)], "--hidden = 1000000, --layers = 1: hidden_size = 1000000"),
    (["--layers", "-2"], "--layers = -2; expected an integer >= 1"),
    (["--batch", "0"], "--batch = 0; expected an integer >= 1"),
    (["--seq-len", "0"], "--seq-len = 0; expected an integer >= 1"),
    (["--seq-len", str(10**7)], "--seq-len = 10000000; expected at most 418471"),
    (["--steps", "x"], "argument --steps: invalid int value: 'x'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--recurrent-dropout", "1"], "--recurrent-dropout = 1.0; expected a number in [0, 1)"),
    (["--weight-dropout=-0.1"], "--weight-dropout = -0.1; expected a number in [0, 1)"),
    (["--weight-dropout", "nan"], "--weight-dropout = nan; expected a number in [0, 1)"),
])
def test_every_bad_option_is_a_usage_error(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        demo.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m arrayrnn.demo") and message in err, err


def test_an_engine_that_cannot_run_here_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(demo.engines, "select_engine", _unavailable)
    with pytest.raises(SystemExit) as info:
        demo.main(["--engine", "numba"])
    assert info.value.code == 2
    assert "--engine = numba: not here on purpose" in capsys.readouterr().err


def _unavailable(name, call):
    raise demo.EngineUnavailableError("not here on purpose")


def test_save_to_a_directory_and_distributed_without_mpi4py_are_usage_errors(capsys, monkeypatch, tmp_path):
    with pytest.raises(SystemExit) as info:
        demo.main(["--save", str(tmp_path)])
    assert info.value.code == 2 and f"--save {tmp_path}: is a directory" in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "mpi4py", None)      # import mpi4py raises ImportError
    with pytest.raises(SystemExit) as info:
        demo.main(["--distributed"])
    assert info.value.code == 2 and "--distributed needs mpi4py" in capsys.readouterr().err


@pytest.mark.parametrize(("field", "value"), [
    ("seed", -1), ("seed", 2**64), ("seed", None), ("seed", 1.0), ("steps", True), ("lr", float("nan")),
    ("clip", 0.0), ("engine", "bogus"), ("engine", None), ("eval_chars", 32), ("sample_chars", -1),
    ("recurrent_dropout", 1.0), ("weight_dropout", -0.5), ("weight_dropout", "0.1"),
])
def test_config_refuses_bad_fields(field, value):
    with pytest.raises(ValueError, match=rf"^{field} = "):
        demo.Config(**{field: value})


def test_the_largest_seed_trains_and_differs_from_seed_zero():
    cfg = demo.Config(steps=2, hidden=8, embed=4, batch=2, seq_len=8, seed=2**64 - 1)
    ids = demo.Vocabulary(demo.load_text()).encode(demo.load_text()[:5000])
    top = demo.train(cfg, ids, demo.CharModel(100, cfg), progress=False)
    zero_cfg = demo.Config(**{**cfg.__dict__, "seed": 0})
    assert top != demo.train(zero_cfg, ids, demo.CharModel(100, zero_cfg), progress=False)


def test_a_sequence_longer_than_a_ranks_text_is_refused():
    ids = np.arange(100) % 7
    longest = demo.Config(steps=1, hidden=8, embed=4, batch=2, seq_len=98)
    demo.train(longest, ids, demo.CharModel(7, longest), progress=False)
    cfg = demo.Config(**{**longest.__dict__, "seq_len": 99})
    with pytest.raises(ValueError, match=r"seq_len = 99; expected an integer <= 98"):
        demo.train(cfg, ids, demo.CharModel(7, cfg), progress=False)


def test_recurrent_and_weight_dropout_train_beside_the_plain_model(tmp_path):
    """The demo's cell-variant options: the same model is trained without and with them, both reported;
    the masks act (the losses differ from the plain run's) and come from the seed (a rerun repeats them)."""
    cfg = demo.Config(**{**TINY.__dict__, "steps": 12, "recurrent_dropout": 0.25, "weight_dropout": 0.3})
    out = io.StringIO()
    result = demo.run_with_and_without(cfg, save=str(tmp_path / "model.npz"), progress=False, out=out)
    text = out.getvalue()
    assert "== without recurrent_dropout, weight_dropout" in text
    assert "== with recurrent_dropout=0.25, weight_dropout=0.3" in text
    assert (f"{result['without']['bpc_after']:.3f} without, {result['with']['bpc_after']:.3f} with "
            "recurrent_dropout=0.25, weight_dropout=0.3") in text
    without, with_variants = result["without"]["losses"], result["with"]["losses"]
    assert all(math.isfinite(v) for v in with_variants) and with_variants != without
    assert demo.run(cfg, progress=False, out=io.StringIO())["losses"] == with_variants
    model, _, loaded = demo.load_model(str(tmp_path / "model.npz"))
    assert loaded == cfg
    assert (model.lstm.spec.recurrent_dropout, model.lstm.spec.weight_dropout) == (0.25, 0.3)


def test_a_saved_model_with_a_member_of_the_wrong_shape_is_refused_before_reading(tmp_path):
    from arrayrnn.core import npzfile

    path = tmp_path / "model.npz"
    cfg = demo.Config(steps=1, hidden=8, embed=4, batch=2, seq_len=8)
    demo.save_model(str(path), demo.CharModel(10, cfg), demo.Vocabulary("abcdefghij"), cfg)
    header, arrays = npzfile.read(path, demo.MODEL_KIND, range(1, 2))
    header = {k: v for k, v in header.items() if k not in ("format", "version")}
    npzfile.write(path, demo.MODEL_KIND, 1, header, {**arrays, "head": np.zeros((3, 3), np.float32)})
    with pytest.raises(ValueError, match=r"member 'head' declares shape \(3, 3\)"):
        demo.load_model(str(path))


def test_auto_trains_on_numba_where_it_runs():
    assert demo.batch_engine("auto") == "numba"       # numba is a dependency: it runs here
    assert demo.batch_engine("reference") == "reference"


@pytest.mark.parametrize("engine, held", [("numba", True), ("reference", False)])
def test_blas_runs_one_thread_beside_the_numba_engines_threads(monkeypatch, engine, held):
    """OpenBLAS's threads spin ~0.1 s after each of the head's products, on the cores the engine's threads
    need (121 -> 86 ms per step once held; bench/bench_demo_step.py); the reference engine's products are
    BLAS's and keep its threads."""
    import threadpoolctl

    import arrayrnn as ar
    from arrayrnn.engines import thresholds

    # TINY's 6M-multiply-add calls split as the demo's own (637M) do
    monkeypatch.setattr(thresholds, "MIN_SPLIT_CALL_FMAS", 0)
    loaded = threadpoolctl.ThreadpoolController().select(user_api="blas")  # NumPy's, not one loaded later
    assert loaded.lib_controllers, "threadpoolctl finds no BLAS under NumPy: this test would check nothing"

    def blas_threads():
        return [lib.num_threads for lib in loaded.lib_controllers]

    seen = []
    train = demo.train

    def spy(*args, **kwargs):
        seen.append(blas_threads())
        return train(*args, **kwargs)

    monkeypatch.setattr(demo, "train", spy)
    before = ar.get_num_threads()
    ar.set_num_threads(2)
    try:
        with threadpoolctl.threadpool_limits(2, user_api="blas"):
            demo.run(demo.Config(**{**TINY.__dict__, "steps": 2, "engine": engine}), progress=False,
                     out=io.StringIO())
            after = blas_threads()
    finally:
        ar.set_num_threads(before)
    assert seen and all(n == (1 if held else 2) for n in seen[0]), seen
    assert all(n == 2 for n in after), after   # given back


def test_a_new_process_gives_the_numbers_of_the_waiting_setting(tmp_path):
    """The default setting (background compile on, an empty numba cache, a fresh process) against the waiting
    one (issue 45): before, "auto" trained on the reference engine until numba's loops loaded, so the numbers
    depended on when they did (2.157 and 2.156 bits/char in two runs of the default demo)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(demo.__file__).resolve().parents[1]
    argv = ["-m", "arrayrnn.demo", "--steps", "3", "--hidden", "16", "--layers", "1", "--seed", "5"]
    outputs = []
    for background in ("1", "0"):
        env = {**os.environ, "ARRAYRNN_BACKGROUND_COMPILE": background, "NUMBA_CACHE_DIR": str(tmp_path),
               "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, *argv], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        timings = re.compile(r"\(\S+ s of training, \S+ chars/s\)|total time: \S+ s")
        outputs.append([timings.sub("", line) for line in proc.stdout.splitlines()])
        assert "engine=numba" in outputs[-1][0], outputs[-1][0]
    assert outputs[0] == outputs[1]
