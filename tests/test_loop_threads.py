"""The numba engine's threads (arrayrnn/engines/numba/loop_threads.py, spin_barrier.py): the batch rows split
by work, the results of 2 threads equal to 1 thread's and to the reference engine, on every mode and cell
variant, both directions and variable lengths; the LSTM forward's column split (small batches, a barrier
per step) likewise; the barrier itself; errors in a worker reach the caller; a forked child gets its own
workers."""

from __future__ import annotations

import inspect
import multiprocessing
import re
import sys
import threading
import time

import numba
import numpy as np
import pytest
from support.rnn_cases import assert_same_results, engine_results

import arrayrnn as ar
from arrayrnn.engines import thread_count, thresholds
from arrayrnn.engines.base import CellMasks
from arrayrnn.engines.numba import engine as numba_engine
from arrayrnn.engines.numba import loop_threads, packed_gemm, plan, workers
from arrayrnn.engines.numba.packed_gemm import vector_lanes
from arrayrnn.engines.numba.spin_barrier import barrier, cancel_barrier, new_sync


# -- row ranges -----------------------------------------------------------------------------------
def _work(batch_sizes, rows):
    return np.array([np.count_nonzero(batch_sizes > b) for b in range(rows)])


@pytest.mark.parametrize("lengths", [[9] * 16, [9, 9, 8, 7, 5, 5, 3, 1, 1, 0], [9, 1, 1, 1, 1, 1, 1, 1],
                                     [0] * 6, [4]])
@pytest.mark.parametrize("parts, tile", [(2, 1), (2, 4), (3, 1)])
def test_row_ranges_cover_the_rows_with_balanced_work(lengths, parts, tile):
    lengths = np.array(lengths)
    batch_sizes = np.array([np.count_nonzero(lengths > t) for t in range(9)])
    ranges = loop_threads.row_ranges(batch_sizes, lengths.size, parts, tile)
    assert ranges[0][0] == 0 and ranges[-1][1] == lengths.size
    assert all(a[1] == b[0] for a, b in zip(ranges[:-1], ranges[1:], strict=True))
    assert all(r1 > r0 for r0, r1 in ranges) and len(ranges) <= parts
    work = _work(batch_sizes, lengths.size)
    shares = [int(work[r0:r1].sum()) for r0, r1 in ranges]
    # each share is within one tile of rows (at most tile * T steps) of the even split
    assert max(shares) - work.sum() / len(ranges) <= 2 * tile * 9 + 9


def test_column_split_only_for_mid_batches_with_large_steps(monkeypatch):
    lstm = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=16 * vector_lanes(np.float32))  # 16 unit groups
    gru = ar.RNNSpec(mode="gru", input_size=4, hidden_size=lstm.hidden_size)

    def parts(spec, rows, threads=2, columns=True):
        return plan.column_parts(spec, rows, np.float32, threads, columns)

    def fmas(spec, rows):  # a step's multiply-adds
        return rows * spec.gate_size * spec.output_size

    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_MIN_STEP_FMAS", fmas(lstm, 12))
    assert parts(lstm, 12) == 2
    assert parts(lstm, 12, columns=False) == 1                       # no column-split loop runs it
    assert parts(lstm, 12, threads=1) == 1
    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_MIN_STEP_FMAS", fmas(lstm, 12) + 1)
    assert parts(lstm, 12) == 1                                       # the barrier would cost more
    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_MIN_STEP_FMAS", 0)
    one_group = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=vector_lanes(np.float32))
    assert parts(one_group, 12) == 1                                  # one unit group: nothing to split
    assert parts(lstm, thresholds.COLUMN_SPLIT_MIN_ROWS - 1) == 1
    rows_split = 2 * thresholds.MIN_ROWS_PER_THREAD
    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_WIDE_STEP_FMAS", fmas(lstm, rows_split) + 1)
    assert parts(lstm, rows_split) == 1                               # the rows split, unless ...
    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_WIDE_STEP_FMAS", fmas(lstm, rows_split))
    assert parts(lstm, rows_split) == 2                               # ... the steps are large
    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_WIDE_STEP_FMAS", 0)
    assert parts(lstm, thresholds.COLUMN_SPLIT_MAX_ROWS) == 1
    assert parts(gru, rows_split) == 1                                # the GRU's stops at the rows split
    assert parts(gru, rows_split - 1) == 2


