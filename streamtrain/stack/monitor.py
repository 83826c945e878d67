"""The live view of a running stack: the coordinator's /status and every service's /metrics, as one table.

Learning is shown in the objective's terms: each device's test-then-train headline metric over its last
`trainer.prequential_window` steps, and the fleet's over the last `PREQUENTIAL_WINDOW_S` seconds, from the
ranks' summed metric sums (exact, not an average of the devices' figures), beside its baseline and the last
held-out evaluation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group
from rich.table import Table
from rich.text import Text

from streamtrain.objectives import Objective, add_sums
from streamtrain.report.run_balance import keeps_up, lag_trend

__all__ = ["DeviceRow", "Monitor", "StackSnapshot", "parse_metrics", "render_snapshot"]

logger = logging.getLogger(__name__)

#: Seconds of lag history the live view judges "keeping up" on: long enough to see past one burst.
TREND_WINDOW_S = 20.0
#: Seconds the fleet's test-then-train figure in the live view covers.
PREQUENTIAL_WINDOW_S = 30.0


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text → sample name → [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def _fetch(url: str, timeout: float = 1.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _value(metrics: Mapping[str, list[tuple[dict[str, str], float]]], name: str,
           device: str | None = None) -> float | None:
    for labels, value in metrics.get(name, []):
        if device is None or labels.get("device") == device:
            return value
    return None


@dataclass
class DeviceRow:
    """What the view shows for one device."""

    device: str
    rate: float | None = None
    batch: float | None = None
    compute_seconds: float | None = None
    step_seconds: float | None = None
    lag: float | None = None
    keeps_up: bool | None = None
    headroom: float | None = None
    buffer: float | None = None
    loss: float | None = None
    trained: float | None = None
    truncated: float | None = None
    prequential: float | None = None
    """The objective's headline metric of this device's samples, test-then-train, over its recent steps."""


@dataclass
class StackSnapshot:
    """The stack at one moment."""

    elapsed_s: float
    phase: str
    policy: str | None = None
    step: int | None = None
    straggler_effect: float | None = None
    straggler_effect_waiting: float | None = None
    plan_latency_ms: float | None = None
    heldout_accuracy: float | None = None
    heldout_step: int | None = None
    metric: str | None = None
    """The objective's headline metric (accuracy, rmse, mae, f1_mean, ...)."""
    prequential: float | None = None
    """The fleet's headline metric, test-then-train, over the last `PREQUENTIAL_WINDOW_S` seconds."""
    prequential_baseline: float | None = None
    heldout: float | None = None
    """The headline metric at the last held-out evaluation."""
    heldout_baseline: float | None = None
    rows: list[DeviceRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Monitor:
    """Polls the coordinator and the services' metrics endpoints.

    Args:
        devices: device ids in rank order.
        coordinator_url: base URL of the coordinator (`/status`, `/metrics`).
        trainer_urls: device → its rank's /metrics URL.
        producer_urls: device → its producer's /metrics URL (none for a device fed from outside).
        objective: Turns the ranks' test-then-train sums into metrics (None: the view shows no such figures).
    """

    def __init__(self, devices: Sequence[str], coordinator_url: str, trainer_urls: Mapping[str, str],
                 producer_urls: Mapping[str, str], objective: Objective | None = None) -> None:
        self.devices = list(devices)
        self.coordinator_url = coordinator_url.rstrip("/")
        self.trainer_urls = dict(trainer_urls)
        self.producer_urls = dict(producer_urls)
        self.status: dict[str, Any] = {}
        self.started = time.monotonic()
        self.phase = "starting"
        self.notes: list[str] = []
        self._last: dict[str, DeviceRow] = {}
        self._lags: dict[str, deque[tuple[float, float]]] = {d: deque() for d in self.devices}
        self.objective = objective
        self._sums: deque[tuple[float, dict[str, float]]] = deque()

    def poll_status(self) -> dict[str, Any]:
        """The coordinator's /status now (the last good one when it does not answer)."""
        text = _fetch(f"{self.coordinator_url}/status")
        if text:
            with contextlib.suppress(json.JSONDecodeError):
                self.status = json.loads(text)
        return self.status

    def step(self) -> int | None:
        """Steps completed by every device, from the last /status."""
        last = [d.get("last_step") for d in self.status.get("devices", [])]
        known = [s for s in last if s is not None]
        if not known or len(known) < len(self.devices):
            return None
        return int(min(known)) + 1

    def snapshot(self) -> StackSnapshot:
        status = self.poll_status()
        coord = parse_metrics(_fetch(f"{self.coordinator_url}/metrics") or "")
        by_device = {d.get("device"): d for d in status.get("devices", [])}
        rows = []
        metrics = []
        for device in self.devices:
            tm = parse_metrics(_fetch(self.trainer_urls[device]) or "") if device in self.trainer_urls else {}
            metrics.append(tm)
            pm = parse_metrics(_fetch(self.producer_urls[device]) or "") if device in self.producer_urls else {}
            st = by_device.get(device, {})
            busy = _value(tm, "streamtrain_trainer_busy_ratio")
            rows.append(DeviceRow(
                device=device,
                # A device fed from outside has no producer of ours: its rate is what arrives on its topic.
                rate=(_value(pm, "streamtrain_producer_achieved_rate_samples_per_second", device)
                      if device in self.producer_urls else st.get("arrival_rate")),
                batch=_value(tm, "streamtrain_trainer_batch_samples"),
                compute_seconds=_value(tm, "streamtrain_trainer_compute_seconds"),
                step_seconds=_value(tm, "streamtrain_trainer_step_seconds"),
                lag=st.get("lag_records"),
                keeps_up=self._keeps_up(device, st.get("lag_records"), st.get("arrival_rate")),
                headroom=None if busy is None else max(0.0, 1.0 - busy),
                buffer=_value(tm, "streamtrain_trainer_buffer_depth_samples"),
                loss=_value(tm, "streamtrain_trainer_loss"),
                trained=_value(tm, "streamtrain_trainer_samples_total"),
                truncated=_value(tm, "streamtrain_trainer_truncated_samples_total"),
                prequential=self._labelled(tm, "streamtrain_trainer_prequential", window="recent",
                                           metric=self.objective.headline) if self.objective else None,
            ))
        for i, row in enumerate(rows):  # a service that has stopped keeps showing its last values
            last = self._last.get(row.device)
            if last is not None:
                for name, value in vars(row).items():
                    if value is None:
                        setattr(row, name, getattr(last, name))
            self._last[row.device] = rows[i]
        heldout = [(_value(m, "streamtrain_trainer_heldout_accuracy_ratio"),
                    _value(m, "streamtrain_trainer_heldout_step")) for m in metrics]
        accuracy, evaluated = next(((a, s) for a, s in heldout if a is not None), (None, None))
        snap = StackSnapshot(
            elapsed_s=time.monotonic() - self.started, phase=self.phase, policy=status.get("policy"),
            step=self.step(), straggler_effect=_value(coord, "streamtrain_coordinator_straggler_effect_ratio"),
            straggler_effect_waiting=_value(coord, "streamtrain_coordinator_straggler_effect_waiting_ratio"),
            plan_latency_ms=status.get("plan_latency_ms_median"), heldout_accuracy=accuracy,
            heldout_step=int(evaluated) if evaluated is not None else None, rows=rows, notes=list(self.notes))
        if self.objective is not None:
            self._learning(snap, metrics)
        return snap

    @staticmethod
    def _labelled(metrics: Mapping[str, list[tuple[dict[str, str], float]]], name: str,
                  **labels: str) -> float | None:
        return next((v for got, v in metrics.get(name, []) if all(got.get(k) == w for k, w in labels.items())), None)

    def _learning(self, snap: StackSnapshot, metrics: Sequence[Mapping[str, list[tuple[dict[str, str], float]]]]
                  ) -> None:
        """The fleet's test-then-train and held-out headline metric, into `snap`."""
        assert self.objective is not None
        headline, baseline = self.objective.headline, self.objective.baseline
        totals: dict[str, float] = {}
        for tm in metrics:
            add_sums(totals, {labels["key"]: value for labels, value in
                              tm.get("streamtrain_trainer_prequential_sums_total", []) if "key" in labels})
        now = time.monotonic()
        self._sums.append((now, totals))
        while len(self._sums) > 1 and self._sums[1][0] <= now - PREQUENTIAL_WINDOW_S:
            self._sums.popleft()
        _, before = self._sums[0]
        recent = {k: v - before.get(k, 0.0) for k, v in totals.items()} if len(self._sums) > 1 else totals
        scored = self.objective.summarise(recent)
        snap.metric, snap.prequential = headline, scored.get(headline)
        snap.prequential_baseline = scored.get(baseline) if baseline else None
        for tm in metrics:
            value = self._labelled(tm, "streamtrain_trainer_heldout", metric=headline)
            if value is not None:
                snap.heldout = value
                snap.heldout_baseline = self._labelled(tm, "streamtrain_trainer_heldout", metric=baseline or "")
                break

    def _keeps_up(self, device: str, lag: float | None, rate: float | None) -> bool | None:
        if lag is None:
            return None
        now = time.monotonic()
        history = self._lags.setdefault(device, deque())
        history.append((now, float(lag)))
        while history and history[0][0] < now - TREND_WINDOW_S:
            history.popleft()
        if now - history[0][0] < TREND_WINDOW_S / 2:
            return keeps_up(None, rate, lag)  # too short a history for a trend: only "next to no lag" tells
        return keeps_up(lag_trend([t for t, _ in history], [v for _, v in history]), rate, lag)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_snapshot(snap: StackSnapshot) -> Group:
    """The live view: a header line, one row per device, then notes (URLs, run directory)."""
    heldout = (f"held-out accuracy {snap.heldout_accuracy:.3f} (step {snap.heldout_step}) · "
               if snap.heldout_accuracy is not None and snap.heldout is None else "")
    if snap.metric is not None and snap.prequential is not None:
        base = f", baseline {snap.prequential_baseline:.3g}" if snap.prequential_baseline is not None else ""
        heldout = f"test-then-train {snap.metric} {snap.prequential:.3g} (last {PREQUENTIAL_WINDOW_S:.0f} s{base}) · "
        if snap.heldout is not None:
            base = f", baseline {snap.heldout_baseline:.3g}" if snap.heldout_baseline is not None else ""
            heldout += f"held-out {snap.metric} {snap.heldout:.3g} (step {snap.heldout_step or '-'}{base}) · "
    head = Text.assemble(
        ("streamtrain up ", "bold"), f"{snap.phase} · {snap.elapsed_s:5.0f} s · policy {snap.policy or '-'} · ",
        f"step {snap.step if snap.step is not None else '-'} · ", heldout,
        f"SE {_fmt(snap.straggler_effect, '.3f')} (where every device has work waiting: "
        f"{_fmt(snap.straggler_effect_waiting, '.3f')}) · plan latency {_fmt(snap.plan_latency_ms, '.2f')} ms (median)")
    table = Table(expand=False)
    scored = snap.metric or "test-then-train"
    for col in ("device", "rate /s", "batch", "compute s", "step s", "lag", "keeps up", "headroom", "buffer", "loss",
                scored, "trained", "truncated"):
        table.add_column(col, justify="right")
    for r in snap.rows:
        table.add_row(r.device, _fmt(r.rate, ".1f"), _fmt(r.batch, ".0f"), _fmt(r.compute_seconds, ".3f"),
                      _fmt(r.step_seconds, ".3f"), _fmt(r.lag, ".0f"), _yes_no(r.keeps_up), _fmt(r.headroom, ".0%"),
                      _fmt(r.buffer, ".0f"), _fmt(r.loss, ".4f"), _fmt(r.prequential, ".3g"), _fmt(r.trained, ".0f"),
                      _fmt(r.truncated, ".0f"))
    return Group(head, table, *(Text(n, style="dim") for n in snap.notes))


def _yes_no(value: bool | None) -> Text:
    if value is None:
        return Text("-")
    return Text("yes", style="green") if value else Text("no", style="bold red")
