"""The embedded broker's cluster ids are ones Kafka's storage tool accepts on its command line."""

from __future__ import annotations

import base64
import uuid

import pytest

from streamtrain.broker import properties


def test_cluster_ids_never_start_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8.. encodes to "-" first in URL-safe base64: the first draw is rejected, the second kept.
    draws = iter([uuid.UUID(bytes=b"\xf8" + b"\x00" * 15), uuid.UUID(bytes=b"\x04" + b"\x00" * 15)])
    monkeypatch.setattr(properties.uuid, "uuid4", lambda: next(draws))
    assert base64.urlsafe_b64encode(b"\xf8" + b"\x00" * 15).decode().startswith("-")
    cluster = properties.new_cluster_id()
    assert not cluster.startswith("-") and len(cluster) == 22


def test_cluster_ids_are_22_url_safe_characters() -> None:
    for _ in range(500):
        cluster = properties.new_cluster_id()
        assert len(cluster) == 22 and not cluster.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster + "==")) == 16
