"""`streamtrain export`: a model version as a graph that runs without streamtrain (torch.export, TorchScript, ONNX).

What the graph takes: the samples packed back to back, `values` (total_frames, num_features) in the model's
dtype, and `lengths` (num_samples,) int64 — sample i is rows sum(lengths[:i]) .. + lengths[i]. What it returns:
what `load_model(...).predict` answers, one row per sample — a classifier's class `probabilities` (argmax: the
label), a multi-label model's tag probabilities, a regression's `values` in the target's own units, a forecast's
`values` (N, horizon, num_features), an objective of your own's `predicted` array. The graph does everything
`predict` does between the two: it standardises every feature as the version says (`trainer.input_shift` /
`input_scale`), scales a sample whose largest |value| exceeds `trainer.max_input_abs` down to
it (the default packing's bound, whose factors ride in the batch so that a forecast answers in the series' own
units), rebuilds the rest of the batch (segment ids, cumulative lengths), runs the model and turns its outputs
into the objective's terms (`Objective.predicted`).

Formats: `export` (the default: `torch.export` with both sizes dynamic, a `.pt2` file loaded with
`torch.export.load(path).module()`), `torchscript` (a trace, `torch.jit.load`; deprecated by torch but still
read everywhere), `onnx` (needs the `onnx` package; the file runs under onnxruntime or `onnx.reference`). Every
graph is checked against `predict` on batches of other sizes and lengths than the trace's, one sample of each
above `max_input_abs`: a model whose computation depends on Python decisions about the batch's shape (a trace
records one branch) fails that check, and export says so instead of writing a graph that is right only for the
probe. The ONNX file is checked as written, run by `onnx.reference.ReferenceEvaluator`, and kept only if it
agrees.
`length_buckets` is set to 0 in the graph: it pads the packed axis so eager CPU kernels are reused, and padding
changes no output (the check would catch one it did change).
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.export import Dim

from streamtrain.plugins import SetupError

from ..models.batching import PackedBatch, model_dtype
from ..models.plugins import build_model
from ..models.standardise import input_scaling
from ..objectives import Objective
from ..wire import Sample
from .errors import VersionError
from .onnx_ops import onnx_symbolics
from .predictor import PREDICT_DEVICE, Predictor

__all__ = ["CHECK_SIZES", "EXPORTED_OUTPUT", "SUFFIXES", "ExportFormat", "PackedGraph", "export_model", "graph_inputs"]

logger = logging.getLogger(__name__)

ExportFormat = Literal["export", "torchscript", "onnx"]

#: The file suffix of each format.
SUFFIXES: dict[str, str] = {"export": ".pt2", "torchscript": ".pt", "onnx": ".onnx"}

#: What the graph returns, by objective (for a person).
EXPORTED_OUTPUT: dict[str, str] = {
    "classification": "(samples, classes) class probabilities (argmax: the label)",
    "multilabel": "(samples, tags) tag probabilities",
    "regression": "(samples, target_width) values in the target's units",
    "forecast": "(samples, horizon, num_features) the next values of each series",
}

#: Batches (sample sizes) the exported graph is checked on: other counts and lengths than the trace's.
CHECK_SIZES: tuple[tuple[int, ...], ...] = ((1,), (7, 120, 3, 64, 19), (300, 2))

#: Sizes of the batch the graph is traced with.
TRACE_SIZES = (5, 9, 30)

#: How close the graph's answers must be to `predict`'s (float32 kernels differ in summation order).
RTOL, ATOL = 1e-4, 1e-5


class PackedGraph(nn.Module):
    """`(values, lengths) -> predictions` around a model that takes a `PackedBatch` (see the module doc)."""

    input_shift: torch.Tensor
    input_scale: torch.Tensor

    def __init__(self, model: nn.Module, objective: Objective, max_input_abs: float,
                 scaling: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        super().__init__()
        self.model = model
        self.objective = objective
        self.max_input_abs = max_input_abs
        self.scaled = scaling is not None
        dtype = next((p.dtype for p in model.parameters()), torch.float32)
        # Unused without scaling, but not empty: torch.export's .pt2 packaging fails on an empty float64 buffer.
        shift, scale = scaling if scaling is not None else (np.zeros(1), np.ones(1))
        self.register_buffer("input_shift", torch.as_tensor(shift, dtype=dtype))
        self.register_buffer("input_scale", torch.as_tensor(scale, dtype=dtype))

    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        count = lengths.shape[0]
        # output_size: the frames are the values' rows, a size the graph knows (not one read from the data).
        segment_ids = torch.repeat_interleave(torch.arange(count, device=values.device), lengths,
                                              output_size=values.shape[0])
        if self.scaled:  # the default packing's input standardisation (`streamtrain.models.standardise`)
            values = (values - self.input_shift) / self.input_scale
        factors = None
        if self.max_input_abs > 0:
            values, factors = _bounded(values, segment_ids, count, self.max_input_abs)
        cu_seqlens = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
        batch = PackedBatch(values, segment_ids, cu_seqlens, lengths, lengths.new_zeros(count),
                            bound_factors=factors)
        return self.objective.predicted(self.model(batch), batch)


def _bounded(values: torch.Tensor, segment_ids: torch.Tensor, count: int,
             max_abs: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The default packing's bound in torch operations: each sample whose largest |value| exceeds `max_abs`
    scaled down to reach it (`streamtrain.models.batching`, which does it in numpy); also returns each sample's
    factor (1 where it was not scaled)."""
    row_max = values.abs().amax(dim=1)
    sample_max = values.new_zeros(count).scatter_reduce(0, segment_ids, row_max, "amax", include_self=True)
    factor = torch.where(sample_max > max_abs, max_abs / sample_max.clamp_min(max_abs), torch.ones_like(sample_max))
    return values * factor[segment_ids].unsqueeze(1), factor


