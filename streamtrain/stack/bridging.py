"""`streamtrain up --bridge FILE`: the bridge in the local stack, and its sources in the report.

The bridge takes the producers' place: it writes the device topics from a user's own topics (the `[bridge]`
table of FILE: sources, decoders; its named devices, if any, are the run's), which must be on the broker the run
uses (an existing one: kafka.bootstrap_servers, which FILE's own `[kafka]` may set: without `--config`, FILE is
the run's configuration file). When the run stops, the bridge is given up to the drain timeout to catch up with
its sources (its group's committed offsets at their ends), then stopped (it commits what it holds); the
trainers then drain. The report accounts for every source record by (topic, partition, offset): bridged,
rejected, skipped or pending, and none lost or duplicated (`streamtrain.source_accounting`).
"""

from __future__ import annotations

import json
import logging
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from streamtrain.bridge.progress import BridgeProgress
from streamtrain.config import ENV_PREFIX, KafkaConfig, StreamtrainConfig
from streamtrain.kafka import (
    KafkaConsumer,
    consume_available,
    drop_reached,
    tail_positions,
)
from streamtrain.report.ledger import ReadInterrupted
from streamtrain.report.schema import BridgeFigures, SourcePartitionFates
from streamtrain.report.source_accounting import collect_sources, tally_sources
from streamtrain.runtime.commands import module_command

from .services import ServiceSpec

__all__ = ["bridge_figures", "bridge_section", "bridge_spec", "run_bridge_settings", "sources_caught_up",
           "wait_caught_up"]

logger = logging.getLogger(__name__)


