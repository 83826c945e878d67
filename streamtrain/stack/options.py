"""What `streamtrain up` is asked to run (`StackOptions`, its flags) and how it fails (`StackError`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .services import DeviceStream

__all__ = ["BrokerMode", "StackError", "StackOptions"]

BrokerMode = Literal["auto", "embedded", "external"]


class StackError(RuntimeError):
    """The stack could not start or a service failed; the message names the service and its log."""


@dataclass(frozen=True)
class StackOptions:
    """How `streamtrain up` runs (its flags)."""

    streams: Sequence[DeviceStream]
    out: Path
    policy: str | None = None
    truncation: str | None = None
    duration_s: float | None = None
    steps: int | None = None
    broker: BrokerMode = "auto"
    prometheus: bool = True
    prometheus_binary: str | None = None
    scrape_interval_s: float = 1.0
    drain_timeout_s: float = 30.0
    start_timeout_s: float = 180.0
    torch_threads: int = 1
    seed: int = 0
    global_args: Sequence[str] = field(default_factory=tuple)
    backlog: int = 0
    """Samples pre-produced per device (each stream's own seed and sizes) before the coordinator and the
    trainers start; with a backlog no live producers run, so training works through a fixed data set at
    full capacity (benchmarks). 0: live producers at the streams' rates."""
    replay: bool = False
    """Replay the configured dataset (`producer.dataset.*`, see `stack.replay`) into the device topics, one shard
    per device at each stream's rate, instead of the synthetic streams."""
    replay_samples: int = 0
    """The replayed dataset's samples (`replay`): test-then-train figures count scorings, each sample once per pass."""
    until_step: int | None = None
    """Stop once every rank has finished this many steps in all, counted from step 0 (unlike `steps`,
    which counts from the first step seen after start-up)."""
    secure: bool = False
    """Run the embedded broker with SASL/SCRAM and ACLs, each service as its own role's principal
    (`stack.secure`)."""
    bridge: dict[str, Any] | None = None
    """The `[bridge]` settings of `--bridge FILE`: the bridge writes the device topics from the user's own topics,
    in the producers' place (`stack.bridging`). None: no bridge."""
    external: tuple[str, ...] = ()
    """Devices fed from outside (`--external-devices`, `stack.external`): no producer of the stack's writes their
    topics; everything else runs for them as for the others."""
    serve: bool = False
    """Run `serve` and a request load at `request_rate` beside the trainers (`stack.serving`)."""
    request_rate: float = 20.0
    """Requests per second the load sends with `serve`."""

    @property
    def devices(self) -> list[str]:
        """The devices, one per stream."""
        return [s.device_id for s in self.streams]

    @property
    def produced(self) -> list[tuple[int, DeviceStream]]:
        """(index, stream) of each device the stack's own producers feed: all but the external ones. The index
        is the stream's place among all streams (it seeds the stream, so a device's samples do not depend on
        which other devices are external)."""
        return [(i, s) for i, s in enumerate(self.streams) if s.device_id not in self.external]
