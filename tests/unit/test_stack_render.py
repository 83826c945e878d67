"""`streamtrain dashboards render` against a stand-in Prometheus: a local HTTP server answering
/api/v1/query_range with canned matrices. This checks the renderer (queries sent, legends, "No data",
the grid); the real Prometheus path is exercised by rendering docs/dashboards/*.png from `streamtrain up`."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from streamtrain.cli import app
from streamtrain.dashboards.render import (
    BACKGROUND,
    PANEL,
    dashboard_panels,
    grid_boxes,
    legend_name,
    render_dashboard,
)

NOW = time.time()
DASHBOARD: dict[str, Any] = {
    "title": "render test",
    "uid": "streamtrain-rendertest",
    "templating": {"list": [{"name": "device", "type": "query", "includeAll": True, "multi": True,
                             "current": {"value": ["$__all"]}}]},
    "panels": [
        {"type": "timeseries", "title": "Step time", "gridPos": {"x": 0, "y": 0, "w": 12, "h": 8},
         "fieldConfig": {"defaults": {"unit": "s"}},
         "targets": [{"refId": "A", "expr": 'step_seconds{device="$device"}', "legendFormat": "dev {{device}}"}]},
        {"type": "timeseries", "title": "Rates", "gridPos": {"x": 12, "y": 0, "w": 12, "h": 8},
         "fieldConfig": {"defaults": {"unit": "ops"}},
         "targets": [{"refId": "A", "expr": "sum by (device) (rate(sent_total[$__rate_interval]))",
                      "legendFormat": "sent {{device}}"}]},
        {"type": "timeseries", "title": "Nothing here", "gridPos": {"x": 0, "y": 8, "w": 24, "h": 6},
         "targets": [{"refId": "A", "expr": "absent_metric_total"}]},
    ],
}


class _FakePrometheus(BaseHTTPRequestHandler):
    queries: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        params = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        type(self).queries.append(params)
        result = []
        if "bad(" in params.get("query", ""):  # what Prometheus answers to a query it cannot parse
            self._reply(400, {"status": "error", "errorType": "bad_data", "error": "parse error: unknown function"})
            return
        if url.path == "/api/v1/query_range" and "absent_metric" not in params["query"]:
            start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
            points = [start + i * step for i in range(int((end - start) / step) + 1)]
            result = [{"metric": {"device": d, "job": "x"}, "values": [[t, str(0.1 * (i + 1) + t % 7 / 100)]
                                                                     for t in points]}
                      for i, d in enumerate(("0", "1"))]
        self._reply(200, {"status": "success", "data": {"resultType": "matrix", "result": result}})

    def _reply(self, code: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    _FakePrometheus.queries = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_grid_boxes_follow_grafana_grid() -> None:
    boxes, height = grid_boxes(dashboard_panels(DASHBOARD), width_px=1600)
    left, right, wide = boxes["Step time"], boxes["Rates"], boxes["Nothing here"]
    assert left.top == right.top and left.width == right.width and left.height == right.height
    assert right.left == pytest.approx(left.left + left.width + 8)  # 8 px gap between neighbours
    assert wide.left == left.left and wide.width == pytest.approx(2 * left.width + 8)  # w=24 spans both
    assert wide.top == pytest.approx(left.top + left.height + 8)  # y=8 starts right under h=8
    assert left.height == pytest.approx(8 * 30 + 7 * 8) and wide.height == pytest.approx(6 * 30 + 5 * 8)
    assert right.left + right.width == pytest.approx(1600 - 16)  # the grid fills the width inside the padding
    assert height == pytest.approx(wide.top + wide.height + 16)


def test_legend_names_fill_labels_or_fall_back_to_the_series_name() -> None:
    assert legend_name("planned {{device}}", {"device": "3"}) == "planned 3"
    assert legend_name("feedback {{reason}}", {}) == "feedback"
    assert legend_name("", {"__name__": "up", "job": "a"}) == 'up{job="a"}'


def test_render_queries_every_panel_and_reports_no_data(prometheus: str, tmp_path: Path) -> None:
    from matplotlib.image import imread

    render = render_dashboard(DASHBOARD, "rendertest", prometheus, minutes=10, out=tmp_path, end=NOW)
    assert render.path == tmp_path / "rendertest.png" and render.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert render.no_data == ["Nothing here"] and not render.errors
    assert render.series == {"Step time": 2, "Rates": 2, "Nothing here": 0}
    sent = {q["query"] for q in _FakePrometheus.queries}
    assert 'step_seconds{device=~".*"}' in sent  # the variable became its All regex
    assert "sum by (device) (rate(sent_total[30s]))" in sent
    assert {float(q["step"]) for q in _FakePrometheus.queries} == {3.0}  # 600 s / 200 points
    assert all(float(q["end"]) - float(q["start"]) == pytest.approx(600.0) for q in _FakePrometheus.queries)

    # The image is laid out on those boxes: panel colour at a panel's title strip, page colour in the gap.
    image = imread(render.path)
    boxes, height = grid_boxes(dashboard_panels(DASHBOARD))
    assert image.shape[:2] == (round(height), 1600)

    def colour(x: float, y: float) -> str:
        r, g, b = (round(float(c) * 255) for c in image[int(y), int(x)][:3])
        return f"#{r:02x}{g:02x}{b:02x}"

    for box in boxes.values():
        assert colour(box.left + box.width - 12, box.top + 6) == PANEL
    left = boxes["Step time"]
    assert colour(left.left + left.width + 4, left.top + left.height / 2) == BACKGROUND
    assert colour(left.left + left.width / 2, left.top + left.height + 4) == BACKGROUND


def test_render_command_writes_one_png_per_dashboard(prometheus: str, tmp_path: Path) -> None:
    (tmp_path / "dash").mkdir()
    (tmp_path / "dash" / "a.json").write_text(json.dumps(DASHBOARD))
    (tmp_path / "dash" / "b.json").write_text(json.dumps({"dashboard": {**DASHBOARD, "uid": "other"}}))
    result = CliRunner().invoke(app, ["dashboards", "render", "--prometheus", prometheus, "--dashboards",
                                      str(tmp_path / "dash"), "--minutes", "2", "--out", str(tmp_path / "png")],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == ["other.png", "rendertest.png"]
    assert "no data: rendertest / Nothing here" in result.output
    assert "2/3 panels with data" in result.output


def test_render_command_names_an_unreachable_prometheus(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dashboards", "render", "--prometheus", "http://127.0.0.1:9",
                                      "--out", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "--prometheus http://127.0.0.1:9" in result.output


def test_a_rejected_query_is_drawn_reported_and_fails_the_command(prometheus: str, tmp_path: Path) -> None:
    bad = {**DASHBOARD, "panels": [*DASHBOARD["panels"][:2],
                                   {**DASHBOARD["panels"][2], "targets": [{"refId": "B", "expr": "bad(x)"}]}]}
    render = render_dashboard(bad, "bad", prometheus, minutes=5, out=tmp_path, end=NOW)
    assert render.no_data == [] and len(render.errors) == 1
    assert render.errors[0].startswith("Nothing here / B: bad(x): HTTP 400: parse error: unknown function")
    (tmp_path / "dash").mkdir()
    (tmp_path / "dash" / "bad.json").write_text(json.dumps(bad))
    result = CliRunner().invoke(app, ["dashboards", "render", "--prometheus", prometheus, "--dashboards",
                                      str(tmp_path / "dash"), "--out", str(tmp_path / "png")], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "query error: Nothing here / B" in result.output
