"""The coordinator's small HTTP endpoint: `/status` (JSON) and `/metrics` (Prometheus text), and the parts of
the status document (`device_status`, `plan_summary`).

The status document is built by the service loop and swapped in whole, so the server thread only
ever reads a finished snapshot. It carries no client settings at all, so no secret can leak.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from streamtrain.wire import Assignment

from .fleet import DeviceRecord
from .state import Plan

__all__ = ["StatusServer", "device_status", "plan_summary"]

logger = logging.getLogger(__name__)


class StatusServer:
    """Serves `/status` from `snapshot()` and `/metrics` from `registry` on a daemon thread.

    Args:
        host: address to bind (`metrics.bind_address`).
        port: port to bind; 0 picks a free one (see `port`).
        snapshot: returns the current status document.
        registry: the service's Prometheus registry.
    """

    def __init__(self, host: str, port: int, snapshot: Callable[[], dict[str, Any]],
                 registry: CollectorRegistry) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/status":
                    body = json.dumps(owner.snapshot(), default=str).encode()
                    self._send(200, "application/json", body)
                elif path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(owner.registry))
                else:
                    self._send(404, "text/plain", b"not found: try /status or /metrics\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("status %s", format % args)

        self.snapshot = snapshot
        self.registry = registry
        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="coordinator-status", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        logger.info("coordinator status on http://%s:%d/status and /metrics", self._server.server_address[0],
                    self.port)

    def close(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which never ran otherwise
            self._server.shutdown()
        self._server.server_close()


def device_status(device_id: str, rec: DeviceRecord, wall: float, present: bool) -> dict[str, Any]:
    """One device on the status page: its model, lag, rate, pending index, offsets and last step."""
    model = rec.model
    return {
        "device": device_id, "rank": rec.rank,
        "model": {"a": model.a, "b": model.b, "fitted": model.fitted, "observations": model.n_obs,
                  "rel_error": model.rel_error},
        "lag_records": rec.lag, "lag_seconds": rec.lag_seconds(wall), "arrival_rate": rec.rate.rate,
        "pending": len(rec.book), "in_flight": rec.book.inflight, "index_complete": rec.book.complete,
        "buffer_depth": rec.book.buffer_depth, "lowest_unprocessed": rec.book.floor,
        "end_offset": rec.end_offset, "log_start_offset": rec.log_start, "committed_offset": rec.committed,
        "last_step": rec.last_feedback.step if rec.last_feedback else None, "mean_size": rec.mean_size,
        "present": present,
    }


def plan_summary(plan: Plan, assignment: Assignment, basis: int, *, complete: bool, warm: bool, latency: float,
                 fraction: float | None) -> dict[str, Any]:
    """The last plan on the status page: what it asked of each device, and how long it took to make."""
    return {
        "step": plan.step, "basis_step": basis, "policy": plan.policy, "complete": complete, "warm_start": warm,
        "latency_ms": latency * 1e3, "latency_step_fraction": fraction,
        "step_time_target": plan.step_time_target, "global_batch": plan.global_batch, "lr_scale": plan.lr_scale,
        "created_at": assignment.created_at,
        "devices": [{"device": b.device_id, "count": b.count, "total_size": b.total_size,
                     "predicted_seconds": b.predicted_seconds, "weight": b.weight,
                     "truncate_before": b.truncate_before, "dropped": b.dropped,
                     "first_offset": None if b.offsets is None or not len(b.offsets) else int(b.offsets[0])}
                    for b in plan.devices],
    }
