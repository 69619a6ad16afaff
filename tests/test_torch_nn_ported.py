"""PyTorch's own RNN tests from ``test/test_nn.py`` (torch 2.13), ported to ``arrayrnn.torch.LSTM/GRU/RNN``.

Paraphrased, not copied: each test below keeps the PyTorch test's name and checks what it checks, with
``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` replaced by the drop-in classes. Where the original compares a CPU
module with a cuDNN one, the port compares ``nn.*`` (CPU, the oracle) with ours; where it loops over
CPU and CUDA, the port runs the CPU half.

All 22 CPU-applicable RNN tests of test_nn.py are here: test_RNN_nonlinearity,
test_RNN_nonlinearity_passed_as_arg, test_rnn_weight_norm, test_cudnn_forward_exception,
test_rnn_args_check, test_projections_lstm_args_check, test_rnn_initial_hidden_state,
test_projections_lstm_initial_hidden_state, test_projections_errors_on_gru_and_rnn,
test_RNN_cpu_vs_cudnn_no_dropout, test_RNN_cpu_vs_cudnn_with_dropout, test_RNN_dropout,
test_error_RNN_seq_len_zero, test_RNN_input_size_zero, test_RNN_dropout_state, test_RNN_change_dropout,
test_save_lstm_compatibility, test_rnn_retain_variables, test_LSTM_grad_and_gradgrad,
test_GRU_grad_and_gradgrad, test_LSTM_differentiable_backward_using_oneDNN, test_variable_sequence; and,
on CPU, the CPU halves of the CUDA-only test_RNN_cudnn_weight_norm, test_partial_flat_weights,
test_cudnn_weight_format (a weight moved out of the one buffer), test_cudnn_weight_tying (a tied reverse
bias) and test_rnn_fused (CUDA's fused cells against the CPU path: here nn.* on CPU against ours).

The cell tests, against ``arrayrnn.torch.LSTMCell`` / ``GRUCell`` / ``RNNCell``: test_RNN_cell,
test_RNN_cell_forward_zero_hidden_size, test_RNN_cell_no_broadcasting, test_LSTM_cell,
test_LSTM_cell_forward_input_size, test_LSTM_cell_forward_hidden_size and the CPU half of the CUDA-only
test_lstmcell_backward_only_one_output_grad (TestNNDeviceType); the smoke tests among them also compare
with ``nn``'s cells. From torch/testing/_internal/common_modules.py, the cells' ModuleInfo samples:
their error inputs (module_error_inputs_torch_nn_RNN_GRU_Cell / _LSTMCell: exception types and messages)
and their no-batch-dimension inputs (module_inputs_torch_nn_RNN_GRU_Cell / _LSTMCell, checked as
no_batch_dim_reference_fn checks them).

Not ported (CUDA-only: multi-GPU device checks, CUDA-side packing): test_cudnn_rnn_dropout_states_device,
test_rnn_check_device, test_projections_lstm_check_device, test_pack_sequence_batch_sizes_throw.
"""

from __future__ import annotations

import copy
import io
import itertools
import re

import pytest
import torch
import torch.nn.utils.rnn as rnn_utils
from torch import nn

from arrayrnn.torch import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell

OURS = {"RNN": RNN, "GRU": GRU, "LSTM": LSTM}
THEIRS = {"RNN": nn.RNN, "GRU": nn.GRU, "LSTM": nn.LSTM}
OUR_CELLS = {"RNNCell": RNNCell, "GRUCell": GRUCell, "LSTMCell": LSTMCell}
THEIR_CELLS = {"RNNCell": nn.RNNCell, "GRUCell": nn.GRUCell, "LSTMCell": nn.LSTMCell}


def test_RNN_nonlinearity():
    assert RNN(1, 10).nonlinearity == "tanh"
    assert RNN(1, 10, nonlinearity="relu").nonlinearity == "relu"
    with pytest.raises(ValueError, match="Unknown nonlinearity"):
        RNN(1, 10, nonlinearity="garbage")


def test_RNN_nonlinearity_passed_as_arg():
    assert RNN(2, 3, 1, "relu").nonlinearity == "relu"


def test_rnn_weight_norm():
    def check(module, name, n_params):
        module = nn.utils.weight_norm(module, name=name)
        assert sum(isinstance(w, nn.Parameter) for w in module._flat_weights) == n_params - 1
        module = nn.utils.remove_weight_norm(module, name=name)
        assert sum(isinstance(w, nn.Parameter) for w in module._flat_weights) == n_params
        named = dict(module.named_parameters())
        assert module._parameters.get(name) is not None and named.get(name) is not None
        for suffix in ("_v", "_g"):
            assert name + suffix not in module._parameters and name + suffix not in named

    check(LSTM(32, 32), "weight_ih_l0", 4)
    check(LSTM(32, 32, proj_size=16), "weight_hr_l0", 5)


