"""The examples gallery (``examples/*.py``): every script runs as a user runs it and learns something.

Each script runs in a fresh process (``sys.executable``, a temporary working directory, ``MPLBACKEND=Agg``,
under a timeout, its whole process group killed afterwards), must exit with status 0, and must print a
line ``final loss A (first B)`` with ``A < B``; each then has a check of its own on what it printed (an
accuracy, a difference against PyTorch, a gradient against finite differences, ...). The MPI example also
runs under ``mpiexec -n 2`` and must train the model of the one-process run. The CuPy example must train
on the GPU where CuPy and a GPU are usable and print ``skipped: <reason>`` elsewhere.

The scripts inherit this process's setting (conftest.py): in the default, waiting one, ``engine="auto"``
waits for numba's compile (numba's cache is warm once the suite has run the engines).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
from support.dist_jobs import mpiexec, run_job

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TIMEOUT = 300
NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
_OUTPUTS: dict[tuple[str, int], str] = {}


def run_example(path: Path, cwd: Path, ranks: int = 0) -> str:
    """Run one example (under ``mpiexec -n ranks`` if ``ranks``); its stdout, after checking status 0."""
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    cmd = [sys.executable, str(path)]
    if ranks:
        cmd = [mpiexec(), "-n", str(ranks)] + cmd
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = run_job(cmd, TIMEOUT, cwd=cwd, env=env)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, (f"{' '.join(cmd)} exited with status {proc.returncode}; stdout:\n"
                                  f"{out[-3000:]}\nstderr:\n{err[-3000:]}")
    return out


def output_of(name: str, tmp_path: Path, ranks: int = 0) -> str:
    """The stdout of ``examples/<name>`` (run once per session and number of ranks)."""
    key = (name, ranks)
    if key not in _OUTPUTS:
        _OUTPUTS[key] = run_example(ROOT / "examples" / name, tmp_path, ranks)
    return _OUTPUTS[key]


def numbers(pattern: str, text: str) -> list[float]:
    """The numbers of the first line matching ``pattern`` (``{}`` marks each number)."""
    match = re.search(NUMBER.join(re.escape(part) for part in pattern.split("{}")), text)
    assert match, f"no line matching {pattern!r} in the output:\n{text[-3000:]}"
    return [float(v) for v in match.groups()]


def test_the_gallery_has_its_header_and_eight_examples():
    assert (ROOT / "examples" / "README.rst").read_text().startswith("Examples gallery\n================\n")
    assert len(EXAMPLES) >= 8, [p.name for p in EXAMPLES]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_in_sphinx_gallery_format(path):
    """A reST docstring whose first line is a title underlined with ``=``, then ``# %%`` cells."""
    source = path.read_text()
    lines = (ast.get_docstring(ast.parse(source), clean=True) or "").splitlines()
    assert len(lines) >= 3 and lines[1] == "=" * len(lines[0]) and lines[0].strip(), (
        f"{path.name}: the docstring must start with a title line underlined with '=' of its length")
    assert path.name.startswith("plot_"), f"{path.name}: sphinx-gallery runs plot_*.py (filename_pattern)"
    assert "\n# %%\n" in source, f"{path.name}: no '# %%' cell"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_and_its_loss_decreases(path, tmp_path):
    out = output_of(path.name, tmp_path)
    if path.name == "plot_mpi_data_parallel.py" and importlib.util.find_spec("mpi4py") is None:
        assert "skipped: mpi4py is not installed" in out
        return
    final, first = numbers("final loss {} (first {})", out)
    assert final < first, f"{path.name}: the loss did not decrease ({first} -> {final})"


def test_sequence_classification_learns_the_sign_of_the_sum(tmp_path):
    after, before = numbers("test accuracy {} (before training {})", output_of(
        "plot_sequence_classification.py", tmp_path))
    assert after > 0.85 and after > before + 0.2, (after, before)


def test_char_lm_beats_the_unigram_model(tmp_path):
    out = output_of("plot_char_lm.py", tmp_path)
    after, before, unigram = numbers("validation bits/char {} (before {}, unigram entropy {})", out)
    assert after < unigram < before, (after, unigram, before)
    assert "sample:\nThe " in out


def test_gru_forecasts_better_than_repeating_the_last_value(tmp_path):
    mse, naive = numbers("test mse {} (repeating the last value: {};", output_of("plot_gru_forecasting.py",
                                                                                 tmp_path))
    assert mse < 0.8 * naive, (mse, naive)


def test_bidirectional_tagger_tags_and_y_is_the_last_layers_states(tmp_path):
    out = output_of("plot_bidirectional_tagger.py", tmp_path)
    after, before = numbers("tag accuracy {} (before training {})", out)
    assert after > 0.85 and after > before + 0.2, (after, before)
    (gap,) = numbers("max |y - concat(h_all[2], h_all[3])| = {}", out)
    assert gap < 1e-6


def _cupy_usable() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def test_cupy_example_runs_on_the_gpu_or_says_why_not(tmp_path):
    out = output_of("plot_cupy.py", tmp_path)
    assert "NumPy (" in out
    if _cupy_usable():
        assert "skipped:" not in out
        losses, weights = numbers("max |difference| NumPy vs CuPy: losses {}, weights after 30 steps {}", out)
        assert losses < 1e-3 and weights < 1e-3, (losses, weights)
    else:
        assert re.search(r"^skipped: \S", out, re.MULTILINE), out
        if importlib.util.find_spec("cupy") is None:
            assert "skipped: CuPy is not installed" in out


def test_torch_example_matches_nn_lstm(tmp_path):
    out = output_of("plot_torch_training_loop.py", tmp_path)
    assert "isinstance(ours.lstm, torch.nn.LSTM): True" in out
    (gap,) = numbers("max |difference| against nn.LSTM: {}", out)
    assert gap < 1e-4, gap


def test_jax_gradient_matches_finite_differences(tmp_path):
    analytic, numeric = numbers("directional derivative: jax.grad {}, central difference {}",
                                output_of("plot_jax_model.py", tmp_path))
    assert abs(analytic - numeric) <= 0.05 * abs(numeric) + 1e-4, (analytic, numeric)


def test_mpi_example_on_two_ranks_agrees_with_one(tmp_path):
    """Under ``mpiexec -n 2`` both ranks hold the same weights, and the losses are the one-rank run's."""
    two = output_of("plot_mpi_data_parallel.py", tmp_path, ranks=2)
    one = output_of("plot_mpi_data_parallel.py", tmp_path)
    assert "2 rank(s), 12 rows of each batch per rank" in two
    assert "ranks agree: True" in two and "ranks agree: True" in one
    assert two.count("final loss") == 1, "only rank 0 prints"
    final_two, first_two = numbers("final loss {} (first {})", two)
    final_one, first_one = numbers("final loss {} (first {})", one)
    assert final_two < first_two
    assert final_two == pytest.approx(final_one, rel=1e-3) and first_two == pytest.approx(first_one, rel=1e-3)
