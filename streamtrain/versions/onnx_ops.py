"""ONNX forms of the operators the packed models sum segments with, where torch's own exporter gets them wrong.

The packed models pool each sample's frames with `index_add_` (a sum per segment: many rows add into one).
torch's TorchScript-based ONNX exporter renders `index_add` as a `ScatterElements` *without* a reduction, which
keeps one of the rows that land on the same index instead of their sum (its own warning says so: "ONNX export
does not support duplicated values in 'index'"): the graph ran, and a conv model's probabilities were off by up
to 0.5. `ScatterElements` has had `reduction="add"` since opset 16; `onnx_symbolics` registers that form for the
duration of one export.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.onnx import register_custom_op_symbolic, symbolic_helper, unregister_custom_op_symbolic

__all__ = ["OPSET", "onnx_symbolics"]


class _Unsupported(RuntimeError):
    """A use of an operator these forms do not cover (the export says so and writes nothing)."""


#: The opset the graphs are written in: `ScatterElements` with reduction add (16) and max (18).
OPSET = 18


@symbolic_helper.parse_args("v", "i", "v", "v", "v")
def _index_add(g: Any, target: Any, dim: int, index: Any, source: Any, alpha: Any = None) -> Any:
    """`target.index_add(dim, index, source)` as a `ScatterElements` that adds rows sharing an index."""
    if alpha is not None and not symbolic_helper._is_none(alpha) and symbolic_helper._maybe_get_const(alpha, "f") != 1:
        raise _Unsupported("index_add with alpha != 1")
    rank = symbolic_helper._get_tensor_rank(source)
    if rank is None:
        raise _Unsupported("index_add of a source of unknown rank")
    axes = [a for a in range(rank) if a != dim]
    # The index along `dim`, broadcast over the other axes to the source's shape (ScatterElements' contract).
    spread = index
    if axes:
        spread = g.op("Unsqueeze", index, g.op("Constant", value_t=torch.tensor(axes, dtype=torch.int64)))
    spread = g.op("Expand", spread, g.op("Shape", source))
    return g.op("ScatterElements", target, spread, source, axis_i=dim, reduction_s="add")


@symbolic_helper.parse_args("v")
def _asinh(g: Any, x: Any) -> Any:
    """`torch.asinh`: ONNX has had `Asinh` since opset 9; torch's exporter has no form for it."""
    return g.op("Asinh", x)


#: The value a reduction starts from (what a segment no row lands on would hold).
_IDENTITY = {"sum": 0.0, "prod": 1.0, "amax": float("-inf"), "amin": float("inf")}
_ONNX_REDUCTION = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}


def _filled(g: Any, like: Any, value: float) -> Any:
    """A tensor of `like`'s shape and dtype, every element `value`."""
    constant = g.op("ConstantOfShape", g.op("Shape", like),
                    value_t=torch.tensor([value], dtype=torch.float32))
    return g.op("CastLike", constant, like)


@symbolic_helper.parse_args("v", "i", "v", "v", "s", "b")
def _scatter_reduce(g: Any, target: Any, dim: int, index: Any, source: Any, reduce: str,
                    include_self: bool) -> Any:
    """`target.scatter_reduce(dim, index, source, reduce, include_self)`, include_self=False included (the seq
    model's per-series max): the source's rows reduced from the reduction's identity where an index lands,
    `target` where none does; torch's exporter refuses include_self=False."""
    if reduce not in _ONNX_REDUCTION:
        raise _Unsupported(f"scatter_reduce with reduce={reduce!r}")
    reduction = _ONNX_REDUCTION[reduce]
    if include_self:
        return g.op("ScatterElements", target, index, source, axis_i=dim,
                    reduction_s=reduction)
    reduced = g.op("ScatterElements", _filled(g, target, _IDENTITY[reduce]), index, source,
                   axis_i=dim, reduction_s=reduction)
    landed = g.op("ScatterElements", _filled(g, target, 0.0), index, _filled(g, source, 1.0),
                  axis_i=dim, reduction_s="add")
    return g.op("Where", g.op("Greater", landed, _filled(g, target, 0.0)), reduced, target)


#: aten operator -> its ONNX form here.
SYMBOLICS: dict[str, Callable[..., Any]] = {"aten::index_add": _index_add, "aten::asinh": _asinh,
                                             "aten::scatter_reduce": _scatter_reduce}


@contextlib.contextmanager
def onnx_symbolics() -> Iterator[int]:
    """Register the forms above for one `torch.onnx.export(..., opset_version=OPSET, dynamo=False)`; yields OPSET."""
    for name, symbolic in SYMBOLICS.items():
        register_custom_op_symbolic(name, symbolic, OPSET)
    try:
        yield OPSET
    finally:
        for name in SYMBOLICS:
            unregister_custom_op_symbolic(name, OPSET)