def test_cudnn_forward_exception():
    cases = [(LSTM(10, 20, batch_first=True), (torch.zeros(1, 2, 19), torch.zeros(1, 2, 19))),
             (LSTM(10, 20, batch_first=True, proj_size=10), (torch.zeros(1, 2, 19), torch.zeros(1, 2, 19))),
             (GRU(10, 20, batch_first=True), torch.zeros(1, 2, 19)),
             (RNN(10, 20, batch_first=True), torch.zeros(1, 2, 19))]
    for module, hidden in cases:
        with pytest.raises(RuntimeError, match="Expected hidden.*size.*got"):
            module(torch.randn(2, 3, 10), hidden)
        with pytest.raises(RuntimeError, match=re.escape("input.size(-1) must be equal to input_size")):
            module(torch.randn(2, 3, 3))


def _reshape(shape, axis, size):
    return tuple(size if i == axis else s for i, s in enumerate(shape))


def test_rnn_args_check():
    I, H, L, B, T, bad = 3, 5, 2, 4, 6, 7
    good_x, good_h = (T, B, I), (L, B, H)

    def inputs(mode, x_shape, h_shape):
        x, h = torch.randn(x_shape), torch.randn(h_shape)
        if mode != "LSTM":
            return [(x, h)]
        if h_shape == good_h:
            return [(x, (h, h))]
        ok = torch.randn(good_h)
        return [(x, (h, ok)), (x, (ok, h))]

    for mode in OURS:
        for x_shape, h_shape in [(_reshape(good_x, 1, bad), good_h), (good_x, _reshape(good_h, 1, bad)),
                                 (_reshape(good_x, 2, bad), good_h), (good_x, _reshape(good_h, 2, bad)),
                                 (good_x, _reshape(good_h, 0, bad))]:
            for x, hidden in inputs(mode, x_shape, h_shape):
                with pytest.raises(RuntimeError):
                    OURS[mode](I, H, L)(x, hidden)


def test_projections_lstm_args_check():
    I, H, P, L, B, T, bad = 3, 5, 2, 2, 4, 6, 7
    good_x, good_h, good_c = (T, B, I), (L, B, P), (L, B, H)
    cases = [(_reshape(good_x, 1, bad), good_h, good_c),
             (good_x, _reshape(good_h, 1, bad), _reshape(good_c, 1, bad)),
             (_reshape(good_x, 2, bad), good_h, good_c),
             (good_x, _reshape(good_h, 2, bad), _reshape(good_c, 2, bad)),
             (good_x, _reshape(good_h, 0, bad), _reshape(good_c, 0, bad)),
             (good_x, _reshape(good_h, 0, H), good_c),
             (good_x, _reshape(good_h, 0, bad), good_c),
             (good_x, good_h, _reshape(good_c, 0, bad))]
    for x_shape, h_shape, c_shape in cases:
        module = LSTM(I, H, L, proj_size=P)
        with pytest.raises(RuntimeError):
            module(torch.randn(x_shape), (torch.randn(h_shape), torch.randn(c_shape)))


def test_rnn_initial_hidden_state():
    for mode in OURS:
        module = OURS[mode](30, 20, 2)
        x = torch.randn(10, 32, 30)
        zeros = torch.zeros(2, 32, 20)
        y1, h1 = module(x, (zeros, zeros) if mode == "LSTM" else zeros)
        y2, h2 = module(x)
        torch.testing.assert_close(y1, y2)
        torch.testing.assert_close(h1, h2)


def test_projections_lstm_initial_hidden_state():
    for bidirectional in (False, True):
        D = 2 if bidirectional else 1
        module = LSTM(30, 20, 2, bidirectional=bidirectional, proj_size=10)
        x = torch.randn(10, 32, 30)
        y1, h1 = module(x, (torch.zeros(2 * D, 32, 10), torch.zeros(2 * D, 32, 20)))
        y2, h2 = module(x)
        torch.testing.assert_close(y1, y2)
        torch.testing.assert_close(h1, h2)


def test_projections_errors_on_gru_and_rnn():
    for cls in (RNN, GRU):
        with pytest.raises(ValueError, match="proj_size argument is only supported for LSTM, not RNN or GRU"):
            cls(30, 20, 2, proj_size=10)