def test_one_rule_says_which_forwards_have_a_column_loop(monkeypatch):
    def spec(**fields):
        return ar.RNNSpec(**{"mode": "lstm", "input_size": 4, "hidden_size": 4, **fields})

    assert plan.column_loop(spec(), ()) and plan.column_loop(spec(mode="gru"), ())
    assert plan.column_loop(spec(), ("weight",))                     # DropConnect scales W_hh before the loop
    for variants in (("recurrent",), ("zoneout_h",), ("zoneout_c",), ("weight", "recurrent")):
        assert not plan.column_loop(spec(), variants), variants
    for fields in (dict(mode="gru", reset_after=False), dict(mode="rnn_tanh"), dict(proj_size=2),
                   dict(peepholes=True)):
        assert not plan.column_loop(spec(**fields), ()), fields
    # the masks a call applies decide, not the spec's options: at inference recurrent dropout draws none
    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_MIN_STEP_FMAS", 0)
    dropped = spec(recurrent_dropout=0.3, hidden_size=4 * vector_lanes(np.float32))
    x, bs = np.zeros((3, 12, 4), np.float32), np.full(3, 12)
    inference = plan.forward_plan(dropped, x, bs, masks=None, threads=2)
    assert inference.variants == () and inference.column_parts == 2
    recurrent = CellMasks(recurrent=np.ones((1, 12, dropped.hidden_size), np.float32))
    training = plan.forward_plan(dropped, x, bs, masks=recurrent, threads=2)
    assert training.variants == ("recurrent",) and training.column_parts == 1


def test_row_ranges_of_an_empty_batch():
    assert loop_threads.row_ranges(np.zeros(3, np.int64), 0, 2) == []


def test_rows_split_follows_the_threads_and_the_batch(threads):
    threads(2)
    assert plan.rows_split(64, loop_threads.available_threads()) == 2
    assert plan.rows_split(1, 2) == 1
    assert plan.rows_split(2 * thresholds.MIN_ROWS_PER_THREAD - 1, 2) == 1
    threads(1)
    assert plan.rows_split(64, loop_threads.available_threads()) == 1


# -- whole calls: 2 threads against 1 thread and the reference engine -------------------------------
CONFIGS = {
    "lstm-bi": dict(mode="lstm", bidirectional=True),
    "lstm-proj-clip": dict(mode="lstm", proj_size=3, cell_clip=(-0.3, 0.6), num_layers=2),
    "lstm-variants": dict(mode="lstm", recurrent_dropout=0.3, weight_dropout=0.2, zoneout=0.3,
                          zoneout_cell=0.2, peepholes=True),
    "gru-bi": dict(mode="gru", bidirectional=True),
    "gru-reset-before-zone": dict(mode="gru", reset_after=False, recurrent_dropout=0.3, zoneout=0.3),
    "rnn_relu-bi-zone": dict(mode="rnn_relu", bidirectional=True, zoneout=0.2),
}


