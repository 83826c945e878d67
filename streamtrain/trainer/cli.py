"""Commands of the trainer service, added to the `streamtrain` CLI by `register`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["register"]


def register(app: typer.Typer, bench: typer.Typer | None = None) -> None:
    """Add `train` to a command group (no trainer benchmarks yet)."""
    del bench
    app.command("train")(train)


def train(
    ctx: typer.Context,
    device_id: Annotated[str | None, typer.Option(help="Device this rank trains (its topic <prefix>.device.<id>).")]
    = None,
    devices: Annotated[
        str | None, typer.Option(help="Comma-separated devices, one per rank: rank r trains the r-th "
                                        "(--local-ranks or torchrun).")
    ] = None,
    node_devices: Annotated[
        str | None,
        typer.Option(help="Comma-separated devices of this node, one per local rank: local rank r trains the r-th "
                          "(torchrun across nodes with --nnodes MIN:MAX, where global ranks change).")
    ] = None,
    local_ranks: Annotated[
        int | None, typer.Option(help="Launch this many ranks here, training the devices of --devices (default "
                                      "0..N-1).", min=1)
    ] = None,
    steps: Annotated[int | None, typer.Option(help="Stop after this many global steps (0: until SIGTERM).")] = None,
    checkpoint_dir: Annotated[Path | None, typer.Option(help="Directory of atomic checkpoints.")] = None,
    plan_wait: Annotated[float | None, typer.Option(help="Seconds to wait for a plan before a local one.")] = None,
) -> None:
    """Train one DDP rank per device on its Kafka stream, following the coordinator's plans.

    Which devices: --local-ranks N starts N ranks on this machine, rank r training the r-th device of --devices
    (default 0 .. N-1): --local-ranks 2 --devices cam7,cam8 trains the topics <prefix>.device.cam7 and
    <prefix>.device.cam8 (<prefix>: kafka.topic_prefix). Under torchrun (one rank per process, with RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT) --devices names one device per global rank; across elastic nodes give
    each node its own --node-devices: a node's devices stay its own as ranks change.

    Each rank creates its device topic when missing (kafka.partitions, default 1) and starts at the offset its
    group committed, else at the topic's start. The samples must fit the settings: shape (size,
    trainer.num_features) and, for classification, a label below trainer.num_classes; any other goes to
    <prefix>.dead-letter with the reason. Run `streamtrain coordinate` beside the ranks for balanced plans;
    without it each rank plans alone after --plan-wait seconds.

    SIGTERM (Ctrl-C with --local-ranks) finishes the step, commits, checkpoints and exits 0.

    Example: streamtrain --set kafka.bootstrap_servers=kafka-1:9092 --set trainer.num_features=2 train
    --local-ranks 2 --devices cam7,cam8
    """
    from confluent_kafka import KafkaException

    from streamtrain.runtime.commands import EXIT_CONFIG, config_from, die
    from streamtrain.wire import TopicNames

    from .errors import TrainerSetupError
    from .placement import device_for_rank

    flags: dict[str, Any] = {
        "trainer.max_steps": steps,
        "trainer.checkpoint_dir": str(checkpoint_dir) if checkpoint_dir is not None else None,
        "trainer.plan_wait_seconds": plan_wait,
    }
    cfg = config_from(ctx, flags)
    names = [d.strip() for d in devices.split(",")] if devices else []
    node_names = [d.strip() for d in node_devices.split(",")] if node_devices else []
    if local_ranks is not None and not names:
        names = [str(i) for i in range(local_ranks)]
    try:
        for name in [*names, *node_names, *([device_id] if device_id else [])]:
            TopicNames(cfg.kafka.topic_prefix).device(name)
    except ValueError as exc:
        die(str(exc), EXIT_CONFIG)
    if local_ranks is not None:
        if len(names) != local_ranks:
            die(f"--local-ranks {local_ranks} needs {local_ranks} devices, --devices names {len(names)}", EXIT_CONFIG)
        from .launch import launch_local_ranks

        try:
            status = launch_local_ranks(cfg, names)
        except TrainerSetupError as exc:  # e.g. trainer.cpu_allocator=jemalloc without jemalloc installed
            die(str(exc), EXIT_CONFIG)
        raise typer.Exit(status)
    if device_id is None:
        try:
            device_id = device_for_rank(names, node_names, os.environ)
        except TrainerSetupError as exc:
            die(str(exc), EXIT_CONFIG)
    from .rank import run_rank

    try:
        code = run_rank(cfg, device_id)
    except TrainerSetupError as exc:  # devices, backends, plug-ins, topic layout: the message names the setting
        die(str(exc), EXIT_CONFIG)
    except KafkaException as exc:
        die(f"Kafka: {exc}")
    raise typer.Exit(code)
