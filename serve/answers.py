"""One batch of requests in, one `Prediction` per request out: outputs where the model could answer, reasons where not.

A request is a `Sample` on the same wire as the device topics. What cannot be answered still gets its
prediction record, with an error reason and no output, so every request offset has exactly one answer and a
client waiting on it learns why: `corrupt`, `invalid-sample` (and the other wire reasons),
`wrong-shape` (not (size, num_features)), `dtype-not-accepted` / `dtype-overflow` (the payload rule of the
version's settings), `model-error` (the collate function or the model raised on it). A batch the model
cannot take whole is answered sample by sample, so one bad request costs only its own answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message

from streamtrain.models.batching import payload_problem
from streamtrain.versions import Predictor
from streamtrain.wire import Prediction, Sample, WireError, decode, now_ms

__all__ = ["MODEL_ERROR", "WRONG_SHAPE", "Answered", "answer_batch", "request_problem"]

logger = logging.getLogger(__name__)

WRONG_SHAPE = "wrong-shape"
MODEL_ERROR = "model-error"


def request_problem(sample: Sample, predictor: Predictor) -> tuple[str, str] | None:
    """Why the version cannot answer `sample`, as (reason, detail), or None when it can try."""
    config = predictor.config
    if config.collate is None and (len(sample.shape) != 2 or sample.shape[1] != config.num_features):
        return WRONG_SHAPE, f"shape {list(sample.shape)} is not (size, {config.num_features})"
    return payload_problem(sample, config)


@dataclass(frozen=True)
class Answered:
    """The predictions of one batch, in request order, and what it took."""

    predictions: list[Prediction]
    forward_seconds: float


def _refused(job: str, msg: Message, reason: str, detail: str, produced_at: int | None) -> Prediction:
    return Prediction(job=job, request_topic=msg.topic() or "", request_partition=msg.partition() or 0,
                      request_offset=msg.offset() or 0, version=-1, request_produced_at=produced_at, error=reason,
                      error_detail=detail)


def answer_batch(job: str, predictor: Predictor, messages: Sequence[Message]) -> Answered:
    """Answer `messages` (request records) with `predictor`: one prediction each, in their order.

    Args:
        job: The job named in every prediction.
        predictor: The live version.
        messages: Consumed request records (no errors among them).
    """
    out: list[Prediction | None] = [None] * len(messages)
    good: list[tuple[int, Sample]] = []
    for i, msg in enumerate(messages):
        try:
            sample = decode(msg.value(), msg.headers(), Sample)
        except WireError as exc:
            out[i] = _refused(job, msg, exc.reason, str(exc), None)
            continue
        problem = request_problem(sample, predictor)
        if problem is not None:
            out[i] = _refused(job, msg, *problem, sample.produced_at)
        else:
            good.append((i, sample))
    started = time.perf_counter()
    rows = _predict(predictor, [s for _, s in good])
    forward = time.perf_counter() - started
    answered_at = now_ms()
    for (i, sample), row in zip(good, rows, strict=True):
        msg = messages[i]
        where: dict[str, Any] = {"job": job, "request_topic": msg.topic() or "",
                                 "request_partition": msg.partition() or 0, "request_offset": msg.offset() or 0,
                                 "request_produced_at": sample.produced_at, "answered_at": answered_at}
        if isinstance(row, tuple):
            out[i] = Prediction(**where, version=-1, error=row[0], error_detail=row[1])
        else:
            out[i] = Prediction(**where, version=predictor.version, **row)
    return Answered([p for p in out if p is not None], forward)


def _predict(predictor: Predictor, samples: Sequence[Sample]) -> list[dict[str, Any] | tuple[str, str]]:
    """Each sample's output fields, or (reason, detail) for one the model could not take."""
    if not samples:
        return []
    try:
        result = predictor.predict_samples(samples)
        return [result.row(i) for i in range(len(samples))]
    except Exception as exc:  # a plug-in may raise anything: it must cost only the requests it failed on
        if len(samples) == 1:
            logger.warning("version %d could not answer request %s#%s: %s: %s", predictor.version,
                           samples[0].device_id, samples[0].seq, type(exc).__name__, exc)
            return [(MODEL_ERROR, f"{type(exc).__name__}: {exc}")]
    return [row for sample in samples for row in _predict(predictor, [sample])]