def _run(engine: str, spec: ar.RNNSpec, B: int = 21, training: bool = True) -> dict:
    return engine_results(engine, spec, T=8, B=B, seed=5, training=training)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_two_threads_equal_one_thread_and_the_reference(config, threads):
    spec = ar.RNNSpec(input_size=5, hidden_size=6, dtype="float64", **CONFIGS[config])
    threads(1)
    one = _run("numba", spec)
    threads(2)
    two = _run("numba", spec)
    assert_same_results(two, one, rtol=1e-13, atol=1e-14)
    assert_same_results(two, _run("reference", spec), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
# float32: from 16 rows the weight gradients' products split their rows between the threads (a different
# float32 summation than one BLAS call: 2e-7 apart at 0.02)
@pytest.mark.parametrize("dtype, rtol, atol", [("float64", 1e-13, 1e-14), ("float32", 1e-5, 1e-6)])
@pytest.mark.parametrize("fields", [dict(bidirectional=True), dict(num_layers=2)], ids=["bi", "2-layers"])
@pytest.mark.parametrize("mode, rows", [("lstm", 9), ("lstm", 17), ("gru", 9)])
def test_column_split_equals_one_thread_and_the_reference(mode, fields, dtype, rtol, atol, training, rows,
                                                          threads, monkeypatch):
    # H = 37: 3 (float32) or 5 (float64) unit groups with a partial last one, split 1 + 2 or 2 + 3;
    # 9 rows: below the rows split's threshold; 17: past it, where an LSTM's large steps split their units
    clip = dict(cell_clip=(-0.4, 0.5)) if mode == "lstm" and "num_layers" in fields else {}
    spec = ar.RNNSpec(mode=mode, input_size=5, hidden_size=37, dtype=dtype, **fields, **clip)
    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_MIN_STEP_FMAS", 0)  # small sizes, same code path
    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_WIDE_STEP_FMAS", 0)
    monkeypatch.setattr(plan, "wavefront_schedule", lambda *a, **k: None)  # layer by layer (test_wavefront)
    calls = []
    real = numba_engine.run_columns
    monkeypatch.setattr(numba_engine, "run_columns", lambda *a: calls.append(a[1]) or real(*a))
    threads(1)
    one = _run("numba", spec, B=rows, training=training)
    assert calls == []
    threads(2)
    two = _run("numba", spec, B=rows, training=training)
    assert calls and set(calls) == {2}
    assert_same_results(two, one, rtol, atol)
    assert_same_results(two, _run("reference", spec, B=rows, training=training), 100 * rtol, 100 * atol)


def test_the_barrier_holds_every_thread_at_each_step(threads):
    threads(2)
    steps, seen, wrong = 2000, np.zeros(2, np.int64), np.zeros(2, np.int64)
    sync = new_sync()

    @numba.njit(nogil=True)
    def meet(part, parts, sync, seen, wrong, steps):
        for s in range(steps):
            seen[part] = s
            barrier(sync, parts)
            for k in range(parts):  # everyone has written step s, nobody step s + 1 yet
                if seen[k] != s:
                    wrong[part] += 1
            barrier(sync, parts)

    granted = []

    def plan(n):
        granted.append(n)
        return [lambda part=part: meet(part, n, sync, seen, wrong, steps) for part in range(n)]

    workers.in_parallel(plan, 2)
    assert granted == [2]
    assert wrong.tolist() == [0, 0] and seen.tolist() == [steps - 1] * 2
    assert sync[0] == 0 and sync[8] == 2 * steps


@numba.njit(nogil=True)
def _meet(sync, parties, steps):
    """``steps`` barriers; False as soon as one is cancelled."""
    for _ in range(steps):
        if not barrier(sync, parties):
            return False
    return True


def test_a_cancelled_barrier_releases_its_waiter_now_and_later():
    sync, said = new_sync(), []
    waiter = threading.Thread(target=lambda: said.append(_meet(sync, 2, 1)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()           # waiting for its partner
    cancel_barrier(sync)
    waiter.join(30)
    assert said == [False] and not _meet(sync, 2, 1)


def test_a_failing_part_of_a_column_split_releases_the_parts_at_the_barrier(threads):
    """The column split's parts meet at a barrier each step: one that fails before it arrives used to leave
    the others spinning for good."""
    threads(2)
    returned = []

    def loop(part, parts, sync, scratch):
        assert parts == 2
        if part == 1:
            raise RuntimeError("part 1 failed")
        returned.append(_meet(sync, parts, 1000))

    with pytest.raises(RuntimeError, match="part 1 failed"):
        loop_threads.run_columns(loop, 2, np.float32)
    assert returned == [False] and workers.busy_helpers() == 0


def test_the_split_is_used(threads, monkeypatch):
    seen = []
    real = loop_threads.row_ranges
    monkeypatch.setattr(loop_threads, "row_ranges", lambda *a: seen.append(real(*a)) or seen[-1])
    threads(2)
    _run("numba", ar.RNNSpec(mode="gru", input_size=5, hidden_size=6))
    assert seen and all(len(r) == 2 for r in seen)


# -- small calls on the calling thread --------------------------------------------------------------
def test_call_fmas_counts_every_layer_directions_two_products():
    spec = ar.RNNSpec(mode="gru", input_size=5, hidden_size=6, num_layers=2, bidirectional=True)
    # layer 0: x (5) and h (6) into 3 * 6 gates; layer 1: both directions' outputs (12) and h (6); 2 each
    assert plan.call_fmas(spec, 7, 3) == 7 * 3 * 18 * 2 * ((5 + 6) + (12 + 6))


def test_a_call_below_the_split_threshold_plans_one_thread(monkeypatch):
    """Below MIN_SPLIT_CALL_FMAS multiply-adds a call gets one thread whatever the engine has (its parts'
    hand-off costs more than the split saves: bench/bench_threads.py --small); from it, the engine's."""
    monkeypatch.setattr(thread_count, "_explicit", thread_count._explicit)
    ar.set_num_threads(2)
    spec = ar.RNNSpec(mode="lstm", input_size=64, hidden_size=64)
    T, B = 3, 16
    x, bs = np.zeros((T, B, 64), np.float32), np.full(T, B, np.int64)
    fmas = plan.call_fmas(spec, T, B)
    for threshold, expected in ((fmas + 1, 1), (fmas, 2)):
        monkeypatch.setattr(thresholds, "MIN_SPLIT_CALL_FMAS", threshold)
        forward, backward = plan.forward_plan(spec, x, bs), plan.backward_plan(spec, B, steps=T)
        assert (forward.threads, forward.row_threads) == (expected, expected)
        assert (backward.threads, backward.row_threads) == (expected, expected)
        assert plan.one_step_on_one_thread(spec, B) is (plan.call_fmas(spec, 1, B) < threshold)
    assert plan.backward_plan(spec, B).threads == 2            # steps not known: the engine's threads
    assert plan.forward_plan(spec, x, bs, threads=2).threads == 2   # asked for: as asked


@pytest.mark.parametrize("threshold, splits", [(None, False), (0, True)], ids=["default", "all split"])
def test_a_small_training_call_hands_no_part_to_a_worker(monkeypatch, threshold, splits):
    """A small call (T = 2, B = 16, H = 32: 0.26M multiply-adds) at two threads runs its forward and its
    backward on the calling thread: no split asks for a second thread; with the threshold at 0 it does."""
    monkeypatch.setattr(thread_count, "_explicit", thread_count._explicit)
    ar.set_num_threads(2)
    if threshold is not None:
        monkeypatch.setattr(thresholds, "MIN_SPLIT_CALL_FMAS", threshold)
    wanted = []
    real = workers.in_parallel
    monkeypatch.setattr(workers, "in_parallel",
                        lambda plan_, n, *args, **kwargs: wanted.append(n) or real(plan_, n, *args, **kwargs))
    spec = ar.RNNSpec(mode="lstm", input_size=32, hidden_size=32)
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 16, 32)).astype(np.float32)
    res = ar.rnn_forward(params, x, training=True, engine="numba")
    ar.rnn_backward(res, dy=np.ones_like(res.y))
    assert (max(wanted, default=1) > 1) is splits


# -- failures and fork ------------------------------------------------------------------------------
def test_an_error_in_a_worker_reaches_the_caller_after_every_range(threads):
    threads(2)
    done = []

    def loop(r0, r1, scratch):
        if r0 > 0:
            raise RuntimeError(f"rows {r0}..{r1} failed")
        done.append((r0, r1))

    batch_sizes = np.full(3, 16)
    with pytest.raises(RuntimeError, match=r"rows 8\.\.16 failed"):
        loop_threads.run_split(loop, (), batch_sizes, 16, 2, np.float32)
    assert done == [(0, 8)]


def _forward_in_child(queue):
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4)
    x = np.ones((4, 16, 3), np.float32)
    queue.put(float(ar.rnn_forward(ar.PackedParams.init(spec), x, engine="numba").y.sum()))


