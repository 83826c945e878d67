"""The local stack with a real Prometheus: every PromQL expression of every dashboard panel returns data.

`streamtrain up --serve` runs a small dataset (so the held-out evaluation and the serving panels have data)
against the session broker; once Prometheus has scraped every service, the ranks have stepped (and
dead-lettered a few corrupt records injected into a device topic) and serve has answered with a version,
each panel's query goes through Prometheus' HTTP API. A query that reads a test-then-train sum of another
objective (regression's `abs_error_sum`, say) has no data in a classification run; it is let off only when
a sibling query of its panel has data. Then SIGTERM stops the stack in order, and its report must account
for every sample, the dead letters included.

The dashboards come from deploy/grafana/dashboards (or $STREAMTRAIN_TEST_DASHBOARDS).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamtrain.config import KafkaConfig
from streamtrain.dashboards.queries import load_dashboard_queries
from streamtrain.kafka import make_producer
from streamtrain.objectives.classification import Classification
from streamtrain.runtime.commands import CLI_MODULE, module_command
from streamtrain.stack.prometheus import INSTALL_HINT, find_prometheus, instant_query

PROMETHEUS = find_prometheus()
DASHBOARDS = Path(os.environ.get("STREAMTRAIN_TEST_DASHBOARDS")
                  or Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards")
BAD_RECORDS = 3
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: The test-then-train sums a classification run exports; a query for any other is another objective's.
CLASSIFICATION_SUMS = {name for ratio in Classification.ratios for name in (ratio.numerator, ratio.denominator)}

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason=f"no prometheus binary on this machine: {INSTALL_HINT}"),
]


def _wait_for(what: str, check: Callable[[], object], timeout: float, proc: subprocess.Popen[bytes],
              log: Path) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"streamtrain up exited ({proc.returncode}) waiting for {what}:\n" \
                                    f"{log.read_text()[-4000:]}"
        value = check()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; up's output:\n{log.read_text()[-4000:]}")


def _first(pattern: str, log: Path) -> str | None:
    match = re.search(pattern, log.read_text())
    return match.group(1) if match else None


def _other_objectives(expr: str) -> bool:
    """Whether `expr` reads only test-then-train sums that a classification run does not export."""
    keys = set(re.findall(r'key="(\w+)"', expr))
    return bool(keys) and not keys & CLASSIFICATION_SUMS


def _value(url: str, expr: str) -> float:
    result = instant_query(url, expr)
    return float(result[0]["value"][1]) if result else 0.0


@pytest.mark.timeout(420)
def test_every_dashboard_query_returns_data_from_the_local_stack(tmp_path: Path, broker: Any) -> None:
    queries = load_dashboard_queries(DASHBOARDS) if DASHBOARDS.is_dir() else []
    assert queries, f"no dashboard panel with a PromQL expression under {DASHBOARDS}"
    bootstrap = broker.bootstrap
    out, log = tmp_path / "run", tmp_path / "up.log"
    prefix = f"t{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    env.update(STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS=bootstrap, STREAMTRAIN_KAFKA__TOPIC_PREFIX=prefix, COLUMNS="300")
    subprocess.run([sys.executable, str(EXAMPLES / "toy_series.py"), str(tmp_path / "data")], check=True,
                   capture_output=True)  # Toy_TRAIN.ts, and Toy_TEST.ts beside it: the held-out set
    cmd = module_command(CLI_MODULE, "up", "--dataset", str(tmp_path / "data" / "Toy_TRAIN.ts"), "--devices", "2",
                         "--rates", "20,40", "--serve", "--request-rate", "5", "--broker", "external", "--no-live",
                         "--drain-timeout", "60", "--out", str(out),
                         sets={"trainer.hidden_size": 16, "trainer.eval_every": 10,
                               "versions.publish_every_seconds": 2})
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_for("the stack to come up", lambda: "stack up:" in log.read_text(), 240, proc, log)
        url = _first(r"Prometheus (http://[\d.:]+)", log)
        topics = _first(r"topics (\S+)\.\*", log)
        assert url and topics, log.read_text()
        # coordinator, two ranks, the producers and serve
        _wait_for("every target scraped and 5 steps on both ranks", lambda: _value(url, "count(up == 1)") == 5
                  and _value(url, 'count(up{job="streamtrain-serve"} == 1)') == 1
                  and _value(url, "min(streamtrain_trainer_completed_steps)") >= 5, 120, proc, log)

        kafka = KafkaConfig(bootstrap_servers=bootstrap, topic_prefix=topics)
        producer = make_producer(kafka)
        for i in range(BAD_RECORDS):  # no schema header: the rank must dead-letter them, not crash
            producer.produce(kafka.topics.device("0"), value=f"not a sample {i}".encode())
        assert producer.flush(30) == 0
        _wait_for("the bad records dead-lettered and scraped",
                  lambda: _value(url, "sum(streamtrain_trainer_dead_lettered_records_total)") >= BAD_RECORDS, 90, proc,
                  log)
        _wait_for("a held-out evaluation, and serve's answers by a version that trained a sample",
                  lambda: _value(url, "count(streamtrain_trainer_heldout)") > 0
                  and _value(url, "sum(streamtrain_serve_freshness_seconds_count)") > 0, 120, proc, log)
        time.sleep(5.0)  # a few more scrapes, so every rate() window holds several points

        failures, answered, let_off = [], set(), []
        for query in queries:
            try:
                if instant_query(url, query.expr):
                    answered.add((query.dashboard, query.panel))
                elif _other_objectives(query.expr):
                    let_off.append(query)
                else:
                    failures.append(f"no data: {query}")
            except RuntimeError as exc:
                failures.append(f"error: {query}: {exc}")
        failures += [f"no data in the whole panel: {query}" for query in let_off
                     if (query.dashboard, query.panel) not in answered]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=240)
    assert not failures, f"{len(failures)} of {len(queries)} dashboard queries failed:\n" + "\n".join(failures)
    assert code == 0, log.read_text()[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["stopped_by"] == "SIGTERM"
    assert report["samples_dead_lettered"] == BAD_RECORDS
    assert report["samples_unaccounted"] == 0 and report["samples_pending"] == 0
    assert report["prometheus_url"] == url
