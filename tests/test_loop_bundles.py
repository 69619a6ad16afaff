"""The compiled loops' named arguments (arrayrnn/engines/numba/bundles.py): each loop unpacks a bundle into
locals named as the bundle's fields, in their order, so a field added, removed or moved in one place but
not the other fails here, not as a wrong number in a result."""

from __future__ import annotations

import ast
import inspect

from arrayrnn.engines.numba import bundles, gru_loops, loop_parts, lstm_loops, rnn_loops

# a loop's parameter name -> the bundles it may carry
PARAMETERS = {
    "steps": (bundles.Steps,),
    "state": (bundles.State, bundles.ColumnState),
    "cell": (bundles.LSTMCell, bundles.GRUCell, bundles.RNNCell),
    "cache": (bundles.LSTMCache, bundles.GRUCache),
    "variants": (bundles.Variants,),
    "work": (bundles.ForwardWork, bundles.BackwardWork),
    "residuals": (bundles.LSTMResiduals, bundles.GRUResiduals),
    "grads": (bundles.BackSteps,),
    "carry": (bundles.Cotangents,),
    "norm": (bundles.NormForward, bundles.NormBackward),
}


def _unpacks() -> list[tuple[str, str, tuple[str, ...]]]:
    """(function, parameter, the names it is unpacked into) for every ``a, b = parameter`` in the loops'
    modules."""
    found = []
    nodes = [node for module in (loop_parts, lstm_loops, gru_loops, rnn_loops)
             for node in ast.walk(ast.parse(inspect.getsource(module)))]
    for node in nodes:
        if not isinstance(node, ast.FunctionDef):
            continue
        params = {a.arg for a in node.args.args}
        for stmt in ast.walk(node):
            if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id in params
                    and isinstance(stmt.targets[0], ast.Tuple)):
                names = tuple(t.id for t in stmt.targets[0].elts)
                found.append((node.name, stmt.value.id, names))
    return found


def test_every_unpack_of_a_bundle_names_its_fields_in_order():
    unpacks = _unpacks()
    loops_seen = {function for function, _, _ in unpacks}
    loops_named = {f"{mode}_{phase}_loop" for mode in ("lstm", "gru", "rnn")
                   for phase in ("forward", "backward")}
    assert loops_named | {"lstm_forward_columns", "gru_forward_columns"} <= loops_seen
    for function, param, names in unpacks:
        assert param in PARAMETERS, (function, param)
        assert names in {cls._fields for cls in PARAMETERS[param]}, (function, param, names)


def test_bundles_cross_the_call_as_plain_tuples():
    steps = bundles.Steps(bundles.absent("float32", 3), bundles.absent("int64", 1),
                          bundles.absent("float32", 3), False)
    plain = bundles.plain((1, steps, 2.0))
    assert type(plain[1]) is tuple and plain[1] == tuple(steps) and plain[0] == 1 and plain[2] == 2.0
