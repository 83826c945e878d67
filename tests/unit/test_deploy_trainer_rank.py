"""deploy/trainer_rank.py, the entrypoint that gives each trainer replica of `docker compose` its rank."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "trainer_rank.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trainer_rank", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


rank_module = _module()


def test_every_replica_derives_a_distinct_rank_and_the_same_master() -> None:
    # What each replica sees from Compose's DNS, in whatever order it answers.
    peers = ["172.18.0.10", "172.18.0.9", "172.18.0.11", "172.18.0.2"]
    seen = {own: rank_module.assign_rank(own, list(reversed(peers)) if i % 2 else peers, 4)
            for i, own in enumerate(peers)}
    assert sorted(rank for rank, _ in seen.values()) == [0, 1, 2, 3]
    assert {master for _, master in seen.values()} == {"172.18.0.2"}
    assert seen["172.18.0.2"][0] == 0 and seen["172.18.0.9"][0] == 1  # numeric, not string, order
    assert seen["172.18.0.11"][0] == 3


def test_a_replica_count_other_than_world_size_is_refused() -> None:
    with pytest.raises(rank_module.RankError, match="WORLD_SIZE is 4"):
        rank_module.assign_rank("10.0.0.1", ["10.0.0.1", "10.0.0.2", "10.0.0.3"], 4)
    with pytest.raises(rank_module.RankError, match="not among"):
        rank_module.assign_rank("10.0.0.9", ["10.0.0.1", "10.0.0.2"], 2)


def _run(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([sys.executable, str(SCRIPT), *command], env={**base, **env},
                          capture_output=True, text=True, timeout=60)


_PRINT_ENV = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
              "('RANK', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'STREAMTRAIN_METRICS__PORT', 'WORLD_SIZE')}))")


def test_the_entrypoint_resolves_the_service_and_execs_the_command_with_torchrun_variables() -> None:
    env = {"WORLD_SIZE": "1", "STREAMTRAIN_TRAINER_SERVICE": "localhost",
           "STREAMTRAIN_TRAINER_ADDRESS": "127.0.0.1", "STREAMTRAIN_TRAINER_METRICS_PORT": "9400",
           "STREAMTRAIN_RENDEZVOUS_TIMEOUT_SECONDS": "20"}
    result = _run(env, sys.executable, "-c", _PRINT_ENV, "--devices", "0")
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen == {"RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                    "STREAMTRAIN_METRICS__PORT": "9400", "WORLD_SIZE": "1"}
    assert "renamed" not in result.stderr


def test_the_old_rendezvous_timeout_name_still_works_and_says_it_is_renamed() -> None:
    env = {"WORLD_SIZE": "2", "STREAMTRAIN_TRAINER_SERVICE": "localhost", "STREAMTRAIN_TRAINER_ADDRESS": "127.0.0.1",
           "STREAMTRAIN_RENDEZVOUS_TIMEOUT_S": "0.5"}
    started = time.monotonic()
    result = _run(env, sys.executable, "-c", "pass")  # one replica of two ever resolves: waits out the timeout
    assert result.returncode == 2 and time.monotonic() - started < 30
    assert "STREAMTRAIN_RENDEZVOUS_TIMEOUT_S is renamed STREAMTRAIN_RENDEZVOUS_TIMEOUT_SECONDS" in result.stderr


def test_a_given_rank_is_kept_and_every_replica_serves_one_port() -> None:
    # A rank serves on metrics.port + LOCAL_RANK (streamtrain/trainer/rank.py); LOCAL_RANK is 0 in a container.
    env = {"WORLD_SIZE": "4", "RANK": "3", "MASTER_ADDR": "trainer-0", "STREAMTRAIN_TRAINER_METRICS_PORT": "9400"}
    result = _run(env, sys.executable, "-c", _PRINT_ENV)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["RANK"] == "3" and seen["MASTER_ADDR"] == "trainer-0" and seen["LOCAL_RANK"] == "0"
    assert int(seen["STREAMTRAIN_METRICS__PORT"]) + int(seen["LOCAL_RANK"]) == 9400


def test_devices_must_match_the_number_of_replicas() -> None:
    result = _run({"WORLD_SIZE": "2", "RANK": "0"}, "streamtrain", "train", "--devices", "0,1,2")
    assert result.returncode == 2
    assert "--devices names 3 devices but WORLD_SIZE is 2" in result.stderr
    missing = _run({}, "streamtrain", "train")
    assert missing.returncode == 2 and "WORLD_SIZE must be set" in missing.stderr
