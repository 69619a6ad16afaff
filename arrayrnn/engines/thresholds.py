"""Every threshold the engines choose a path by, in one table: each value, what it decides, and the
measurement behind it (bench/RESULTS.md has the runs; ratios are our time with the choice / without it,
below 1 faster). The numba engine reads them when it plans a call (:mod:`.numba.plan`), the shared
driver in its backward (:class:`.stack.ActiveRows`), cuDNN's ``check`` for ``"auto"``. Code reads them
as ``thresholds.NAME`` at call time, so a test or a benchmark may set one for a run. Constants compiled
into the kernels (the packed GEMM's row panel, the barrier's spins) stay beside their kernels.
"""

from __future__ import annotations

# -- the shared driver's backward ------------------------------------------------------------------
# The hoisted backward products gather the active (step, row) entries first when at most this fraction
# of them is active (NumPy only: not measured on a GPU). S5 (about half active): training step
# 0.81-0.83x; forced at 0.69-0.75 active 0.94-0.97x, at 0.81 1.02-1.07x.
ACTIVE_ROWS_MAX_FILL = 0.75

# -- the numba engine: threads (bench/bench_threads.py) ---------------------------------------------
# A time loop's rows split one thread per this many rows: below it one thread ran faster (B = 8: two
# threads 1.2-1.4x slower; B = 16: 0.7x).
MIN_ROWS_PER_THREAD = 8
# A call splits over threads only from this many multiply-adds (its forward's products, T * B * G*H * (I + H)
# summed over layers and directions; numba.plan.call_fmas); below, it runs on the calling thread as with one
# thread. bench/bench_threads.py --small, back to back, AMD Zen 4: two threads 1.04-3.4x slower than one at
# 0.5-63M (T = 1-30, B = 16-64, H = 64-256, forward and training), 0.92-1.06x at 84M, 0.74-0.95x from 134M.
MIN_SPLIT_CALL_FMAS = 1 << 26
# From this many rows up to the rows split's 2 * MIN_ROWS_PER_THREAD, a plain LSTM or reset-after GRU
# forward splits its hidden units instead (the column split, a barrier per step) when a step has
# COLUMN_SPLIT_MIN_STEP_FMAS or more multiply-adds: 0.74-0.86x of one thread at B = 12, H = 256 (3.1M)
# and B = 8, H = 512 (8.4M); 1.33x at B = 8, H = 256 (2.1M), 1.6x at B = 4, 3.4x at B = 1, where the
# barrier and the second core's wake-up cost more than the halved step saves. The reset-after GRU's
# column split: 0.67-0.74x of its one-thread loop at 8-12 rows with H = 384-512.
COLUMN_SPLIT_MIN_ROWS = MIN_ROWS_PER_THREAD
COLUMN_SPLIT_MIN_STEP_FMAS = 3_000_000
# From 2 * MIN_ROWS_PER_THREAD rows to below this many, the LSTM's column split also beats the rows split
# on steps of COLUMN_SPLIT_WIDE_STEP_FMAS or more (medians of 9: 0.89-0.90x at B = 16, H = 384 (9.4M)
# and 512 (16.8M); 1.04x at B = 16, H = 256 (4.2M); 1.00x at B = 24, 1.03x at B = 32, H = 512; 1.11x
# at B = 32, H = 256). The LSTM only: the GRU's column split at 16 rows ran 1.04x (H = 512) and 1.10x
# (H = 384) of its rows split.
COLUMN_SPLIT_MAX_ROWS = 24
COLUMN_SPLIT_WIDE_STEP_FMAS = 8_000_000

# -- the numba engine: the wavefront (bench/bench_wavefront.py) ---------------------------------------
# Layers or directions run side by side from this many rows: directions 0.61-0.94x of layer by layer
# for the forward from 8 rows (0.93-1.00x at 64), training steps 0.70-0.92x; at 1-4 rows up to 1.5x
# slower (the partner core's wake-up and the slower clock of two busy cores cost more than the overlap
# saves on small layers).
WAVEFRONT_MIN_ROWS = 8
# The layer pipeline runs where neither the rows split nor the column split does: at 8-12 rows without
# them 0.68-0.84x of layer by layer; it lost to the column split (1.1-1.5x at 8 rows, H = 512: fill and
# drain, W_ih re-read per chunk, two cores' slower clock) and to the rows split from 16 rows.
PIPELINE_LAYERS = True
# The pipeline cuts time into this many chunks at most (fill and drain of a 2-layer pipeline cost 1 /
# CHUNKS of the sequential time), each of MIN_CHUNK_STEPS steps at least (a chunk's waits, projection
# call and loop launch cost tens of microseconds, a small step a few).
CHUNKS = 6
MIN_CHUNK_STEPS = 4

