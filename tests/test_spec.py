import json

import numpy as np
import pytest

import arrayrnn as ar
from arrayrnn import RNNSpec


def test_defaults_and_normalization():
    spec = RNNSpec("lstm", 3, 5, bias=True, cell_clip=2.5, dtype=np.float64)
    assert spec.bias == "double" and spec.cell_clip == (-2.5, 2.5) and spec.dtype == "float64"
    assert RNNSpec("gru", 3, 5, bias=False).bias == "none"
    assert RNNSpec("lstm", 3, 5, cell_clip=(-1, 3)).cell_clip == (-1.0, 3.0)
    assert RNNSpec("rnn_tanh", 3, 5, dtype=np.dtype("float32")).dtype == "float32"


@pytest.mark.parametrize(("mode", "gates", "names"), [
    ("rnn_tanh", 1, ("h",)), ("rnn_relu", 1, ("h",)),
    ("lstm", 4, ("i", "f", "g", "o")), ("gru", 3, ("r", "z", "n")),
])
def test_derived_sizes(mode, gates, names):
    spec = RNNSpec(mode, 7, 6, num_layers=3, bidirectional=True)
    assert spec.gates == gates and spec.gate_names == names and spec.gate_size == gates * 6
    assert spec.num_directions == 2 and spec.output_size == 6
    assert spec.layer_input_size(0) == 7 and spec.layer_input_size(2) == 12
    with pytest.raises(ValueError, match="layer = 3"):
        spec.layer_input_size(3)


def test_projection_sizes():
    spec = RNNSpec("lstm", 7, 6, num_layers=2, bidirectional=True, proj_size=2)
    assert spec.output_size == 2 and spec.layer_input_size(1) == 4


@pytest.mark.parametrize(("bias", "b_ih", "b_hh"), [
    (True, True, True), ("double", True, True), ("single_inp", True, False), ("single_rec", False, True),
    (False, False, False), ("none", False, False),
])
def test_bias_modes(bias, b_ih, b_hh):
    spec = RNNSpec("gru", 2, 3, bias=bias)
    assert (spec.has_b_ih, spec.has_b_hh) == (b_ih, b_hh)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(mode="lstmm"), r"mode = 'lstmm'; expected one of"),
    (dict(input_size=0), r"input_size = 0; expected an integer >= 1"),
    (dict(hidden_size=0), r"hidden_size = 0; expected an integer >= 1"),
    (dict(hidden_size=2.0), r"hidden_size = 2.0"),
    (dict(num_layers=0), r"num_layers = 0"),
    (dict(num_layers=True), r"num_layers = True"),
    (dict(proj_size=-1), r"proj_size = -1"),
    (dict(mode="gru", proj_size=2), r"proj_size = 2 with mode = 'gru'"),
    (dict(proj_size=4), r"proj_size = 4; expected 0 \(no projection\) or 0 < proj_size < hidden_size = 4"),
    (dict(proj_size=5), r"proj_size = 5"),
    (dict(dropout=1.0), r"dropout = 1.0; expected a probability in \[0, 1\)"),
    (dict(dropout=-0.1), r"dropout = -0.1"),
    (dict(dropout="0.5"), r"dropout = '0.5'"),
    (dict(dtype="int32"), r"dtype = 'int32'; expected one of"),
    (dict(dtype="bfloat16"), r"dtype = 'bfloat16'"),
    (dict(bias="single"), r"bias = 'single'; expected True, False or one of"),
    (dict(bidirectional=1), r"bidirectional = 1; expected True or False"),
    (dict(cell_clip=0.0), r"cell_clip = 0.0; expected finite bounds"),
    (dict(cell_clip=(2, 1)), r"cell_clip = \(2, 1\)"),
    (dict(cell_clip=float("inf")), r"cell_clip = inf"),
    (dict(cell_clip="x"), r"cell_clip = 'x'"),
    (dict(mode="gru", cell_clip=1.0), r"cell_clip = 1.0 with mode = 'gru'"),
    (dict(reset_after=False), r"reset_after = False with mode = 'lstm'"),
])
def test_validation_errors(kwargs, message):
    fields = dict(mode="lstm", input_size=3, hidden_size=4) | kwargs
    with pytest.raises(ValueError, match=message):
        RNNSpec(**fields)


def test_frozen_and_hashable():
    spec = RNNSpec("lstm", 3, 4)
    with pytest.raises(AttributeError):
        spec.hidden_size = 5
    assert hash(spec) == hash(RNNSpec("lstm", 3, 4, bias="double"))


