"""Commands of the bridge service, added to the `streamtrain` CLI by `register`."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["register"]

_HELP = """Bridge existing topics, in their own format, into the device topics as Samples, exactly once.

Each source topic (`\\[\\[bridge.sources]]` in the --config file: its topic and decoder) is read in the bridge's
group; every record becomes one Sample in its device's topic (<prefix>.device.<id>, the device from the
record's key or a field), or a dead letter with the decoder's reason. Samples, dead letters and the group's
offsets commit in one Kafka transaction: a crash at any point loses and duplicates nothing.

The sources may be on another cluster than the stack's (`\\[bridge.source_cluster]`: its bootstrap_servers,
security_protocol, sasl_* and ssl_*, as in `\\[kafka]`; STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__* in the environment):
the bridge then reads them there and keeps its progress on the stack's cluster, in the same transactions.

Decoders: `json` (a field mapping: the array, its shape, label or target, device, time), `raw` (little-endian
arrays of one dtype and shape, the device from the key), or your own `package.module:function`, which gets
each record (key, value, headers, timestamp, topic/partition/offset) and returns the sample's fields, or None
to skip it. A sample is \\[size, features]: a one-axis array is written as \\[size, 1], and the trainers must be
told the features (trainer.num_features). Each decoder is tried on its topic's next records before the bridge
starts (bridge.check_records): a setting that cannot work, or under which fewer than bridge.check_min_decoded
of them decode, exits with status 2 and names the setting.

Example (docs/guides/bridge.md has the whole config):

  streamtrain --config bridge.toml bridge

  \\[\\[bridge.sources]]
  topic = "sensors"
  decoder = "json"
  mapping = { data = "values", shape = [-1, 16], label = "label", device = "sensor" }
"""


def register(app: typer.Typer, bench: typer.Typer | None = None) -> None:
    """Add `bridge` to a command group (its benchmark, `bench bridge`, is in `benchmarks`)."""
    del bench
    app.command("bridge", help=_HELP)(bridge)


def bridge(
    ctx: typer.Context,
    devices: Annotated[str | None, typer.Option(help="bridge.devices: comma-separated device ids the bridge "
                                                "writes (default coordinator.devices).")] = None,
    instance: Annotated[str | None, typer.Option(help="bridge.instance: this bridge's name among several in one "
                                                 "group (its transactional id; keep it across restarts).")] = None,
    port: Annotated[int | None, typer.Option(help="metrics.port of /metrics (0: any free).")] = None,
) -> None:
    """Run the bridge until SIGTERM or Ctrl-C (the open transaction is committed first)."""
    import signal

    from confluent_kafka import KafkaException

    from streamtrain.metrics import serve_metrics
    from streamtrain.runtime.commands import EXIT_CONFIG, config_from, console, die

    from .errors import BridgeFatalError, BridgeSetupError
    from .service import Bridge

    listed = [d.strip() for d in devices.split(",") if d.strip()] if devices else None
    cfg = config_from(ctx, {"bridge.devices": listed, "bridge.instance": instance, "metrics.port": port})
    try:
        service = Bridge(cfg)
    except BridgeSetupError as exc:
        die(str(exc), EXIT_CONFIG)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _sig, _frame: service.stop())
    try:
        service.start()
        if cfg.bridge.metrics:
            bound = serve_metrics(service.metrics.registry, cfg.metrics.bind_address, cfg.metrics.port)
            console.print(f"bridge metrics on http://{cfg.metrics.bind_address}:{bound}/metrics", highlight=False)
        console.print(f"bridging {', '.join(service.decoders)} into the topics of {len(service.devices)} devices "
                      f"(transactional id {service.transactional_id})", highlight=False)
        service.run()
    except BridgeSetupError as exc:
        service.close(commit=False)
        die(str(exc), EXIT_CONFIG)
    except (BridgeFatalError, KafkaException, TimeoutError) as exc:
        service.close(commit=False)  # what the open transaction held is read again at the next start
        detail = exc.args[0].str() if isinstance(exc, KafkaException) and exc.args else str(exc)
        # An explained refusal names its own cluster (the stack's, or the sources'); anything else is the stack's.
        told = isinstance(exc, BridgeFatalError) or detail.startswith("Kafka at ")
        die(detail if told else f"Kafka at {cfg.kafka.bootstrap_servers}: {exc}")
    service.close()
    console.print("bridge stopped: what it read is committed", highlight=False)