# -- test_RNN_cpu_vs_cudnn_*: nn.* on CPU (the oracle) against ours, float64, 258 configurations -----
def _forward_backward(module, x_val, grad_y, weights, h_val, grad_h, c_val=None, grad_c=None):
    lstm = module.mode == "LSTM"
    with torch.no_grad():
        for ours, theirs in zip(module.all_weights, weights, strict=True):
            for w, v in zip(ours, theirs, strict=True):
                w.copy_(v)
    if isinstance(x_val, rnn_utils.PackedSequence):
        x = rnn_utils.PackedSequence(x_val.data.clone().requires_grad_(), x_val.batch_sizes)
        leaf = x.data
    else:
        x = leaf = x_val.clone().requires_grad_()
    if lstm:
        hx = (h_val.clone().requires_grad_(), (c_val if c_val is not None else h_val).add(1).requires_grad_())
    else:
        hx = h_val.clone().requires_grad_()
    y, state = module(x, hx)
    y = y.data if isinstance(y, rnn_utils.PackedSequence) else y
    if lstm:
        torch.autograd.backward([y, state[0], state[1]],
                                [grad_y, grad_h, (grad_c if grad_c is not None else grad_h) + 1])
    else:
        torch.autograd.backward([y, state], [grad_y, grad_h])
    return {"y": y.detach(), "h": (state[0] if lstm else state).detach(),
            "c": state[1].detach() if lstm else None, "dx": leaf.grad,
            "dh": (hx[0] if lstm else hx).grad, "dc": hx[1].grad if lstm else None,
            "dw": [w.grad for layer in module.all_weights for w in layer]}


def _compare(theirs, ours):
    for key in ("y", "h", "c", "dx", "dh", "dc"):
        if theirs[key] is None:
            assert ours[key] is None
            continue
        torch.testing.assert_close(ours[key], theirs[key], atol=5e-5, rtol=0, msg=key)
    for a, b in zip(ours["dw"], theirs["dw"], strict=True):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=0)


def _noncontiguous(t):
    return torch.stack([torch.zeros_like(t), t], t.dim()).select(t.dim(), 1)


def _cpu_vs_ours(dropout):
    I, H, P, L, T, B = 10, 6, 3, 2, 7, 6
    dtype = torch.float64

    def pair(mode, *args, **kwargs):
        return THEIRS[mode](*args, **kwargs).to(dtype), OURS[mode](*args, **kwargs).to(dtype)

    def run(modules, x, grad_y, h, grad_h, c=None, grad_c=None):
        theirs, ours = modules
        weights = [[w.detach().clone() for w in layer] for layer in theirs.all_weights]
        _compare(_forward_backward(theirs, x, grad_y, weights, h, grad_h, c, grad_c),
                 _forward_backward(ours, x, grad_y, weights, h, grad_h, c, grad_c))

    for mode, (bias, bidir, batch_first, contiguous, variable, lens_tensor) in itertools.product(
            ("RNN", "LSTM", "GRU"), itertools.product((True, False), repeat=6)):
        D = 2 if bidir else 1
        x = torch.randn((B, T, I) if batch_first else (T, B, I), dtype=dtype)
        grad_y = torch.randn((B, T, H * D) if batch_first else (T, B, H * D), dtype=dtype)
        h, grad_h = torch.randn(L * D, B, H, dtype=dtype), torch.randn(L * D, B, H, dtype=dtype)
        if not contiguous:
            grad_y, grad_h, h = _noncontiguous(grad_y), _noncontiguous(grad_h), _noncontiguous(h)
        if variable:
            lengths = [7, 5, 5, 2, 1, 1]
            lengths = torch.tensor(lengths) if lens_tensor else lengths
            x = rnn_utils.pack_padded_sequence(x, lengths, batch_first=batch_first)
            grad_y = rnn_utils.pack_padded_sequence(grad_y, lengths, batch_first=batch_first).data
        kwargs = dict(bias=bias, dropout=dropout, bidirectional=bidir, batch_first=batch_first)
        run(pair(mode, I, H, L, **kwargs), x, grad_y, h, grad_h)

    for nonlinearity in ("tanh", "relu"):
        x, grad_y = torch.randn(T, B, I, dtype=dtype), torch.randn(T, B, H, dtype=dtype)
        h, grad_h = torch.randn(L, B, H, dtype=dtype), torch.randn(L, B, H, dtype=dtype)
        run(pair("RNN", I, H, L, nonlinearity=nonlinearity), x, grad_y, h, grad_h)

    for bias, bidir, batch_first, contiguous, variable, lens_tensor in itertools.product((True, False),
                                                                                         repeat=6):
        D = 2 if bidir else 1
        x = torch.randn((B, T, I) if batch_first else (T, B, I), dtype=dtype)
        grad_y = torch.randn((B, T, P * D) if batch_first else (T, B, P * D), dtype=dtype)
        h, grad_h = torch.randn(L * D, B, P, dtype=dtype), torch.randn(L * D, B, P, dtype=dtype)
        c, grad_c = torch.randn(L * D, B, H, dtype=dtype), torch.randn(L * D, B, H, dtype=dtype)
        if not contiguous:
            grad_y, grad_h, grad_c = map(_noncontiguous, (grad_y, grad_h, grad_c))
            h, c = _noncontiguous(h), _noncontiguous(c)
        if variable:
            lengths = [7, 5, 5, 2, 1, 1]
            lengths = torch.tensor(lengths) if lens_tensor else lengths
            x = rnn_utils.pack_padded_sequence(x, lengths, batch_first=batch_first)
            grad_y = rnn_utils.pack_padded_sequence(grad_y, lengths, batch_first=batch_first).data
        kwargs = dict(bias=bias, dropout=dropout, bidirectional=bidir, batch_first=batch_first, proj_size=P)
        run(pair("LSTM", I, H, L, **kwargs), x, grad_y, h, grad_h, c, grad_c)


