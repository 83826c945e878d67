"""The provisioned Grafana dashboards: valid JSON, the panels the issue asks for, the provisioned
datasource, metric names the services really declare, and PromQL the real Prometheus parser accepts.

(`tests/integration` evaluates every expression against a Prometheus scraping a live local stack.)
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from coordinator.service_metrics import CoordinatorMetrics
from producers.metrics import ProducerMetrics
from trainer.metrics import TrainerMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
FILES = sorted(DASHBOARDS.glob("*.json"))

#: What the issue asks the dashboards to show, as (dashboard uid, words every matching panel title has).
REQUIRED = [
    ("streamtrain-balance", "straggler effect"),
    ("streamtrain-balance", "step time per device"),
    ("streamtrain-balance", "batch per device"),
    ("streamtrain-balance", "predicted vs actual"),
    ("streamtrain-balance", "step wall period split"),
    ("streamtrain-throughput", "produced vs trained samples/s per device"),
    ("streamtrain-lag", "lag (records)"),
    ("streamtrain-lag", "lag (seconds)"),
    ("streamtrain-lag", "buffer depth"),
    ("streamtrain-lag", "truncation"),
    ("streamtrain-lag", "dead letters"),
    ("streamtrain-training", "loss"),
    ("streamtrain-training", "plan latency"),
    ("streamtrain-training", "late plans"),
]


def _load(path: Path) -> dict[str, Any]:
    model = json.loads(path.read_text())
    assert isinstance(model, dict)
    return model


def _targets() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, expr) of every query of every panel."""
    found = []
    for path in FILES:
        model = _load(path)
        for panel in model["panels"]:
            for target in panel.get("targets", []):
                found.append((model["uid"], panel["title"], target["expr"]))
    return found


def _declared_metric_names() -> set[str]:
    """Every sample name the producers, trainer and coordinator expose (counters with _total, etc.)."""
    registry = CollectorRegistry()
    ProducerMetrics(registry, ["0"])
    trainer_registry = CollectorRegistry()
    TrainerMetrics(trainer_registry, "0", "job")
    coordinator = CoordinatorMetrics(CollectorRegistry(), "job")
    coordinator.add_device("0")
    names: set[str] = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    for reg in (registry, trainer_registry, coordinator.registry):
        for family in reg.collect():
            names.update(family.name + suffix for suffix in suffixes[family.type])
    return names


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboards", ROOT / "deploy/grafana/build_dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_dashboards_are_valid_json_with_unique_uids() -> None:
    assert len(FILES) >= 4
    uids = [_load(p)["uid"] for p in FILES]
    assert len(uids) == len(set(uids))
    for path in FILES:
        model = _load(path)
        assert model["title"] and model["panels"]
        assert path.stem == model["uid"]


@pytest.mark.parametrize(("uid", "words"), REQUIRED, ids=[w for _, w in REQUIRED])
def test_the_required_panels_exist_with_queries(uid: str, words: str) -> None:
    model = _load(DASHBOARDS / f"{uid}.json")
    panels = [p for p in model["panels"] if words in p["title"].lower()]
    assert panels, f"{uid} has no panel about {words!r}"
    assert all(p["targets"] and all(t["expr"].strip() for t in p["targets"]) for p in panels)


def test_every_panel_uses_the_provisioned_datasource() -> None:
    provisioned = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = provisioned["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    for path in FILES:
        model = _load(path)
        for variable in model["templating"]["list"]:
            assert variable["datasource"]["uid"] == source["uid"]
        for panel in model["panels"]:
            assert panel["datasource"] == {"type": "prometheus", "uid": source["uid"]}, panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == source["uid"], panel["title"]


def test_queries_use_only_the_device_variable_as_a_regex_matcher() -> None:
    for path in FILES:
        variables = {v["name"]: v for v in _load(path)["templating"]["list"]}
        assert set(variables) == {"device"}
        assert variables["device"]["allValue"] == ".*" and variables["device"]["includeAll"]
    for uid, title, expr in _targets():
        used = re.findall(r"\$\{?(\w+)", expr)
        assert set(used) <= {"device"}, (uid, title, expr)
        assert expr.count("$device") == expr.count('device=~"$device"'), (uid, title, expr)


def test_queries_name_only_metrics_the_services_declare() -> None:
    declared = _declared_metric_names()
    assert "streamtrain_trainer_samples_total" in declared  # the helper itself sees counters as exposed
    assert "streamtrain_coordinator_plan_latency_seconds_bucket" in declared
    used = {name for _, _, expr in _targets() for name in re.findall(r"\bstreamtrain_[a-z_]+", expr)}
    assert used, "no streamtrain metric in any query"
    assert used <= declared, f"not declared by any service: {sorted(used - declared)}"


def test_the_json_is_what_the_generator_writes() -> None:
    generator = _generator()
    for uid, (title, description, panels) in generator.DASHBOARDS.items():
        expected = generator.dashboard(uid, title, description, panels)
        assert _load(DASHBOARDS / f"{uid}.json") == expected, (
            f"{uid}.json is stale: run python deploy/grafana/build_dashboards.py")


def test_prometheus_parses_every_query(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) not installed")
    rules = [{"record": f"check:q{i}", "expr": expr.replace("$device", ".*")}
             for i, (_, _, expr) in enumerate(_targets())]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout
