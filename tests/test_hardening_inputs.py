"""Issue 12: NumPy scalars accepted where Python numbers are; unclear errors made clear; Adam validates
before changing state; forged optimizer files are ValueErrors that leave the optimizer unchanged."""

import json

import numpy as np
import pytest

import arrayrnn as ar
from arrayrnn import optim
from arrayrnn.core import npzfile


def test_numpy_scalars_are_accepted_in_the_spec():
    spec = ar.RNNSpec(mode="lstm", input_size=np.int64(8), hidden_size=np.int32(4), num_layers=np.int64(2),
                      bidirectional=np.True_, cell_clip=np.float32(3), dropout=np.float64(0.5))
    assert spec == ar.RNNSpec(mode="lstm", input_size=8, hidden_size=4, num_layers=2, bidirectional=True,
                              cell_clip=3.0, dropout=0.5)
    assert type(spec.input_size) is int and type(spec.bidirectional) is bool
    assert ar.RNNSpec(mode="lstm", input_size=2, hidden_size=2,
                      cell_clip=(np.float32(-1), np.int8(2))).cell_clip == (-1.0, 2.0)


def test_numpy_scalars_are_accepted_by_optimizers():
    p = np.ones(3)
    optim.SGD(p, lr=np.float32(0.5), momentum=np.float64(0.0)).step(np.ones(3))
    np.testing.assert_array_equal(p, np.full(3, 0.5))
    optim.Adam(np.ones(3), lr=np.float32(0.01), betas=(np.float32(0.9), np.float64(0.99)))


@pytest.mark.parametrize("clip", [("a", "b"), (None, 1.0), (1.0, "x")])
def test_cell_clip_pairs_of_non_numbers_name_cell_clip(clip):
    with pytest.raises(ValueError, match=r"cell_clip = .*expected None, a positive float c, or a pair"):
        ar.RNNSpec(mode="lstm", input_size=2, hidden_size=2, cell_clip=clip)


def test_a_huge_hidden_size_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"hidden_size = 1000000000000"):
        ar.RNNSpec(mode="lstm", input_size=2, hidden_size=10**12)
    with pytest.raises(ValueError, match=r"hidden_size = 100000 with input_size = 8: a weight matrix"):
        ar.RNNSpec(mode="lstm", input_size=8, hidden_size=100_000)


def test_bool_like_numpy_values_are_not_sizes():
    with pytest.raises(ValueError, match="input_size = np.True_"):
        ar.RNNSpec(mode="lstm", input_size=np.True_, hidden_size=2)
    with pytest.raises(ValueError, match="bidirectional = 1"):
        ar.RNNSpec(mode="lstm", input_size=2, hidden_size=2, bidirectional=1)


def test_adam_step_on_a_read_only_buffer_changes_no_state():
    p = np.ones(3)
    opt = optim.Adam(p)
    p.flags.writeable = False
    with pytest.raises(ValueError, match="params is a read-only buffer"):
        opt.step(np.ones(3))
    assert opt.step_count == 0
    np.testing.assert_array_equal(opt.state[0]["exp_avg"], 0.0)


def test_a_gradient_of_another_dtype_changes_no_state():
    opt = optim.Adam(np.ones(3, dtype=np.float32))
    with pytest.raises(TypeError, match="different dtypes"):
        opt.step(np.ones(3))
    assert opt.step_count == 0


def _forge(path, header, arrays):
    npzfile.write(path, header, arrays)


@pytest.mark.parametrize("change, message", [
    (lambda h: h.pop("type"), "optimizer None"),
    (lambda h: h["hyperparameters"].update(momentum=0.9), "unknown entries"),
    (lambda h: h.update(hyperparameters=[1]), "hyperparameters"),
    (lambda h: h.update(names="exp_avg"), "names"),
    (lambda h: h.update(names=[["nope"]]), "does not hold"),
    (lambda h: h.update(step="3"), "step"),
    (lambda h: h["hyperparameters"].update(lr="x"), "lr"),
])
def test_forged_optimizer_headers_are_value_errors_and_change_nothing(tmp_path, change, message):
    source = optim.Adam(np.ones(3))
    source.step(np.ones(3))
    path = tmp_path / "opt.npz"
    source.save(path)
    header, arrays = npzfile.read(path)
    change(header)
    _forge(path, header, arrays)
    target = optim.Adam(np.ones(3), lr=0.5)
    before = (target.step_count, target.lr, target.state[0]["exp_avg"].copy())
    with pytest.raises(ValueError, match=message):
        target.load(path)
    assert (target.step_count, target.lr) == before[:2]
    np.testing.assert_array_equal(target.state[0]["exp_avg"], before[2])


