"""`streamtrain export`: a model version as a graph that runs without streamtrain (torch.export, TorchScript, ONNX).

What the graph takes: the packed batch's two defining tensors, `values` (total_frames, num_features) in the
model's dtype and `lengths` (num_samples,) int64 — sample i is rows sum(lengths[:i]) .. + lengths[i] — and it
returns the model's outputs (num_samples, outputs), the logits of a classifier. The graph rebuilds the rest of
the batch (segment ids, cumulative lengths) itself. The default packing's other step, scaling a sample whose
largest |value| exceeds `max_input_abs` down to it, stays with the caller (a no-op for well-scaled data).

Formats: `export` (the default: `torch.export` with both sizes dynamic, a `.pt2` file loaded with
`torch.export.load(path).module()`), `torchscript` (a trace, `torch.jit.load`; deprecated by torch but still
read everywhere), `onnx` (needs the `onnx` package). Every graph is checked on batches of other sizes and
lengths against the model itself: a model whose computation depends on Python decisions about the batch's shape
(a trace records one branch) fails that check, and export says so instead of writing a graph that is right only
for the probe.
`length_buckets` is set to 0 in the graph: it pads the packed axis so eager CPU kernels are reused, and padding
changes no output (the check would catch one it did change).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from torch.export import Dim

from ..models.batching import PackedBatch, collate_packed
from ..models.errors import SetupError
from ..models.plugins import build_model, probe_samples
from .errors import VersionError
from .predictor import Predictor

__all__ = ["SUFFIXES", "ExportFormat", "PackedGraph", "export_model"]

logger = logging.getLogger(__name__)

ExportFormat = Literal["export", "torchscript", "onnx"]

#: The file suffix of each format.
SUFFIXES: dict[str, str] = {"export": ".pt2", "torchscript": ".pt", "onnx": ".onnx"}

#: Probe batches (sample sizes) the exported graph is checked on: other counts and lengths than the trace's.
CHECK_SIZES: tuple[tuple[int, ...], ...] = ((1,), (7, 120, 3, 64, 19), (300, 2))


class PackedGraph(nn.Module):
    """`(values, lengths) -> outputs` around a model that takes a `PackedBatch`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        count = lengths.shape[0]
        # output_size: the frames are the values' rows, a size the graph knows (not one read from the data).
        segment_ids = torch.repeat_interleave(torch.arange(count, device=values.device), lengths,
                                              output_size=values.shape[0])
        cu_seqlens = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
        return self.model(PackedBatch(values, segment_ids, cu_seqlens, lengths, lengths.new_zeros(count)))


def _refuse(predictor: Predictor, why: str) -> VersionError:
    return VersionError(f"version {predictor.version} ({predictor.spec.settings.get('model')!r}) cannot be exported: "
                        f"{why}")


def _graph(predictor: Predictor) -> tuple[PackedGraph, nn.Module]:
    """The graph module to trace (settings for export) and the model it must agree with."""
    if predictor.config.collate is not None:
        raise _refuse(predictor, f"its batches come from trainer.collate {predictor.config.collate!r}, a plug-in "
                      "whose batch is not the packed (values, lengths) an exported graph takes")
    config = predictor.config.model_copy(update={"length_buckets": 0})
    try:
        model = build_model(config)
    except SetupError as exc:
        raise _refuse(predictor, str(exc)) from None
    model.load_state_dict(predictor.model.state_dict())
    return PackedGraph(model.eval()), predictor.model


def export_model(predictor: Predictor, out: Path, fmt: ExportFormat = "export") -> Path:
    """Export `predictor`'s model to `out` and check the graph against the model.

    Args:
        predictor: A loaded version (`load_model`).
        out: The file to write.
        fmt: "export" (torch.export, .pt2), "torchscript" or "onnx" (needs the `onnx` package: the `onnx` extra).

    Returns:
        `out`.

    Raises:
        VersionError: the model cannot be exported, or its graph does not agree with it; the message says why.
    """
    graph, reference = _graph(predictor)
    probe = collate_packed(probe_samples(predictor.config, (5, 9, 30)), predictor.config)
    args = (probe.values, probe.lengths)
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's warnings about Python values: the check below decides
        try:
            if fmt == "torchscript":
                traced = torch.jit.trace(graph, args, check_trace=False)
                runnable: nn.Module = traced
            else:
                program = torch.export.export(graph, args, dynamic_shapes={"values": {0: Dim("frames")},
                                                                           "lengths": {0: Dim("samples")}})
                runnable = program.module()
        except Exception as exc:  # a model may fail tracing in any way: say how
            raise _refuse(predictor, f"capturing its graph failed ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
        _check(predictor, runnable, reference)
        if fmt == "onnx":
            _onnx(predictor, graph, probe, out)
        elif fmt == "torchscript":
            torch.jit.save(traced, str(out))
        else:
            torch.export.save(program, str(out))
    logger.info("exported version %d to %s (%s)", predictor.version, out, fmt)
    return out


def _check(predictor: Predictor, runnable: nn.Module, reference: nn.Module) -> None:
    for sizes in CHECK_SIZES:
        batch = collate_packed(probe_samples(predictor.config, sizes), predictor.config)
        try:
            got = runnable(batch.values, batch.lengths)
        except Exception as exc:
            raise _refuse(predictor, f"its graph fails on a batch of {len(sizes)} samples of sizes "
                          f"{list(sizes)} ({type(exc).__name__}: {str(exc).splitlines()[0]}): its computation "
                          "depends on the shape of the batch it was traced with") from None
        want = reference(batch)
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
            raise _refuse(predictor, f"its graph answers a batch of sizes {list(sizes)} differently from the "
                          "model (a Python decision on the traced batch's shape was recorded as a constant)")


def _onnx(predictor: Predictor, graph: PackedGraph, probe: PackedBatch, out: Path) -> None:
    try:
        import onnx  # noqa: F401  (torch.onnx writes the file through it)
    except ImportError:
        raise _refuse(predictor, "ONNX export needs the onnx package (pip install 'streamtrain[onnx]'); "
                      "--format torchscript needs nothing more") from None
    try:
        torch.onnx.export(graph, (probe.values, probe.lengths), str(out), dynamo=False,
                          input_names=["values", "lengths"], output_names=["outputs"],
                          dynamic_axes={"values": {0: "frames"}, "lengths": {0: "samples"},
                                        "outputs": {0: "samples"}})
    except Exception as exc:  # the exporter's errors name the operator it has no ONNX form for
        raise _refuse(predictor, f"the ONNX exporter refused it ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0]}); --format torchscript may still work") from None