def test_RNN_cpu_vs_cudnn_no_dropout():
    _cpu_vs_ours(0)


def test_RNN_cpu_vs_cudnn_with_dropout():
    _cpu_vs_ours(1)  # p = 1 drops every inter-layer activation, so both sides are deterministic


def test_RNN_cudnn_weight_norm():
    def check(module, name):
        x = torch.randn(7, 6, 10)
        expected = module(x)
        module = nn.utils.weight_norm(module, name=name)
        torch.testing.assert_close(module(x), expected)
        module = nn.utils.remove_weight_norm(module, name=name)
        torch.testing.assert_close(module(x), expected)

    check(LSTM(10, 6, 2), "weight_hh_l0")
    check(LSTM(10, 6, 2, proj_size=3), "weight_hr_l0")


def test_partial_flat_weights():
    module = LSTM(10, 6, 2)
    x = torch.randn(3, 2, 10)
    expected = module(x)
    weight = module.weight_hh_l0
    del module.weight_hh_l0
    assert not hasattr(module, "weight_hh_l0")
    module.to(torch.float32)  # the CPU half: _apply with an attribute missing does not raise
    module.weight_hh_l0 = weight
    torch.testing.assert_close(module(x)[0], expected[0])


def _four_modules(cls_of, **kwargs):
    return [cls_of["LSTM"](10, 20, batch_first=True, **kwargs),
            cls_of["LSTM"](10, 20, batch_first=True, proj_size=10, **kwargs),
            cls_of["GRU"](10, 20, batch_first=True, **kwargs),
            cls_of["RNN"](10, 20, batch_first=True, **kwargs)]


def _all_inputs(module, x, num_directions):
    """``hx`` (``(h, c)`` for an LSTM) and ``[x, h(, c), *parameters]``, all requiring grad."""
    h = torch.randn(num_directions, 5, module.proj_size or 20, requires_grad=True)
    if module.mode != "LSTM":
        return h, [x, h, *module.parameters()]
    c = torch.randn(num_directions, 5, 20, requires_grad=True)
    return (h, c), [x, h, c, *module.parameters()]


def test_cudnn_weight_format():
    """The CPU half: a weight moved out of the one buffer (``set_``) gives the same results and gradients
    (through the concatenating path) and still shares memory with the tensor it was set to."""
    for module in _four_modules(OURS):
        x = torch.randn(5, 4, 10, requires_grad=True)
        hx, inputs = _all_inputs(module, x, 1)
        y = module(x, hx)[0]
        y.sum().backward()
        grads = [t.grad.clone() for t in inputs]
        weight = inputs[4 if module.mode == "LSTM" else 3]
        data = weight.data.clone()
        with torch.no_grad():
            weight.set_(data)
        for _ in range(2):
            for t in inputs:
                t.grad = None
            moved = module(x, hx)[0]
            moved.sum().backward()
            torch.testing.assert_close(moved, y)
            for a, t in zip(grads, inputs, strict=True):
                torch.testing.assert_close(t.grad, a)
        data[:] = 4
        assert torch.equal(weight.data, data)


