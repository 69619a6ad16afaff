"""Run in a subprocess by test_cudnn_engine.py: the index map from cuDNN's real answers on a CPU-only
machine, through the undocumented trick of a zero-filled host buffer standing in for the handle (cuDNN 9.24
answers cudnnGetRNNWeightSpaceSize / cudnnGetRNNWeightParams correctly that way). Prints one JSON line."""

from __future__ import annotations

import itertools
import json
import sys

import numpy as np

import cudnn_bindings as cb
from arrayrnn.core.spec import RNNSpec
from arrayrnn.engines.cudnn import config as cf
from arrayrnn.engines.cudnn import weight_map


def specs():
    for mode, bias, bidir, layers, proj, dtype in itertools.product(
            ("rnn_tanh", "rnn_relu", "lstm", "gru"), ("double", "single_inp", "single_rec", "none"),
            (False, True), (1, 2), (0, 3), ("float32", "float64", "float16")):
        if proj and mode != "lstm":
            continue
        yield RNNSpec(mode=mode, input_size=5, hidden_size=4, num_layers=layers, bidirectional=bidir,
                      bias=bias, proj_size=proj, dtype=dtype)


def main() -> None:
    fake_handle = np.zeros(1 << 20, np.uint8)
    rng = np.random.default_rng(0)
    done = 0
    for spec in specs():
        with cb.RNNDescriptor(cf.rnn_config(spec)) as desc:
            nbytes = cb.weight_space_size(fake_handle.ctypes.data, desc)
            host_space = np.zeros(nbytes + 8, np.uint8)

            def query(pseudo, lin, desc=desc, nbytes=nbytes, base=host_space.ctypes.data):
                return cb.weight_params(fake_handle.ctypes.data, desc, pseudo, lin, weight_space=base,
                                        weight_space_size=nbytes)

            itemsize = np.dtype(spec.dtype).itemsize
            idx = weight_map.index_map(spec, itemsize, nbytes, query)
            canonical = rng.standard_normal(idx.size).astype(spec.dtype)
            native = weight_map.to_cudnn(np, canonical, idx, nbytes // itemsize)
            back = weight_map.to_canonical(native, idx)
            assert back.tobytes() == canonical.tobytes(), spec
            untouched = np.ones(native.size, bool)
            untouched[idx] = False
            assert not native[untouched].any(), spec
            done += 1
    print(json.dumps({"ok": done}))


if __name__ == "__main__":
    sys.exit(main())
