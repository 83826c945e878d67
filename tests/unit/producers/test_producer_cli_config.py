"""Bad producer settings stop with a message naming the setting; metrics are declared once."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from streamtrain.cli import app
from streamtrain.config import ConfigError, load_config
from streamtrain.producers.metrics import ProducerMetrics


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({"producer.injection.alpha": 1.5}, "producer.injection.alpha"),
        ({"producer.size.dif": -1}, "producer.size.dif"),
        ({"producer.rate.preset": "S3"}, "producer.rate.preset"),
        ({"producer.rate.mean": 0}, "producer.rate.mean"),
        ({"producer.devices": 2, "producer.rate.rates": [1, 2, 3]}, "rate.rates"),
        ({"producer.client": {"acks": "1"}}, "producer.client"),
        ({"producer.rate.bursts": {"every_seconds": 1, "duration_seconds": 2}}, "producer.rate.bursts"),
        ({"producer.synthetic.labels_per_device": 11}, "labels_per_device"),
        ({"producer.dataset.sharding": "kmeans"}, "producer.dataset.sharding"),
    ],
)
def test_bad_settings_name_the_setting(overrides: dict[str, object], setting: str) -> None:
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")):
        load_config(env={}, overrides=overrides)


def test_produce_exits_2_on_unreachable_dif() -> None:
    result = CliRunner().invoke(app, ["produce", "--size-kind", "normal", "--size", "45", "--dif", "64"], env={})
    assert result.exit_code == 2
    assert "size.dif" in result.output and "lognormal" in result.output


def test_produce_exits_2_naming_a_bad_flag() -> None:
    result = CliRunner().invoke(app, ["produce", "--rate-kind", "poisson"], env={})
    assert result.exit_code == 2 and "producer.rate.kind" in result.output


def test_produce_exits_2_on_an_unusable_dataset(tmp_path: Path) -> None:
    (tmp_path / "junk.npy").write_text("no")
    result = CliRunner().invoke(app, ["produce", "--dataset", str(tmp_path)], env={})
    assert result.exit_code == 2 and "junk.npy" in result.output


def test_metrics_have_conventional_names_and_a_child_per_device() -> None:
    registry = CollectorRegistry()
    ProducerMetrics(registry, ["a", "b"])
    assert registry.get_sample_value("streamtrain_producer_samples_sent_total", {"device": "b"}) == 0.0
    assert registry.get_sample_value("streamtrain_producer_samples_failed_total", {"device": "a"}) == 0.0
    assert registry.get_sample_value("streamtrain_producer_sent_bytes_total", {"device": "a"}) == 0.0
    assert registry.get_sample_value("streamtrain_producer_target_rate_samples_per_second", {"device": "a"}) == 0.0
    assert registry.get_sample_value("streamtrain_producer_broker_up") == 1.0


def test_producers_run_until_stopped_by_default_and_zero_duration_means_the_same() -> None:
    assert load_config(env={}).producer.duration_seconds is None
    assert load_config(env={}, overrides={"producer.duration_seconds": 0}).producer.duration_seconds is None
    assert load_config(env={}, overrides={"producer.duration_seconds": 2.5}).producer.duration_seconds == 2.5
    with pytest.raises(ConfigError, match=r"producer\.duration_seconds"):
        load_config(env={}, overrides={"producer.duration_seconds": -1})
