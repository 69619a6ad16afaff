"""arrayrnn.torch.LSTMCell / GRUCell / RNNCell as drop-ins for nn.LSTMCell / GRUCell / RNNCell (the oracle):
nn's type, signatures and weights in one buffer, one fused step forward and its hand-written backward,
the weights' values followed however they change, and nn's own forward for what the step does not serve.
PyTorch's own cell tests are ported in test_torch_nn_ported.py."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from support.fresh_process import run_fresh
from torch import nn

from arrayrnn.engines import thresholds
from arrayrnn.torch import GRUCell, LSTMCell, RNNCell

PAIRS = {"LSTMCell": (LSTMCell, nn.LSTMCell), "GRUCell": (GRUCell, nn.GRUCell),
         "RNNCell": (RNNCell, nn.RNNCell)}
CASES = [("LSTMCell", {}), ("LSTMCell", {"bias": False}), ("GRUCell", {}), ("GRUCell", {"bias": False}),
         ("RNNCell", {}), ("RNNCell", {"nonlinearity": "relu", "bias": False})]


def pair(name, *args, **kwargs):
    """(ours, theirs) with the same weights: the constructors draw them alike from torch's generator."""
    ours_cls, their_cls = PAIRS[name]
    torch.manual_seed(0)
    ours = ours_cls(*args, **kwargs)
    torch.manual_seed(0)
    return ours, their_cls(*args, **kwargs)


def run_loop(cell, xs, state):
    """Every step of ``xs`` through ``cell`` from ``state``; the outputs of every step."""
    outs = []
    for x in xs:
        out = cell(x, state)
        state = out
        outs.append(out if isinstance(out, tuple) else (out,))
    return outs


def loss_of(outs):
    return sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype, device=o.device).view(o.shape)).sum()
               for step in outs for o in step)


def assert_one_buffer(tensors):
    """Consecutive contiguous views of one storage, in nn's parameter order."""
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    offset = tensors[0].storage_offset()
    for t in tensors:
        assert t.is_contiguous() and t.storage_offset() == offset
        offset += t.numel()


def states(name, B, H, dtype=torch.float64):
    torch.manual_seed(5)
    h = torch.randn(B, H, dtype=dtype)
    return (h, torch.randn(B, H, dtype=dtype)) if name == "LSTMCell" else h


@pytest.mark.parametrize("name, kwargs", CASES)
def test_the_cells_are_torchs_classes_with_its_weights(name, kwargs):
    ours, theirs = pair(name, 3, 4, **kwargs)
    assert isinstance(ours, type(theirs)) and isinstance(ours, nn.RNNCellBase)
    assert repr(ours) == repr(theirs)
    named = [[(n, p.shape) for n, p in m.named_parameters()] for m in (ours, theirs)]
    assert named[0] == named[1]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)  # nn's initialisation, bit for bit
    assert_one_buffer(list(ours.parameters()))
    assert ours.flat.numel() == sum(p.numel() for p in theirs.parameters())


