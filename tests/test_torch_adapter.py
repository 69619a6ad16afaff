"""arrayrnn.torch.ArrayRNN against nn.LSTM / GRU / RNN (the oracle), gradcheck, zero-copy and state_dict."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import arrayrnn as ar
from arrayrnn.torch import ArrayRNN

TORCH_CLASSES = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN,
                 "rnn_relu": torch.nn.RNN}
CONFIGS = [  # mode, num_layers, bidirectional, proj_size, bias
    ("lstm", 2, True, 0, True),
    ("lstm", 1, False, 2, True),
    ("lstm", 2, True, 2, False),
    ("gru", 2, True, 0, True),
    ("rnn_tanh", 1, True, 0, True),
    ("rnn_relu", 2, False, 0, False),
]


def torch_rnn(mode, input_size, hidden_size, num_layers=1, bidirectional=False, proj_size=0, bias=True,
              batch_first=False):
    kwargs = dict(num_layers=num_layers, bidirectional=bidirectional, bias=bias, batch_first=batch_first)
    if mode == "lstm":
        kwargs["proj_size"] = proj_size
    if mode.startswith("rnn"):
        kwargs["nonlinearity"] = mode.removeprefix("rnn_")
    torch.manual_seed(0)
    return TORCH_CLASSES[mode](input_size, hidden_size, **kwargs).double()


def state_tensors(mode, module, B, gen):
    D = 2 if module.bidirectional else 1
    h_out = getattr(module, "proj_size", 0) or module.hidden_size
    h0 = torch.randn(module.num_layers * D, B, h_out, dtype=torch.float64, generator=gen)
    if mode != "lstm":
        return h0
    return h0, torch.randn(module.num_layers * D, B, module.hidden_size, dtype=torch.float64, generator=gen)


def flat_grad_of(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in module.parameters()])


@pytest.mark.parametrize("mode,layers,bidir,proj,bias", CONFIGS)
def test_outputs_and_gradients_equal_torch(mode, layers, bidir, proj, bias):
    ref = torch_rnn(mode, 3, 4, layers, bidir, proj, bias)
    ours = ArrayRNN.from_torch(ref)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, 3, dtype=torch.float64, generator=gen)
    hx = state_tensors(mode, ref, 3, gen)
    results = []
    for module in (ref, ours):
        xi = x.clone().requires_grad_()
        hxi = tuple(h.clone().requires_grad_() for h in hx) if mode == "lstm" else hx.clone().requires_grad_()
        y, state = module(xi, hxi)
        states = state if mode == "lstm" else (state,)
        weights = torch.linspace(-1, 1, y.numel(), dtype=torch.float64).reshape(y.shape)
        loss = (y * weights).sum() + sum((s * s).sum() for s in states)
        loss.backward()
        hx_grads = [h.grad for h in (hxi if mode == "lstm" else (hxi,))]
        results.append((y, states, xi.grad, hx_grads, flat_grad_of(module)))
    (y0, s0, dx0, dh0, dw0), (y1, s1, dx1, dh1, dw1) = results
    torch.testing.assert_close(y1, y0)
    for a, b in zip(s1, s0, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(dx1, dx0)
    for a, b in zip(dh1, dh0, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(dw1, dw0)


@pytest.mark.parametrize("mode,layers,bidir,proj,bias", CONFIGS)
def test_gradcheck(mode, layers, bidir, proj, bias):
    spec = ar.RNNSpec(mode=mode, input_size=2, hidden_size=3, num_layers=layers, bidirectional=bidir,
                      proj_size=proj, bias=bias, dtype="float64")
    module = ArrayRNN(spec, seed=3)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 3, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    lengths = torch.tensor([4, 1, 3])
    hx = state_tensors(mode, torch_rnn(mode, 2, 3, layers, bidir, proj, bias), 3, gen)
    hx = tuple(h.requires_grad_() for h in hx) if mode == "lstm" else (hx.requires_grad_(),)

    def fn(flat, x, *states):  # the parameter swapped for `flat`, so gradcheck differentiates it too
        y, state = torch.func.functional_call(module, {"flat": flat}, (x, hx_of(mode, states)),
                                              {"lengths": lengths})
        return (y, *state) if mode == "lstm" else (y, state)

    flat = module.flat.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(fn, (flat, x, *hx), eps=1e-6, atol=1e-6)


def hx_of(mode, states):
    return tuple(states) if mode == "lstm" else states[0]


def test_parameters_is_one_flat_buffer_like_torchs():
    module = ArrayRNN("lstm", 3, 4, num_layers=2, bidirectional=True, proj_size=2, dtype=torch.float64)
    ref = torch_rnn("lstm", 3, 4, 2, True, 2)
    (param,) = module.parameters()
    assert param.shape == (sum(p.numel() for p in ref.parameters()),)
    assert param.dtype == torch.float64 and module.spec.dtype == "float64"
    assert module.float().spec.dtype == "float32"


def test_nn_rnn_style_construction_matches_nn_rnn():
    ours = ArrayRNN("rnn", 3, 4, num_layers=2, nonlinearity="relu", dtype=torch.float64, seed=5)
    assert ours.spec.mode == "rnn_relu"
    ref = torch_rnn("rnn_relu", 3, 4, 2)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    y, h = ours(x)
    y_ref, h_ref = ref(x)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(h, h_ref)


def test_constructor_draws_from_torchs_generator():
    torch.manual_seed(7)
    a = ArrayRNN("gru", 3, 4)
    torch.manual_seed(7)
    b = ArrayRNN("gru", 3, 4)
    torch.testing.assert_close(a.flat, b.flat)
    assert float(a.flat.detach().abs().max()) <= 0.5  # uniform(-1/sqrt(H), 1/sqrt(H)), H = 4


@pytest.mark.parametrize("batch_first", [False, True])
def test_lengths_equal_torch_on_packed_input(batch_first):
    ref = torch_rnn("lstm", 3, 4, 2, True, batch_first=batch_first)
    ours = ArrayRNN.from_torch(ref)
    assert ours.batch_first == batch_first
    x = torch.randn((3, 6, 3) if batch_first else (6, 3, 3), dtype=torch.float64)
    lengths = torch.tensor([2, 6, 4])
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    y_ref, (h_ref, c_ref) = ref(packed)
    y_ref, _ = pad_packed_sequence(y_ref, batch_first=batch_first, total_length=6)
    y, (h, c) = ours(x, lengths=lengths)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(c, c_ref)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_packed_sequence_in_and_out(mode):
    ref = torch_rnn(mode, 3, 4, 2, True)
    ours = ArrayRNN.from_torch(ref)
    x = torch.randn(5, 4, 3, dtype=torch.float64)
    lengths = torch.tensor([3, 5, 1, 3])
    outs = []
    for module in (ref, ours):
        xi = x.clone().requires_grad_()
        packed = pack_padded_sequence(xi, lengths, enforce_sorted=False)
        y, state = module(packed)
        assert isinstance(y, torch.nn.utils.rnn.PackedSequence)
        h = state[0] if mode == "lstm" else state
        (y.data.sum() + (h * h).sum()).backward()
        outs.append((y, h, xi.grad, flat_grad_of(module)))
    (y0, h0, dx0, dw0), (y1, h1, dx1, dw1) = outs
    torch.testing.assert_close(y1.data, y0.data)
    assert torch.equal(y1.batch_sizes, y0.batch_sizes)
    assert torch.equal(y1.sorted_indices, y0.sorted_indices)
    assert torch.equal(y1.unsorted_indices, y0.unsorted_indices)
    torch.testing.assert_close(h1, h0)
    torch.testing.assert_close(dx1, dx0)
    torch.testing.assert_close(dw1, dw0)


def test_adam_steps_equal_torch():
    ref = torch_rnn("lstm", 3, 5, 2, True)
    ours = ArrayRNN.from_torch(ref)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=0.01)
    opt_ours = torch.optim.Adam(ours.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(4)
    batches = [(torch.randn(6, 2, 3, dtype=torch.float64, generator=gen),
                torch.randn(6, 2, 10, dtype=torch.float64, generator=gen)) for _ in range(4)]
    for module, opt in ((ref, opt_ref), (ours, opt_ours)):
        for x, target in batches:
            opt.zero_grad()
            y, _ = module(x)
            torch.nn.functional.mse_loss(y, target).backward()
            opt.step()
    flat_ref = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    torch.testing.assert_close(ours.flat.detach(), flat_ref)
    assert not torch.equal(ours.flat.detach(), ArrayRNN.from_torch(torch_rnn("lstm", 3, 5, 2, True)).flat)


def test_engine_receives_views_not_copies(monkeypatch):
    module = ArrayRNN("lstm", 3, 4, dtype=torch.float64, seed=0)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    seen = {}
    real_forward = ar.rnn_forward

    def spy(params, x_arr, *args, **kwargs):
        seen["params"], seen["x"] = params.data, x_arr
        seen["res"] = res = real_forward(params, x_arr, *args, **kwargs)
        return res

    monkeypatch.setattr(ar, "rnn_forward", spy)
    y, (h, c) = module(x)
    assert seen["params"].ctypes.data == module.flat.data_ptr()
    assert seen["x"].ctypes.data == x.data_ptr()
    assert y.data_ptr() == seen["res"].y.ctypes.data and h.data_ptr() == seen["res"].h_n.ctypes.data


def test_state_dict_has_torchs_keys_both_ways():
    ref = torch_rnn("lstm", 3, 4, 2, True, 2)
    ours = ArrayRNN("lstm", 3, 4, num_layers=2, bidirectional=True, proj_size=2, dtype=torch.float64, seed=9)
    state = ours.state_dict()
    assert list(state) == list(ref.state_dict())
    ref.load_state_dict(state)
    x = torch.randn(4, 2, 3, dtype=torch.float64)
    torch.testing.assert_close(ref(x)[0], ours(x)[0])
    fresh = ArrayRNN("lstm", 3, 4, num_layers=2, bidirectional=True, proj_size=2, dtype=torch.float64, seed=1)
    fresh.load_state_dict(ref.state_dict())
    torch.testing.assert_close(fresh.flat, ours.flat)
    wrapped = torch.nn.Sequential(ours)  # nested prefix "0."
    assert list(wrapped.state_dict())[0] == "0.weight_ih_l0"
    torch.nn.Sequential(fresh).load_state_dict(wrapped.state_dict())


def test_strict_load_refuses_a_nested_unexpected_key_like_nn_gru():
    ours, theirs = ArrayRNN("gru", 3, 4, dtype=torch.float64), torch_rnn("gru", 3, 4)
    state = {f"0.{k}": v for k, v in theirs.state_dict().items()}
    for module in (ours, theirs):
        with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "0.foo.bar"'):
            torch.nn.Sequential(module).load_state_dict({**state, "0.foo.bar": torch.zeros(1)})
    torch.nn.Sequential(ours).load_state_dict({**state, "0.foo.bar": torch.zeros(1)}, strict=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_in_float32(dtype):
    module = ArrayRNN("lstm", 3, 4, dtype=torch.float32, seed=0)
    x = torch.randn(5, 2, 3)
    y32, _ = module(x)
    module.to(dtype)
    y, (h, c) = module(x.to(dtype))
    assert y.dtype == h.dtype == dtype and module.spec.dtype == "float32"
    torch.testing.assert_close(y.float(), y32, atol=2e-2, rtol=0)


def test_meta_tensors_give_shapes():
    module = ArrayRNN("gru", 3, 4, num_layers=2, bidirectional=True, seed=0).to("meta")
    y, h = module(torch.randn(5, 2, 3, device="meta"))
    assert y.shape == (5, 2, 8) and h.shape == (4, 2, 4) and y.device.type == "meta"


def test_shape_errors_are_runtime_errors_too():
    module = ArrayRNN("lstm", 3, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="x has shape") as info:
        module(torch.randn(5, 3, dtype=torch.float64))
    assert isinstance(info.value, ValueError)
    with pytest.raises(RuntimeError, match="T = 0"):
        module(torch.randn(0, 2, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="expected the module's dtype"):
        module(torch.randn(5, 2, 3, dtype=torch.float16))


def test_empty_batch():
    module = ArrayRNN("rnn_relu", 3, 4, num_layers=2, dtype=torch.float64)
    y, h = module(torch.randn(5, 0, 3, dtype=torch.float64))
    assert y.shape == (5, 0, 4) and h.shape == (2, 0, 4)
    y.sum().backward()
    assert torch.equal(module.flat.grad, torch.zeros_like(module.flat))


def test_torch_compile_and_load_weights_only():
    import io

    module = ArrayRNN("gru", 3, 4, num_layers=2, seed=0)
    x, lengths = torch.randn(5, 2, 3), torch.tensor([5, 2])
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, lengths=lengths)[0], module(x, lengths=lengths)[0])
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    torch.testing.assert_close(loaded(x)[0], module(x)[0])


def test_load_state_dict_reports_missing_unexpected_and_shapes():
    ours = ArrayRNN("gru", 3, 4, dtype=torch.float64)
    state = torch_rnn("gru", 3, 4).state_dict()
    with pytest.raises(RuntimeError, match="Missing key.*bias_hh_l0"):
        ours.load_state_dict({k: v for k, v in state.items() if k != "bias_hh_l0"})
    with pytest.raises(RuntimeError, match="Unexpected key.*weight_ih_l1"):
        ours.load_state_dict({**state, "weight_ih_l1": state["weight_ih_l0"]})
    with pytest.raises(RuntimeError, match=r"weight_hh_l0 has shape \(12, 5\); expected \(12, 4\)"):
        ours.load_state_dict({**state, "weight_hh_l0": torch.zeros(12, 5, dtype=torch.float64)})


@pytest.mark.parametrize("mode,layers,bidir,proj,bias", CONFIGS + [("gru", 1, False, 0, "single_rec")])
def test_gradgradcheck(mode, layers, bidir, proj, bias):
    """Double backward: the differentiable torch-op path (create_graph=True) against finite differences."""
    spec = ar.RNNSpec(mode=mode, input_size=2, hidden_size=3, num_layers=layers, bidirectional=bidir,
                      proj_size=proj, bias=bias, dtype="float64")
    module = ArrayRNN(spec, seed=3)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 2, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    lengths = torch.tensor([2, 1])

    def fn(flat, x):
        y, state = torch.func.functional_call(module, {"flat": flat}, (x,), {"lengths": lengths})
        return (y, *state) if mode == "lstm" else (y, state)

    flat = module.flat.detach().clone().requires_grad_()
    assert torch.autograd.gradgradcheck(fn, (flat, x), eps=1e-6, atol=1e-5)


def test_double_backward_equals_first_order_and_reaches_every_input():
    module = ArrayRNN("lstm", 2, 3, num_layers=2, dtype=torch.float64, seed=0)
    x = torch.randn(3, 2, 2, dtype=torch.float64, requires_grad=True)
    y, _ = module(x)
    (dx,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    (dx_plain,) = torch.autograd.grad((module(x)[0] ** 2).sum(), x)  # the fused engines' BPTT
    torch.testing.assert_close(dx, dx_plain)
    dx.pow(2).sum().backward()
    assert module.flat.grad.abs().sum() > 0 and x.grad.abs().sum() > 0


def test_differentiable_path_uses_the_engines_dropout_masks():
    module = ArrayRNN("gru", 3, 4, num_layers=3, dropout=0.5, dtype=torch.float64, seed=0)
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    y, _ = module(x, seed=7)
    (dx_engine,) = torch.autograd.grad(y.sum(), x)
    y, _ = module(x, seed=7)
    (dx_torch,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    torch.testing.assert_close(dx_torch, dx_engine)


def test_dropout_seed_comes_from_torchs_generator():
    module = ArrayRNN("lstm", 3, 4, num_layers=3, dropout=0.5, dtype=torch.float64, seed=0)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    torch.manual_seed(11)
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    torch.manual_seed(11)
    y_train, _ = module(x)
    params = ar.PackedParams(module.spec, module.flat.detach().numpy())
    expected = ar.rnn_forward(params, x.numpy(), training=True, seed=seed).y
    np.testing.assert_allclose(y_train.detach().numpy(), expected, rtol=1e-12)
    module.eval()
    y_eval, _ = module(x)
    ref = torch_rnn("lstm", 3, 4, 3)
    ref.load_state_dict(module.state_dict())
    torch.testing.assert_close(y_eval, ref.eval()(x)[0])
    assert not torch.allclose(y_train, y_eval)


def test_eval_mode_gradients_equal_training_mode():
    module = ArrayRNN("gru", 3, 4, dtype=torch.float64, seed=2)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    grads = []
    for training in (True, False):
        module.train(training)
        module.zero_grad()
        module(x)[0].pow(2).sum().backward()
        grads.append(module.flat.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("call,error,match", [
    (lambda m: m(torch.randn(5, 3, dtype=torch.float64)), ValueError, "x has shape"),
    (lambda m: m(torch.randn(5, 2, 3, dtype=torch.float32)), TypeError, "float32"),
    (lambda m: m(torch.randn(5, 2, 7, dtype=torch.float64)), ValueError, "input_size"),
    (lambda m: m(torch.randn(5, 2, 3, dtype=torch.float64), torch.zeros(1, 2, 4, dtype=torch.float64)),
     TypeError, r"expected \(h0, c0\)"),
    (lambda m: m(torch.randn(5, 2, 3, dtype=torch.float64), lengths=torch.tensor([6, 1])), ValueError,
     "lengths"),
    (lambda m: m(pack_padded_sequence(torch.randn(5, 2, 3, dtype=torch.float64), torch.tensor([5, 2])),
                 lengths=torch.tensor([5, 2])), ValueError, "PackedSequence"),
    (lambda m: m(np.zeros((5, 2, 3))), TypeError, "x has type ndarray"),
    (lambda m: m(torch.randn(5, 2, 3, dtype=torch.float64), (torch.zeros(2, 2, 4, dtype=torch.float64),
                                                              torch.zeros(1, 2, 4, dtype=torch.float64))),
     ValueError, "h0 has shape"),
    (lambda m: m(torch.randn(5, 2, 3, dtype=torch.float64), engine="fast"), ValueError, "fast"),
])
def test_bad_input_is_a_clear_error(call, error, match):
    module = ArrayRNN("lstm", 3, 4, dtype=torch.float64)
    with pytest.raises(error, match=match):
        call(module)


def test_bad_construction_is_a_clear_error():
    with pytest.raises(ValueError, match="mode = 'lstmx'"):
        ArrayRNN("lstmx", 3, 4)
    with pytest.raises(ValueError, match="input_size = None"):
        ArrayRNN("lstm")
    with pytest.raises(ValueError, match="hidden_size"):
        ArrayRNN("lstm", 3, 0)
    gru = ArrayRNN("gru", 3, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match="expected a tensor h0 for gru"):
        gru(torch.randn(5, 2, 3, dtype=torch.float64), (torch.zeros(1, 2, 4, dtype=torch.float64),))
    with pytest.raises(ValueError, match="nonlinearity = 'sigmoid'"):
        ArrayRNN("rnn", 3, 4, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="given with an RNNSpec"):
        ArrayRNN(ar.RNNSpec(mode="gru", input_size=3, hidden_size=4), 3, 4)
    with pytest.raises(TypeError, match="expected torch.nn.RNN, LSTM or GRU"):
        ArrayRNN.from_torch(torch.nn.Linear(2, 3))


def _cuda_reason() -> str | None:
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "cupy is not installed (the gpu extra)"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_reason() is not None, reason=str(_cuda_reason()))
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_cuda_tensors_equal_cpu(mode):
    cpu = ArrayRNN(mode, 3, 4, num_layers=2, bidirectional=True, dtype=torch.float64, seed=0)
    gpu = ArrayRNN(mode, 3, 4, num_layers=2, bidirectional=True, dtype=torch.float64, seed=0).cuda()
    x = torch.randn(6, 3, 3, dtype=torch.float64)
    lengths = torch.tensor([6, 2, 4])
    results = []
    for module, device in ((cpu, "cpu"), (gpu, "cuda")):
        xi = x.detach().to(device).requires_grad_()  # a leaf on each device (x itself stays grad-free)
        y, _ = module(xi, lengths=lengths)
        assert y.device.type == device
        (y * y).sum().backward()
        results.append((y.cpu(), xi.grad.cpu(), module.flat.grad.cpu()))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_reason() is not None, reason=str(_cuda_reason()))
def test_cuda_runs_on_torchs_current_stream_without_copies(monkeypatch):
    import cupy

    module = ArrayRNN("lstm", 3, 4, dtype=torch.float32, seed=0).cuda()
    x = torch.randn(5, 2, 3, device="cuda")
    seen = {}
    real_forward = ar.rnn_forward

    def spy(params, x_arr, *args, **kwargs):
        seen["stream"] = cupy.cuda.get_current_stream().ptr
        seen["params"], seen["x"] = params.data.data.ptr, x_arr.data.ptr
        return real_forward(params, x_arr, *args, **kwargs)

    monkeypatch.setattr(ar, "rnn_forward", spy)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y, _ = module(x)
        y.sum().backward()
    torch.cuda.synchronize()
    assert seen["stream"] == stream.cuda_stream
    assert seen["params"] == module.flat.data_ptr() and seen["x"] == x.data_ptr()
    assert module.flat.grad.isfinite().all()


def test_bench_adapter_quick_runs(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "bench_adapter.py"
    spec = importlib.util.spec_from_file_location("bench_adapter", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--quick", "--no-jax"])
    out = capsys.readouterr().out
    assert "| direct |" in out and "| torch |" in out and "| dropin |" in out


def test_sorted_packed_sequence_batch_first():
    ref = torch_rnn("gru", 3, 4, 1, True, batch_first=True)
    ours = ArrayRNN.from_torch(ref)
    packed = pack_padded_sequence(torch.randn(3, 5, 3, dtype=torch.float64), torch.tensor([5, 4, 2]),
                                  batch_first=True, enforce_sorted=True)
    (y_ref, h_ref), (y, h) = ref(packed), ours(packed)
    assert y.sorted_indices is None and torch.equal(y.batch_sizes, y_ref.batch_sizes)
    torch.testing.assert_close(y.data, y_ref.data)
    torch.testing.assert_close(h, h_ref)


def test_in_place_change_before_backward_is_torchs_error():
    module = ArrayRNN("lstm", 2, 3, dtype=torch.float64)
    x = torch.randn(3, 2, 2, dtype=torch.float64)
    y, _ = module(x)
    with torch.no_grad():
        module.flat.add_(1.0)  # e.g. an optimizer step between forward and backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def _run_exported_in_onnxruntime(module, x, dynamo, tmp_path):
    """``module`` exported on ``x`` (dynamo or TorchScript exporter), then run in onnxruntime on ``x``."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    path = str(tmp_path / "m.onnx")
    if dynamo:
        torch.onnx.export(module, (x,), dynamo=True, verbose=False).save(path)
    else:
        torch.onnx.export(module, (x,), path, dynamo=False, input_names=["x"])
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
@pytest.mark.parametrize("dynamo", [True, False])
def test_onnx_export_of_array_rnn_runs_in_onnxruntime_like_the_module(dynamo, tmp_path):
    module = ArrayRNN("lstm", 3, 4, num_layers=2, bidirectional=True, seed=0).eval()
    x = torch.randn(5, 2, 3)
    got = _run_exported_in_onnxruntime(module, x, dynamo, tmp_path)
    y, (h, c) = module(x)
    for a, b in zip(got, (y, h, c), strict=True):
        np.testing.assert_allclose(a, b.detach().numpy(), atol=1e-5)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_legacy_onnx_export_of_a_packed_sequence_through_array_rnn(mode):
    """pack_padded_sequence -> ArrayRNN -> pad_packed_sequence exports with the pair kept around the ONNX
    nodes (the lengths become sequence_lens), as nn.LSTM's does; unsorted lengths, initial states."""
    ort = pytest.importorskip("onnxruntime")
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class Packed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = ArrayRNN(mode, 3, 4, num_layers=2, bidirectional=True, seed=0)

        def forward(self, x, h0, lengths):
            hx = (h0, h0 * 0.5) if mode == "lstm" else h0
            y, state = self.rnn(pack_padded_sequence(x, lengths, enforce_sorted=False), hx)
            h_n = state[0] if mode == "lstm" else state
            return pad_packed_sequence(y)[0], h_n

    model = Packed().eval()
    x, h0, lengths = torch.randn(6, 3, 3), torch.randn(4, 3, 4), torch.tensor([4, 6, 2], dtype=torch.int32)
    buffer = io.BytesIO()
    torch.onnx.export(model, (x, h0, lengths), buffer, dynamo=False, input_names=["x", "h0", "lengths"])
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x.numpy(), "h0": h0.numpy(), "lengths": lengths.numpy()})
    with torch.no_grad():
        want = model(x, h0, lengths)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
