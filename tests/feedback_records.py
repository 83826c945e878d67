"""The steps' feedback among the records of a feedback topic, which also carries the ranks' start-up profiles."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Message

from streamtrain.wire import DeviceProfile, StepFeedback, decode, fingerprint_of


def is_profile(msg: Message) -> bool:
    """Whether `msg` is a rank's start-up `DeviceProfile` (sent once before its first step), not a step's report."""
    value = msg.value()
    return value is not None and value[2:10] == fingerprint_of(DeviceProfile)


def step_feedback(messages: Iterable[Message]) -> list[StepFeedback]:
    """Each `StepFeedback` of `messages` (records of a feedback topic), the start-up profiles left out."""
    return [decode(m.value(), m.headers(), StepFeedback) for m in messages if not is_profile(m)]


def profiles(messages: Iterable[Message]) -> list[DeviceProfile]:
    """Each start-up `DeviceProfile` of `messages`."""
    return [decode(m.value(), m.headers(), DeviceProfile) for m in messages if is_profile(m)]
