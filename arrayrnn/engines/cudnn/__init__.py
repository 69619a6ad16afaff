"""The cuDNN engine (CUDA GPUs): the whole stack in cuDNN v9's RNN calls, through ``cudnn_bindings``.

- :mod:`.engine`: ``CudnnEngine``, its weight format and the calls on CuPy arrays;
- :mod:`.config`: what needs no GPU: the spec's cuDNN configuration and precision, the algorithm choice
  (``config.algo``, ``config.allow_tf32``: the user's switches), what cuDNN refuses, the canonical <-> cudnn
  index maps and the masks that keep padding out;
- :mod:`.shape_plans`: per call shape, the descriptors and prepared calls made once and reused.

Importing this package imports nothing: CuPy and cuDNN are loaded by the modules that use them.
"""
