"""The runnable entries: `python -m streamtrain.cli` and each service's own, with the same global options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamtrain.runtime.commands import CLI_MODULE, module_command
from streamtrain.stack.services import coordinator_spec, device_streams, producer_spec, trainer_spec
from streamtrain.trainer.launch import rank_command

#: Each entry and one of its commands that loads the configuration before it touches Kafka.
ENTRIES = [
    (CLI_MODULE, ("config", "show")),
    ("streamtrain.producers", ("produce", "--no-progress")),
    ("streamtrain.coordinator", ("coordinate",)),
    ("streamtrain.trainer", ("train", "--device-id", "0")),
    ("streamtrain.bridge", ("bridge",)),
]


def _run(argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**env, "COLUMNS": "200"},
                          check=False)


@pytest.mark.parametrize(("module", "command"), ENTRIES, ids=[m for m, _ in ENTRIES])
def test_every_entry_takes_the_global_options_and_rejects_a_bad_setting_by_name(
        module: str, command: tuple[str, ...]) -> None:
    result = _run(module_command(module, *command, sets={"kafka.partitions": 0}))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "kafka.partitions" in result.stderr and "command line" in result.stderr


@pytest.mark.parametrize(("module", "command"), ENTRIES, ids=[m for m, _ in ENTRIES])
def test_every_entry_lists_its_commands(module: str, command: tuple[str, ...]) -> None:
    result = _run((sys.executable, "-m", module, "--help"))
    assert result.returncode == 0, result.stderr
    assert "--set" in result.stdout and command[0] in result.stdout


def test_module_command_puts_global_options_then_settings_then_the_command() -> None:
    argv = module_command("streamtrain.trainer", "train", "--steps", "3", global_args=("--config", "a.toml"),
                          sets={"coordinator.devices": ["a", "b"], "trainer.lr": 0.5})
    assert argv == (sys.executable, "-m", "streamtrain.trainer", "--config", "a.toml",
                    "--set", 'coordinator.devices=["a", "b"]',
                    "--set", "trainer.lr=0.5", "train", "--steps", "3")


def test_the_stack_starts_each_service_through_its_own_entry(tmp_path: Path) -> None:
    common: dict[str, object] = {"kafka.topic_prefix": "t"}
    specs = [producer_spec(device_streams(1)[0], 0, 0, 1, common, []),
             coordinator_spec(["0"], None, None, 2, common, []),
             trainer_spec(["0"], 3, tmp_path, 1, common, [])]
    assert [s.argv[1:3] for s in specs] == [("-m", "streamtrain.producers"), ("-m", "streamtrain.coordinator"),
                                            ("-m", "streamtrain.trainer")]


def test_local_ranks_run_the_trainer_entry() -> None:
    """`train --local-ranks` starts each rank as `python -m streamtrain.trainer train --device-id D`, not the CLI."""
    assert rank_command("cam0") == (sys.executable, "-m", "streamtrain.trainer", "train", "--device-id", "cam0")
