"""`up --bridge FILE` takes FILE's other settings and named devices, or refuses them before starting anything."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from streamtrain.cli import app

SOURCE = '[[bridge.sources]]\ntopic = "events"\n'


def _up(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args], env={"COLUMNS": "300", "STREAMTRAIN_CONFIG": ""})
    return result.exit_code, " ".join(result.output.split())


def test_without_config_the_bridge_file_is_the_runs_configuration(tmp_path: Path) -> None:
    bridge = tmp_path / "bridge.toml"
    bridge.write_text(f'[kafka]\nbootstrap_servers = "127.0.0.1:1"\n\n{SOURCE}')
    code, output = _up("up", "--bridge", str(bridge), "--broker", "external", "--no-live", "--no-prometheus",
                       "--out", str(tmp_path / "run"))
    assert "its settings outside [bridge] (kafka) are the run's configuration" in output
    assert code == 1 and "no Kafka broker answers at 127.0.0.1:1" in output  # FILE's broker, not the default


def test_settings_beside_the_bridge_table_and_another_config_are_refused(tmp_path: Path) -> None:
    bridge, other = tmp_path / "bridge.toml", tmp_path / "run.toml"
    bridge.write_text(f'[trainer]\nnum_features = 4\n\n[bridge]\ndevices = ["a"]\n\n{SOURCE}')
    other.write_text('job = "mine"\n')
    code, output = _up("--config", str(other), "up", "--bridge", str(bridge))
    assert code == 2 and "has settings outside its [bridge] table (trainer), while the run's configuration" in output
    code, output = _up("--config", str(bridge), "up", "--bridge", str(bridge), "--devices", "2")  # the same file:
    assert code == 2 and "outside its [bridge]" not in output and "--devices 2 with bridge.devices" in output  # fine


def test_named_devices_are_the_runs_and_a_different_devices_count_is_refused(tmp_path: Path) -> None:
    bridge = tmp_path / "bridge.toml"
    bridge.write_text(f'[bridge]\ndevices = ["s-a", "s-b", "s-c"]\n\n{SOURCE}')
    code, output = _up("up", "--bridge", str(bridge), "--devices", "2")
    assert code == 2 and "--devices 2 with bridge.devices ['s-a', 's-b', 's-c']" in output
