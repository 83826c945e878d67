"""Commands of the producers service, added to the `streamtrain` CLI by `register`."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

__all__ = ["register"]


def register(app: typer.Typer, bench: typer.Typer | None = None) -> None:
    """Add `produce` to a command group (its benchmark, `bench ingest`, is in `benchmarks`)."""
    del bench
    app.command("produce")(produce)


def produce(
    ctx: typer.Context,
    devices: Annotated[int | None, typer.Option(help="Number of device streams.")] = None,
    duration: Annotated[float | None,
                        typer.Option(help="Seconds to run (0: until Ctrl-C/SIGTERM, the default).")] = None,
    max_samples: Annotated[int | None, typer.Option(help="Stop each device after this many samples.")] = None,
    rate: Annotated[float | None, typer.Option(help="Mean rate per device, samples/s.")] = None,
    rate_kind: Annotated[str | None, typer.Option(help="constant | uniform | normal | unlimited.")] = None,
    rate_std: Annotated[float | None, typer.Option(help="Std of per-device rates (uniform, normal).")] = None,
    preset: Annotated[str | None, typer.Option(help="ScaDLES rate set: S1, S2, S1' (S1p), S2' (S2p).")] = None,
    size_kind: Annotated[str | None, typer.Option(help="fixed | normal | lognormal | replay.")] = None,
    size: Annotated[float | None, typer.Option(help="Mean sample size (frames, tokens).")] = None,
    dif: Annotated[float | None, typer.Option(help="DIF: std of sample sizes.")] = None,
    labels_per_device: Annotated[int | None, typer.Option(help="Non-IID: classes per device.")] = None,
    dataset: Annotated[Path | None, typer.Option(help="Replay this dataset (a .ts/.npy/.npz/.csv file or a "
                                                                     "directory of them).")] = None,
    sharding: Annotated[str | None, typer.Option(help="random | stratified | distribution-aware.")] = None,
    alpha: Annotated[float | None, typer.Option(help="Injection: fraction of other devices receiving.")] = None,
    beta: Annotated[float | None, typer.Option(help="Injection: fraction of samples shared per round.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of every random choice.")] = None,
    progress: Annotated[bool, typer.Option(help="Live progress table.")] = True,
) -> None:
    """Publish one stream of samples per device to <prefix>.device.<id> at controlled rates."""
    from rich.live import Live

    from streamtrain.datasets import DatasetError
    from streamtrain.metrics import serve_metrics
    from streamtrain.runtime.commands import EXIT_CONFIG, config_from, console, die

    from .display import progress_view, summary_view
    from .service import ProducerError, StreamProducer

    flags: dict[str, Any] = {
        "producer.devices": devices, "producer.duration_seconds": duration, "producer.max_samples": max_samples,
        "producer.rate.mean": rate, "producer.rate.kind": rate_kind, "producer.rate.std": rate_std,
        "producer.rate.preset": preset, "producer.size.kind": size_kind, "producer.size.mean": size,
        "producer.size.dif": dif, "producer.synthetic.labels_per_device": labels_per_device,
        "producer.dataset.path": str(dataset) if dataset else None, "producer.dataset.sharding": sharding,
        "producer.injection.alpha": alpha, "producer.injection.beta": beta, "producer.seed": seed,
    }
    cfg = config_from(ctx, flags)
    try:
        service = StreamProducer(cfg.kafka, cfg.producer)
    except (DatasetError, ValueError) as exc:
        die(str(exc), EXIT_CONFIG)
    if cfg.producer.metrics:
        port = cfg.producer.metrics_port if cfg.producer.metrics_port is not None else cfg.metrics.port
        bound = serve_metrics(service.metrics.registry, cfg.metrics.bind_address, port)
        console.print(f"metrics on http://{cfg.metrics.bind_address}:{bound}/metrics")

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        # SIGINT (Ctrl-C) and SIGTERM (docker stop, supervisors) both end the stream and flush every accepted
        # record; handled explicitly, since a process started in the background inherits SIGINT ignored.
        if service.stop_event.is_set():
            raise KeyboardInterrupt  # a second signal: stop waiting for the flush
        service.request_stop("interrupt" if signum == signal.SIGINT else "SIGTERM")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if progress and console.is_terminal:
            with Live(get_renderable=lambda: progress_view(service.snapshot()), console=console, refresh_per_second=2):
                summary = service.run()
        else:
            summary = service.run()
    except ProducerError as exc:
        die(str(exc))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    console.print(summary_view(summary))
    if not summary.ok:
        raise typer.Exit(1)