@pytest.mark.parametrize("name, kwargs", CASES)
def test_a_loop_of_steps_and_its_backward_equal_torch(name, kwargs):
    ours, theirs = pair(name, 3, 4, dtype=torch.float64, **kwargs)
    xs = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    results = []
    for cell in (ours, theirs):
        xs.grad = None
        state = tuple(s.requires_grad_() for s in states(name, 2, 4)) if name == "LSTMCell" else \
            states(name, 2, 4).requires_grad_()
        outs = run_loop(cell, xs, state)
        loss_of(outs).backward()
        start = state if isinstance(state, tuple) else (state,)
        results.append([o.detach() for step in outs for o in step] + [xs.grad, *(s.grad for s in start)]
                       + [p.grad for p in cell.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.flat_grad, torch.cat([p.grad.reshape(-1) for p in theirs.parameters()]),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(PAIRS))
def test_gradcheck_and_gradgradcheck_in_float64(name):
    ours = PAIRS[name][0](3, 4, dtype=torch.float64)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    hx = states(name, 2, 4)
    hx = tuple(s.requires_grad_() for s in hx) if isinstance(hx, tuple) else hx.requires_grad_()
    weights = list(ours.parameters())
    names = [n for n, _ in ours.named_parameters()]

    def step(x, *args):
        n_states = 2 if name == "LSTMCell" else 1
        state = args[:n_states] if n_states == 2 else args[0]
        params = dict(zip(names, args[n_states:], strict=True))
        out = torch.func.functional_call(ours, params, (x, state))
        return out if isinstance(out, tuple) else (out,)

    inputs = (x, *(hx if isinstance(hx, tuple) else (hx,)), *weights)
    assert torch.autograd.gradcheck(step, inputs)
    assert torch.autograd.gradgradcheck(step, inputs)


def test_first_order_runs_the_fused_step(monkeypatch, auto_takes_numba):
    from arrayrnn.engines.numba.step import NumbaStep

    calls = []
    real = NumbaStep.backward
    monkeypatch.setattr(NumbaStep, "backward", lambda *a, **k: calls.append(1) or real(*a, **k))
    cell = LSTMCell(3, 4)
    x = torch.randn(2, 3, requires_grad=True)
    cell(x)[0].sum().backward()
    assert calls == [1]
    (dx,) = torch.autograd.grad(cell(x)[0].sum(), x, create_graph=True)  # the differentiable path
    assert calls == [1] and dx.requires_grad


def numba_loads(monkeypatch, loaded: bool):
    """``engine='auto'`` sees numba's loops as loaded or not (before they have loaded in the background,
    what every new process runs first, auto takes the reference engine). Returns ``load()``, which makes
    the loads complete (the background compile finishing: ``forget_choices``)."""
    from arrayrnn.engines import forget_choices
    from arrayrnn.engines.numba import warmup

    state = {"loaded": loaded}
    monkeypatch.setattr(warmup, "loaded", lambda call: state["loaded"])

    def load():
        state["loaded"] = True
        forget_choices()

    return load


@pytest.fixture(params=["reference", "numba"])
def step_on(request, monkeypatch):
    """The drop-in cells' step on the reference engine or on numba; the value's ``engine`` names it."""
    load = numba_loads(monkeypatch, request.param == "numba")
    load.engine = request.param
    return load


def step_engine_of(cell):
    """The engine the cell's last fused step ran on."""
    return cell.__dict__["_prepared"][0][1].stepper.name


UPDATES = ["fused optimizer", "data copy", "numpy write", "load_state_dict", "foreach optimizer",
           "bias add_ under no_grad", "SGD step"]


def update_weights(cell, update):
    if update in ("fused optimizer", "foreach optimizer"):
        torch.optim.Adam(cell.parameters(), lr=0.1, **{update.split()[0]: True}).step()
    elif update == "SGD step":
        torch.optim.SGD(cell.parameters(), lr=0.5).step()
    elif update == "data copy":
        cell.weight_hh.data.copy_(torch.full_like(cell.weight_hh, 0.01))
    elif update == "numpy write":
        cell.weight_hh.detach().numpy()[0, 0] = 3.0
    elif update == "bias add_ under no_grad":
        with torch.no_grad():
            cell.bias_ih.add_(1.0)
    else:
        cell.load_state_dict({k: v * 0.5 for k, v in cell.state_dict().items()})


@pytest.mark.parametrize("name", ["LSTMCell", "GRUCell"])
@pytest.mark.parametrize("update", UPDATES)
def test_every_way_of_changing_the_weights_is_seen_by_the_next_step(update, name, step_on):
    """Each step engine keeps what it prepared from the weights between calls (numba: packed copies; the
    others: the summed biases); an optimizer step, a write through ``.data``, an in-place bias update and a
    NumPy write move no version counter the step reads, and the next step still sees them."""
    ours, theirs = pair(name, 3, 4)
    x, hx = torch.randn(2, 3), states(name, 2, 4, torch.float32)
    for cell in (ours, theirs):
        out = cell(x, hx)
        (out[0] if isinstance(out, tuple) else out).square().sum().backward()
        update_weights(cell, update)
    torch.testing.assert_close(ours(x, hx), theirs(x, hx))
    assert step_engine_of(ours) == step_on.engine


@pytest.mark.parametrize(("rows", "table"), [(1, None), (3, None), (3, ((2, 0),))])
@pytest.mark.parametrize("name", ["LSTMCell", "GRUCell"])
@pytest.mark.parametrize("update", UPDATES)
def test_every_way_of_changing_the_weights_is_seen_by_the_next_inference_step(update, name, rows, table,
                                                                                 step_on, monkeypatch):
    """Under ``no_grad`` the numba step of a few rows reads the weights' buffer itself (nothing kept to
    compare: up to 16 rows always, more where the weights are large), else (more rows: here ``table``
    makes 3 rows "more") its packed copy after a comparison: every write, whichever way, reaches the next
    step, before and after steps with a gradient."""
    if table is not None:
        monkeypatch.setattr(thresholds, "SOURCE_STEP_ROWS", table)
    ours, theirs = pair(name, 3, 4)
    x, hx = torch.randn(rows, 3), states(name, rows, 4, torch.float32)
    for cell in (ours, theirs):
        with torch.no_grad():
            cell(x, hx)
        out = cell(x, hx)
        (out[0] if isinstance(out, tuple) else out).square().sum().backward()
        update_weights(cell, update)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, hx), theirs(x, hx))
    assert step_engine_of(ours) == step_on.engine
    step = ours.__dict__["_prepared"][0][1]
    assert step.stepper.steps_from_source(step.weights.spec, rows) == (step_on.engine == "numba" and
                                                                       table is None)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("name", ["LSTMCell", "GRUCell"])