def test_jit_trace_of_array_rnn_saves_and_loads(tmp_path):
    module = ArrayRNN("gru", 3, 4, num_layers=2, seed=0)
    traced = torch.jit.trace(module, (torch.randn(5, 2, 3),))
    traced.save(str(tmp_path / "m.pt"))
    loaded = torch.jit.load(str(tmp_path / "m.pt"))
    x = torch.randn(7, 3, 3)
    torch.testing.assert_close(loaded(x)[0], module(x)[0])


def test_peephole_lstm_on_the_torch_op_paths_equals_the_engines():
    """Gradients of gradients, torch.func and an empty batch run the torch-op recurrence: with peepholes
    (i, f see the previous cell state, o the new one) it must compute what rnn_forward computes."""
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4, num_layers=2, bidirectional=True,
                      peepholes=True, dtype="float64")
    module = ArrayRNN(spec, seed=0)
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    params = ar.PackedParams(spec, module.flat.detach().numpy())
    np.testing.assert_allclose(module(x)[0].detach().numpy(), ar.rnn_forward(params, x.detach().numpy()).y,
                               atol=1e-12)
    batched = torch.func.vmap(lambda z: module(z)[0])(x.detach()[None])[0]  # the torch-op forward
    torch.testing.assert_close(batched, module(x)[0].detach())
    first = torch.autograd.grad(module(x)[0].square().sum(), x)[0]  # the engines' BPTT
    differentiable = torch.autograd.grad(module(x)[0].square().sum(), x, create_graph=True)[0]
    torch.testing.assert_close(differentiable, first)
    assert torch.autograd.gradgradcheck(lambda z: module(z)[0], (x,))