@pytest.mark.parametrize("spec", [
    RNNSpec("lstm", 3, 4, num_layers=2, bidirectional=True, proj_size=2, cell_clip=(-1, 2), dropout=0.25),
    RNNSpec("gru", 3, 4, bias="single_rec", reset_after=False, dtype="float64"),
    RNNSpec("rnn_relu", 1, 1, bias=False, dtype="float16"),
])
def test_dict_round_trip(spec):
    import json

    d = json.loads(json.dumps(spec.to_dict()))
    assert RNNSpec.from_dict(d) == spec


def test_from_dict_rejects_unknown_fields_and_non_dicts():
    with pytest.raises(ValueError, match=r"unknown fields \['hiden_size'\]"):
        RNNSpec.from_dict({"mode": "lstm", "input_size": 3, "hiden_size": 4})
    with pytest.raises(ValueError, match="expected a dict"):
        RNNSpec.from_dict(["lstm"])


def test_numpy_scalars_are_accepted_in_the_spec():
    spec = ar.RNNSpec(mode="lstm", input_size=np.int64(8), hidden_size=np.int32(4), num_layers=np.int64(2),
                      bidirectional=np.True_, cell_clip=np.float32(3), dropout=np.float64(0.5))
    assert spec == ar.RNNSpec(mode="lstm", input_size=8, hidden_size=4, num_layers=2, bidirectional=True,
                              cell_clip=3.0, dropout=0.5)
    assert type(spec.input_size) is int and type(spec.bidirectional) is bool
    assert ar.RNNSpec(mode="lstm", input_size=2, hidden_size=2,
                      cell_clip=(np.float32(-1), np.int8(2))).cell_clip == (-1.0, 2.0)


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


# -- seeds: one rule (core/spec.py check_seed) at every entry point that takes one -----------------------
def _seed_entry_points():
    """``name -> fn(seed)`` for every public API taking a seed (the torch adapter's below)."""
    from arrayrnn.autodiff.gradcheck import check_grads
    from arrayrnn.frontend.dropout import dropout_masks

    spec = RNNSpec("gru", 3, 4, num_layers=2, dropout=0.5, dtype="float64")
    params = ar.PackedParams.init(spec)
    x = np.ones((2, 1, 3))
    layer = ar.nn.GRU(3, 4, 2, dropout=0.5, dtype="float64")
    return {
        "check_seed": ar.core.spec.check_seed,
        "rnn_forward": lambda s: ar.rnn_forward(params, x, training=True, seed=s),
        "ops.rnn": lambda s: ar.value_and_grad(lambda p: ar.ops.mean(ar.ops.rnn(p, x, seed=s)[0]))(params),
        "dropout_masks": lambda s: dropout_masks(spec, 2, 1, s),
        "cell_masks": lambda s: ar.cell_masks(spec.replace(recurrent_dropout=0.5), s, 1, 2),
        "PackedParams.init": lambda s: ar.PackedParams.init(spec, seed=s),
        "nn.Dense": lambda s: ar.nn.Dense(3, 4, seed=s),
        "nn.Embedding": lambda s: ar.nn.Embedding(3, 4, seed=s),
        "nn.LSTM": lambda s: ar.nn.LSTM(3, 4, seed=s),
        "nn.GRU.apply": lambda s: ar.value_and_grad(
            lambda p: ar.ops.mean(layer.apply(p, x, seed=s)[0]))(layer.params),
        "check_grads": lambda s: check_grads(lambda v: v * 2.0, np.ones(2), seed=s),
    }


BAD_SEEDS = [(2**64, ValueError, r"seed = 18446744073709551616; expected None or an int in \[0, 2\*\*64\)"),
             (2**100, ValueError, r"seed = 1267650600228229401496703205376; expected"),
             (-1, ValueError, r"seed = -1; expected None or an int in \[0, 2\*\*64\)"),
             (True, TypeError, r"seed has type bool; expected None or an int in \[0, 2\*\*64\)"),
             (np.bool_(False), TypeError, r"seed has type bool"),
             (1.0, TypeError, r"seed has type float"),
             ("1", TypeError, r"seed has type str")]


@pytest.mark.parametrize("entry", sorted(_seed_entry_points()))
@pytest.mark.parametrize(("seed", "error", "message"), BAD_SEEDS)
def test_every_entry_point_refuses_bad_seeds(entry, seed, error, message):
    with pytest.raises(error, match=message):
        _seed_entry_points()[entry](seed)


