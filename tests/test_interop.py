import numpy as np
import pytest
import torch

import arrayrnn as ar
from arrayrnn.core.interop import spec_from_torch

SMALL = ar.RNNSpec(mode="lstm", input_size=2, hidden_size=3)
MODULES = [
    lambda: torch.nn.LSTM(4, 5),
    lambda: torch.nn.LSTM(4, 5, num_layers=3, bidirectional=True, proj_size=2),
    lambda: torch.nn.LSTM(4, 5, num_layers=2, bias=False, dropout=0.3),
    lambda: torch.nn.GRU(4, 5, num_layers=2, bidirectional=True),
    lambda: torch.nn.GRU(4, 5, bias=False).double(),
    lambda: torch.nn.RNN(4, 5, nonlinearity="relu", num_layers=2, bidirectional=True),
    lambda: torch.nn.RNN(4, 5, batch_first=True).double(),
]


@pytest.mark.parametrize("make", MODULES)
def test_torch_round_trip_is_bit_exact(make):
    torch.manual_seed(0)
    module = make()
    params = ar.from_torch(module)
    state = module.state_dict()
    assert params.size == sum(p.numel() for p in module.parameters())
    exported = ar.to_torch_state_dict(params)
    assert list(exported) == list(state)
    for key, value in state.items():
        assert exported[key].shape == value.shape and exported[key].dtype == value.dtype
        assert torch.equal(exported[key], value), key
    clone = make()
    clone.load_state_dict(exported)
    assert all(torch.equal(a, b) for a, b in zip(clone.parameters(), module.parameters(), strict=True))
    flat = torch.cat([p.detach().flatten() for p in module.parameters()]).numpy()
    assert np.array_equal(params.data, flat), "the canonical buffer must equal torch's parameter order"


def test_spec_from_torch_reads_every_field():
    spec = spec_from_torch(torch.nn.LSTM(3, 6, num_layers=2, bidirectional=True, proj_size=2, bias=False,
                                         dropout=0.5).double())
    assert spec == ar.RNNSpec("lstm", 3, 6, num_layers=2, bidirectional=True, proj_size=2, bias=False,
                              dropout=0.5, dtype="float64")
    assert spec_from_torch(torch.nn.RNN(3, 6, nonlinearity="relu")).mode == "rnn_relu"


def test_from_torch_rejects_other_modules():
    with pytest.raises(TypeError, match=r"module has type Linear; expected torch.nn.RNN, LSTM or GRU"):
        ar.from_torch(torch.nn.Linear(2, 3))


@pytest.mark.parametrize(("spec", "message"), [
    (ar.RNNSpec("gru", 3, 4, bias="single_rec"), r"bias = 'single_rec' has no PyTorch equivalent"),
    (ar.RNNSpec("gru", 3, 4, reset_after=False), r"reset_after = False .* no PyTorch equivalent"),
    (ar.RNNSpec("lstm", 3, 4, cell_clip=1.0), r"cell_clip = \(-1.0, 1.0\) has no PyTorch equivalent"),
    (ar.RNNSpec("lstm", 3, 4, peepholes=True), r"peepholes = True has no PyTorch equivalent"),
    (ar.RNNSpec("gru", 3, 4, zoneout=0.1), r"zoneout = 0.1, zoneout_cell = None have no PyTorch equivalent"),
])
def test_export_refuses_what_torch_cannot_compute(spec, message):
    with pytest.raises(ValueError, match=message):
        ar.to_torch_state_dict(ar.PackedParams.zeros(spec))


def test_exported_tensors_do_not_alias_the_buffer():
    params = ar.from_torch(torch.nn.GRU(2, 3))
    exported = ar.to_torch_state_dict(params)
    exported["weight_ih_l0"].zero_()
    assert params.view(0, 0, "W_ih").any()


@pytest.mark.parametrize("where", ["x", "h0"])
def test_torch_tensors_that_require_grad_say_detach(where):
    params = ar.PackedParams.init(SMALL, seed=0)
    args = {"x": torch.zeros(4, 1, 2), "h0": torch.zeros(1, 1, 3)}
    args[where].requires_grad_(True)
    message = rf"{where} is a torch tensor that requires grad; pass {where}.detach\(\)"
    with pytest.raises(TypeError, match=message):
        ar.rnn_forward(params, **args)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.complex64])
def test_from_torch_of_unsupported_dtypes_is_a_type_error(dtype):
    with pytest.raises(TypeError, match="expected one of torch.float16, float32, float64"):
        ar.from_torch(torch.nn.LSTM(2, 3).to(dtype))


def test_from_torch_of_a_meta_module():
    with pytest.raises(ValueError, match="meta device"):
        ar.from_torch(torch.nn.LSTM(2, 3, device="meta"))


def test_from_torch_of_a_weight_normed_module():
    module = torch.nn.utils.parametrizations.weight_norm(torch.nn.GRU(2, 3), "weight_hh_l0")
    with pytest.raises(ValueError, match="has no 'weight_hh_l0'.*re-parametrised"):
        ar.from_torch(module)


def test_from_torch_of_a_wrong_shaped_weight():
    module = torch.nn.LSTM(2, 3)
    module.weight_hh_l0.data = torch.zeros(12, 4)
    with pytest.raises(ValueError, match=r"weight_hh_l0 has shape \(12, 4\); expected \(12, 3\)"):
        ar.from_torch(module)


def test_to_torch_state_dict_of_an_array():
    with pytest.raises(TypeError, match="params has type ndarray; expected an arrayrnn.PackedParams"):
        ar.to_torch_state_dict(np.zeros(3))
