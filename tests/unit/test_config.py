"""One typed configuration: TOML < environment < flags, and bad values named at start-up (exit 2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamtrain.cli import app
from streamtrain.config import ConfigError, load_config, parse_assignment


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "streamtrain.toml"
    path.write_text(text)
    return path


def test_defaults_need_nothing() -> None:
    cfg = load_config(env={})
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert cfg.kafka.topics.device("cam-1") == "streamtrain.device.cam-1"


def test_precedence_is_file_then_env_then_flags(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[kafka]\npartitions = 2\ntopic_prefix = "fromfile"\nretention_seconds = 1.5\n')
    env = {"STREAMTRAIN_KAFKA__PARTITIONS": "3", "STREAMTRAIN_KAFKA__TOPIC_PREFIX": "fromenv"}
    cfg = load_config(path, env=env, overrides={"kafka.partitions": 4})
    assert cfg.kafka.partitions == 4  # flag beats env beats file
    assert cfg.kafka.topic_prefix == "fromenv"  # env beats file
    assert cfg.kafka.retention_seconds == 1.5  # file beats default


def test_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'job = "nightly"\n')
    assert load_config(env={"STREAMTRAIN_CONFIG": str(path)}).job == "nightly"


def test_env_json_values_fill_maps() -> None:
    env = {"STREAMTRAIN_KAFKA__CLIENT": '{"security.protocol": "SASL_SSL", "sasl.password": "hunter2"}'}
    cfg = load_config(env=env)
    assert cfg.kafka.client["security.protocol"] == "SASL_SSL"
    assert cfg.kafka.redacted_client()["sasl.password"] == "***"


def test_unrelated_streamtrain_variables_are_not_settings() -> None:
    assert load_config(env={"STREAMTRAIN_TEST_BOOTSTRAP": "x:1"}).job == "streamtrain"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"STREAMTRAIN_KAFKA__PARTITIONS": "0"}, ["kafka.partitions", "greater than or equal to 1",
                                                  "STREAMTRAIN_KAFKA__PARTITIONS"]),
        ({"STREAMTRAIN_LOG_LEVEL": "LOUD"}, ["log_level", "'DEBUG', 'INFO', 'WARNING' or 'ERROR'", "'LOUD'"]),
        ({"STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS": "localhost"}, ["kafka.bootstrap_servers", "host:port"]),
        ({"STREAMTRAIN_KAFKA__TOPIC_PREFIX": "a b"}, ["kafka.topic_prefix", "letters, digits"]),
        ({"STREAMTRAIN_KAFKA__PARTITON": "2"}, ["kafka.partiton", "unknown setting", "partitions"]),
        ({"STREAMTRAIN_BROKER__HEAP": "lots"}, ["broker.heap", "pattern"]),
    ],
)
def test_bad_values_name_the_setting_its_source_and_what_is_allowed(env: dict[str, str], names: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(env=env)
    for name in names:
        assert name in str(err.value)


@pytest.mark.parametrize(("source", "typo", "known"), [
    ({"mapping": {"lable": "y"}}, "bridge.sources.0.mapping.lable", "data, device, dtype, label"),
    ({"decoder": "raw", "layout": {"shap": [-1]}}, "bridge.sources.0.layout.shap", "dtype, label_header, shape"),
    ({"decodr": "json"}, "bridge.sources.0.decodr", "decoder, layout, mapping, options, topic"),
])
def test_a_typo_inside_a_list_of_tables_lists_the_names_it_could_be(source: dict[str, object], typo: str,
                                                                      known: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(env={}, overrides={"bridge.sources": [{"topic": "events", **source}]})
    assert f"{typo}: unknown setting (known here: {known}" in str(err.value)


def test_bad_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_toml(tmp_path, "[kafka\n"), env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match=r"kafka.partitions.*\[from file"):
        load_config(_toml(tmp_path, "[kafka]\npartitions = -1\n"), env={})


def test_set_flag_parsing() -> None:
    assert parse_assignment("kafka.partitions=2") == ("kafka.partitions", "2")
    assert parse_assignment('kafka.client={"a": "b"}') == ("kafka.client", {"a": "b"})
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_assignment("kafka.partitions")


def test_cli_exits_2_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    monkeypatch.setenv("STREAMTRAIN_KAFKA__REPLICATION_FACTOR", "0")
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 2
    assert "kafka.replication_factor" in result.output
    monkeypatch.delenv("STREAMTRAIN_KAFKA__REPLICATION_FACTOR")
    result = runner.invoke(app, ["--set", "broker.port=70000", "broker", "status"])
    assert result.exit_code == 2 and "broker.port" in result.output
    result = runner.invoke(app, ["broker", "status", "--port", "-3"])
    assert result.exit_code == 2


def test_cli_shows_the_config_in_force_with_secrets_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMTRAIN_KAFKA__CLIENT", '{"sasl.password": "hunter2"}')
    result = CliRunner().invoke(app, ["--set", "job=nightly", "config", "show"])
    assert result.exit_code == 0, result.output
    assert '"nightly"' in result.output and "hunter2" not in result.output and "***" in result.output


def test_the_demo_configuration_loads_and_its_burst_is_the_one_the_makefile_runs() -> None:
    """`make demo` runs examples/plaid-demo.toml with the Makefile's --rates: the file must validate, slow the
    device with the lightest stream (else that device's own stream sets the pace whatever the policy), and burst
    once between line-rate stretches."""
    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "examples" / "plaid-demo.toml", env={})
    factors = [c.factor for c in cfg.producer.rate.schedule]
    assert factors[0] == factors[-1] == 1 and max(factors) > 10
    make = (root / "Makefile").read_text()
    rates = [float(r) for r in re.search(r"plaid-demo\.toml up .*--rates ([\d.,]+)", make).group(1).split(",")]
    slow = cfg.trainer.slowdowns
    assert len(rates) == len(slow) and rates[slow.index(max(slow))] == min(rates)


def test_a_rule_across_a_section_names_the_settings_given_not_the_default() -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(env={}, overrides={"trainer.target_shift": [0, 10, 0.5]})
    assert "target_shift has 3 values but target_width is 1" in str(refused.value)
    assert "[from command line: trainer.target_shift; the others default]" in str(refused.value)
    load_config(env={}, overrides={"trainer.target_shift": [0, 10, 0.5], "trainer.target_width": 3,
                                   "trainer.objective": "regression"})