@pytest.mark.skipif(sys.platform != "linux", reason="fork is the Linux default start method")
def test_a_forked_child_starts_its_own_workers(threads):
    threads(2)
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4)
    x = np.ones((4, 16, 3), np.float32)
    expected = float(ar.rnn_forward(ar.PackedParams.init(spec), x, engine="numba").y.sum())  # pool made
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_forward_in_child, args=(queue,))
    child.start()
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung on the parent's worker threads")
    assert child.exitcode == 0
    assert queue.get(timeout=5) == pytest.approx(expected, rel=1e-6)


def test_split_matmul_equals_matmul_and_blas_is_held_to_one_thread_only_inside(threads):
    import threadpoolctl

    threads(2)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((517, 33)), rng.standard_normal((21, 33)).T  # a strided right operand
    blas = threadpoolctl.ThreadpoolController().select(user_api="blas")
    before = [lib.num_threads for lib in blas.lib_controllers]
    assert plan.call_threads(thresholds.COLUMN_SPLIT_MIN_ROWS, 2, None) == 2
    with loop_threads.engine_threads(2) as n:
        assert n == 2 and loop_threads.gemm_threads() == 2
        assert [lib.num_threads for lib in blas.lib_controllers] == [1] * len(before)
        np.testing.assert_allclose(loop_threads.split_matmul(a, b), a @ b, rtol=1e-13, atol=1e-13)
    assert [lib.num_threads for lib in blas.lib_controllers] == before
    assert loop_threads.gemm_threads() == 1
    assert plan.call_threads(thresholds.COLUMN_SPLIT_MIN_ROWS - 1, 2, None) == 1  # loops stay on one
    with loop_threads.engine_threads(1) as n:
        assert n == 1 and [lib.num_threads for lib in blas.lib_controllers] == before