def test_torch_op_path_refuses_zoneout_clearly():
    spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=4, zoneout=0.1)
    module = ArrayRNN(spec, seed=0)
    with pytest.raises(ValueError, match="zoneout.*torch-op recurrence"):
        module(torch.randn(5, 0, 3))


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
@pytest.mark.parametrize("dynamo", [True, False])
def test_onnx_export_of_a_peephole_lstm_runs_in_onnxruntime_like_the_module(dynamo, tmp_path):
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4, bidirectional=True, peepholes=True)
    module = ArrayRNN(spec, seed=0).eval()
    x = torch.randn(5, 2, 3)
    got = _run_exported_in_onnxruntime(module, x, dynamo, tmp_path)
    for a, b in zip(got, (module(x)[0], *module(x)[1]), strict=True):
        np.testing.assert_allclose(a, b.detach().numpy(), atol=1e-5)


def test_state_dict_of_a_peephole_lstm_round_trips():
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4, bidirectional=True, peepholes=True)
    module, other = ArrayRNN(spec, seed=0), ArrayRNN(spec, seed=1)
    state = module.state_dict()
    assert "weight_peephole_l0_reverse" in state and state["weight_peephole_l0"].shape == (3, 4)
    other.load_state_dict(state)
    torch.testing.assert_close(other.flat, module.flat)