def test_cudnn_weight_tying():
    """The CPU half against nn.* on CPU: a reverse bias tied to the forward one, one SGD step, equal
    results (the shared Parameter receives both directions' gradients)."""
    torch.manual_seed(0)
    theirs_all = _four_modules(THEIRS, bidirectional=True)
    torch.manual_seed(0)
    for ours, theirs in zip(_four_modules(OURS, bidirectional=True), theirs_all, strict=True):
        results = []
        x = torch.randn(5, 4, 10)
        hx, _ = _all_inputs(ours, x, 2)
        for module in (ours, theirs):
            module.bias_ih_l0_reverse = module.bias_ih_l0
            assert len(list(module.parameters())) == len(module._flat_weights_names) - 1
            optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
            optimizer.zero_grad()
            module(x, hx)[0].sum().backward()
            optimizer.step()
            results.append(module(x, hx)[0])
        torch.testing.assert_close(results[0], results[1])


def test_RNN_dropout():
    for p, train in itertools.product((0, 0.276, 0.731, 1), (True, False)):
        module = RNN(10, 1000, 2, bias=False, dropout=p, nonlinearity="relu").double()
        module.train(train)
        with torch.no_grad():
            for w in module.parameters():
                w.fill_(1)
        y, h = module(torch.ones(1, 1, 10, dtype=torch.float64), torch.zeros(2, 1, 1000, dtype=torch.float64))
        assert y.min() == y.max()
        value = float(y[0, 0, 0])
        if p == 0 or not train:
            assert value == 10000
        elif p == 1:
            assert value == 0
        else:
            assert 8000 < value < 12000
            remainder = (value * (1 - p)) % 10  # the kept units, each 10 / (1 - p)
            assert min(remainder, 10 - remainder) < 1e-2
        assert h[0].min() == h[0].max() and h[1].min() == h[1].max()
        assert float(h[0, 0, 0]) == 10 and float(h[1, 0, 0]) == value


def test_error_RNN_seq_len_zero():
    for cls, bidirectional in itertools.product(OURS.values(), (True, False)):
        with pytest.raises(RuntimeError, match="Expected sequence length to be larger than 0 in RNN"):
            cls(5, 6, bidirectional=bidirectional)(torch.ones(0, 10, 5))


def test_RNN_input_size_zero():
    for cls in OURS.values():
        outputs = cls(input_size=3, hidden_size=4)(torch.zeros(5, 0, 3))
        assert outputs[0].shape == (5, 0, 4)
        outputs[0].sum().backward()


