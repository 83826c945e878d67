"""Commands of the serve service, added to the `streamtrain` CLI by `register`: serve, request, export."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]


def register(app: typer.Typer, bench: typer.Typer | None = None) -> None:
    """Add `serve`, `request` and `export` to a command group (its benchmark, `bench freshness`, is in
    `benchmarks`)."""
    del bench
    app.command("serve")(serve)
    app.command("request")(request)
    app.command("export")(export)


def serve(
    ctx: typer.Context,
    port: Annotated[int | None, typer.Option(help="metrics.port of /metrics (0: any free).")] = None,
    tolerance: Annotated[float | None, typer.Option(help="serve.tolerance of the promotion gate.")] = None,
) -> None:
    """Answer requests on <prefix>.requests with the newest model version that passed the promotion gate.

    Versions are announced on <prefix>.models by the trainers (versions.dir). Each prediction goes to
    <prefix>.predictions naming the version that made it and the request's offset; a request's offset is
    committed only once its prediction is delivered. A version worse than the trivial baseline measured beside
    it (the training mean, the most common class: serve.beat_baseline), one worse than the live one by more than
    serve.tolerance on the first of serve.gate_metrics (default: the objective's own) that tells them apart (over
    serve.min_samples samples each; a held-out figure from a newer evaluation), one whose files are missing or
    corrupt, or one whose
    model.json does not fit this configuration (trainer.num_features, trainer.objective, ...) is not served:
    the log says why, with each figure's step and samples.
    Give the --config the trainers used and kafka.bootstrap_servers (the address `up` prints): requests must
    fit the model. Kafka away longer than serve.broker_timeout_seconds (60): exit 1, for a supervisor to restart
    it. SIGTERM finishes the batch in hand and exits 0.
    """
    from streamtrain.runtime.commands import config_from, die, run_service

    from .broker import BrokerGone
    from .service import ModelServer

    cfg = config_from(ctx, {"metrics.port": port, "serve.tolerance": tolerance})
    server = ModelServer(cfg)
    try:
        run_service(server, cfg, lambda: f"serving job {cfg.job}: {cfg.kafka.topics.requests} -> "
                    f"{cfg.kafka.topics.predictions}, versions from {cfg.kafka.topics.models}; metrics on "
                    f"http://{cfg.metrics.bind_address}:{server.port}/metrics")
    except BrokerGone as exc:
        die(str(exc))  # closed by run(); exit 1, for the supervisor to restart


def request(
    ctx: typer.Context,
    rate: Annotated[float | None, typer.Option(help="serve.request_rate: requests per second.")] = None,
    duration: Annotated[float | None, typer.Option(min=0.0, help="Stop after this many seconds.")] = None,
    count: Annotated[int | None, typer.Option(min=1, help="Stop after this many requests.")] = None,
) -> None:
    """Send requests to <prefix>.requests at a steady rate, until Ctrl-C, --duration or --count.

    The samples, cycled: the held-out set (trainer.eval_packaged / trainer.eval_path), else the data the
    configuration replays (producer.dataset.packaged: its test split; producer.dataset.path), else the synthetic
    task's (trainer.num_features). Give the --config the run used. When versions.dir holds a version and the
    samples do not fit it, nothing is sent and the error names the settings (exit 2)."""
    import signal
    import threading

    from confluent_kafka import KafkaException

    from streamtrain.datasets import DatasetError
    from streamtrain.runtime.commands import EXIT_CONFIG, config_from, console, die

    from .requests import RequestSender

    cfg = config_from(ctx, {"serve.request_rate": rate})
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _sig, _frame: stopping.set())
    sender = RequestSender(cfg, cfg.serve.request_rate)
    try:
        delivered = sender.run(duration, count, stopping.is_set)
    except DatasetError as exc:
        die(f"the requests' samples: {exc}", EXIT_CONFIG)
    except KafkaException as exc:
        die(f"Kafka at {cfg.kafka.bootstrap_servers}: {exc}")
    console.print(f"{delivered} requests delivered to {cfg.kafka.topics.requests}", highlight=False)


def export(
    path: Annotated[Path, typer.Argument(help="A version's directory, or a model directory (versions.dir).")],
    out: Annotated[Path | None, typer.Option("--out", metavar="FILE", help="The file to write (default: "
                                             "model.pt2, model.pt or model.onnx in the current directory).")] = None,
    version: Annotated[str, typer.Option(help="'latest' or a version number (in a model directory).")] = "latest",
    fmt: Annotated[str, typer.Option("--format", help="export (the default: torch.export, .pt2, run with "
                                     "torch.export.load(f).module()), torchscript (.pt: torch.jit.load) or onnx "
                                     "(.onnx: onnxruntime or onnx.reference; needs the onnx package).")]
    = "export",
) -> None:
    """Export a model version to a graph that runs without streamtrain.

    Inputs: `values` (total frames, num_features) in the model's dtype, the samples back to back, and `lengths`
    (samples,) int64. Output: what load_model(...).predict answers, one row per sample (class probabilities,
    tag probabilities, or values in the target's units); the graph bounds samples above trainer.max_input_abs
    itself. Before it is written, the graph (for ONNX, the file itself, run by onnx.reference) is checked
    against predict on batches of other sizes; one that disagrees is not written, and a model that cannot be
    exported faithfully says why (exit 1)."""
    from streamtrain.runtime.commands import EXIT_CONFIG, console, die
    from streamtrain.versions import VersionError, load_model
    from streamtrain.versions.export import EXPORTED_OUTPUT, SUFFIXES, export_model

    if fmt not in SUFFIXES:
        die(f"--format {fmt!r}: choose {', '.join(SUFFIXES)}", EXIT_CONFIG)
    try:
        predictor = load_model(path, version)
        target = out or Path(f"model{SUFFIXES[fmt]}")
        export_model(predictor, target, fmt)  # type: ignore[arg-type]
    except VersionError as exc:
        die(str(exc))
    output = EXPORTED_OUTPUT.get(predictor.spec.objective, "your objective's predicted values")
    console.print(f"version {predictor.version} (step {predictor.spec.step}) exported to {target} and checked "
                  f"against predict: inputs values (frames, {predictor.spec.num_features}) "
                  f"{predictor.spec.settings.get('precision')} and lengths (samples,) int64; output {output}",
                  highlight=False)
