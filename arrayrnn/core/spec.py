"""`RNNSpec`: the validated, hashable description of a recurrent stack.

Every derived size (directions, gates, output size, per-layer input size) is computed here and nowhere
else; the layout, the engines and the interop code all ask the spec.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cell_registry import BUILTIN_MODES, Cell, cell_of, registered_cells

MODES = BUILTIN_MODES
GATE_NAMES = {"rnn_tanh": ("h",), "rnn_relu": ("h",), "lstm": ("i", "f", "g", "o"), "gru": ("r", "z", "n")}
BIAS_MODES = ("double", "single_inp", "single_rec", "none")
DTYPES = ("float16", "float32", "float64")

_BIAS_ALIASES = {True: "double", False: "none", None: "none"}


def _normalize_bias(bias: Any) -> str:
    if isinstance(bias, bool) or bias is None:
        return _BIAS_ALIASES[bias]
    if isinstance(bias, str) and bias in BIAS_MODES:
        return bias
    raise ValueError(f"bias = {bias!r}; expected True, False or one of {BIAS_MODES}")


def normalize_dtype(dtype: Any) -> str:
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or dtype
    if isinstance(name, str) and name in DTYPES:
        return name
    raise ValueError(f"dtype = {dtype!r}; expected one of {DTYPES}")


_INDEX_MAX = 2**31 - 1  # BLAS and cuDNN index a matrix with 32-bit integers


def _is_real(value: Any) -> bool:
    """A Python or NumPy real number (``np.float32(3)``, ``np.int64(8)``), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


_SHOWN_DIGITS = 100  # an int longer than this is abbreviated in a message (2**100 is shown whole)


def shown(value: Any) -> str:
    """``repr(value)`` for an error message, a huge int abbreviated (``10**400``'s repr is 401 digits, and
    past 4300 digits ``repr`` itself raises); tuples and lists element by element."""
    if isinstance(value, (tuple, list)):
        inner = ", ".join(map(shown, value)) + ("," if isinstance(value, tuple) and len(value) == 1 else "")
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, numbers.Integral) and _is_real(value) and abs(int(value)) >= 10**_SHOWN_DIGITS:
        return _abbreviated(int(value))
    return repr(value)


def _abbreviated(value: int) -> str:
    """``-1.234e+400 (an int of 401 digits)``: exact digits, the leading ones truncated; no ``str(value)``."""
    magnitude = abs(value)
    digits = int((magnitude.bit_length() - 1) * math.log10(2))  # a lower bound, then counted up
    while 10**digits <= magnitude:
        digits += 1
    leading = magnitude // 10 ** (digits - 4)  # the first 4 digits, truncated
    sign = "-" if value < 0 else ""
    return f"{sign}{leading // 1000}.{leading % 1000:03d}e+{digits - 1} (an int of {digits} digits)"


def _finite_float(value: Any) -> float | None:
    """``value`` (a real number, not a bool) as a finite float, or None: not a number, NaN, infinite, or an
    int beyond a float's range (``float(10**400)`` raises ``OverflowError``)."""
    if not _is_real(value):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_positive_int(field: str, value: Any, minimum: int = 1) -> int:
    if not (isinstance(value, numbers.Integral) and _is_real(value)) or not minimum <= value <= _INDEX_MAX:
        raise ValueError(f"{field} = {shown(value)}; expected an integer >= {minimum} (and <= {_INDEX_MAX})")
    return int(value)


def _check_probability(field: str, value: Any) -> float:
    number = _finite_float(value)
    if number is None or not 0.0 <= number < 1.0:
        raise ValueError(f"{field} = {shown(value)}; expected a probability in [0, 1)")
    return number


def check_flag(name: str, value: Any, error: type[Exception] = ValueError) -> bool:
    """The one flag rule: ``True`` or ``False`` (NumPy's too), else ``error`` naming ``name`` (``ValueError``
    for a field of a spec or module, ``TypeError`` for a function's argument)."""
    if not isinstance(value, (bool, np.bool_)):
        raise error(f"{name} = {value!r}; expected True or False")
    return bool(value)