@pytest.mark.parametrize("rows", [517, 7])
@pytest.mark.parametrize("count", [1, 2])
def test_split_matmul_adds_the_bias_in_each_threads_share(threads, count, rows, monkeypatch):
    """``split_matmul(a, b, bias=)`` (the numba engine's input projection on BLAS) gives the bits of the
    product then ``+= bias`` in one pass, and with two threads adds each share's bias on that share's thread
    (the pass over a large product is memory-bound); a product too small to split is one product and one
    pass."""
    threads(count)
    rng = np.random.default_rng(rows)
    a = rng.standard_normal((rows, 33)).astype(np.float32)
    b = rng.standard_normal((21, 33)).astype(np.float32).T
    bias = rng.standard_normal(21).astype(np.float32)
    shares = []
    share = loop_threads._share
    monkeypatch.setattr(loop_threads, "_share", lambda *args: shares.append(args[3] is bias) or share(*args))
    with loop_threads.engine_threads(count):
        want = loop_threads.split_matmul(a, b)
        want += bias
        split = count == 2 and rows >= 64 * count
        assert shares == ([False, False] if split else [])
        shares.clear()
        into = np.empty_like(want)
        got = loop_threads.split_matmul(a, b, into, bias=bias)
    assert got is into and got.tobytes() == want.tobytes()
    assert shares == ([True, True] if split else [])


