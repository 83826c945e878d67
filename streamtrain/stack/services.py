"""What `streamtrain up` runs: the device streams, and one command line per service.

Every service is the command a person would run by hand (`produce`, `coordinate`, `train --local-ranks N`,
each through its service's own entry, `python -m streamtrain.producers|coordinator|trainer`, and the `prometheus`
binary), started with the parent's `--config` / `--set` options followed by the stack's own `--set`
overrides (broker address, topic prefix, metrics ports), so a child sees exactly the configuration the
parent was given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from streamtrain.runtime.commands import module_command

__all__ = [
    "DEFAULT_RATES",
    "DEFAULT_SIZES",
    "DeviceStream",
    "ServiceSpec",
    "coordinator_spec",
    "device_streams",
    "producer_spec",
    "prometheus_spec",
    "size_kind_for",
    "stream_settings",
    "trainer_spec",
]

#: Per-device stream rates (samples/s) and mean sample sizes, cycled over the devices: the fast streams
#: carry the small samples, so every device has a different rate, size mix and compute load.
DEFAULT_RATES: tuple[float, ...] = (15.0, 30.0, 45.0, 60.0)
DEFAULT_SIZES: tuple[float, ...] = (60.0, 40.0, 30.0, 20.0)
#: DIF (std of sample sizes) as a fraction of each device's mean size when --dif is not given.
DEFAULT_DIF_FRACTION = 0.3


@dataclass(frozen=True)
class DeviceStream:
    """One device's synthetic stream: its id, rate and sample-size distribution."""

    device_id: str
    rate: float
    size_mean: float
    size_dif: float
    size_kind: str | None = None
    """producer.size.kind; None: normal when size_dif > 0, else fixed."""


@dataclass(frozen=True)
class ServiceSpec:
    """One child process of the stack.

    Attributes:
        name: unique name (also its log file, `<name>.log`).
        kind: producer, coordinator, trainer or prometheus.
        argv: the command line.
        ports: the metrics / HTTP ports it serves (what Prometheus scrapes).
        env: its own environment variables.
    """

    name: str
    kind: str
    argv: tuple[str, ...]
    ports: tuple[int, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables of its own on top of the stack's (credentials: never on the command line)."""


def size_kind_for(mean: float, dif: float) -> str:
    """producer.size.kind for a DIF: fixed at 0, normal where a normal truncated at size 1 can have this
    mean and std, else lognormal (same mean and std, any DIF: a normal with mean 45 stays >= 1 only for
    std up to about 44)."""
    if dif <= 0:
        return "fixed"
    from streamtrain.producers.sizes import solve_truncated_normal

    try:
        solve_truncated_normal(mean, math.sqrt(max(dif**2 - 1.0 / 12.0, 1e-12)), 0.5)
    except ValueError:
        return "lognormal"
    return "normal"


def device_streams(n: int, rates: Sequence[float] | None = None, sizes: Sequence[float] | None = None,
                   dif: float | None = None) -> list[DeviceStream]:
    """`n` device streams "0".."n-1"; rates and mean sizes are cycled from the given lists (or the defaults).

    Raises:
        ValueError: on a rate or size that is not positive, or a negative DIF.
    """
    rates = tuple(rates) if rates else DEFAULT_RATES
    sizes = tuple(sizes) if sizes else DEFAULT_SIZES
    if any(r <= 0 for r in rates):
        raise ValueError(f"--rates {list(rates)}: every rate must be > 0 samples/s")
    if any(s < 1 for s in sizes):
        raise ValueError(f"--sizes {list(sizes)}: every mean size must be >= 1")
    if dif is not None and dif < 0:
        raise ValueError(f"--dif {dif}: must be >= 0")
    streams = []
    for i in range(n):
        mean = sizes[i % len(sizes)]
        std = dif if dif is not None else round(DEFAULT_DIF_FRACTION * mean, 2)
        streams.append(DeviceStream(str(i), rates[i % len(rates)], mean, std, size_kind_for(mean, std)))
    return streams


def stream_settings(stream: DeviceStream, index: int, seed: int) -> dict[str, object]:
    """The `producer.*` settings of one device's stream: its id, rate, size distribution and seed.

    The live producer process and the pre-produced backlog (`stack.backlog`) use the same settings, so
    a device's samples (sizes, payloads, labels) are the same whichever way they reach Kafka.
    """
    return {
        "producer.devices": 1, "producer.device_ids": [stream.device_id],
        "producer.rate.kind": "constant", "producer.rate.mean": stream.rate,
        "producer.size.kind": stream.size_kind or ("normal" if stream.size_dif > 0 else "fixed"),
        "producer.size.mean": stream.size_mean, "producer.size.dif": stream.size_dif,
        "producer.seed": seed + index,
    }


def producer_spec(stream: DeviceStream, index: int, seed: int, port: int, common: dict[str, object],
                  global_args: Sequence[str]) -> ServiceSpec:
    """One `streamtrain produce` process for one device (its own rate and size distribution)."""
    sets: dict[str, object] = {
        **common,
        **stream_settings(stream, index, seed),
        # Runs until the stack stops it (SIGINT flushes every accepted record first).
        "producer.duration_seconds": 0, "producer.metrics_port": port,
        "producer.tick_seconds": 0.01,  # 100 pacing ticks/s per process is plenty at these rates, and spares the CPU
    }
    argv = module_command("streamtrain.producers", "produce", "--no-progress", global_args=global_args, sets=sets)
    return ServiceSpec(f"producer-{stream.device_id}", "producer", argv, (port,))


def coordinator_spec(devices: Sequence[str], policy: str | None, truncation: str | None, port: int,
                     common: dict[str, object], global_args: Sequence[str]) -> ServiceSpec:
    """`streamtrain coordinate`, planning for exactly `devices` (it waits for their feedback each step)."""
    sets: dict[str, object] = {**common, "coordinator.devices": list(devices)}
    argv = ["coordinate", "--port", str(port)]
    if policy:
        argv += ["--policy", policy]
    if truncation:
        argv += ["--truncation", truncation]
    command = module_command("streamtrain.coordinator", *argv, global_args=global_args, sets=sets)
    return ServiceSpec("coordinator", "coordinator", command, (port,))


def trainer_spec(devices: Sequence[str], base_port: int, checkpoint_dir: Path, torch_threads: int,
                 common: dict[str, object], global_args: Sequence[str]) -> ServiceSpec:
    """`streamtrain train --local-ranks N`: rank r trains device r and serves metrics on base_port + r."""
    sets: dict[str, object] = {**common, "metrics.port": base_port, "trainer.torch_threads": torch_threads}
    argv = ["train", "--local-ranks", str(len(devices)), "--devices", ",".join(devices),
            "--checkpoint-dir", str(checkpoint_dir)]
    command = module_command("streamtrain.trainer", *argv, global_args=global_args, sets=sets)
    return ServiceSpec("trainers", "trainer", command, tuple(base_port + r for r in range(len(devices))))


def prometheus_spec(binary: str, config_file: Path, data_dir: Path, host: str, port: int) -> ServiceSpec:
    """The Prometheus server, storing its TSDB under the run directory."""
    argv = (binary, f"--config.file={config_file}", f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address={host}:{port}", "--log.level=warn")
    return ServiceSpec("prometheus", "prometheus", argv, (port,))