@pytest.mark.parametrize("entry", sorted(_seed_entry_points()))
def test_every_entry_point_takes_the_64_bit_extremes(entry):
    fn = _seed_entry_points()[entry]
    for seed in (0, 2**64 - 1, np.uint64(2**64 - 1), np.int8(3)):
        fn(seed)


def test_the_seed_limit_is_torch_manual_seeds():
    """The same upper limit as PyTorch (which also maps negative seeds >= -2**63; we refuse them)."""
    torch = pytest.importorskip("torch")
    for seed in (2**64 - 1, 2**64):
        accepted = []
        for fn in (torch.manual_seed, ar.core.spec.check_seed):
            try:
                fn(seed)
                accepted.append(True)
            except ValueError:
                accepted.append(False)
        assert accepted == [seed < 2**64] * 2


def test_seeds_past_64_bits_no_longer_alias_seed_zero():
    """2**64 drew exactly seed 0's masks (the key is reduced modulo 2**64); now it is refused, and the
    largest seed draws its own masks."""
    from arrayrnn.frontend.dropout import dropout_masks

    spec = RNNSpec("lstm", 3, 8, num_layers=2, dropout=0.5)
    zero, top = dropout_masks(spec, 4, 3, 0)[0], dropout_masks(spec, 4, 3, 2**64 - 1)[0]
    assert not np.array_equal(zero, top)
    np.testing.assert_array_equal(dropout_masks(spec, 4, 3, np.uint64(2**64 - 1))[0], top)


@pytest.mark.parametrize(("seed", "error", "message"), BAD_SEEDS)
def test_the_torch_adapter_refuses_bad_seeds(seed, error, message):
    torch = pytest.importorskip("torch")
    from arrayrnn.torch import ArrayRNN

    with pytest.raises(error, match=message):
        ArrayRNN("lstm", 3, 4, seed=seed)
    module = ArrayRNN("lstm", 3, 4, num_layers=2, dropout=0.5, seed=0)
    with pytest.raises(error, match=message):
        module(torch.ones(2, 1, 3), seed=seed)
# -- cell variants (issue 24) -------------------------------------------------------------------------
def test_cell_variant_defaults_and_zoneout_cell_follows_zoneout():
    plain = RNNSpec("lstm", 3, 5)
    fields = (plain.recurrent_dropout, plain.weight_dropout, plain.zoneout, plain.peepholes)
    assert fields == (0.0, 0.0, 0.0, False)
    assert plain.zoneout_cell == 0.0 and plain.variants == ()
    assert RNNSpec("lstm", 3, 5, zoneout=0.25).zoneout_cell == 0.25
    assert RNNSpec("lstm", 3, 5, zoneout=0.25) == RNNSpec("lstm", 3, 5, zoneout=0.25, zoneout_cell=0.25)
    assert RNNSpec("lstm", 3, 5, zoneout=0.25, zoneout_cell=0.0).zoneout_cell == 0.0
    assert RNNSpec("gru", 3, 5, zoneout=0.25).zoneout_cell is None
    # replace(mode=...) of an LSTM spec carries its zoneout_cell: one that only follows zoneout is dropped
    assert RNNSpec("lstm", 3, 5, zoneout=0.25).replace(mode="gru") == RNNSpec("gru", 3, 5, zoneout=0.25)
    assert RNNSpec("lstm", 3, 5).replace(mode="rnn_tanh").zoneout_cell is None
    spec = RNNSpec("lstm", 3, 5, recurrent_dropout=np.float32(0.5), weight_dropout=0.1,
                   peepholes=np.bool_(True))
    assert spec.recurrent_dropout == 0.5 and type(spec.recurrent_dropout) is float and spec.peepholes is True
    assert spec.variants == ("recurrent_dropout", "weight_dropout", "peepholes")
    assert RNNSpec("lstm", 3, 5, zoneout_cell=0.5).variants == ("zoneout_cell",)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(mode="lstm", recurrent_dropout=1.0), r"recurrent_dropout = 1.0; expected a probability in \[0, 1"),
    (dict(mode="lstm", weight_dropout=-0.1), r"weight_dropout = -0.1; expected a probability"),
    (dict(mode="gru", zoneout="0.1"), r"zoneout = '0.1'; expected a probability"),
    (dict(mode="lstm", zoneout_cell=True), r"zoneout_cell = True; expected a probability"),
    (dict(mode="gru", zoneout_cell=0.1), r"zoneout_cell = 0.1 with mode = 'gru'; only an LSTM has a cell"),
    (dict(mode="gru", peepholes=True), r"peepholes = True with mode = 'gru'; .*only for mode='lstm'"),
    (dict(mode="lstm", peepholes=1), r"peepholes = 1; expected True or False"),
    (dict(mode="lstm", layer_norm=1), r"layer_norm = 1; expected True or False"),
    (dict(mode="gru", layer_norm="True"), r"layer_norm = 'True'; expected True or False"),
    (dict(mode="lstm", layer_norm=True, layer_norm_eps=0.0), r"layer_norm_eps = 0.0; expected a finite"),
    (dict(mode="rnn_tanh", layer_norm=True, layer_norm_eps=-1e-5), r"layer_norm_eps = -1e-05; expected a f"),
    (dict(mode="lstm", layer_norm=True, layer_norm_eps=float("inf")), r"layer_norm_eps = inf; expected a f"),
    (dict(mode="lstm", layer_norm=True, layer_norm_eps="1e-5"), r"layer_norm_eps = '1e-5'; expected a fin"),
    (dict(mode="lstm", layer_norm=True, layer_norm_eps=True), r"layer_norm_eps = True; expected a finite"),
])
def test_cell_variant_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RNNSpec(input_size=3, hidden_size=4, **kwargs)


