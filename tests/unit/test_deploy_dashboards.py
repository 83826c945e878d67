"""The provisioned Grafana dashboards: valid JSON, the panels operators need, the provisioned
datasource, metric names the services really declare, and PromQL the real Prometheus parser accepts.

(`tests/integration` evaluates every expression against a Prometheus scraping a live local stack.)
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from metric_families import service_metric_families

from streamtrain.report.run_balance import KEEPS_UP_FRACTION

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
FILES = sorted(DASHBOARDS.glob("*.json"))

#: What the dashboards must show, as (dashboard uid, words every matching panel title has).
REQUIRED = [
    ("streamtrain-balance", "keeping up per device"),
    ("streamtrain-balance", "headroom per device"),
    ("streamtrain-balance", "lag per device"),
    ("streamtrain-balance", "straggler effect where every device had work waiting"),
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
    ("streamtrain-training", "test-then-train"),
    ("streamtrain-training", "held-out metrics"),
    ("streamtrain-training", "plan latency"),
    ("streamtrain-training", "late plans"),
    ("streamtrain-serving", "freshness"),
    ("streamtrain-serving", "model version in use"),
    ("streamtrain-serving", "request latency"),
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
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {family.name + suffix for _, family in service_metric_families() for suffix in suffixes[family.type]}


def _generator() -> ModuleType:
    return importlib.import_module("streamtrain.dashboards.build")


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
    assert sorted(generator.DASHBOARDS) == [p.stem for p in FILES]
    for uid in generator.DASHBOARDS:
        assert _load(DASHBOARDS / f"{uid}.json") == generator.dashboard_json(uid), (
            f"{uid}.json is stale: run python -m streamtrain.dashboards.build")


def test_panels_tile_grafanas_grid_for_the_pinned_grafana() -> None:
    """Panels sit side by side on the 24-column grid without overlapping; the schema is the pinned Grafana's."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = dict(line.split("=", 1) for line in (ROOT / ".env").read_text().splitlines()
               if line and not line.startswith("#"))
    assert env["GRAFANA_IMAGE"].startswith("grafana/grafana:11.6.")
    assert compose["services"]["grafana"]["image"] == "${GRAFANA_IMAGE:-" + env["GRAFANA_IMAGE"] + "}"
    for path in FILES:
        model = _load(path)
        assert model["schemaVersion"] == 41  # Grafana 11.6's dashboard schema
        cells: set[tuple[int, int]] = set()
        for panel in model["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, (path.name, panel["title"])
            mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                    for y in range(grid["y"], grid["y"] + grid["h"])}
            assert not mine & cells, (path.name, panel["title"])
            cells |= mine


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


def test_the_balance_dashboard_opens_with_what_holds_at_any_load() -> None:
    """First row: keeping up, headroom, lag per device; SE comes after, never before (it misleads at line rate)."""
    panels = _load(DASHBOARDS / "streamtrain-balance.json")["panels"]
    top = sorted((p for p in panels if p["gridPos"]["y"] == 0), key=lambda p: p["gridPos"]["x"])
    assert [p["title"].lower().split(" per device")[0] for p in top] == ["keeping up", "headroom", "lag"]
    assert sum(p["gridPos"]["w"] for p in top) == 24
    keeping_up = top[0]["targets"][0]["expr"]
    assert "deriv(streamtrain_coordinator_lag_records" in keeping_up
    assert f"<= bool {KEEPS_UP_FRACTION:g} * streamtrain_coordinator_arrival_rate_samples_per_second" in keeping_up
    se_rows = [p["gridPos"]["y"] for p in panels if "straggler effect" in p["title"].lower()]
    assert se_rows and min(se_rows) > 0


def test_the_straggler_effect_is_shown_only_over_steps_with_work_waiting_everywhere() -> None:
    for uid, title, expr in _targets():
        assert "streamtrain_coordinator_straggler_effect_ratio" not in expr, (uid, title, expr)
        if "straggler_effect_waiting_ratio" in expr:
            # Gated to 1 while such steps happen and NaN (a gap) otherwise: never a stale or made-up value.
            gate = "(increase(streamtrain_coordinator_waiting_steps_total[1m]) > bool 0)"
            assert f"* on(instance) ({gate} / {gate})" in expr, (uid, title, expr)
    shown = [t for uid, t, e in _targets() if "straggler_effect_waiting_ratio" in e]
    assert shown == ["Straggler effect where every device had work waiting"]
