"""The [coordinator] settings: defaults, and bad values named in the error."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from streamtrain.config import ConfigError, CoordinatorConfig, load_config


def test_defaults_are_valid_and_pick_ett_stream() -> None:
    cfg = CoordinatorConfig()
    assert cfg.policy == "ett-stream"
    assert cfg.lbb_rapid_threshold == 0.3 and cfg.lbb_fine_threshold == 0.05


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"b_min": 10, "b_max": 5}, "b_min"),
        ({"truncation": "bounded"}, "max_lag_samples"),
        ({"lbb_fine_threshold": 0.4}, "lbb_fine_threshold"),
        ({"policy": "fastest"}, "policy"),
        ({"memory_headroom": 1.5}, "memory_headroom"),
    ],
)
def test_bad_settings_name_the_field(settings: dict[str, object], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        CoordinatorConfig(**settings)  # type: ignore[arg-type]


def test_loader_reports_coordinator_section() -> None:
    with pytest.raises(ConfigError, match="coordinator"):
        load_config(env={}, overrides={"coordinator.global_batch": 0})
    assert load_config(env={}, overrides={"coordinator.policy": "lbb"}).coordinator.policy == "lbb"
