import numpy as np
import pytest
import torch

import arrayrnn as ar
from arrayrnn.core.interop import spec_from_torch

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
])
def test_export_refuses_what_torch_cannot_compute(spec, message):
    with pytest.raises(ValueError, match=message):
        ar.to_torch_state_dict(ar.PackedParams.zeros(spec))


def test_exported_tensors_do_not_alias_the_buffer():
    params = ar.from_torch(torch.nn.GRU(2, 3))
    exported = ar.to_torch_state_dict(params)
    exported["weight_ih_l0"].zero_()
    assert params.view(0, 0, "W_ih").any()