def test_RNN_dropout_state():
    for p, train in itertools.product((0, 0.1234), (True, False)):
        module = RNN(100, 100, 2, bias=False, dropout=p, nonlinearity="relu").train(train)
        x, h = torch.rand(1, 1, 100), torch.rand(2, 1, 100)
        y1, h1 = module(x, h)
        y2, h2 = module(x, h)
        buffer = io.BytesIO()
        torch.save(module, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        loaded.flatten_parameters()
        y3, h3 = loaded(x, h)
        if p == 0 or not train:
            for a, b in ((y1, y2), (y1, y3), (h1, h2), (h1, h3)):
                torch.testing.assert_close(a, b)
        else:
            for a, b in ((y1, y2), (y1, y3), (h1, h2), (h1, h3)):
                assert not torch.equal(a, b)


def test_RNN_change_dropout():
    for train in (True, False):
        module = RNN(100, 100, 2, dropout=0, nonlinearity="relu").double().train(train)
        x = torch.rand(3, 2, 100, dtype=torch.float64)
        previous = None
        for p in (0, 0.5, 0, 0.7, 0.2, 1, 0.2, 0):
            module.dropout = p
            y1, h1 = module(x)
            y2, h2 = module(x)
            if p in (0, 1) or not train:
                torch.testing.assert_close(y1, y2)
                torch.testing.assert_close(h1, h2)
            else:
                assert not torch.equal(y1, y2) and not torch.equal(h1, h2)
            if previous is not None:
                assert torch.equal(y1, previous) == (not train) and torch.equal(y2, previous) == (not train)
            previous = y1.detach()


def test_save_lstm_compatibility():
    module = LSTM(2, 3)
    x = torch.randn(32, 5, 2)
    expected = module(x)
    state = module.__dict__
    del state["proj_size"]  # a module pickled before PyTorch 1.8 had no proj_size
    loaded = LSTM(2, 3)
    loaded.__setstate__(state)
    result = loaded(x)
    torch.testing.assert_close(result[0], expected[0])
    torch.testing.assert_close(result[1], expected[1])


def test_rnn_retain_variables():
    for cls in OURS.values():
        module = cls(10, 20, num_layers=2).double()
        x = torch.randn(5, 6, 10, dtype=torch.float64, requires_grad=True)
        y = module(x)
        y[0].sum().backward(retain_graph=True)
        grads = [x.grad.clone()] + [p.grad.clone() for p in module.parameters()]
        for _ in range(4):
            module.zero_grad()
            x.grad.zero_()
            y[0].sum().backward(retain_graph=True)
            for a, b in zip(grads, [x.grad] + [p.grad for p in module.parameters()], strict=True):
                torch.testing.assert_close(a, b)


def test_rnn_fused():
    for dtype in (torch.float32, torch.float64):
        I, H, L, T, B = 10, 6, 2, 7, 6
        x, grad_y = torch.randn(T, B, I, dtype=dtype), torch.randn(T, B, H, dtype=dtype)
        h, grad_h = torch.randn(L, B, H, dtype=dtype), torch.randn(L, B, H, dtype=dtype)
        for mode, bias in itertools.product(("GRU", "LSTM"), (True, False)):
            theirs = THEIRS[mode](I, H, L, bias=bias).to(dtype)
            ours = OURS[mode](I, H, L, bias=bias).to(dtype)
            weights = [[w.detach().clone() for w in layer] for layer in theirs.all_weights]
            _compare(_forward_backward(theirs, x, grad_y, weights, h, grad_h),
                     _forward_backward(ours, x, grad_y, weights, h, grad_h))


def _pad_to(t, length):
    return torch.cat([t, t.new_zeros(length - t.shape[0], *t.shape[1:])])


@pytest.mark.parametrize("enforce_sorted,lengths", [(True, [5]), (False, [5]),
                                                    (True, [10, 10, 6, 2, 2, 1, 1]),
                                                    (False, [10, 10, 6, 2, 2, 1, 1]),
                                                    (False, [2, 1, 3, 2, 10, 5, 3])])
@pytest.mark.parametrize("default_states", [True, False])
@pytest.mark.parametrize("proj_size", [0, 2])
def test_variable_sequence(enforce_sorted, lengths, default_states, proj_size):
    """A packed batch equals its sequences run one by one (outputs, final states, every gradient)."""
    T, B, D, L = max(lengths), len(lengths), 2, 2
    x = torch.randn(T, B, 3, requires_grad=True)
    packed_lstm = LSTM(3, 4, bidirectional=True, num_layers=L, proj_size=proj_size)
    single_lstm = copy.deepcopy(packed_lstm)
    hx = None if default_states else (torch.randn(D * L, B, proj_size or 4), torch.randn(D * L, B, 4))
    outputs, states = [], []
    for b, n in enumerate(lengths):
        row_hx = None if hx is None else tuple(s[:, b:b + 1].contiguous() for s in hx)
        y, state = single_lstm(x[:n, b:b + 1], row_hx)
        outputs.append(_pad_to(y, T))
        states.append(state)
    one_by_one = torch.cat(outputs, 1)
    one_by_one_state = tuple(torch.cat(parts, 1) for parts in zip(*states, strict=True))
    packed = rnn_utils.pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    packed_y, packed_state = packed_lstm(packed, hx)
    y, y_lengths = rnn_utils.pad_packed_sequence(packed_y)
    torch.testing.assert_close(packed_state, one_by_one_state, atol=1e-5, rtol=0)
    torch.testing.assert_close(y, one_by_one, atol=1e-5, rtol=0)
    assert y_lengths.tolist() == lengths
    one_by_one.sum().backward()
    dx = x.grad.clone()
    x.grad = None
    y.sum().backward()
    torch.testing.assert_close(x.grad, dx, atol=1e-5, rtol=0)
    for a, b in zip(packed_lstm.parameters(), single_lstm.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=2e-4, rtol=0)


def _grad_and_gradgrad(module, x):
    def outputs(x):
        y, state = module(x)
        return (y, *state) if isinstance(state, tuple) else (y, state)

    assert torch.autograd.gradcheck(outputs, x, check_batched_grad=False)
    assert torch.autograd.gradgradcheck(outputs, x, check_batched_grad=False)


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_LSTM_grad_and_gradgrad(cls):  # and test_GRU_grad_and_gradgrad
    x = torch.rand(1, 3, 4, dtype=torch.float64, requires_grad=True)
    for bias in (True, False):
        _grad_and_gradgrad(cls(4, 4, bias=bias).double(), x)


def test_LSTM_differentiable_backward_using_oneDNN():
    theirs = nn.LSTM(3, 3, 20, batch_first=True)
    ours = LSTM(3, 3, 20, batch_first=True)
    ours.load_state_dict(theirs.state_dict())
    x = torch.rand(10, 12, 3)
    results = []
    for module in (theirs, ours):
        xi = x.clone().requires_grad_()
        y, _ = module(xi)
        (dx,) = torch.autograd.grad(y, xi, torch.ones_like(y), retain_graph=True, create_graph=True)
        dx.sum().backward(retain_graph=True)
        results.append((dx.detach(), xi.grad))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-5, rtol=1e-4)


