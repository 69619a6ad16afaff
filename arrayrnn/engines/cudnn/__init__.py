"""The cuDNN engine (CUDA GPUs): the whole stack in cuDNN v9's RNN calls, through ``cudnn_bindings``.

- :mod:`.engine`: ``CudnnEngine``, its weight format and the calls on CuPy arrays;
- :mod:`.config`: what the engine asks of cuDNN: what it refuses, the spec's cuDNN configuration and its
  precision, the algorithm choice (``config.algo``, ``config.allow_tf32``: the user's switches);
- :mod:`.weight_map`: the cudnn weight format, as index maps from the canonical layout;
- :mod:`.padding`: cuDNN's stand-in lengths and the masks that keep padding and empty rows out of its results;
- :mod:`.shape_plans`: per call shape, the descriptors and prepared calls made once and reused.

Importing this package imports nothing: CuPy and cuDNN are loaded by the modules that use them.
"""
