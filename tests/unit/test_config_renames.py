"""Renamed settings: the old spelling loads for one release, from TOML, environment and --set, and says the new one."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from streamtrain.config import ConfigError, StreamtrainConfig, TrainerConfig, load_config
from streamtrain.config.renames import Renamed
from streamtrain.runtime.commands import CLI_MODULE, module_command


def _renamed(model: type[BaseModel], path: str = "") -> Iterator[tuple[str, str, Renamed]]:
    """(dotted old name, dotted new name, rename) of every renamed setting reachable as a plain dotted key."""
    table: dict[str, Renamed] = getattr(model, "renamed_settings", {})
    for old, new in table.items():
        yield f"{path}{old}", f"{path}{new.name}", new
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _renamed(annotation, f"{path}{name}.")


RENAMED = sorted(_renamed(StreamtrainConfig))


def _get(cfg: BaseModel, dotted: str) -> Any:
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "streamtrain.toml"
    path.write_text(text)
    return path


def test_the_renames_cover_every_old_duration_spelling() -> None:
    old = {o for o, _, _ in RENAMED}
    assert {"trainer.plan_wait_s", "trainer.data_wait_s", "trainer.idle_wait_s", "trainer.hold_max_s",
            "producer.duration_s", "producer.tick_s", "producer.rate.catch_up_s", "broker.start_timeout_s",
            "kafka.retention_ms", "coordinator.plan_wait_seconds"} <= old
    assert "plan_wait_seconds" in TrainerConfig.model_fields and "plan_wait_s" not in TrainerConfig.model_fields


@pytest.mark.parametrize(("old", "new", "rename"), RENAMED, ids=[o for o, _, _ in RENAMED])
def test_every_old_name_still_sets_the_new_one_with_a_warning(old: str, new: str, rename: Renamed,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    value = 0.5 if rename.convert(0.5) == 0.5 else 5000.0  # valid for every duration; milliseconds stay >= 1 ms
    with pytest.warns(DeprecationWarning, match=rf"{old} is renamed {new}"), caplog.at_level(logging.WARNING):
        cfg = load_config(env={}, overrides={old: value})
    assert _get(cfg, new) == pytest.approx(rename.convert(value))
    assert any(new in r.getMessage() and "command line" in r.getMessage() for r in caplog.records)


def test_old_names_in_a_toml_file_load_even_inside_lists_and_optional_sections(tmp_path: Path) -> None:
    path = _toml(tmp_path, """
[trainer]
plan_wait_s = 3.0
[producer.rate]
catch_up_s = 2.0
schedule = [{ at_s = 0, factor = 1 }, { at_s = 5, factor = 2 }]
bursts = { every_s = 4, duration_s = 1 }
[kafka]
retention_ms = 3600000
""")
    with pytest.warns(DeprecationWarning) as seen:
        cfg = load_config(path, env={})
    assert cfg.trainer.plan_wait_seconds == 3.0 and cfg.producer.rate.catch_up_seconds == 2.0
    assert [c.at_seconds for c in cfg.producer.rate.schedule] == [0, 5]
    assert cfg.producer.rate.bursts is not None and cfg.producer.rate.bursts.every_seconds == 4
    assert cfg.kafka.retention_seconds == 3600 and cfg.kafka.kafka_retention_ms == 3_600_000
    messages = [str(w.message) for w in seen]
    assert any("producer.rate.schedule[1].at_s is renamed producer.rate.schedule[1].at_seconds" in m for m in messages)
    assert all(f"file {path}" in m for m in messages)


def test_an_old_environment_variable_is_named_in_the_warning() -> None:
    with pytest.warns(DeprecationWarning, match="STREAMTRAIN_TRAINER__HOLD_MAX_S"):
        cfg = load_config(env={"STREAMTRAIN_TRAINER__HOLD_MAX_S": "0"})
    assert cfg.trainer.hold_max_seconds == 0


def test_the_coordinators_wait_is_named_for_what_it_waits_for() -> None:
    with pytest.warns(DeprecationWarning, match="coordinator.feedback_wait_seconds"):
        cfg = load_config(env={"STREAMTRAIN_COORDINATOR__PLAN_WAIT_SECONDS": "4"})
    assert cfg.coordinator.feedback_wait_seconds == 4 and cfg.trainer.plan_wait_seconds == 2.0


def test_precedence_holds_whichever_name_each_source_uses(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[trainer]\nplan_wait_s = 3.0\ndata_wait_seconds = 3.0\n")
    with pytest.warns(DeprecationWarning):
        cfg = load_config(path, env={"STREAMTRAIN_TRAINER__DATA_WAIT_S": "4"},
                          overrides={"trainer.plan_wait_seconds": 5})
    assert cfg.trainer.plan_wait_seconds == 5  # flag (new name) over file (old name)
    assert cfg.trainer.data_wait_seconds == 4  # environment (old name) over file (new name)
    with pytest.warns(DeprecationWarning):  # on the command line the later one wins, as for one name
        cfg = load_config(env={}, overrides={"trainer.plan_wait_seconds": 5, "trainer.plan_wait_s": 6})
    assert cfg.trainer.plan_wait_seconds == 6


def test_one_source_giving_both_names_is_refused_naming_both(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[trainer]\nplan_wait_s = 3.0\nplan_wait_seconds = 4.0\n")
    with pytest.raises(ConfigError, match=r"both trainer.plan_wait_s and trainer.plan_wait_seconds"):
        load_config(path, env={})
    env = {"STREAMTRAIN_TRAINER__IDLE_WAIT_S": "1", "STREAMTRAIN_TRAINER__IDLE_WAIT_SECONDS": "2"}
    with pytest.warns(DeprecationWarning), pytest.raises(
            ConfigError, match=r"trainer.idle_wait_seconds is given twice.*STREAMTRAIN_TRAINER__IDLE"):
        load_config(env=env)


def test_a_bad_value_under_an_old_name_is_reported_under_the_new_one() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match=r"trainer.plan_wait_seconds.*-1"):
        load_config(env={}, overrides={"trainer.plan_wait_s": -1})


def test_retention_in_milliseconds_converts_and_forever_stays_forever() -> None:
    with pytest.warns(DeprecationWarning):
        assert load_config(env={"STREAMTRAIN_KAFKA__RETENTION_MS": "-1"}).kafka.retention_seconds == -1
    assert load_config(env={}).kafka.kafka_retention_ms == 7 * 24 * 3600 * 1000
    with pytest.raises(ConfigError, match=r"kafka\.retention_seconds"):
        load_config(env={}, overrides={"kafka.retention_seconds": -0.5})


def test_the_cli_accepts_an_old_name_and_logs_the_new_one() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    result = subprocess.run(module_command(CLI_MODULE, "config", "show", sets={"producer.tick_s": 0.01}),
                            capture_output=True, text=True, timeout=120, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["producer"]["tick_seconds"] == 0.01
    assert "producer.tick_s is renamed producer.tick_seconds" in result.stderr
