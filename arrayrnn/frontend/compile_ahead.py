"""Compiling the numba engine ahead: the probe calls, run through the public API, and ``arrayrnn.warmup``.

The numba engine's background compile (:mod:`arrayrnn.engines.numba.warmup`) runs these calls in a child
process (``python -m arrayrnn warmup --family/--path``); :func:`warmup` runs them in this process, with a
progress bar. They call :func:`~arrayrnn.frontend.rnn.rnn_forward` and
:func:`~arrayrnn.frontend.cell.cell_step` with ``engine="numba"``, so they stand above the frontend and the
engine never imports them: the child process names this module by its command line.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..core.cell_registry import cell_of
from ..core.params import PackedParams
from ..core.spec import RNNSpec
from ..engines import check_cell_spec, forget_choices
from ..engines.numba.warmup import (
    DTYPES,
    KINDS,
    Family,
    Path,
    Signatures,
    compiled_signatures,
    families,
    finish_family,
    mark_loaded,
    new_signatures,
    probing,
)
from ..engines.thread_count import get_num_threads, set_num_threads
from .cell import cell_step, cell_step_backward
from .rnn import rnn_backward, rnn_forward


# -- the probe calls ----------------------------------------------------------------------------------
def _lengths(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _sequence(spec: RNNSpec, T: int, B: int, lengths: np.ndarray | None, training: bool,
              **options: Any) -> Callable[[], None]:
    """One ``rnn_forward`` (and, training, its ``rnn_backward``) on the numba engine."""
    def run() -> None:
        x = np.full((T, B, spec.input_size), 0.5, dtype=spec.dtype)
        res = rnn_forward(PackedParams.init(spec, seed=0), x, lengths, training=training, seed=0,
                          engine="numba", **options)
        if training:
            all_states = {"dh_all": np.ones_like(res.h_all)} if res.h_all is not None else {}
            rnn_backward(res, dy=np.ones_like(res.y), **all_states)
    return run


def _cell(spec: RNNSpec, training: bool, batch: int = 2) -> Callable[[], None]:
    def run() -> None:
        x = np.full((batch, spec.input_size), 0.5, dtype=spec.dtype)
        params = PackedParams.init(spec, seed=0)
        res = cell_step(params, x, training=training, engine="numba")
        if training:
            cell_step_backward(res, dh=np.ones_like(res.h))
            cell_step(params, x, engine="numba")  # a training family loads the inference step too
    return run


def _specs(family: Family) -> tuple[RNNSpec, RNNSpec, RNNSpec | None]:
    """The family's plain stack, its variants' stack, and the one wide enough for the column-split loops."""
    mode = "rnn_tanh" if family.kind == "rnn" else family.kind
    plain = RNNSpec(mode=mode, input_size=4, hidden_size=8, num_layers=2, bidirectional=True,
                    dtype=family.dtype)
    lstm = family.kind == "lstm"
    variants = plain.replace(
        mode="rnn_relu" if family.kind == "rnn" else mode, dropout=0.25, recurrent_dropout=0.25,
        weight_dropout=0.25, zoneout=0.1, zoneout_cell=0.1 if lstm else None, peepholes=lstm,
        proj_size=4 if lstm else 0, cell_clip=3.0 if lstm else None,
        reset_after=family.kind != "gru")  # GRU: the reset-before loops here, reset-after in `plain`
    wide = None if family.kind == "rnn" else RNNSpec(mode=mode, input_size=4, hidden_size=384,
                                                     dtype=family.dtype)
    return plain, variants, wide


def probe_calls(family: Family) -> list[Callable[[], None]]:
    """Calls that run every compiled function the family's calls can reach (each loop, the row and
    column splits, the wavefront, the step-by-step input projection, T = 1, the cell step, each variant,
    layer norm)."""
    plain, variants, wide = _specs(family)
    training = family.training
    calls = [
        _sequence(plain, 4, 3, _lengths(4, 2, 0), training),
        _sequence(plain, 4, 16, _lengths(*[4] * 8, *[1] * 8), training),   # mostly padding, 2 threads
        _sequence(plain, 1, 2, None, training),
        _sequence(variants, 4, 3, _lengths(3, 4, 1), training, return_all_states=True),
        _sequence(variants, 4, 3, _lengths(3, 4, 1), False),
        _sequence(variants.replace(layer_norm=True), 4, 3, _lengths(3, 4, 1), training),
        _cell(plain.replace(num_layers=1, bidirectional=False), training),
    ]
    if wide is not None:
        calls.append(_sequence(wide, 2, 8, None, training))                  # the column split
    if family.kind == "lstm":                                                # ... and layer norm's
        calls.append(_sequence(wide.replace(layer_norm=True), 2, 8, None, training))
    return calls


def _on_threads(threads: int, call: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        before = get_num_threads()
        set_num_threads(threads)
        try:
            call()
        finally:
            set_num_threads(before)
    return run


def path_probe_calls(path: Path) -> list[Callable[[], None]]:
    """The call of ``path`` itself on a few steps, with its threads and with one (a call of several Python
    threads may find the engine's workers busy), full lengths and uneven ones; at one step, the cell step
    too where the spec has one."""
    spec = RNNSpec.from_dict(json.loads(path.spec))
    T, B = (1, path.batch) if path.one_step else (3, path.batch)
    uneven = _lengths(*[T] * (B - 1), 0 if path.zero_length else max(1, T - 1))
    options = {"return_all_states": True} if path.all_states else {}
    calls = [_on_threads(path.threads, _sequence(spec, T, B, uneven, path.training, **options)),
             _on_threads(1, _sequence(spec, T, B, None, path.training, **options))]
    if path.one_step:
        try:
            check_cell_spec(spec)
        except ValueError:
            return calls
        calls += [_on_threads(n, _cell(spec, path.training, B)) for n in dict.fromkeys((path.threads, 1))]
    return calls


def custom_cell_probe_calls(modes: list[str], dtypes: str | Iterable[str],
                            training: bool) -> list[Callable[[], None]]:
    """One small call per custom cell of ``modes`` and dtype: its loops are one signature per dtype (and
    phase), compiled in this process only (:mod:`arrayrnn.engines.numba.custom_loops`)."""
    names = [f.dtype for f in families("lstm", dtypes, training)]  # the dtypes checked as for the built-ins
    return [_sequence(RNNSpec(mode=mode, input_size=2, hidden_size=3, dtype=dtype), 3, 2, _lengths(3, 1),
                      training) for mode in modes for dtype in names]


def _split_custom(modes: RNNSpec | str | Iterable[RNNSpec | str]) -> tuple[list[str], list[RNNSpec | str]]:
    """(the custom cells' mode names, the other modes) of a :func:`warmup` argument."""
    listed = [modes] if isinstance(modes, (RNNSpec, str)) else list(modes)
    names = [m.mode if isinstance(m, RNNSpec) else m for m in listed]
    custom = [n for n in names if isinstance(n, str) and cell_of(n) is not None]
    return custom, [m for m, n in zip(listed, names, strict=True) if n not in custom]


# -- running them -----------------------------------------------------------------------------------
def compile_family(family: Family, progress: Any = None) -> Signatures:
    """Run the family's probe calls here (numba compiles what they reach); the signatures that appeared."""
    before = compiled_signatures()
    for call in probe_calls(family):
        with probing():   # tiny calls that must reach the split loops large calls run
            call()
        if progress is not None:
            progress.update(1)
    finish_family(family)
    return new_signatures(before, compiled_signatures())


def compile_path(path: Path) -> Signatures:
    """Run the path's probe calls here; the signatures that appeared."""
    before = compiled_signatures()
    for call in path_probe_calls(path):
        with probing():   # the path's call over a few steps: its splits as over all of them
            call()
    mark_loaded(path)
    return new_signatures(before, compiled_signatures())


def _writable(stream: Any) -> bool:
    """Whether ``stream`` (``sys.stderr``) can take a progress bar: not None, not closed, and its file
    descriptor, where it has one, still open."""
    if stream is None or getattr(stream, "closed", False):
        return False
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # no descriptor (a StringIO, a notebook's stream): fine
        return True
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def warmup(modes: RNNSpec | str | Iterable[RNNSpec | str] = KINDS, dtypes: str | Iterable[str] = DTYPES, *,
           training: bool = True, progress: bool = True) -> None:
    """Compile the numba engine's loops for ``modes`` x ``dtypes`` now, in this process.

    Afterwards no call waits for numba and ``engine="auto"`` takes the numba engine from the first call. The
    compiled code lands in numba's on-disk cache, so later processes load it (``python -m arrayrnn warmup``
    in a server or CI image). A custom cell's loops (a mode registered with :func:`arrayrnn.register_cell`)
    compile for this process only: ``engine="auto"`` runs such a cell on the reference engine until they
    have, here or by a first ``engine="numba"`` call.

    Parameters
    ----------
    modes : str, RNNSpec or iterable of them, optional
        Mode names (``"lstm"``, ``"gru"``, ``"rnn_tanh"``, a registered cell's, ...) or :class:`RNNSpec` s.
    dtypes : str or iterable of str, optional
        ``"float32"``, ``"float64"``.
    training : bool, optional
        Compile the backward's loops too.
    progress : bool, optional
        A progress bar on stderr, skipped where there is none to write to (``sys.stderr`` None under
        pythonw or with ``2>&-``, closed, or its descriptor gone).

    Raises
    ------
    ValueError
        An unknown mode or dtype.

    Examples
    --------
    >>> import arrayrnn as ar
    >>> ar.warmup("gru", "float32", training=False, progress=False)  # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    if not isinstance(training, bool):
        raise TypeError(f"training = {training!r}; expected True or False")
    custom, builtin = _split_custom(modes)
    todo = families(builtin, dtypes, training) if builtin or not custom else []
    cell_calls = custom_cell_probe_calls(custom, dtypes, training)
    total = sum(len(probe_calls(f)) for f in todo) + len(cell_calls)
    stream = sys.stderr
    shown = progress and _writable(stream)
    with tqdm(total=total, desc="arrayrnn warmup", unit="call", file=stream, disable=not shown) as bar:
        for family in todo:
            bar.set_postfix_str(family.text())
            compile_family(family, bar)
        for call in cell_calls:
            call()
            bar.update(1)
    forget_choices()
