"""The pre-produced backlog's producer settings: the live stream's sizes and seed, unpaced, a fixed count."""

from __future__ import annotations

import numpy as np

from streamtrain.config import ProducerConfig
from streamtrain.producers.sizes import make_size_sampler
from streamtrain.producers.sources import device_rng
from streamtrain.stack.backlog import backlog_config
from streamtrain.stack.services import DeviceStream, stream_settings


def test_backlog_uses_the_live_streams_settings_unpaced_and_bounded() -> None:
    stream = DeviceStream("cam7", rate=30.0, size_mean=45.0, size_dif=64.0, size_kind="lognormal")
    cfg = backlog_config(ProducerConfig(), stream, index=2, seed=5, samples=1234)
    live = stream_settings(stream, 2, 5)
    assert cfg.device_ids == ["cam7"] and cfg.devices == 1
    assert cfg.seed == live["producer.seed"] == 7
    assert cfg.size.kind == "lognormal" and cfg.size.mean == 45.0 and cfg.size.dif == 64.0
    assert cfg.rate.kind == "unlimited" and cfg.max_samples == 1234 and cfg.duration_seconds is None
    assert not cfg.metrics
    sizes = make_size_sampler(cfg.size)(device_rng(cfg.seed, 0, 0), 20000)
    assert abs(sizes.mean() - 45.0) < 2.0 and abs(sizes.std() - 64.0) < 8.0 and sizes.min() >= 1


def test_default_size_kind_follows_the_dif() -> None:
    assert stream_settings(DeviceStream("0", 1.0, 45.0, 0.0), 0, 0)["producer.size.kind"] == "fixed"
    assert stream_settings(DeviceStream("0", 1.0, 45.0, 16.0), 0, 0)["producer.size.kind"] == "normal"
    cfg = backlog_config(ProducerConfig(), DeviceStream("0", 1.0, 45.0, 16.0), 0, 0, 10)
    assert np.isclose(cfg.size.dif, 16.0)