def test_frozen_weights_written_between_inference_steps_and_a_step_with_an_input_gradient(name, rows,
                                                                                          step_on):
    """Weights that need no gradient, inference steps, a ``.data`` write, then a step whose input needs a
    gradient: that step (and its backward) runs on the new values."""
    ours, theirs = pair(name, 3, 4)
    x, hx = torch.randn(rows, 3), states(name, rows, 4, torch.float32)
    grads = []
    for cell in (ours, theirs):
        cell.requires_grad_(False)
        with torch.no_grad():
            cell(x, hx)
        cell.weight_hh.data.copy_(torch.full_like(cell.weight_hh, 0.2))
        xr = x.clone().requires_grad_()
        out = cell(xr, hx)
        (out[0] if isinstance(out, tuple) else out).square().sum().backward()
        grads.append(xr.grad)
    torch.testing.assert_close(grads[0], grads[1])


_FRESH_TRAINED_THEN_INFERENCE = """
    import torch
    import arrayrnn as ar
    from arrayrnn.engines.numba import packed_gemm, source_step
    from arrayrnn.engines.numba import warmup as W
    from arrayrnn.torch import LSTMCell

    torch.manual_seed(0)
    cell, ref = LSTMCell(3, 5), torch.nn.LSTMCell(3, 5)
    ref.load_state_dict(cell.state_dict())
    x, hx = torch.randn(3, 3), (torch.randn(3, 5), torch.randn(3, 5))
    cell(x, hx)[0].sum().backward()                    # a training step first: the training family is asked
    assert W.wait(ar.RNNSpec(mode="lstm", input_size=3, hidden_size=5), training=True, timeout=800)
    before = W.compiled_signatures()
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cell(x, hx), ref(x, hx))
    step = cell.__dict__["_prepared"][0][1]
    assert step.stepper.name == "numba" and step.stepper.steps_from_source(step.weights.spec, 3)
    assert source_step.lstm_source_step.signatures, "the steps did not read the weights as they are"
    cell(x[:1], (hx[0][:1], hx[1][:1]))[0].sum().backward()  # one row: the weight gradients' outer products
    assert packed_gemm._outer_into.signatures, "the one-row backward took no outer product"
    assert W.new_signatures(before, W.compiled_signatures()) == {}
    print("ok")
"""