def _normalize_cell_clip(cell_clip: Any) -> tuple[float, float] | None:
    if cell_clip is None:
        return None
    if _is_real(cell_clip):
        c = _finite_float(cell_clip)
        lo, hi = (None, None) if c is None else (-c, c)
    elif isinstance(cell_clip, (tuple, list)) and len(cell_clip) == 2 and all(map(_is_real, cell_clip)):
        lo, hi = (_finite_float(v) for v in cell_clip)
    else:
        raise ValueError(f"cell_clip = {shown(cell_clip)}; expected None, a positive float c, or a pair "
                         "(lo, hi)")
    if lo is None or hi is None or not lo < hi:
        raise ValueError(f"cell_clip = {shown(cell_clip)}; expected finite bounds with lo < hi")
    return (lo, hi)


@dataclass(frozen=True)
class RNNSpec:
    """What a recurrent stack is: mode, sizes, layers, directions, bias mode and options.

    Construction validates every field and normalizes aliases: ``bias=True`` becomes ``"double"``,
    ``bias=False`` ``"none"``; a float ``cell_clip=c`` becomes ``(-c, c)``; a NumPy dtype becomes its name.
    Below, ``H = hidden_size``, ``H_out = proj_size or hidden_size``, ``D = 2 if bidirectional else 1``,
    ``L = num_layers``.

    Parameters
    ----------
    mode : str
        ``"rnn_tanh"``, ``"rnn_relu"``, ``"lstm"`` (gates ``i, f, g, o``), ``"gru"`` (gates ``r, z, n``), or
        the name of a custom cell registered with :func:`arrayrnn.register_cell` (``"cifg"`` and
        ``"slstm"`` once :mod:`arrayrnn.cells` is imported).
    input_size : int
        Features of ``x`` (its last axis), at least 1.
    hidden_size : int
        ``H``, at least 1.
    num_layers : int, optional
        Stacked layers; layer ``l > 0`` reads the previous layer's ``(.., D*H_out)`` output.
    bidirectional : bool, optional
        Add a reverse direction to every layer.
    bias : bool or str, optional
        ``True``/``"double"`` (``b_ih`` and ``b_hh``), ``"single_inp"`` (``b_ih`` only), ``"single_rec"``
        (``b_hh`` only), ``False``/``"none"``.
    proj_size : int, optional
        LSTM projection ``h_t = W_hr @ (o * tanh(c_t))``, ``0 < proj_size < hidden_size``; 0 for none.
    cell_clip : float or (float, float), optional
        LSTM cell clipping: the new cell state is clipped to ``(lo, hi)`` (``c`` means ``(-c, c)``).
    dropout : float, optional
        Dropout between layers (not after the last), in training only.
    reset_after : bool, optional
        GRU variant: True is cuDNN's and PyTorch's, False the reset-before one (Keras ``reset_after=False``).
    dtype : str, optional
        ``"float32"``, ``"float64"`` or ``"float16"`` (GPU).
    recurrent_dropout, weight_dropout : float, optional
        Dropout of the recurrent input ``h`` and DropConnect of ``W_hh`` (training only).
    zoneout, zoneout_cell : float, optional
        Zoneout probabilities of ``h`` and (LSTM) of ``c``; ``zoneout_cell`` defaults to ``zoneout``.
    peepholes : bool, optional
        LSTM peephole connections (view ``"P"`` of shape ``(3, hidden_size)``, rows ``i, f, o``).
    layer_norm : bool, optional
        Layer normalisation of each product (and of ``c`` for LSTM) inside the recurrence; gains are views.
    layer_norm_eps : float, optional
        The layer normalisation's epsilon.

    Raises
    ------
    ValueError
        A field out of range or a combination that does not exist (projection, cell clipping or peepholes
        outside LSTM, ...); the message names the field, the value and what is allowed.

    Examples
    --------
    >>> import arrayrnn as ar
    >>> spec = ar.RNNSpec(mode="lstm", input_size=32, hidden_size=64, num_layers=2, bidirectional=True)
    >>> spec.num_directions, spec.gate_size, spec.output_size, spec.bias
    (2, 256, 64, 'double')
    >>> spec.state_shape(batch=8)
    (4, 8, 64)
    """

    mode: str
    input_size: int
    hidden_size: int
    num_layers: int = 1
    bidirectional: bool = False
    bias: str | bool = True
    proj_size: int = 0
    cell_clip: tuple[float, float] | float | None = None
    dropout: float = 0.0
    reset_after: bool = True
    dtype: str = "float32"
    # cell variants ("beyond the peers"); training-only masks come from arrayrnn.frontend.dropout
    recurrent_dropout: float = 0.0
    weight_dropout: float = 0.0
    zoneout: float = 0.0
    zoneout_cell: float | None = None
    peepholes: bool = False
    # layer normalisation inside the recurrence (issue 38): LN of each product (+ of c for LSTM)
    layer_norm: bool = False
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.mode not in MODES and cell_of(self.mode) is None:
            raise ValueError(f"mode = {self.mode!r}; expected one of {MODES} or the name of a cell "
                             f"registered with arrayrnn.register_cell (registered: {registered_cells()})")
        for field, minimum in (("input_size", 1), ("hidden_size", 1), ("num_layers", 1), ("proj_size", 0)):
            object.__setattr__(self, field, check_positive_int(field, getattr(self, field), minimum))
        for flag in ("bidirectional", "reset_after"):
            object.__setattr__(self, flag, check_flag(flag, getattr(self, flag)))
        if self.proj_size and self.mode != "lstm":
            raise ValueError(f"proj_size = {self.proj_size} with mode = {self.mode!r}; "
                             "projection exists only for mode='lstm' (use proj_size=0)")
        if self.proj_size >= self.hidden_size:
            raise ValueError(f"proj_size = {self.proj_size}; expected 0 (no projection) or "
                             f"0 < proj_size < hidden_size = {self.hidden_size}")
        if self.cell_clip is not None and self.mode != "lstm":
            raise ValueError(f"cell_clip = {self.cell_clip!r} with mode = {self.mode!r}; "
                             "cell clipping exists only for mode='lstm' (use cell_clip=None)")
        if not self.reset_after and self.mode != "gru":
            raise ValueError(f"reset_after = False with mode = {self.mode!r}; only GRU has a reset variant")
        for field in ("dropout", "recurrent_dropout", "weight_dropout", "zoneout"):
            object.__setattr__(self, field, _check_probability(field, getattr(self, field)))
        if self.zoneout and self.custom_cell is not None:
            raise ValueError(f"zoneout = {self.zoneout} with the custom cell mode = {self.mode!r}; zoneout "
                             "runs on the built-in cells only (use zoneout=0.0; recurrent_dropout and "
                             "weight_dropout work on every cell)")
        self._normalize_variants()
        self._normalize_layer_norm()
        object.__setattr__(self, "bias", _normalize_bias(self.bias))
        object.__setattr__(self, "cell_clip", _normalize_cell_clip(self.cell_clip))
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        self._check_matrix_sizes()

    def _normalize_variants(self) -> None:
        object.__setattr__(self, "peepholes", check_flag("peepholes", self.peepholes))
        if self.peepholes and self.mode != "lstm":
            raise ValueError(f"peepholes = True with mode = {self.mode!r}; peephole connections exist only "
                             "for mode='lstm' (use peepholes=False)")
        # zoneout_cell follows zoneout unless set; a mode without a cell keeps None (a value of 0 or of
        # zoneout, as spec.replace(mode=...) of an LSTM spec carries, means the same and becomes None)
        if self.zoneout_cell is None or (self.mode != "lstm" and self.zoneout_cell in (0.0, self.zoneout)):
            cell = self.zoneout if self.mode == "lstm" else None
        elif self.mode != "lstm":
            raise ValueError(f"zoneout_cell = {self.zoneout_cell!r} with mode = {self.mode!r}; only an LSTM "
                             "has a cell state (use zoneout_cell=None; zoneout= applies to h)")
        else:
            cell = _check_probability("zoneout_cell", self.zoneout_cell)
        object.__setattr__(self, "zoneout_cell", cell)

    def call_masks(self, training: bool) -> tuple[str, ...]:
        """The one rule of which masks a call applies, by name: ``"dropout"`` between layers (training, two
        layers or more), ``"recurrent"`` (recurrent dropout) and ``"weight"`` (DropConnect) in training
        only, ``"zoneout_h"`` and ``"zoneout_c"`` always (drawn in training, their expectation otherwise).
        The cell variants' names are the fields of :class:`arrayrnn.engines.base.CellMasks`."""
        on = {"dropout": training and self.dropout > 0 and self.num_layers > 1,
              "recurrent": training and self.recurrent_dropout > 0,
              "weight": training and self.weight_dropout > 0,
              "zoneout_h": bool(self.zoneout), "zoneout_c": bool(self.zoneout_cell)}
        return tuple(name for name, used in on.items() if used)

    def draws_masks(self, training: bool) -> bool:
        """Whether a call draws random masks (and so needs a seed): in training, where any mask applies."""
        return training and bool(self.call_masks(training))

    def _normalize_layer_norm(self) -> None:
        object.__setattr__(self, "layer_norm", check_flag("layer_norm", self.layer_norm))
        if self.layer_norm and self.custom_cell is not None:
            raise ValueError(f"layer_norm = True with the custom cell mode = {self.mode!r}; layer "
                             "normalisation inside the recurrence runs on the built-in cells only (use "
                             "layer_norm=False)")
        eps = _finite_float(self.layer_norm_eps)
        if eps is None or not eps > 0:
            raise ValueError(f"layer_norm_eps = {shown(self.layer_norm_eps)}; expected a finite float > 0 "
                             "(the variance's floor inside the square root, 1e-5 by default)")
        object.__setattr__(self, "layer_norm_eps", eps)

    @property
    def variants(self) -> tuple[str, ...]:
        """The cell variants this spec turns on, by field name (``()`` for a plain stack); layer
        normalisation (``"layer_norm"``) counts as one: code that runs only plain cells refuses it too."""
        on = [name for name in ("recurrent_dropout", "weight_dropout", "zoneout") if getattr(self, name)]
        if self.zoneout_cell and "zoneout" not in on:
            on.append("zoneout_cell")
        on += [name for name in ("peepholes", "layer_norm") if getattr(self, name)]
        return tuple(on)

    @property
    def norms_per_step(self) -> int:
        """How many rows one step of one layer-direction normalises inside its time loop (0 without
        ``layer_norm``): the recurrent product, and the cell state (LSTM); the reset-before GRU's
        recurrent product comes in two parts (r, z and n), each normalised over its own row. The input
        product is normalised too, outside the loop."""
        if not self.layer_norm:
            return 0
        return 2 if self.mode == "lstm" or (self.mode == "gru" and not self.reset_after) else 1

    def _check_matrix_sizes(self) -> None:
        widest = max(self.input_size, self.num_directions * self.output_size, self.output_size)
        if self.gate_size * widest > _INDEX_MAX:
            raise ValueError(f"hidden_size = {self.hidden_size} with input_size = {self.input_size}: a "
                             f"weight matrix would hold {self.gate_size * widest} elements; expected at most "
                             f"{_INDEX_MAX} (32-bit BLAS/cuDNN indexing)")

    # -- derived sizes: the only place these are computed ---------------------------------------
    @property
    def num_directions(self) -> int:
        """``D``, the number of directions (2 if bidirectional, else 1)."""
        return 2 if self.bidirectional else 1

    @property
    def custom_cell(self) -> Cell | None:
        """The registered custom cell this spec runs (:mod:`.cell_registry`), ``None`` for a built-in mode."""
        return None if self.mode in MODES else cell_of(self.mode)

    @property
    def gates(self) -> int:
        """``G``, the gate blocks per weight matrix (1 for rnn, 3 for gru, 4 for lstm, a custom cell's
        ``len(cell.gates)``)."""
        return len(self.gate_names)

    @property
    def gate_names(self) -> tuple[str, ...]:
        """The gate names in buffer order (LSTM ``("i", "f", "g", "o")``, GRU ``("r", "z", "n")``,
        RNN ``("h",)``, a custom cell's ``cell.gates``)."""
        cell = self.custom_cell
        return cell.gates if cell is not None else GATE_NAMES[self.mode]

    @property
    def split_gates(self) -> tuple[str, ...]:
        """The gates whose recurrent part ``W_hh h + b_hh`` stays apart from the input part inside the step
        (the reset-after GRU's ``n``; a custom cell's ``split``), in gate order."""
        cell = self.custom_cell
        if cell is not None:
            return cell.split
        return ("n",) if self.mode == "gru" and self.reset_after else ()

    @property
    def gate_size(self) -> int:
        """``G * hidden_size``, the rows of ``W_ih`` and ``W_hh``."""
        return self.gates * self.hidden_size

    @property
    def output_size(self) -> int:
        """``H_out``, the size of h and of each direction's slice of y (proj_size if projecting, else
        hidden_size)."""
        return self.proj_size or self.hidden_size

    @property
    def has_b_ih(self) -> bool:
        """Whether the bias mode keeps the input bias ``b_ih`` (``"double"`` or ``"single_inp"``)."""
        return self.bias in ("double", "single_inp")

    @property
    def has_b_hh(self) -> bool:
        """Whether the bias mode keeps the recurrent bias ``b_hh`` (``"double"`` or ``"single_rec"``)."""
        return self.bias in ("double", "single_rec")

    @property
    def has_cell(self) -> bool:
        """Whether the cell carries a state besides ``h`` (LSTM's ``c``; a custom cell of two states or
        more)."""
        cell = self.custom_cell
        return len(cell.states) > 1 if cell is not None else self.mode == "lstm"

    @property
    def cell_width(self) -> int:
        """The columns of ``c`` (``c0``, ``c_n``): ``H`` for LSTM, ``(S-1)*H`` for a custom cell of ``S``
        states (state ``k >= 1`` in columns ``(k-1)*H .. k*H``), 0 without a cell state."""
        cell = self.custom_cell
        if cell is not None:
            return (len(cell.states) - 1) * self.hidden_size
        return self.hidden_size if self.mode == "lstm" else 0

    def state_shape(self, batch: int, cell: bool = False) -> tuple[int, int, int]:
        """Shape of ``h0``/``h_n``: ``(L*D, B, H_out)``; with ``cell``, of ``c0``/``c_n``: ``(L*D, B, H)``
        (a custom cell: ``(L*D, B, (S-1)*H)``, :attr:`cell_width`)."""
        width = self.cell_width if cell else self.output_size
        return (self.num_layers * self.num_directions, batch, width)

    def layer_input_size(self, layer: int) -> int:
        """``I_l``: ``input_size`` for layer 0, else ``D * H_out``; a ``ValueError`` for a layer out of
        range."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer = {layer!r}; expected 0 <= layer < num_layers = {self.num_layers}")
        return self.input_size if layer == 0 else self.num_directions * self.output_size

    # -- serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values. Cell-variant and layer-norm fields at their defaults are left
        out, so a plain stack's dict (and a saved file's header) is what it was before those fields
        existed."""
        d = dataclasses.asdict(self)
        if d["cell_clip"] is not None:
            d["cell_clip"] = list(d["cell_clip"])
        defaults = {"recurrent_dropout": 0.0, "weight_dropout": 0.0, "zoneout": 0.0, "peepholes": False,
                    "zoneout_cell": self.zoneout if self.mode == "lstm" else None, "layer_norm": False,
                    "layer_norm_eps": 1e-5}
        return {k: v for k, v in d.items() if k not in defaults or v != defaults[k]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RNNSpec:
        """The spec from a dict of its fields (as written by `to_dict`); a ``ValueError`` on unknown
        fields."""
        if not isinstance(d, dict):
            raise ValueError(f"spec = {d!r}; expected a dict of RNNSpec fields")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"spec has unknown fields {unknown}; expected a subset of {sorted(names)}")
        return cls(**d)

    def replace(self, **changes: Any) -> RNNSpec:
        """A copy with some fields changed (``dataclasses.replace``), validated like a new spec."""
        return dataclasses.replace(self, **changes)


SEED_LIMIT = 2**64  # seeds are 64-bit (the dropout generator's key), like torch.manual_seed's


def check_seed(seed: Any) -> int | None:
    """The one seed rule (every API that takes a seed): ``None`` or an int in ``[0, 2**64)``."""
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed has type {type(seed).__name__}; expected None or an int in [0, 2**64)")
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed = {shown(seed)}; expected None or an int in [0, 2**64) (a 64-bit seed)")
    return int(seed)


def check_count(name: str, value: Any, minimum: int = 0) -> int:
    """A count argument (a size, a number of threads): a Python or NumPy int, not a bool, of at least
    ``minimum``; else a ``TypeError`` (another type) or ``ValueError`` naming ``name`` and the value."""
    expected = "a non-negative int" if minimum == 0 else f"an int >= {minimum}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} = {value!r} has type {type(value).__name__}; expected {expected}")
    if value < minimum:
        raise ValueError(f"{name} = {shown(value)}; expected {expected}")
    return int(value)