def test_the_numba_engines_blas_projection_is_the_shared_drivers_with_its_bias_split(threads, monkeypatch):
    """The numba engine's input projection on BLAS (a product past ``PACKED_PROJECTION_MAX``) equals the
    shared driver's :func:`.stack.input_projection` on the same split product, bit for bit, and is the
    path a whole-sequence call of that size takes."""
    from arrayrnn.engines import stack
    from arrayrnn.engines.numba import engine
    from arrayrnn.engines.numba.engine import blas_projection

    threads(2)
    T, B, I, H = 40, 64, 96, 80
    assert not plan.packed_projection(T, B, I, 4 * H, np.float32)
    spec = ar.RNNSpec(mode="lstm", input_size=I, hidden_size=H)
    w = stack.direction_weights(ar.PackedParams.init(spec, seed=3), 0, 0)
    x = np.random.default_rng(3).standard_normal((T, B, I)).astype(np.float32)
    with loop_threads.engine_threads(2):
        want = stack.input_projection(x, w, loop_threads.split_matmul)
        got = blas_projection(x, w, np.empty_like(want))
    assert got.shape == (T, B, 4 * H) and got.tobytes() == want.tobytes()
    taken = []
    monkeypatch.setattr(engine, "blas_projection", lambda *args: taken.append(1) or blas_projection(*args))
    result = ar.rnn_forward(ar.PackedParams.init(spec, seed=3), x, engine="numba")
    assert taken == [1] and np.isfinite(result.y).all()


def test_float32_results_change_with_the_thread_count_only_by_the_documented_rounding(threads):
    """docs/guide/threads.md, "Rounding across thread counts": the hoisted products split their rows over the
    threads a call gets, and OpenBLAS rounds a product of fewer rows differently (issue 34 saw ~1e-8 in y,
    ~2e-6 in dparams); the same thread count gives the same bits run to run."""
    spec = ar.RNNSpec(mode="gru", input_size=64, hidden_size=128)
    threads(1)
    one = _run("numba", spec, B=32)
    threads(2)
    two, again = _run("numba", spec, B=32), _run("numba", spec, B=32)
    for name, value in one.items():
        if value is None:
            continue
        assert two[name].tobytes() == again[name].tobytes(), name
        np.testing.assert_allclose(two[name], value, rtol=0, atol=1e-5 * np.abs(value).max(), err_msg=name)


