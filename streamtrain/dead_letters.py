"""The dead-letter topic: records no service can use, kept with the reason, never dropped in silence."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, Message, Producer

from .kafka import produce
from .wire import DeadLetter, WireError, encode
from .wire.codec import Headers, header_items

__all__ = ["REASON_HEADER", "DeadLetterSink"]

logger = logging.getLogger(__name__)

#: Header repeating a dead letter's reason code, for tools that read only headers.
REASON_HEADER = "st-reason"


class DeadLetterSink:
    """Sends records no service can use to `<prefix>.dead-letter`, with the reason in a header.

    Args:
        producer: an idempotent producer (see `make_producer`); the caller flushes and closes it.
        topic: the dead-letter topic.
        service: name of the rejecting service, recorded in every dead letter.
    """

    def __init__(self, producer: Producer, topic: str, service: str) -> None:
        self.producer = producer
        self.topic = topic
        self.service = service
        self.sent = 0
        self.failed = 0

    def send(self, msg: Message, reason: str, detail: str) -> None:
        """Dead-letter one consumed message; delivery failures are counted, not raised."""
        self.send_parts(msg.topic() or "", msg.partition() or 0, msg.offset() or 0, reason, detail,
                        key=msg.key(), value=msg.value(), headers=msg.headers())

    def send_parts(self, topic: str, partition: int, offset: int, reason: str, detail: str, *,
                   key: bytes | None = None, value: bytes | None = None, headers: Headers | None = None) -> None:
        """Dead-letter the record at (`topic`, `partition`, `offset`) given by its parts."""
        letter = DeadLetter(
            topic=topic,
            partition=partition,
            offset=offset,
            reason=reason,
            detail=detail,
            service=self.service,
            headers={k: v or b"" for k, v in header_items(headers)},
            key=key,
            value=value,
        )
        body, letter_headers = encode(letter)
        letter_headers.append((REASON_HEADER, reason.encode()))
        produce(self.producer, self.topic, body, letter_headers, self._delivered)

    def send_error(self, msg: Message, error: WireError) -> None:
        """Dead-letter a message that failed to decode, with the error's reason code."""
        self.send(msg, error.reason, str(error))

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.sent += 1
        else:
            self.failed += 1
            logger.error("dead letter could not be delivered: %s", err)