def test_ports_run_our_classes():
    """The names above resolve to arrayrnn's classes, not torch's (so the ports test the drop-ins)."""
    for name, cls in OURS.items():
        assert cls.__module__ == "arrayrnn.adapters.torch" and cls is not THEIRS[name]
        assert isinstance(cls(2, 3), nn.RNNBase)
    assert copy.deepcopy(LSTM(2, 3)).mode == "LSTM"


# -- the cells ----------------------------------------------------------------------------------------------
def _cell_pair(name, *args, **kwargs):
    torch.manual_seed(0)
    ours = OUR_CELLS[name](*args, **kwargs)
    torch.manual_seed(0)
    return ours, THEIR_CELLS[name](*args, **kwargs)


def test_RNN_cell():
    for name in ("RNNCell", "GRUCell"):
        for bias in (True, False):
            x, hx = torch.randn(3, 10), torch.randn(3, 20)
            grads = []
            for cell in _cell_pair(name, 10, 20, bias=bias):
                h = hx
                for _ in range(6):
                    h = cell(x, h)
                h.sum().backward()
                grads.append([h.detach(), *(p.grad for p in cell.parameters())])
            for a, b in zip(*grads, strict=True):  # the original is a smoke test; nn's cell is the oracle
                torch.testing.assert_close(a, b)


def test_RNN_cell_forward_zero_hidden_size():
    x, hx = torch.randn(3, 10), torch.randn(3, 0)
    for cell in (RNNCell(10, 0, nonlinearity="relu"), RNNCell(10, 0, nonlinearity="tanh"), GRUCell(10, 0)):
        assert cell(x, hx).shape == torch.Size([3, 0])


def test_RNN_cell_no_broadcasting():
    def check(name, x, hx):
        with pytest.raises(RuntimeError):
            OUR_CELLS[name](10, 20)(x, hx)

    def check_all(bad_hx, good_hx, x):
        check("RNNCell", x, bad_hx)
        check("GRUCell", x, bad_hx)
        check("LSTMCell", x, (bad_hx, good_hx))
        check("LSTMCell", x, (good_hx, bad_hx))

    x, good_hx = torch.randn(3, 10), torch.randn(3, 20)
    check_all(torch.randn(1, 20), good_hx, x)  # hidden / input batch size broadcasting
    check_all(torch.randn(3, 1), good_hx, x)   # hx's hidden_size against the module's
    check_all(good_hx, good_hx, torch.randn(3, 1))  # input's input_size against the module's


def test_LSTM_cell():
    for bias in (True, False):
        x, hx, cx = torch.randn(3, 10), torch.randn(3, 20), torch.randn(3, 20)
        grads = []
        for cell in _cell_pair("LSTMCell", 10, 20, bias=bias):
            h, c = hx, cx
            for _ in range(6):
                h, c = cell(x, (h, c))
            (h + c).sum().backward()
            grads.append([h.detach(), c.detach(), *(p.grad for p in cell.parameters())])
        for a, b in zip(*grads, strict=True):
            torch.testing.assert_close(a, b)


def test_LSTM_cell_forward_input_size():
    with pytest.raises(Exception):  # noqa: B017 - the original asserts Exception
        LSTMCell(10, 20)(torch.randn(3, 11), (torch.randn(3, 20), torch.randn(3, 20)))


def test_LSTM_cell_forward_hidden_size():
    x, hx, cx = torch.randn(3, 10), torch.randn(3, 21), torch.randn(3, 20)
    lstm = LSTMCell(10, 20)
    with pytest.raises(Exception):  # noqa: B017
        lstm(x, (hx, cx))
    with pytest.raises(Exception):  # noqa: B017
        lstm(x, (cx, hx))