def bridge_section(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The `[bridge]` table of a TOML file, and the names of the file's other settings (`kafka`, `trainer`, `job`
    ...: `up` makes the file the run's configuration for them, or refuses it, `stack.cli`).

    Raises:
        ValueError: the file cannot be read, is not TOML, or has no `[bridge]` table with sources.
    """
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ValueError(f"--bridge {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"--bridge {path} is not valid TOML: {exc}") from None
    section = data.get("bridge")
    if not isinstance(section, dict) or not section.get("sources"):
        raise ValueError(f"--bridge {path} has no [bridge] table with [[bridge.sources]] (the topics to bridge and "
                         "their decoders; docs/guides/bridge.md)")
    return section, sorted(k for k in data if k != "bridge")


def run_bridge_settings(section: Mapping[str, Any], kafka: KafkaConfig, devices: Sequence[str]) -> dict[str, Any]:
    """The bridge's settings in a run: it writes the run's devices, and its group, unless set, is the run's own
    (`<topic prefix>.bridge`), so a run bridges its sources from their start into its own device topics, as `up`
    keeps every run's topics apart."""
    return {**section, "devices": list(devices), "group_id": section.get("group_id") or f"{kafka.topic_prefix}.bridge",
            "metrics": True}  # `up` waits for its metrics endpoint: the bridge has started, its check passed


def bridge_spec(port: int, section: Mapping[str, Any], common: dict[str, object],
                global_args: Sequence[str]) -> ServiceSpec:
    """`python -m streamtrain.bridge bridge`, with `section` as its settings (`run_bridge_settings`).

    Its source cluster (`bridge.source_cluster`, with its login) goes in its environment, never on its command line;
    so each setting of the section is set on its own (a `--set bridge=...` of the whole table would replace it).
    """
    sets: dict[str, object] = {**common, **{f"bridge.{k}": v for k, v in section.items() if k != "source_cluster"},
                               "metrics.port": port}
    argv = module_command("streamtrain.bridge", "bridge", global_args=global_args, sets=sets)
    source = section.get("source_cluster")
    env = {f"{ENV_PREFIX}BRIDGE__SOURCE_CLUSTER": json.dumps(source, default=str)} if source else {}
    return ServiceSpec("bridge", "bridge", argv, (port,), env)


def sources_caught_up(cfg: StreamtrainConfig, timeout: float = 10.0) -> bool:
    """Whether the bridge's group has bridged every record of its sources.

    Per source partition, where the group stands (its committed offset; the log start where it has none, as an
    empty partition never has) against the partition's end (its last stable offset). Short of the end, the
    offsets between may hold no record at all: the commit marker a transactional source ends with, or an aborted
    transaction's records, which a `read_committed` reader is never given and the bridge never commits past
    (it commits only with records). So a partition short of its end is read from there: caught up when the
    reader's position passes the end with no record given.
    """
    progress = BridgeProgress(cfg)
    try:
        with progress.clients() as (consumer, member):  # reads the group's offsets, never joins it
            spans: dict[tuple[str, int], tuple[int, int]] = {}
            for source in cfg.bridge.sources:
                for pid, span in tail_positions(consumer, source.topic, None, timeout).items():
                    spans[(source.topic, pid)] = span
            behind: dict[tuple[str, int], int] = {}
            starts = []
            for tp in progress.committed(member, [TopicPartition(t, p) for t, p in spans], timeout):
                low, high = spans[(tp.topic, tp.partition)]
                start = max(tp.offset, low)  # no commit (OFFSET_INVALID, negative): the bridge starts at the log start
                if start < high:
                    behind[(tp.topic, tp.partition)] = high
                    starts.append(TopicPartition(tp.topic, tp.partition, start))
            return not behind or _nothing_to_read(consumer, starts, behind, min(timeout, 2.0))
    except (KafkaException, TimeoutError) as exc:
        logger.warning("cannot tell whether the bridge caught up (%s)", exc)
        return False


def _nothing_to_read(consumer: KafkaConsumer, starts: list[TopicPartition], ends: dict[tuple[str, int], int],
                     timeout: float) -> bool:
    """Whether a `read_committed` reader from `starts` reaches `ends` without being given a record."""
    consumer.assign(starts)
    deadline = time.monotonic() + timeout
    while ends and time.monotonic() < deadline:
        for msg in consume_available(consumer, 100, 0.2):
            if msg.error() is None and (msg.offset() or 0) < ends.get((msg.topic() or "", msg.partition() or 0), 0):
                return False  # a record the group has not committed past: not bridged yet
        drop_reached(consumer, ends)
    return not ends


def wait_caught_up(cfg: StreamtrainConfig, timeout: float, alive: Callable[[], bool],
                   tick: Callable[[], None]) -> bool:
    """Wait (at most `timeout`, while `alive()`) until the bridge caught up with its sources; returns whether it did."""
    deadline = time.monotonic() + timeout
    while alive():
        if sources_caught_up(cfg):
            return True
        if time.monotonic() > deadline:
            break
        tick()
        time.sleep(0.5)
    logger.warning("the bridge did not catch up with its sources within %.0f s; what it has not bridged stays in "
                   "its topics, reported as pending", timeout)
    return False


def bridge_figures(cfg: StreamtrainConfig, stop: Callable[[], bool] | None = None) -> BridgeFigures:
    """Every source record's fate, read back from Kafka (the sources, the device topics, the dead letters).

    Raises:
        ReadInterrupted: `stop` said so.
        TimeoutError / KafkaException: the broker does not deliver the records.
    """
    records = collect_sources(cfg, timeout=60.0, stop=stop)
    if stop is not None and stop():
        raise ReadInterrupted("reading the bridge's sources back from Kafka was interrupted")
    tallies = tally_sources(records)
    parts = [SourcePartitionFates.model_validate(t.summary()) for t in tallies]
    return BridgeFigures(
        group=cfg.bridge.group(cfg.job), sources=[s.topic for s in cfg.bridge.sources],
        source_records=sum(p.records for p in parts), source_bridged=sum(p.bridged for p in parts),
        source_rejected=sum(p.rejected for p in parts), source_skipped=sum(p.skipped for p in parts),
        source_pending=sum(p.pending for p in parts), source_lost=sum(p.lost for p in parts),
        source_unknown=sum(p.unknown for p in parts), source_duplicated=sum(p.duplicated for p in parts),
        partitions=parts)
