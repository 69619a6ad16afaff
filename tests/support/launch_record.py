"""What every cupy-engine program hands each kernel it launches, recorded without a GPU or the simulator.

:func:`record_all` builds every program of :mod:`arrayrnn.engines.cupy.programs` (each mode and cell variant,
forward with and without the cache, backward with and without ``dc_seq``) on a device that records its
launch sites instead of packing them, and describes each site's arguments in a form that does not depend on
where memory was allocated: an array as ``b<k>+<offset>:<shape>:<strides>`` (the program's ``k``-th buffer,
allocated in a fixed order), a scalar as its type and value. ``launch_order.json`` beside this module holds a
digest of that record per spec and pass (every variant-flag combination together), as the engine filled its
kernels' parameters BY POSITION (before issue 43, commit d045e82); the test that reads it checks that the
named binding hands every parameter the same value.

    python tests/support/launch_record.py           # write launch_order.json again (a deliberate change only)
    python tests/support/launch_record.py "lstm"    # print the records of every group whose name has "lstm"
                                                    # (run it here and at d045e82 and diff, to see a change)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from arrayrnn import RNNSpec  # noqa: E402
from arrayrnn.engines.base import VariantFlags  # noqa: E402
from arrayrnn.engines.cupy import launch as cuda_launch  # noqa: E402
from arrayrnn.engines.cupy.programs import Shape, backward_program, forward_program  # noqa: E402

GOLDEN = Path(__file__).with_name("launch_order.json")
T, B, I, H, P = 3, 2, 3, 4, 2


def _specs() -> Iterator[tuple[str, RNNSpec]]:
    """Every mode with every cell option it takes (invalid combinations skipped)."""
    base = dict(input_size=I, hidden_size=H, dtype="float64")
    for mode in ("rnn_tanh", "rnn_relu", "gru"):
        for norm, after in itertools.product((False, True), (True, False)):
            if mode != "gru" and not after:
                continue
            extra = {"reset_after": after} if mode == "gru" else {}
            yield f"{mode} after={after} norm={norm}", RNNSpec(mode=mode, layer_norm=norm, **extra, **base)
    for proj, peep, clip, norm in itertools.product((0, P), (False, True), (None, 1.5), (False, True)):
        try:
            spec = RNNSpec(mode="lstm", proj_size=proj, peepholes=peep, cell_clip=clip, layer_norm=norm,
                           **base)
        except ValueError:
            continue
        yield f"lstm proj={proj} peep={peep} clip={clip} norm={norm}", spec


def _shapes(spec: RNNSpec) -> Iterator[tuple[str, bool, Shape]]:
    """(label, backward?, shape): every variant-flag combination the mode takes, both passes."""
    lengths, f64 = np.array([B, B, 1], np.int64).tobytes(), np.dtype(np.float64)
    cells = (False, True) if spec.mode == "lstm" else (False,)
    for rec, zone_h, zone_c in itertools.product((False, True), (False, True), cells):
        flags = VariantFlags(rec, zone_h, zone_c)
        label = f"rec={rec} zh={zone_h} zc={zone_c}"
        for keep in (False, True):
            yield f"forward {label} keep={keep}", False, Shape(T, B, lengths, False, flags, f64, keep=keep)
        for dc_seq in (False, True) if spec.mode == "lstm" else (False,):
            yield f"backward {label} dc_seq={dc_seq}", True, Shape(T, B, lengths, True, flags, f64,
                                                                   dc_seq=dc_seq)


class RecordingDevice:
    """A program's device: NumPy buffers (each noted, in order) and launch sites noted, not packed."""

    def __init__(self) -> None:
        self.buffers: list[np.ndarray] = []
        self.sites: list[tuple[str, int | None, tuple]] = []
        self.xp = types.SimpleNamespace(zeros=self._noted(np.zeros), empty=self._noted(np.empty))

    def _noted(self, make: Any) -> Any:
        def noted(*args: Any, **kwargs: Any) -> np.ndarray:
            buffer = make(*args, **kwargs)
            self.buffers.append(buffer)
            return buffer
        return noted

    def site(self, kernel: Any, args: tuple, block: int | None = None) -> Any:
        self.sites.append((cuda_launch.kernel_name(kernel), block, args))
        return lambda elements, t, n: None

    def describe(self, value: Any) -> str:
        """``value`` in a form independent of where the program's buffers were allocated."""
        if isinstance(value, (bool, np.bool_)):
            return f"bool={bool(value)}"
        if isinstance(value, (int, np.integer)):
            return f"int={int(value)}"
        if isinstance(value, np.floating):
            return f"{value.dtype.name}={float(value)!r}"
        if not isinstance(value, np.ndarray):
            raise TypeError(f"a launch argument {value!r} is neither an array nor a scalar")
        ptr = value.__array_interface__["data"][0]
        for k, buffer in enumerate(self.buffers):
            base = buffer.__array_interface__["data"][0]
            if base <= ptr < base + max(buffer.nbytes, 1):
                return f"b{k}+{ptr - base}:{value.shape}:{value.strides}"
        raise AssertionError(f"an array argument of shape {value.shape} is no buffer of the program")


def record(backward: bool, spec: RNNSpec, shape: Shape) -> list[list]:
    """Every launch site one program makes: ``[kernel, block, [argument, ...]]``."""
    dev = RecordingDevice()
    (backward_program if backward else forward_program)(spec)(dev, spec, shape)
    return [[name, block, [dev.describe(a) for a in args]] for name, block, args in dev.sites]


def record_all() -> dict[str, dict[str, list[list]]]:
    """``{"<spec> | <pass>": {"<variant flags>": program record}}``."""
    groups: dict[str, dict[str, list[list]]] = {}
    for label, spec in _specs():
        for shape_label, backward, shape in _shapes(spec):
            pass_name, flags = shape_label.split(" ", 1)
            groups.setdefault(f"{label} | {pass_name}", {})[flags] = record(backward, spec, shape)
    return groups


def digest(group: dict[str, list[list]]) -> str:
    return hashlib.sha256(json.dumps(group, sort_keys=True).encode()).hexdigest()[:16]


def digests() -> dict[str, str]:
    return {name: digest(group) for name, group in record_all().items()}


if __name__ == "__main__":
    if len(sys.argv) > 1:
        for name, group in record_all().items():
            if sys.argv[1] in name:
                print(json.dumps({name: group}, indent=1, sort_keys=True))
    else:
        GOLDEN.write_text(json.dumps(digests(), indent=0, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN}")
