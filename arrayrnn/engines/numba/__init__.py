"""The numba engine (the default on CPU): the shared stack driver with compiled time loops.

- :mod:`.engine`: ``NumbaEngine`` / ``NumbaKernel``, the driver's hooks and each direction's loop;
- :mod:`.lstm_loops`, :mod:`.gru_loops`, :mod:`.rnn_loops`: each cell's compiled time loops (forward,
  backward, column-split forwards), built from :mod:`.loop_parts`;
- :mod:`.packed_gemm`, :mod:`.simd_ir`: the packed GEMM and its SIMD micro-kernel;
- :mod:`.loop_threads`, :mod:`.workers`, :mod:`.spin_barrier`: rows and columns split over worker threads;
- :mod:`.wavefront`: a stack's directions or layers side by side;
- :mod:`.step`: one cell step on the compiled loops.

Importing this package imports nothing: numba is loaded by the modules that compile.
"""