def test_a_users_fresh_process_steps_from_the_weights_without_compiling_once_trained(tmp_path):
    """The default setting (background compile on, an empty cache): once the training family has loaded
    (it loads the inference steps too), ``no_grad`` steps run numba's step from the weights as they are
    (:mod:`.source_step`), a one-row training step's backward its outer products, and neither compiles
    anything in the caller's process."""
    out = run_fresh(_FRESH_TRAINED_THEN_INFERENCE, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_cell_first_called_before_numba_loaded_moves_to_it_once_loaded(monkeypatch):
    load = numba_loads(monkeypatch, False)
    ours, theirs = pair("LSTMCell", 3, 4)
    x, hx = torch.randn(2, 3), states("LSTMCell", 2, 4, torch.float32)
    torch.testing.assert_close(ours(x, hx), theirs(x, hx))
    assert step_engine_of(ours) == "reference"
    load()  # the background compile finished
    torch.testing.assert_close(ours(x, hx), theirs(x, hx))
    assert step_engine_of(ours) == "numba"


@pytest.mark.parametrize("name", ["LSTMCell", "GRUCell"])
def test_weights_changed_and_restored_between_a_step_and_its_backward(name, step_on):
    """The numba step packs the backward's matrices at the first backward: from the values the forward
    read, not from what ``.data`` holds then, so the next step (weights restored) differentiates right."""
    ours, theirs = pair(name, 3, 4)
    ours.double(), theirs.double()
    x, hx = torch.randn(2, 3, dtype=torch.float64), states(name, 2, 4)
    grads = []
    for cell in (ours, theirs):
        kept = cell.weight_hh.detach().clone()
        out = cell(x, hx)
        cell.weight_hh.data.copy_(torch.full_like(kept, 0.3))  # no version counter moves
        (out[0] if isinstance(out, tuple) else out).sum().backward()
        cell.weight_hh.data.copy_(kept)
        xr = x.clone().requires_grad_()
        hr = [t.clone().requires_grad_() for t in (hx if isinstance(hx, tuple) else (hx,))]
        out = cell(xr, tuple(hr) if len(hr) == 2 else hr[0])
        loss_of([out if isinstance(out, tuple) else (out,)]).backward()
        grads.append([xr.grad, *(t.grad for t in hr)])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name, inputs", [
    ("LSTMCell", lambda: (torch.randn(3),)),                                        # unbatched, no state
    ("LSTMCell", lambda: (torch.randn(3), (torch.randn(4), torch.randn(4)))),       # unbatched
    ("GRUCell", lambda: (torch.randn(2, 3),)),                                      # zero state
    ("RNNCell", lambda: (torch.randn(3), torch.randn(4))),
])
def test_unbatched_input_and_default_states_equal_torch(name, inputs):
    ours, theirs = pair(name, 3, 4)
    args = inputs()
    torch.testing.assert_close(ours(*args), theirs(*args))


