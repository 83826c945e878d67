"""`DeviceProfile` on the feedback topic: its round trip, and how the coordinator's reader tells it from feedback."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from streamtrain.coordinator.inputs import FeedbackReader
from streamtrain.wire import DeviceProfile, SchemaMismatchError, StepFeedback, decode, encode
from streamtrain.wire.codec import SCHEMA_HEADER, HeaderList
from streamtrain.wire.layout import MARKER
from streamtrain.wire.legacy import encode_previous

PROFILE = DeviceProfile(job="j", device_id="3", rank=3, sizes=(400, 1600, 3200), seconds=(0.02, 0.08, 0.16),
                        slope=5e-5, intercept=0.0, mean_sample_size=100.0, profile_seconds=0.4, sent_at=1)
FEEDBACK = StepFeedback(job="j", step=0, device_id="3", rank=3, plan_step=0, samples=4, total_size=400,
                        compute_seconds=0.2, data_wait_seconds=0.0, comm_seconds=0.0, step_seconds=0.25,
                        memory_bytes=0, lowest_unprocessed_offset=4, buffer_depth=10, sent_at=1,
                        prequential={"count": 4.0})


def test_profile_round_trips_and_is_not_a_step() -> None:
    value, headers = encode(PROFILE)
    assert decode(value, headers, DeviceProfile) == PROFILE
    with pytest.raises(SchemaMismatchError, match="DeviceProfile"):  # what every reader of steps sees in it
        decode(value, headers, StepFeedback)
    assert PROFILE.problem() is None


@pytest.mark.parametrize(("change", "says"), [
    ({"slope": float("nan")}, "not finite"), ({"intercept": -0.1}, "negative"),
    ({"slope": 0.0, "intercept": 0.0}, "no time"), ({"mean_sample_size": 0.5}, "below 1"),
    ({"seconds": (0.1,)}, "3 sizes but 1 times")])
def test_a_profile_no_rank_could_send_says_why(change: dict[str, Any], says: str) -> None:
    problem = replace(PROFILE, **change).problem()
    assert problem is not None and says in problem


@dataclass
class _Msg:
    """The parts of a confluent-kafka Message the reader reads."""

    _value: bytes
    _headers: HeaderList
    _offset: int = 0

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def topic(self) -> str:
        return "p.feedback"

    def value(self) -> bytes:
        return self._value

    def headers(self) -> HeaderList:
        return self._headers


@dataclass
class _Sink:
    sent: list[str] = field(default_factory=list)

    def send(self, _msg: object, reason: str, _detail: str) -> None:
        self.sent.append(reason)


def _reader(with_profiles: bool) -> tuple[FeedbackReader, list[DeviceProfile], _Sink]:
    reader = object.__new__(FeedbackReader)  # no Kafka: only the decoding of one record is under test
    got: list[DeviceProfile] = []
    sink = _Sink()
    reader.__dict__.update(topic="p.feedback", job="j", dead_letters=sink, on_dead_letter=None, check=None,
                           on_profile=got.append if with_profiles else None, _replay_end={})
    return reader, got, sink


def _read(reader: FeedbackReader, value: bytes, headers: HeaderList) -> list[StepFeedback]:
    out: list[StepFeedback] = []
    reader._handle(_Msg(value, headers), out)  # type: ignore[arg-type]
    return out


def _older_feedback() -> tuple[bytes, HeaderList]:
    """`FEEDBACK` as a trainer before profiles (StepFeedback v2, single-object) sent it."""
    value, headers = encode_previous(FEEDBACK, version=2)
    fp = bytes.fromhex(dict(headers).pop(SCHEMA_HEADER).decode())
    return MARKER + fp + value, [h for h in headers if h[0] != SCHEMA_HEADER]


def test_reader_hands_profiles_on_and_still_reads_feedback_old_and_new() -> None:
    reader, got, sink = _reader(with_profiles=True)
    assert _read(reader, *encode(PROFILE)) == [] and got == [PROFILE]
    assert _read(reader, *encode(FEEDBACK)) == [FEEDBACK]
    assert _read(reader, *_older_feedback()) == [replace(FEEDBACK, prequential={})]  # no profile, older version
    assert _read(reader, *encode(replace(PROFILE, job="other"))) == [] and got == [PROFILE]  # another job's
    assert _read(reader, *encode(replace(PROFILE, slope=-1.0))) == [] and sink.sent == ["feedback-impossible"]
    assert got == [PROFILE]


def test_reader_without_profiles_dead_letters_them_as_an_older_coordinator_does() -> None:
    reader, _got, sink = _reader(with_profiles=False)
    assert _read(reader, *encode(PROFILE)) == [] and sink.sent == ["wrong-schema"]
    assert _read(reader, *encode(FEEDBACK)) == [FEEDBACK]