def test_an_optimizer_header_that_is_a_json_list(tmp_path):
    path = tmp_path / "opt.npz"
    np.savez(path, header=np.frombuffer(json.dumps([1, 2]).encode(), dtype=np.uint8))
    with pytest.raises(ValueError, match="JSON list"):
        optim.Adam(np.ones(3)).load(path)


def test_optimizer_file_byte_flips_are_value_errors(tmp_path):
    opt = optim.Adam(np.ones(3))
    opt.step(np.ones(3))
    path = tmp_path / "opt.npz"
    opt.save(path)
    raw = path.read_bytes()
    for where in range(0, len(raw), 3):
        flipped = bytearray(raw)
        flipped[where] ^= 0x5A
        path.write_bytes(bytes(flipped))
        target = optim.Adam(np.ones(3))
        try:
            target.load(path)
        except ValueError:
            assert target.step_count == 0


def test_save_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    import os
    import stat
    path = tmp_path / "m.npz"
    params = ar.PackedParams.init(ar.RNNSpec(mode="gru", input_size=2, hidden_size=2), seed=0)
    ar.save(path, params)
    os.chmod(path, 0o644)
    ar.save(path, params)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    opt = optim.SGD(params)
    opt.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


SPEC = ar.RNNSpec(mode="lstm", input_size=2, hidden_size=3)


def test_ragged_lengths_name_lengths():
    params = ar.PackedParams.init(SPEC, seed=0)
    ragged = r"lengths = \[\[1\], \[2, 3\]\] is ragged; expected .* shape \(2,\)"
    with pytest.raises(ValueError, match=ragged):
        ar.rnn_forward(params, np.zeros((4, 2, 2), np.float32), lengths=[[1], [2, 3]])


def test_init_seed_errors_name_seed():
    with pytest.raises(ValueError, match="seed = -1"):
        ar.PackedParams.init(SPEC, seed=-1)
    with pytest.raises(TypeError, match="seed has type str"):
        ar.PackedParams.init(SPEC, seed="abc")
    np.testing.assert_array_equal(ar.PackedParams.init(SPEC, seed=np.int64(3)).data,
                                  ar.PackedParams.init(SPEC, seed=3).data)


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("where", ["x", "h0"])
def test_torch_tensors_that_require_grad_say_detach(where):
    params = ar.PackedParams.init(SPEC, seed=0)
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


def test_a_torch_buffer_that_requires_grad_says_detach():
    buffer = torch.zeros(ar.PackedParams.init(SPEC).data.size, requires_grad=True)
    with pytest.raises(TypeError, match=r"requires grad; pass .*\.detach\(\)"):
        ar.PackedParams(SPEC, buffer)


def test_load_of_byte_flipped_files_is_always_a_value_error(tmp_path):
    path = tmp_path / "m.npz"
    original = ar.PackedParams.init(SPEC, seed=0)
    ar.save(path, original)
    raw = path.read_bytes()
    for where in range(0, len(raw), 5):
        for mask in (0x01, 0xFF):
            flipped = bytearray(raw)
            flipped[where] ^= mask
            path.write_bytes(bytes(flipped))
            try:
                loaded = ar.load(path)
            except ValueError:
                continue
            # a flip in a field nobody reads (a zip timestamp, npy header padding) is harmless
            assert loaded.spec == original.spec
            np.testing.assert_array_equal(loaded.data, original.data)


def test_load_of_a_deeply_nested_header(tmp_path):
    path = tmp_path / "deep.npz"
    deep = "[" * 100_000 + "]" * 100_000
    np.savez(path, header=np.frombuffer(deep.encode(), dtype=np.uint8), data=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="header is not valid JSON"):
        ar.load(path)