def _refuse(predictor: Predictor, why: str) -> VersionError:
    return VersionError(f"version {predictor.version} ({predictor.spec.settings.get('model')!r}) cannot be exported: "
                        f"{why}")


def _graph(predictor: Predictor) -> PackedGraph:
    """The graph module to capture: the version's weights in a model built for export (no length buckets)."""
    if predictor.config.collate is not None:
        raise _refuse(predictor, f"its batches come from trainer.collate {predictor.config.collate!r}, a plug-in "
                      "whose batch is not the packed (values, lengths) an exported graph takes")
    config = predictor.config.model_copy(update={"length_buckets": 0})
    try:
        model = build_model(config)
    except SetupError as exc:
        raise _refuse(predictor, str(exc)) from None
    model.load_state_dict(predictor.model.state_dict())
    return PackedGraph(model.eval(), predictor.objective, config.max_input_abs, input_scaling(config)).eval()


def graph_inputs(arrays: Sequence[np.ndarray], dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """An exported graph's inputs for `arrays` (each (size, num_features)): `values` and `lengths`.

    Args:
        arrays: The samples.
        dtype: The model's dtype (`trainer.precision`; model.json's `features.dtype`).
    """
    lengths = torch.tensor([len(a) for a in arrays], dtype=torch.int64)
    values = torch.from_numpy(np.concatenate([np.asarray(a, dtype=np.float64) for a in arrays])).to(dtype)
    return values, lengths


def _check_arrays(predictor: Predictor, sizes: Sequence[int], seed: int) -> list[np.ndarray]:
    """Samples of `sizes` (at least the objective's shortest), one scaled above `max_input_abs` when it is set."""
    rng = np.random.default_rng(seed)
    shortest = predictor.objective.min_size()
    arrays = [rng.standard_normal((max(n, shortest), predictor.spec.num_features)) for n in sizes]
    bound = predictor.config.max_input_abs
    if bound > 0:
        arrays[len(arrays) // 2] *= 10 * bound  # the graph must bound it as `predict` does
    return arrays


def _answers(predictor: Predictor, arrays: Sequence[np.ndarray]) -> torch.Tensor:
    """What `predict` answers for `arrays`, as the one array the graph returns."""
    samples = [Sample.from_array(PREDICT_DEVICE, i, a.astype(np.float32)) for i, a in enumerate(arrays)]
    outputs, batch = predictor._outputs(samples)
    return predictor.objective.predicted(outputs, batch)


Runner = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _check(predictor: Predictor, run: Runner, what: str) -> None:
    """Refuse the graph unless `run` answers every check batch as `predict` does."""
    dtype = model_dtype(predictor.config)
    for seed, sizes in enumerate(CHECK_SIZES):
        arrays = _check_arrays(predictor, sizes, seed)
        values, lengths = graph_inputs([a.astype(np.float32) for a in arrays], dtype)
        try:
            got = run(values, lengths)
        except Exception as exc:  # a graph may fail on another shape in any way: say how
            raise _refuse(predictor, f"{what} fails on a batch of {len(sizes)} samples of sizes {list(sizes)} "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): its "
                          "computation depends on the shape of the batch it was traced with") from None
        want = _answers(predictor, arrays)
        if got.shape != want.shape or not torch.allclose(got.to(want.dtype), want, rtol=RTOL, atol=ATOL):
            worst = (got.to(want.dtype) - want).abs().max().item() if got.shape == want.shape else None
            differs = (f"by up to {worst:.3g}" if worst is not None
                       else f"in shape ({list(got.shape)} vs {list(want.shape)})")
            raise _refuse(predictor, f"{what} answers a batch of sizes {list(sizes)} differently from predict "
                          f"({differs}): an operator the format renders differently, or a Python decision on the "
                          "traced batch's shape recorded as a constant")


def export_model(predictor: Predictor, out: Path, fmt: ExportFormat = "export") -> Path:
    """Export `predictor`'s model to `out`, checked against `predict` before it is written (see the module doc).

    Args:
        predictor: A loaded version (`load_model`).
        out: The file to write.
        fmt: "export" (torch.export, .pt2), "torchscript" or "onnx" (needs the `onnx` package: the `onnx` extra).

    Returns:
        `out`.

    Raises:
        VersionError: the model cannot be exported, or its graph does not agree with `predict` (nothing is
            written); the message says why.
    """
    graph = _graph(predictor)
    dtype = model_dtype(predictor.config)
    args = graph_inputs(_check_arrays(predictor, TRACE_SIZES, seed=99), dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's warnings about Python values: the check below decides
        if fmt == "onnx":
            _onnx(predictor, graph, args, out)
        else:
            _torch(predictor, graph, args, out, fmt)
    logger.info("exported version %d to %s (%s)", predictor.version, out, fmt)
    return out


def _torch(predictor: Predictor, graph: PackedGraph, args: tuple[torch.Tensor, torch.Tensor], out: Path,
           fmt: ExportFormat) -> None:
    try:
        if fmt == "torchscript":
            traced = torch.jit.trace(graph, args, check_trace=False)
            _check(predictor, traced, "its TorchScript graph")
            torch.jit.save(traced, str(out))
            return
        program = torch.export.export(graph, args, dynamic_shapes={"values": {0: Dim("frames")},
                                                                   "lengths": {0: Dim("samples")}})
    except VersionError:
        raise
    except Exception as exc:  # a model may fail tracing in any way: say how
        raise _refuse(predictor, f"capturing its graph failed ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    _check(predictor, program.module(), "its torch.export graph")
    torch.export.save(program, str(out))


def _onnx(predictor: Predictor, graph: PackedGraph, args: tuple[torch.Tensor, torch.Tensor], out: Path) -> None:
    """Write the ONNX file beside `out`, run it with onnx's reference evaluator on the check batches, and move it
    into place only when it agrees with `predict`."""
    try:
        import onnx
        from onnx.reference import ReferenceEvaluator
    except ImportError:
        raise _refuse(predictor, "ONNX export needs the onnx package (pip install 'streamtrain[onnx]'); "
                      "--format export or torchscript need nothing more") from None
    handle, scratch = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(handle)
    try:
        try:
            with onnx_symbolics() as opset:
                torch.onnx.export(graph, args, scratch, dynamo=False, opset_version=opset,
                                  input_names=["values", "lengths"],
                                  output_names=["predictions"],
                                  dynamic_axes={"values": {0: "frames"}, "lengths": {0: "samples"},
                                                "predictions": {0: "samples"}})
            evaluator: Any = ReferenceEvaluator(onnx.load(scratch))
        except Exception as exc:  # the exporter's errors name the operator it has no ONNX form for
            raise _refuse(predictor, f"the ONNX exporter refused it ({type(exc).__name__}: "
                          f"{_first_line(exc)}); --format export or torchscript may still work") from None

        def run(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            got = evaluator.run(None, {"values": values.numpy(), "lengths": lengths.numpy()})[0]
            return torch.from_numpy(np.asarray(got))

        _check(predictor, run, "its ONNX graph (run by onnx.reference)")
        os.replace(scratch, out)
    finally:
        Path(scratch).unlink(missing_ok=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
