"""One batch of requests in, one `Prediction` per request out: outputs where the model could answer, reasons where not.

A request is a `Sample` on the same wire as the device topics. What cannot be answered still gets its
prediction record, with an error reason and no output, so every request offset has exactly one answer and a
client waiting on it learns why: `corrupt`, `invalid-sample` (and the other wire reasons),
`wrong-shape` (not (size, num_features)), `dtype-not-accepted` / `dtype-overflow` (the payload rule of the
version's settings) — the rule `load_model(...).predict` refuses a sample by too (`Predictor.problem`) —
and `model-error` (the collate function or the model raised on it). A batch the model cannot take whole is
answered sample by sample, so one bad request costs only its own answer.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from confluent_kafka import Message

from streamtrain.versions import Predictor
from streamtrain.wire import Prediction, Sample, WireError, decode, now_ms

__all__ = ["MODEL_ERROR", "Answered", "RefusalTally", "answer_batch"]

logger = logging.getLogger(__name__)

MODEL_ERROR = "model-error"


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
        problem = predictor.problem(sample, wire_checked=True)  # decode checked the wire's rule
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


def _record_fields(row: dict[str, Any], objective: str) -> dict[str, Any]:
    """A `Predictions` row as a `Prediction` record's output fields (values flattened row-major, a forecast's
    time-major, with the shape they had)."""
    shape = np.shape(row["values"])
    return {"label": row["label"], "label_name": row["label_name"], "probabilities": tuple(row["probabilities"]),
            "values": tuple(float(v) for v in np.ravel(row["values"])), "tags": tuple(row["tags"]),
            "objective": objective, "value_shape": tuple(int(n) for n in shape) if len(shape) > 1 else ()}


def _predict(predictor: Predictor, samples: Sequence[Sample]) -> list[dict[str, Any] | tuple[str, str]]:
    """Each sample's output fields, or (reason, detail) for one the model could not take."""
    if not samples:
        return []
    try:
        result = predictor.predict_samples(samples)
        return [_record_fields(row, result.objective) for row in result.rows()]
    except Exception as exc:  # a plug-in may raise anything: it must cost only the requests it failed on
        if len(samples) == 1:
            logger.warning("version %d could not answer request %s#%s: %s: %s", predictor.version,
                           samples[0].device_id, samples[0].seq, type(exc).__name__, exc)
            return [(MODEL_ERROR, f"{type(exc).__name__}: {exc}")]
    return [row for sample in samples for row in _predict(predictor, [sample])]


class RefusalTally:
    """Requests answered with an error reason, told in the log at most once every `every_seconds`: a client whose
    every request is refused (the wrong shape, say) shows up in serve's log, with the reasons counted, not only in
    the prediction records it may never read.

    Args:
        every_seconds: The least time between two reports.
    """

    def __init__(self, every_seconds: float = 10.0) -> None:
        self.every_seconds = every_seconds
        self._counts: Counter[str] = Counter()
        self._example: dict[str, str] = {}
        self._answered = 0
        self._since = time.monotonic()

    def count(self, predictions: Sequence[Prediction]) -> None:
        """Count a batch's answers, the refused ones by reason (one detail kept per reason)."""
        self._answered += len(predictions)
        for prediction in predictions:
            if prediction.error is not None:
                self._counts[prediction.error] += 1
                self._example.setdefault(prediction.error, prediction.error_detail or "")

    def report(self, now: float | None = None, force: bool = False) -> str | None:
        """What to log, when requests were refused and `every_seconds` have passed (or `force`); then start over."""
        now = time.monotonic() if now is None else now
        if not self._counts or (not force and now - self._since < self.every_seconds):
            return None
        refused = sum(self._counts.values())
        reasons = ", ".join(f"{reason} {n} (e.g. {self._example[reason]})" for reason, n in
                            self._counts.most_common())
        message = (f"serve: {refused} of {self._answered} requests in the last {now - self._since:.0f} s answered "
                   f"with an error instead of a prediction: {reasons}")
        self._counts.clear()
        self._example.clear()
        self._answered = 0
        self._since = now
        return message