def test_re_parametrised_weights_equal_torch():
    ours, theirs = pair("GRUCell", 3, 4)
    for cell in (ours, theirs):
        nn.utils.parametrizations.weight_norm(cell, "weight_hh")
    x = torch.randn(2, 3)
    for cell in (ours, theirs):
        cell(x).square().sum().backward()
    torch.testing.assert_close(ours(x), theirs(x))
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_to_double_deepcopy_and_save_load_keep_one_buffer():
    ours, theirs = pair("LSTMCell", 3, 4)
    x = torch.randn(2, 3)
    ours(x)  # packs the float32 weights
    ours.double()
    assert_one_buffer(list(ours.parameters()))
    torch.testing.assert_close(ours(x.double()), theirs.double()(x.double()))
    clone = copy.deepcopy(ours)
    assert_one_buffer(list(clone.parameters()))
    buffer = io.BytesIO()
    torch.save(ours, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert type(loaded) is LSTMCell
    for module in (clone, loaded):
        torch.testing.assert_close(module(x.double()), theirs(x.double()))


def test_a_nonlinearity_changed_after_construction_is_followed_like_torch():
    ours, theirs = pair("RNNCell", 3, 4)
    x = torch.randn(2, 3)
    ours(x)
    for cell in (ours, theirs):
        cell.nonlinearity = "relu"
    torch.testing.assert_close(ours(x), theirs(x))
    for cell in (ours, theirs):
        cell.nonlinearity = "sigmoid"
    for cell in (ours, theirs):
        with pytest.raises(RuntimeError, match="Unknown nonlinearity: sigmoid"):
            cell(x)


@pytest.mark.parametrize("context", ["bfloat16 input", "cpu autocast", "meta", "empty batch"])
def test_what_the_step_does_not_serve_runs_torchs_forward(context, monkeypatch):
    from arrayrnn.engines.numba.step import NumbaStep

    monkeypatch.setattr(NumbaStep, "forward", lambda *a, **k: pytest.fail("the fused step ran"))
    ours, theirs = pair("LSTMCell", 3, 4)
    x = torch.randn(2, 3)
    if context == "bfloat16 input":
        ours, theirs, x = ours.bfloat16(), theirs.bfloat16(), x.bfloat16()
    elif context == "meta":
        ours, theirs, x = ours.to("meta"), theirs.to("meta"), x.to("meta")
    elif context == "empty batch":
        x = torch.randn(0, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=context == "cpu autocast"):
        got, want = ours(x), theirs(x)
    assert [(t.dtype, t.shape) for t in got] == [(t.dtype, t.shape) for t in want]
    if context != "meta":
        torch.testing.assert_close(got, want)


def test_torch_func_transforms_and_vmap_equal_torch():
    ours, theirs = pair("GRUCell", 3, 4)
    x, h = torch.randn(5, 2, 3), torch.randn(5, 2, 4)
    for transform in (lambda f: torch.func.vmap(f), lambda f: torch.func.vmap(torch.func.grad(
            lambda x, h: f(x, h).square().sum()))):
        got = transform(lambda x, h: ours(x, h))(x, h)
        torch.testing.assert_close(got, transform(lambda x, h: theirs(x, h))(x, h))


def test_torch_compile_and_jit_trace_of_a_decoder_loop_equal_eager():
    ours, _ = pair("LSTMCell", 3, 4)
    xs = torch.randn(4, 2, 3)

    def decode(xs):
        return run_loop(ours, xs, None)[-1][0]

    want = decode(xs)
    torch.testing.assert_close(torch.compile(decode, fullgraph=True, backend="eager")(xs), want)
    traced = torch.jit.trace(ours, (xs[0],))
    torch.testing.assert_close(traced(xs[0]), ours(xs[0]))
    torch.compiler.reset()


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_onnx_export_of_a_cell_runs_in_onnxruntime_like_torch(dynamo, tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    ours, theirs = pair("GRUCell", 3, 4)
    x, h = torch.randn(2, 3), torch.randn(2, 4)
    path = str(tmp_path / "cell.onnx")
    if dynamo:
        torch.onnx.export(ours, (x, h), dynamo=True, verbose=False).save(path)
    else:
        torch.onnx.export(ours, (x, h), path, dynamo=False, input_names=["x", "h"])
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = dict(zip([i.name for i in session.get_inputs()], (x.numpy(), h.numpy()), strict=True))
    (got,) = session.run(None, feeds)
    torch.testing.assert_close(torch.from_numpy(got), theirs(x, h), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_a_cuda_cell_loop_equals_torch():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    pytest.importorskip("cupy")
    ours, theirs = (m.cuda() for m in pair("LSTMCell", 8, 16))
    xs = torch.randn(6, 4, 8, device="cuda")
    results = []
    for cell in (ours, theirs):
        outs = run_loop(cell, xs, None)
        loss_of(outs).backward()
        results.append([outs[-1][0].detach(), *(p.grad for p in cell.parameters())])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_cell_that_trains_waits_for_the_backwards_loops(monkeypatch):
    """A cell whose backward may follow (grad mode on, weights that require grad) takes numba's step only once
    its training loops are loaded: before, it was chosen as an inference call, so its first backward
    compiled numba's backward on the caller's thread ("auto" never waits)."""
    from arrayrnn.engines import forget_choices
    from arrayrnn.engines.numba import warmup

    monkeypatch.setattr(warmup, "loaded", lambda call: not call.training)   # the inference loops only
    forget_choices()
    cell = LSTMCell(3, 4)
    x = torch.randn(2, 3)
    with torch.no_grad():
        cell(x)
    assert step_engine_of(cell) == "numba"
    cell(x)[0].sum().backward()
    assert step_engine_of(cell) == "reference"
    monkeypatch.setattr(warmup, "loaded", lambda call: True)   # the training loops loaded
    forget_choices()
    cell(x)[0].sum().backward()
    assert step_engine_of(cell) == "numba"
    chosen = cell.__dict__["_prepared"][0][1]
    with torch.no_grad():   # a step chosen for training serves inference: not chosen nor prepared again
        cell(x)
    assert cell.__dict__["_prepared"][0][1] is chosen
    forget_choices()
