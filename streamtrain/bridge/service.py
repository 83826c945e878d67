"""The bridge: records of existing topics in, one `Sample` per record out to its device's topic, exactly once.

One loop: consume a batch; in the open transaction (begun at its first record) decode each record and write
its sample to its device's topic, or its dead letter; every `bridge.transaction_records` records or
`bridge.transaction_seconds`, put the consumer's positions in the transaction as its group's offsets
(`send_offsets_to_transaction`) and commit. The samples, the dead letters and the progress commit together or
not at all, so a crash at any point loses and duplicates nothing: the open transaction is aborted (by the
restarted bridge, which fences its previous self by its transactional id, or by the broker's transaction
timeout) and its records are read again from the committed offsets. Readers see only committed transactions
(`isolation.level=read_committed`: the trainers, and the bridge's own consumer of topics written the same way).

Its sources may be on another cluster than the one it writes (`bridge.source_cluster`): its progress is then
kept on the cluster it writes, under twins of the source topics (`progress`), in the same transactions.

Errors: one that needs an abort (`txn_requires_abort`) aborts and rewinds the consumer to the committed
offsets; a retriable one retries the call; a fatal one (fenced) stops the bridge with `BridgeFatalError`.
A record the decoder rejects never stops it: it goes to the dead-letter topic, inside the same transaction.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from streamtrain.authz import raise_if_refused
from streamtrain.config import StreamtrainConfig
from streamtrain.dead_letters import DeadLetterSink
from streamtrain.decoders import (
    SKIPPED_REASON,
    Decoder,
    DecoderSetupError,
    Rejected,
    SourceRecord,
    build_decoder,
    to_sample,
)
from streamtrain.kafka import (
    KafkaConsumer,
    TopicSpec,
    consume_available,
    ensure_topics,
    make_admin,
    make_consumer,
    make_transactional_producer,
    produce,
)
from streamtrain.wire import WireError, encode

from .checks import SourceCheck, check_sources
from .errors import BridgeFatalError, BridgeSetupError
from .metrics import BridgeMetrics
from .progress import BridgeProgress, close_quietly

__all__ = ["Bridge"]

logger = logging.getLogger(__name__)

#: Seconds each transactional call may block (commit, abort, offsets) before it is retried.
CALL_TIMEOUT_S = 10.0

#: Producers replaced in a row, with no transaction committed in between, before the bridge gives up.
MAX_RENEWALS = 5


@dataclass
class _Transaction:
    """The open transaction: when it began and what it holds (counted in the metrics once it commits)."""

    began: float
    records: int = 0
    records_in: Counter[str] = field(default_factory=Counter)
    samples_out: Counter[str] = field(default_factory=Counter)
    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)


class Bridge:
    """Bridges `bridge.sources` into the device topics (see the module docstring).

    Args:
        config: the whole configuration (job, Kafka, `bridge`, the devices).
        registry: Prometheus registry of its metrics (a fresh one when not given).

    Raises:
        BridgeSetupError: a setting it cannot start with (no sources, no devices, a decoder that does not load).
    """

    def __init__(self, config: StreamtrainConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.settings = config.bridge
        if not self.settings.sources:
            raise BridgeSetupError("bridge.sources: no topic to bridge; add a [[bridge.sources]] table with its topic "
                                   "and decoder")
        self.devices = config.bridge_devices
        if not self.devices:
            raise BridgeSetupError("bridge.devices: the bridge needs the job's devices (bridge.devices, or "
                                   "coordinator.devices): a record for any other is dead-lettered")
        self.decoders: dict[str, Decoder] = {}
        for i, source in enumerate(self.settings.sources):
            try:
                self.decoders[source.topic] = build_decoder(source, f"bridge.sources.{i}")
            except DecoderSetupError as exc:
                raise BridgeSetupError(str(exc)) from None
        self.topics = config.kafka.topics
        self.transactional_id = self.settings.transactional_id(config.job)
        self.metrics = BridgeMetrics(registry if registry is not None else CollectorRegistry(), config.job,
                                     list(self.decoders), self.devices)
        self.producer = self._new_producer()
        self.progress = BridgeProgress(config)
        # Static membership: a restarted bridge takes its partitions back at once, rather than after the session
        # timeout of the member it was before the crash (its transactional id names it just as stably).
        self.member = make_consumer(config.kafka, self.settings.group(config.job),
                                    **{"group.instance.id": self.transactional_id})
        # The consumer of the sources: the group's member itself, or on another cluster one that is only assigned
        # the source partitions of the group's twins (`progress`).
        self.consumer: KafkaConsumer = self.progress.reader() if self.progress.remote else self.member
        self._source_partitions: dict[str, int] = {}
        self.dead_letters = DeadLetterSink(self.producer, self.topics.dead_letter, "bridge")
        self._txn: _Transaction | None = None
        self._renewals = 0
        self._stopping = False
        self._lag_at = 0.0
        self._warned: set[tuple[str, str]] = set()

    # ---- start and stop -----------------------------------------------------------------------------------

    def start(self) -> list[SourceCheck]:
        """Create the topics (`bridge.create_topics`), check every source and its decoder, fence any previous
        instance (its open transaction is aborted), and join the group.

        Returns:
            What the start-up check found per source.

        Raises:
            BridgeSetupError: a source or decoder that cannot work, named by its setting.
            BridgeFatalError: transactions cannot be initialised.
        """
        if self.settings.create_topics:
            names = [*(self.topics.device(d) for d in self.devices), self.topics.dead_letter]
            ensure_topics(make_admin(self.config.kafka), [TopicSpec.from_config(self.config.kafka, n) for n in names])
        if self.progress.remote:
            self._source_partitions = self.progress.source_partitions(min(self.settings.check_seconds, 10.0) + 5.0)
            self.progress.ensure_twins(self._source_partitions)
        checks = check_sources(self.config, self.decoders, self.devices)
        self._init_transactions()
        self.member.subscribe(self.progress.group_topics(), on_assign=self._assigned, on_revoke=self._revoked,
                              on_lost=self._lost)
        logger.info("bridging %s%s to the topics of devices %s (transactional id %s, group %s)",
                    ", ".join(self.decoders), f" of {self.progress.where}" if self.progress.remote else "",
                    ", ".join(self.devices), self.transactional_id, self.settings.group(self.config.job))
        return checks

    def _new_producer(self) -> Producer:
        return make_transactional_producer(self.config.kafka, self.transactional_id,
                                           self.settings.transaction_timeout_seconds)

    def _init_transactions(self) -> None:
        """Fence any earlier producer of this transactional id (the broker aborts its open transaction); retried
        while the broker is away."""
        while True:
            try:
                self.producer.init_transactions(self.settings.transaction_timeout_seconds + CALL_TIMEOUT_S)
                return
            except KafkaException as exc:
                err = exc.args[0]
                raise_if_refused(self.config.kafka, err, "WRITE", self.transactional_id, "transactional id")
                if err.fatal() or not err.retriable() or self._stopping:
                    raise BridgeFatalError(f"transactions of {self.transactional_id} could not start: {exc}") from None
                logger.warning("transactions of %s cannot start yet (%s): retrying", self.transactional_id, err.str())

    def _renew_producer(self) -> None:
        """Replace the producer after an abort with a fresh one that fences it.

        A producer whose broker went away mid-transaction can keep a request to the dead connection pending, and
        its next transaction then waits on it for good, whatever the call's timeout (librdkafka 2.x). The old
        producer is let go in a thread of its own: destroying a client in that state may block.
        """
        self._renewals += 1
        if self._renewals > MAX_RENEWALS:
            raise BridgeFatalError(f"{MAX_RENEWALS} producers in a row failed to commit a transaction; stopping (the "
                                   "open transaction is aborted, nothing is lost): see the warnings before this")
        retired = [self.producer]  # the only reference: the thread that clears it destroys the producer
        self.producer = self._new_producer()
        self.dead_letters.producer = self.producer
        threading.Thread(target=retired.clear, name="release-producer", daemon=True).start()
        self._init_transactions()

    def stop(self) -> None:
        """Ask `run` to commit what it holds and return (safe in a signal handler)."""
        self._stopping = True

    def close(self, commit: bool = True) -> None:
        """Commit the open transaction (with `commit`; else leave it to be aborted), leave the group, close."""
        self._stopping = True
        try:
            if commit and self._txn is not None and not self._commit():
                logger.warning("the open transaction could not commit: its records are bridged at the next start")
        finally:
            close_quietly(self.member)  # first: revoking its partitions unassigns them from the reader of the sources
            if self.consumer is not self.member:
                close_quietly(self.consumer)

    # ---- the loop -------------------------------------------------------------------------------------------

    def run(self) -> None:
        """Bridge until `stop`; the open transaction is committed before returning."""
        while not self._stopping:
            self.run_once()

    def run_once(self, timeout: float = 0.1) -> int:
        """Bridge what arrives within `timeout` (at most a transaction's worth); returns the records consumed."""
        room = self.settings.transaction_records - (self._txn.records if self._txn else 0)
        wait = timeout if self._txn is None else min(timeout, max(0.0, self._txn_deadline() - time.monotonic()))
        if self.consumer is not self.member:  # the group's events (rebalances, errors); its twins are paused
            event = self.member.poll(0)
            if event is not None and event.error() is not None:
                self._consumer_error(event, self.member)
        messages = consume_available(self.consumer, max(1, room), wait)
        for msg in messages:
            if msg.error() is None:
                self._bridge(msg)
            else:
                self._consumer_error(msg, self.consumer)
        txn = self._txn
        if txn is not None and (txn.records >= self.settings.transaction_records
                                or time.monotonic() >= self._txn_deadline()):
            self._commit()
        self._observe_lag()
        return len(messages)

    def _consumer_error(self, msg: Message, consumer: KafkaConsumer) -> None:
        err = msg.error()
        assert err is not None
        if err.fatal() or err.code() == KafkaError._FATAL:  # librdkafka's fatal event is not flagged fatal
            raise BridgeFatalError(f"the consumer failed for good ({err.str()}): another bridge with instance "
                                   f"{self.settings.instance} in group {self.settings.group(self.config.job)} "
                                   "took its place, or the consumer broke; this one stops")
        if consumer is not self.member and self.progress.ignored(err):
            return
        raise_if_refused(consumer.kafka, err, "READ", msg.topic(), "topic")
        if err.code() != KafkaError._PARTITION_EOF:
            logger.warning("consumer error (retrying): %s", err)

    def _txn_deadline(self) -> float:
        return (self._txn.began if self._txn else time.monotonic()) + self.settings.transaction_seconds

    def _bridge(self, msg: Message) -> None:
        """Decode one source record into the open transaction: its sample, or its dead letter."""
        if self._txn is None:
            self.producer.begin_transaction()
            self._txn = _Transaction(time.monotonic())
        txn = self._txn
        record = SourceRecord.from_message(msg)
        txn.records += 1
        txn.records_in[record.topic] += 1
        try:
            fields = self.decoders[record.topic](record)
            if fields is None:
                # The fate of a skipped record is in Kafka too (accounting); its value stays in the source topic.
                self.dead_letters.send_parts(record.topic, record.partition, record.offset, SKIPPED_REASON,
                                             "the decoder returned None: skipped on purpose", key=record.key,
                                             headers=msg.headers())
                txn.skipped[record.topic] += 1
                return
            sample = to_sample(fields, record, self.devices)
            value, headers = encode(sample)
        except Rejected as exc:
            self._reject(msg, record, exc.reason, exc.detail)
        except WireError as exc:
            self._reject(msg, record, exc.reason, str(exc))
        except Exception as exc:  # a user decoder's own failure rejects the record, never stops the bridge
            self._reject(msg, record, "decoder-error", f"{type(exc).__name__}: {exc}")
        else:
            produce(self.producer, self.topics.device(sample.device_id), value, headers)
            txn.samples_out[sample.device_id] += 1

    def _reject(self, msg: Message, record: SourceRecord, reason: str, detail: str) -> None:
        assert self._txn is not None
        self.dead_letters.send(msg, reason, detail)
        self._txn.rejected[(record.topic, reason)] += 1
        level = logging.DEBUG if (record.topic, reason) in self._warned else logging.WARNING
        self._warned.add((record.topic, reason))
        logger.log(level, "dead-lettered %s: %s (%s)%s", record.source, reason, detail,
                   "" if level == logging.DEBUG else "; more of this reason are logged at DEBUG")

    # ---- transactions ---------------------------------------------------------------------------------------

    def _commit(self) -> bool:
        """Commit the open transaction with the consumer's positions as the group's offsets; when that fails,
        abort it (and read its records again). Returns whether it committed."""
        txn = self._txn
        assert txn is not None
        positions = [tp for tp in self.consumer.position(self.consumer.assignment()) if tp.offset >= 0]
        try:
            self.producer.send_offsets_to_transaction(self.progress.tracked(positions),
                                                      self.member.consumer_group_metadata(), CALL_TIMEOUT_S)
        except KafkaException as exc:
            # Not retried, even when retriable: called again after a coordinator went away, it may block for good
            # (librdkafka ignores its timeout there). Aborting and reading the records again costs a transaction.
            return self._failed(exc.args[0], "sending the offsets")
        while True:
            try:
                self.producer.commit_transaction(CALL_TIMEOUT_S)
                break
            except KafkaException as exc:
                err = exc.args[0]
                if not err.retriable() or err.fatal() or err.txn_requires_abort() or self._stopping:
                    return self._failed(err, "the commit")
                raise_if_refused(self.config.kafka, err, "WRITE", self.transactional_id, "transactional id")
                logger.warning("the commit of a transaction failed for now (%s): retrying", err.str())
        self._txn = None
        self._renewals = 0
        self._count(txn)
        return True

    def _failed(self, err: KafkaError, what: str) -> bool:
        """A transaction that cannot commit: abort it, and unless stopping read its records again (returns False)."""
        raise_if_refused(self.config.kafka, err, "WRITE", self.transactional_id, "transactional id")
        logger.warning("%s of a transaction failed (%s): aborting it; its records are read again", what, err.str())
        self._abort()
        return False

    def _count(self, txn: _Transaction) -> None:
        m, job = self.metrics, self.config.job
        for topic, n in txn.records_in.items():
            m.records_in.labels(job, topic).inc(n)
        for device, n in txn.samples_out.items():
            m.samples_out.labels(job, device).inc(n)
        for (topic, reason), n in txn.rejected.items():
            m.rejected.labels(job, topic, reason).inc(n)
        for topic, n in txn.skipped.items():
            m.skipped.labels(job, topic).inc(n)
        m.transactions.labels(job, "committed").inc()
        m.transaction_records.labels(job).set(txn.records)
        m.transaction_seconds.labels(job).observe(time.monotonic() - txn.began)

    def _abort(self) -> None:
        """Abort the open transaction; unless stopping, rewind the consumer to the group's committed offsets and
        carry on with a fresh producer."""
        txn, self._txn = self._txn, None
        self._abort_call()
        if txn is not None:
            self.metrics.transactions.labels(self.config.job, "aborted").inc()
            self.metrics.transaction_seconds.labels(self.config.job).observe(time.monotonic() - txn.began)
        if not self._stopping:  # a bridge that stops reads them again at its next start
            self._rewind(self.consumer.assignment())
            self._renew_producer()

    def _abort_call(self) -> None:
        """Ask the broker to abort the open transaction; when it cannot be asked now, the fresh producer that
        replaces this one fences it, and the broker aborts it then."""
        try:
            self.producer.abort_transaction(CALL_TIMEOUT_S)
        except KafkaException as exc:
            # Even a "fatal" error here (an invalid state after the broker came back) ends only this producer.
            raise_if_refused(self.config.kafka, exc.args[0], "WRITE", self.transactional_id, "transactional id")
            logger.warning("abort of a transaction failed (%s): the next producer's start aborts it",
                           exc.args[0].str())

    def _rewind(self, parts: list[TopicPartition]) -> None:
        """Seek `parts` back to their committed offsets (the log start where none): the aborted records again."""
        if not parts:
            return
        deadline = time.monotonic() + self.settings.transaction_timeout_seconds
        while True:
            try:
                for tp in self.progress.committed(self.member, parts, CALL_TIMEOUT_S):
                    offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                    self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
                return
            except KafkaException as exc:
                # Records past the committed offsets must be read again, or the next commit would pass them.
                if time.monotonic() > deadline:
                    raise BridgeFatalError(f"could not rewind to the committed offsets ({exc}); stopping, the "
                                           "next start reads from them") from None
                logger.warning("rewinding to the committed offsets failed for now (%s): retrying", exc)
                time.sleep(0.5)

    # ---- the group ------------------------------------------------------------------------------------------

    def _assigned(self, _consumer: object, parts: list[TopicPartition]) -> None:
        logger.info("assigned %s", ", ".join(f"{tp.topic}[{tp.partition}]" for tp in parts) or "nothing")
        if self.consumer is self.member:
            return
        # Two clusters: the group's twins are never fetched; the reader takes their source partitions, from the
        # group's committed offsets (a twin partition past the source's, from an older layout, has none).
        self.member.assign(parts)
        self.member.pause(parts)
        sources = [tp for tp in self.progress.sources_of(parts)
                   if tp.partition < self._source_partitions.get(tp.topic, 0)]
        starts = self.progress.committed(self.member, sources, self.settings.transaction_timeout_seconds)
        self.consumer.incremental_assign([TopicPartition(tp.topic, tp.partition,
                                                         tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                                          for tp in starts])

    def _revoked(self, _consumer: object, parts: list[TopicPartition]) -> None:
        """Partitions go to another bridge: commit what was bridged of them first (or abort it)."""
        if self._txn is not None:
            self._commit()
        self._release(parts)

    def _lost(self, _consumer: object, parts: list[TopicPartition]) -> None:
        """Partitions already belong to another bridge: their offsets can no longer be committed by this one."""
        if self._txn is not None:
            txn, self._txn = self._txn, None
            self._abort_call()
            self._renew_producer()
            self.metrics.transactions.labels(self.config.job, "aborted").inc()
            logger.warning("partitions lost (%d records of the open transaction aborted; another bridge reads them)",
                           txn.records)
        self._release(parts)

    def _release(self, parts: list[TopicPartition]) -> None:
        """Stop reading the source partitions of the group's `parts` (on two clusters: unassign them)."""
        sources = self.progress.sources_of(parts)
        if self.consumer is not self.member:
            held = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
            self.consumer.incremental_unassign([tp for tp in sources if (tp.topic, tp.partition) in held])
        self._forget_lag(sources)

    def _forget_lag(self, parts: list[TopicPartition]) -> None:
        for tp in parts:
            with contextlib.suppress(KeyError):  # never observed: no series to remove
                self.metrics.source_lag.remove(self.config.job, tp.topic, str(tp.partition))

    def _observe_lag(self) -> None:
        """Each assigned partition's end (as last fetched) minus the position, about once a second."""
        now = time.monotonic()
        if now - self._lag_at < 1.0:
            return
        self._lag_at = now
        for tp in self.consumer.position(self.consumer.assignment()):
            _low, high = self.consumer.get_watermark_offsets(tp, cached=True)
            if high >= 0 and tp.offset >= 0:
                self.metrics.source_lag.labels(self.config.job, tp.topic, str(tp.partition)).set(
                    max(0, high - tp.offset))

