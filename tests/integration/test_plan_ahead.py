"""Plans one step ahead, end to end (`streamtrain up` on the session's broker: producers, coordinator, 2 gloo ranks).

Under a backlog the coordinator makes the plan for step s+1 while step s runs, so the ranks find it there at
the step boundary: the plan wait on the critical path is a poll of what the consumer already fetched, where
waiting for step s's feedback to be planned costs a round trip through Kafka at every step. Every sample is
still trained exactly once or is accounted for (the report reads every record back from Kafka).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from streamtrain.config import KafkaConfig
from streamtrain.runtime.commands import CLI_MODULE, module_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _up(out: Path, ahead: int, kafka: KafkaConfig) -> dict[str, Any]:
    # 2 x 4,500 samples at 256 a step outlast the 30 steps: every step is under a backlog. Topics of this run's own
    # on the session's broker: a broker's start is no part of the check.
    cmd = module_command(CLI_MODULE, "up", "--devices", "2", "--backlog", "4500", "--steps", "30", "--dif", "16",
                         "--broker", "external", "--no-prometheus", "--no-live", "--drain-timeout", "90",
                         "--out", str(out),
                         sets={"trainer.hidden_size": 16, "trainer.slowdowns": [1, 3], "coordinator.plan_ahead": ahead,
                               "kafka.bootstrap_servers": kafka.bootstrap_servers,
                               "kafka.topic_prefix": f"{kafka.topic_prefix}a{ahead}"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env={**env, "COLUMNS": "200"})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert report["plan_ahead"] == ahead and report["failures"] == []
    # Nothing lost, nothing trained twice: every produced record was trained once, or is accounted for.
    assert report["samples_unaccounted"] == 0 and report["samples_duplicated"] == 0
    assert report["samples_trained"] + report["samples_truncated"] + report["samples_dead_lettered"] == \
        report["samples_produced"]
    return report


@pytest.mark.timeout(900)
def test_ranks_find_the_next_plan_waiting_under_a_backlog(tmp_path: Path, kafka_cfg: KafkaConfig) -> None:
    ahead = _up(tmp_path / "ahead", 1, kafka_cfg)
    behind = _up(tmp_path / "behind", 0, kafka_cfg)
    split = ahead["step_period_split_median"]
    assert set(split) == {"compute", "communication", "plan_wait", "data_wait", "hold", "other"}
    assert split["hold"] == 0.0  # a backlog is never held
    # Waiting for the last step's feedback to be planned costs a round trip through Kafka (its length depends on
    # the machine: 9-65 ms here); a plan made ahead is already fetched (a poll; the median leaves room for a busy
    # machine).
    assert ahead["plan_wait_seconds_median"] < 0.02  # 0.2-0.4 ms on a quiet machine, 7.8 ms seen under load 15
    assert ahead["plan_wait_seconds_median"] < 0.25 * behind["plan_wait_seconds_median"]
    # The ranks followed the coordinator's plans, not local fallbacks, apart from the first steps at most.
    assert ahead["rank_steps_on_local_plan"] <= 2
    steps = json.loads((tmp_path / "ahead" / "series.json").read_text())["devices"]
    for series in steps.values():
        # Steps here compute for 50-100 ms and a plan's round trip takes 30-60 ms, so on a busy 2-core machine some
        # plans made ahead still arrive after the boundary (7 of 27 steps in the worst full-suite run seen); most
        # must not. The medians above are the claim; this guards against plans ahead that never arrive in time.
        late = series["plan_wait_seconds"][3:]
        assert sum(w < 0.005 for w in late) >= 2 / 3 * len(late)