def test_lstmcell_backward_only_one_output_grad():
    """Undefined gradients (one output unused) do not hamper the backward (pytorch#11872); CPU, float64."""
    cell = LSTMCell(2, 3).double()
    s = torch.randn(1, 2, dtype=torch.double, requires_grad=True)
    for i in range(2):
        out = cell(s)[i]
        out.sum().backward()
        assert s.grad is None or s.grad.abs().sum().item() != 0
        s.grad = None


_BAD_CELL_INPUTS = [  # (cell, constructor args, input shape, state shapes, error type, message)
    ("RNNCell", (10, 20), (3, 11), [(3, 20)], RuntimeError,
     "input has inconsistent input_size: got 11 expected 10"),
    ("RNNCell", (10, 20), (3, 10), [(3, 21)], RuntimeError,
     "hidden0 has inconsistent hidden_size: got 21, expected 20"),
    ("RNNCell", (10, 20), (3, 10), [(5, 20)], RuntimeError,
     "Input batch size 3 doesn't match hidden0 batch size 5"),
    ("RNNCell", (10, 20), (3, 10), [(3, 1, 1, 20)], ValueError,
     "Expected hidden to be 1D or 2D, got 4D instead"),
    ("RNNCell", (10, 20, True, "relu"), (3, 10), [(3, 21)], RuntimeError,
     "hidden0 has inconsistent hidden_size: got 21, expected 20"),
    ("LSTMCell", (10, 20), (3, 11), [(3, 20), (3, 20)], RuntimeError,
     "input has inconsistent input_size: got 11 expected 10"),
    ("LSTMCell", (10, 20), (3, 10), [(3, 21), (3, 21)], RuntimeError,
     "hidden0 has inconsistent hidden_size: got 21, expected 20"),
    ("LSTMCell", (10, 20), (3, 10), [(5, 20), (5, 20)], RuntimeError,
     "Input batch size 3 doesn't match hidden0 batch size 5"),
    ("LSTMCell", (10, 20), (3, 10), [(3, 1, 1, 20), (3, 1, 1, 20)], ValueError,
     r"Expected hx\[0\] to be 1D or 2D, got 4D instead"),
]


@pytest.mark.parametrize("name, args, x_shape, state_shapes, error, message",
                         _BAD_CELL_INPUTS + [("GRUCell", *case[1:]) for case in _BAD_CELL_INPUTS[:4]])
def test_cell_module_error_inputs(name, args, x_shape, state_shapes, error, message):
    """common_modules' module_error_inputs_torch_nn_RNN_GRU_Cell (RNNCell, GRUCell) and _LSTMCell."""
    states = [torch.randn(shape) for shape in state_shapes]
    with pytest.raises(error, match=message):
        OUR_CELLS[name](*args)(torch.randn(x_shape), tuple(states) if name == "LSTMCell" else states[0])


@pytest.mark.parametrize("name, kwargs", [("RNNCell", {}), ("RNNCell", {"bias": True}),
                                          ("RNNCell", {"bias": True, "nonlinearity": "relu"}),
                                          ("GRUCell", {}), ("GRUCell", {"bias": True}),
                                          ("LSTMCell", {}), ("LSTMCell", {"bias": True})])
def test_cell_no_batch_dim_inputs(name, kwargs):
    """common_modules' module_inputs_torch_nn_RNN_GRU_Cell / _LSTMCell: an unbatched input equals the
    batched module on it with a batch of one, squeezed (no_batch_dim_reference_fn), gradients included."""
    cell = OUR_CELLS[name](5, 10, **kwargs).double()
    x = torch.randn(5, dtype=torch.double, requires_grad=True)
    n_states = 2 if name == "LSTMCell" else 1
    state = [torch.randn(10, dtype=torch.double, requires_grad=True) for _ in range(n_states)]
    hx = tuple(state) if name == "LSTMCell" else state[0]
    got = cell(x, hx)
    batched_hx = tuple(s.unsqueeze(0) for s in state) if name == "LSTMCell" else state[0].unsqueeze(0)
    want = cell(x.unsqueeze(0), batched_hx)
    got, want = (o if isinstance(o, tuple) else (o,) for o in (got, want))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b.squeeze(0))
    grads = [torch.autograd.grad(sum(o.sum() for o in outs), [x, *state]) for outs in (got, want)]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_cell_ports_run_our_classes():
    for name, cls in OUR_CELLS.items():
        assert cls.__module__ == "arrayrnn.adapters.torch_cell" and cls is not THEIR_CELLS[name]
        assert isinstance(cls(2, 3), THEIR_CELLS[name])
