"""The fuzz corpora themselves: every record really is broken in the way its `reason` says."""

from __future__ import annotations

import pytest
from fuzzing import assignment_corpus, device_corpus, feedback_corpus, reason_counts

from streamtrain.models.batching import sample_problems
from streamtrain.wire import Assignment, Sample, StepFeedback, WireError, decode


def _reason(value: bytes | None, headers: list, expect: type, oversize: int | None = None,
            features: int = 16, classes: int = 10, device: str | None = None) -> str | None:
    if oversize is not None and value is not None and len(value) > oversize:
        return "oversize"
    try:
        record = decode(value, headers, expect, device=device)
    except WireError as exc:
        return exc.reason
    if isinstance(record, Sample) and (sample_problems(record, features) or (record.label or 0) >= classes):
        return "untrainable"
    return None


def test_every_device_record_fails_for_its_stated_reason() -> None:
    corpus = list(device_corpus(3_400, seed=7, oversize_bytes=64 * 1024))
    assert len(corpus) == 3_400
    for record in corpus:
        got = _reason(record.value, record.headers, Sample, oversize=64 * 1024, device="fuzz")
        assert got == record.reason, (record.kind, record.reason, got)
    counts = reason_counts(corpus)
    assert set(counts) == {"corrupt", "unknown-schema", "wrong-schema", "missing-header", "size-mismatch",
                           "invalid-sample", "untrainable", "oversize", "device-mismatch"}
    assert len({r.kind for r in corpus}) == 22


@pytest.mark.parametrize(("corpus", "expect"), [(feedback_corpus, StepFeedback), (assignment_corpus, Assignment)])
def test_every_control_record_fails_for_its_stated_reason(corpus, expect) -> None:  # type: ignore[no-untyped-def]
    records = list(corpus(700, seed=3))
    for record in records:
        assert _reason(record.value, record.headers, expect) == record.reason, record.kind
    assert len(reason_counts(records)) == 3 and len({r.kind for r in records}) == 7


def test_same_seed_same_corpus() -> None:
    a = [(r.value, r.headers) for r in device_corpus(200, seed=1)]
    assert a == [(r.value, r.headers) for r in device_corpus(200, seed=1)]
    assert a != [(r.value, r.headers) for r in device_corpus(200, seed=2)]