def test_callers_starting_workers_at_once_start_no_more_than_the_limit(monkeypatch):
    """Issue 45: 4 callers under 2 threads each started a worker when they reserved at once (up to 4
    workers, each able to run a part beside its caller: 8 threads on 2 cores); the limit is 1."""
    crew = workers._Crew()
    real = workers._Crew._spawn
    monkeypatch.setattr(workers._Crew, "_spawn", lambda self: time.sleep(0.05) or real(self))
    meet = threading.Barrier(4)

    def reserve():
        meet.wait()
        crew.reserve(workers._Gang(None), 1, 1)

    callers = [threading.Thread(target=reserve) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(30)
    assert len(crew.everyone) == 1


def test_the_plan_memo_is_keyed_on_every_threshold_the_plan_reads(monkeypatch):
    """forward_plan is made once per shape; the thresholds it reads key it too, so a test or bench that sets
    one (as the tests above do) gets a new plan: the list must name every threshold plan.py reads."""
    source = inspect.getsource(plan)
    read = set(re.findall(r"\bth\.([A-Z_]+)", source)) - {  # read per call (the backward's plan too)
        "ACTIVE_PROJECTION_MAX_FILL", "ACTIVE_PROJECTION_MIN_ROWS", "BLAS_ONE_THREAD_MAX_ROWS",
        "BLAS_ONE_THREAD_MAX", "OPENBLAS_THREADED_MIN", "MIN_SPLIT_CALL_FMAS"}
    assert read == set(plan._read_thresholds.__reduce__()[1])
    spec = ar.RNNSpec(mode="lstm", input_size=8, hidden_size=64)
    x = np.zeros((3, 12, 8), np.float32)
    bs = np.full(3, 12, np.int64)
    before = plan.forward_plan(spec, x, bs, threads=2)
    assert plan.forward_plan(spec, x, bs, threads=2) is before  # memoised
    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_MIN_STEP_FMAS", 0)
    after = plan.forward_plan(spec, x, bs, threads=2)
    assert after.column_parts == 2 and before.column_parts == 1


@pytest.mark.parametrize("steps, rows, hidden, held", [
    (1, 8, 256, True), (4, 16, 64, True),                      # products OpenBLAS would thread, small
    (1, 8, 32, False), (1, 1, 256, False),                     # OpenBLAS runs one thread anyway
    (8, 16, 32, False), (1, 64, 512, False)])                  # too many pairs; too large a product
def test_a_small_one_thread_backward_holds_blas_to_one_thread(monkeypatch, steps, rows, hidden, held):
    """A one-thread backward over few (step, row) pairs whose products OpenBLAS would thread but which are
    small runs them on one BLAS thread (beside a busy process OpenBLAS's second thread only spins); any other
    keeps BLAS's threads; both give back BLAS's own count after."""
    import threadpoolctl

    spec = ar.RNNSpec(mode="lstm", input_size=hidden, hidden_size=hidden)
    assert plan.backward_holds_blas(spec, steps * rows) is held
    seen = []
    matmul = numba_engine.NumbaEngine.matmul

    def blas_threads():
        return {lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"}

    def recording(self, a, b, out=None):
        seen.extend(blas_threads())
        return matmul(self, a, b, out)

    monkeypatch.setattr(numba_engine.NumbaEngine, "matmul", recording)
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(0).standard_normal((steps, rows, hidden)).astype(np.float32)
    with threadpoolctl.threadpool_limits(2, user_api="blas"), loop_threads.one_thread():
        own = blas_threads()
        if own == {1}:
            pytest.skip("NumPy's BLAS runs one thread here (a one-core machine): nothing to hold")
        res = ar.rnn_forward(params, x, training=True, engine="numba")
        seen.clear()
        ar.rnn_backward(res, dy=np.ones_like(res.y))
        assert seen and set(seen) == ({1} if held else own)
        assert blas_threads() == own


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, n", [(1024, 256), (7, 3), (1, 1), (0, 4)])
def test_an_outer_product_gives_blas_bits_without_blas(m, n, dtype, monkeypatch):
    """``split_matmul`` of ``(M, 1) @ (1, N)`` (a weight gradient over one (step, row) pair) is one multiply
    per entry: BLAS's bits (each entry one rounded product), NumPy's ``matmul`` never called; into ``out``
    too, and from the transposed views the backward passes. A C-order ``out`` (or none) takes the compiled
    kernel (:func:`.packed_gemm.outer`), an ``out`` in another order NumPy's broadcast multiply: the same
    bits."""
    rng = np.random.default_rng(m)
    a, b = rng.standard_normal((1, m)).astype(dtype).T, rng.standard_normal((1, n)).astype(dtype)
    want = np.matmul(a, b)
    compiled = []
    monkeypatch.setattr(loop_threads.np, "matmul", None)  # any BLAS call fails
    kernel = packed_gemm._outer_into
    monkeypatch.setattr(packed_gemm, "_outer_into", lambda *args: compiled.append(1) or kernel(*args))
    got, into = loop_threads.split_matmul(a, b), np.empty((m, n), dtype)
    fortran = np.empty((m, n), dtype, order="F")
    assert loop_threads.split_matmul(a, b, out=into) is into and len(compiled) == 2
    assert loop_threads.split_matmul(a, b, out=fortran) is fortran and len(compiled) == 2 + (m * n <= 1)
    for result in (got, into, fortran):
        assert result.dtype == want.dtype and result.tobytes() == want.tobytes()
