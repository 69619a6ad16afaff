"""The CuPy engine (CUDA GPUs): the shared stack driver with each direction's time loop as a program of
numba-cuda kernels launched on CuPy's stream, then replayed as one CUDA graph.

- :mod:`.engine`: ``CupyEngine`` / ``GpuKernel``, the driver's hooks, and ``Device`` (its array module and
  launch sites);
- :mod:`.programs`: one direction's program per shape (buffers, launch sites, the loop), forward and backward;
- :mod:`.norms`: what a program adds for layer norm;
- :mod:`.kernels`: the ``@cuda.jit`` kernels (the gate math of :mod:`..gate_math` as device functions);
- :mod:`.custom_programs`, :mod:`.custom_kernels`: a custom cell's programs and its kernels, generated per
  cell; :mod:`.cell_math`: :mod:`arrayrnn.cellmath` compiled for CUDA;
- :mod:`.launch`: a kernel's arguments packed once, launched with ``cuLaunchKernel`` (or the simulator's);
- :mod:`.graphs`: the time loops captured into CUDA graphs and replayed.

Importing this package imports nothing: CuPy and numba-cuda are loaded by the modules that use them.
"""