def test_plain_spec_dict_has_no_variant_fields_and_variant_dicts_round_trip():
    assert set(RNNSpec("lstm", 3, 5).to_dict()) == {
        "mode", "input_size", "hidden_size", "num_layers", "bidirectional", "bias", "proj_size", "cell_clip",
        "dropout", "reset_after", "dtype"}
    for spec in (RNNSpec("lstm", 3, 5, recurrent_dropout=0.2, weight_dropout=0.3, zoneout=0.1,
                         zoneout_cell=0.05, peepholes=True),
                 RNNSpec("lstm", 3, 5, zoneout=0.1), RNNSpec("gru", 3, 5, zoneout=0.1, reset_after=False),
                 RNNSpec("rnn_relu", 3, 5, weight_dropout=0.5),
                 RNNSpec("gru", 3, 5, layer_norm=True, layer_norm_eps=1e-3, reset_after=False)):
        d = json.loads(json.dumps(spec.to_dict()))
        assert RNNSpec.from_dict(d) == spec and hash(RNNSpec.from_dict(d)) == hash(spec)
    assert RNNSpec("lstm", 3, 5, zoneout=0.1).to_dict()["zoneout"] == 0.1
    assert "zoneout_cell" not in RNNSpec("lstm", 3, 5, zoneout=0.1).to_dict()


def test_one_rule_names_the_masks_a_call_applies():
    def spec(**fields):
        return RNNSpec(**{"mode": "lstm", "input_size": 3, "hidden_size": 4, **fields})

    assert spec().call_masks(True) == () and not spec().draws_masks(True)
    assert spec(dropout=0.5).call_masks(True) == ()                     # one layer: nothing between layers
    assert spec(dropout=0.5, num_layers=2).call_masks(True) == ("dropout",)
    assert spec(dropout=0.5, num_layers=2).call_masks(False) == ()
    both = spec(recurrent_dropout=0.2, weight_dropout=0.3)
    assert both.call_masks(True) == ("recurrent", "weight") and both.call_masks(False) == ()
    assert both.draws_masks(True) and not both.draws_masks(False)
    zoned = spec(zoneout=0.1)                                           # the cell follows h
    assert zoned.call_masks(True) == zoned.call_masks(False) == ("zoneout_h", "zoneout_c")
    assert zoned.draws_masks(True) and not zoned.draws_masks(False)     # inference: the expectation
    assert spec(zoneout_cell=0.2).call_masks(False) == ("zoneout_c",)
    assert RNNSpec("gru", 3, 4, zoneout=0.1).call_masks(True) == ("zoneout_h",)
    assert spec(peepholes=True).call_masks(True) == ()                 # no mask


def test_check_flag_raises_the_error_its_caller_names():
    from arrayrnn.core.spec import check_flag

    assert check_flag("f", np.bool_(True)) is True
    with pytest.raises(ValueError, match="f = 1; expected True or False"):
        check_flag("f", 1)
    with pytest.raises(TypeError, match="g = 'yes'"):
        check_flag("g", "yes", TypeError)