# -- the numba engine: the input projection ------------------------------------------------------------
# Up to this many multiply-adds (T * B * I * G*H) the hoisted input projection runs on the packed kernel,
# one thread: a BLAS call that small gains nothing from BLAS's threads, and on a busy machine waiting on
# them cost more than the product (S3: 23 ms for a 200x64 @ 64x512 projection, its time loop 3 ms).
PACKED_PROJECTION_MAX = 1 << 24
# A one-thread backward over at most BLAS_ONE_THREAD_MAX_ROWS (step, row) pairs whose widest product has
# more than OPENBLAS_THREADED_MIN and at most BLAS_ONE_THREAD_MAX multiply-adds holds NumPy's BLAS to one
# thread: beside a busy process OpenBLAS's second thread spins on the busy core (T = 1 LSTM training step,
# B = 8, H = 256: 2.11x nn.LSTM's beside one busy process, 1.01x held; quiet 0.91-0.94x, 0.99-1.01x held).
# Up to OPENBLAS_THREADED_MIN a float32 product took the same time at one and two OpenBLAS threads (NumPy's
# OpenBLAS, a 2-core Xeon: (1024, 8) @ (8, 64) 12.1 / 12.4 us; from ~1M multiply-adds two threads ran up to
# 2x faster, or 7x slower when its threads had to wake), so holding it there would only cost the two
# thread-count settles (~11 us).
BLAS_ONE_THREAD_MAX_ROWS = 64
OPENBLAS_THREADED_MIN = 1 << 19
BLAS_ONE_THREAD_MAX = 1 << 24
# Variable lengths: where at most ACTIVE_PROJECTION_MAX_FILL of the (step, row) entries are active and a
# step has ACTIVE_PROJECTION_MIN_ROWS active rows or more on average, the projection runs step by step on
# each step's active rows (the packed kernel, W_ih packed once). S5 (lengths uniform in 1..T, about half
# active): forward 0.75-0.81x; at 2 rows a step on average it lost (up to 1.23x at B = 2); wide steps of
# a small input (B = 32, I = 128, H = 512) broke even.
ACTIVE_PROJECTION_MAX_FILL = 0.9
ACTIVE_PROJECTION_MIN_ROWS = 4

# -- the numba engine: one cell step (.numba.step) -------------------------------------------------------
# An inference step of at most R rows of a plain built-in cell whose weights take at least N bytes ((R, N)
# pairs) reads the caller's weights as they are, each row once, in one compiled call (.numba.source_step:
# no private copy, nothing to compare); any other step compares the buffer with its private copy (one
# memcmp, reading both) and runs the packed products. The whole inference step of a drop-in cell, float32,
# one thread, I = H, from the buffer / compare + packed (us; best of 3 alternated rounds, bench/RESULTS.md,
# 2026-12-01, AMD EPYC): LSTM 130 KiB (H = 64) 34 / 47 at 8 rows, 46 / 55 at 16, 71 / 70 at 32, 119 / 100 at
# 64; 516 KiB 90 / 103 at 16, 154 / 151 at 32, 284 / 248 at 64; 2 MiB 441 / 449 at 32, 845 / 788 at 64. GRU
# 98 KiB 38 / 46 at 16, 57 / 58 at 32; 387 KiB 71 / 85 at 16, 121 / 120 at 32, 218 / 188 at 64; 1.5 MiB 335 /
# 336 at 32, 640 / 588 at 64; 6 MiB 2222 / 2319 at 64, 4584 / 4415 at 128.
SOURCE_STEP_ROWS = ((16, 0), (32, 1 << 19), (64, 1 << 22))
# A one-row inference step from the buffer with weights of at least this many bytes runs its products on
# NumPy's BLAS (two GEMVs, which OpenBLAS threads) where the engine has more than one thread; otherwise
# (and always at one thread) in one compiled call (.numba.source_step). OpenBLAS threads a GEMV from
# about half a million elements. A drop-in cell's step at two threads, float32, I = H, BLAS / one call (us;
# bench/RESULTS.md, 2026-12-01, AMD EPYC): LSTM 2 MiB 72 / 63, 3.1 MiB 87 / 79, 4.5 MiB 76 / 99, 8 MiB 102 /
# 159; GRU 1.5 MiB 64 / 53, 3.4 MiB 91 / 78, 4.6 MiB 76 / 94, 6 MiB 87 / 115. float64 not measured.
SOURCE_GEMV_MIN_BYTES = 1 << 22

# -- cuDNN ----------------------------------------------------------------------------------------------
# "auto" leaves sequences shorter than this to the CuPy engine. NOT MEASURED: no GPU was available when
# this was written; 16 is a placeholder to be replaced by bench/bench_gpu.py's crossover on a GPU.
AUTO_MIN_SEQ_LEN = 16
