"""Serve takes the announcements that arrived together at once: the newest that passes goes live, the older ones
it supersedes are never loaded, and every one's samples still wait for the version that goes live (freshness)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from streamtrain.config import StreamtrainConfig
from streamtrain.models import build_model
from streamtrain.serve import service
from streamtrain.serve.service import ModelServer
from streamtrain.versions import spec_for, write_version
from streamtrain.wire import DeviceLineage, ModelVersion, ProducedCount


@dataclass
class _Announcement:
    record: ModelVersion

    def error(self) -> None:
        return None


def _server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, versions: range) -> tuple[ModelServer, list[str]]:
    config = StreamtrainConfig.model_validate({"kafka": {"bootstrap_servers": "127.0.0.1:1"},
                                              "versions": {"dir": str(tmp_path)}})
    model = build_model(config.trainer).state_dict()
    for v in versions:
        write_version(tmp_path, spec_for(config.trainer, job=config.job, version=v, step=v, class_names=None,
                                         offsets={}, metrics={}), model)
    loaded: list[str] = []

    def load(path: Path) -> object:
        loaded.append(Path(path).name)
        return real_load(path)

    real_load = service.load_model
    monkeypatch.setattr(service, "load_model", load)
    server = ModelServer(config)
    monkeypatch.setattr(server, "_decode", lambda msg: msg.record)
    return server, loaded


def _announced(server: ModelServer, root: Path, monkeypatch: pytest.MonkeyPatch, *versions: int) -> None:
    records = [_Announcement(ModelVersion(job=server.config.job, version=v, step=v, location=str(root / f"v{v:06d}"),
                                          lineage=(DeviceLineage("0", v, (ProducedCount(1_000 * v, v),)),)))
               for v in versions]
    monkeypatch.setattr(service, "consume_available", lambda *_args: records)
    server._poll_models(0.0)


def test_only_the_newest_of_the_announcements_read_together_is_loaded(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    server, loaded = _server(tmp_path, monkeypatch, range(1, 5))
    try:
        _announced(server, tmp_path, monkeypatch, 1)
        assert loaded == ["v000001"] and server.live is not None and server.live.predictor.version == 1
        server.pending.clear()
        _announced(server, tmp_path, monkeypatch, 3, 2, 4, 1)  # 1 again: live already, not counted twice
        assert loaded == ["v000001", "v000004"] and server.live.predictor.version == 4
        assert sum(c.count for c in server.pending.counts()) == 2 + 3 + 4  # every newer version's samples wait
    finally:
        server.close()


def test_an_older_announcement_goes_live_when_the_newest_cannot(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    server, loaded = _server(tmp_path, monkeypatch, range(1, 3))  # version 3 is announced but has no files
    try:
        _announced(server, tmp_path, monkeypatch, 2, 3)
        assert loaded == ["v000003", "v000002"] and server.live is not None and server.live.predictor.version == 2
    finally:
        server.close()
