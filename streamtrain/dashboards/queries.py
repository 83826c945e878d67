"""The PromQL of Grafana dashboards: the balance figures `up` reports, as queries, and every query made
evaluable against a plain Prometheus.

`keeping_up_query` and `waiting_straggler_effect_query` say in PromQL what `streamtrain.report.run_balance` computes for
`up`'s report (a device keeps up while its lag stays level; SE counts only over steps where every device
had work waiting), so the dashboards and the report read a run alike.

Grafana expands template variables before a query reaches Prometheus; to check a dashboard without
Grafana, `dashboard_queries` does the same: `$__rate_interval` and friends become fixed ranges, and a
dashboard variable becomes its "All" regex (so `device="$device"` turns into `device=~".*"`) or its
constant / custom value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamtrain.report.run_balance import KEEPS_UP_FRACTION

__all__ = ["BUILTIN_RANGES", "PanelQuery", "dashboard_queries", "dashboard_variables", "expand_variables",
           "keeping_up_query", "load_dashboard_queries", "waiting_straggler_effect_query"]

#: Grafana's built-in range variables, as a short local run can answer them (1 s scrapes).
BUILTIN_RANGES: dict[str, str] = {"__rate_interval": "30s", "__interval": "5s", "__range": "5m",
                                  "__interval_ms": "5000", "__range_s": "300", "__range_ms": "300000"}
_ALL = ".*"
_VAR = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\[\[(\w+)(?::[\w]+)?\]\]|\$(\w+)")


def keeping_up_query(selector: str = "", window: str = "1m") -> str:
    """1 per device while it keeps up with its stream, else 0: `streamtrain.report.run_balance.keeps_up` in PromQL.

    A device keeps up while its lag grows by at most `KEEPS_UP_FRACTION` of its arrival rate over `window`
    (a trend, not a burst), or while less than a second of arrivals (at least one record) is waiting.

    Args:
        selector: label matchers for the coordinator's per-device series, e.g. `device=~"$device"`.
        window: the range the lag's trend is fitted over.
    """
    matchers = f"{{{selector}}}" if selector else ""
    lag = f"streamtrain_coordinator_lag_records{matchers}"
    rate = f"streamtrain_coordinator_arrival_rate_samples_per_second{matchers}"
    level = f"(deriv({lag}[{window}]) <= bool {KEEPS_UP_FRACTION:g} * {rate})"
    short = f"({lag} <= bool clamp_min({rate}, 1))"
    return f"clamp_max({level} + {short}, 1)"


def waiting_straggler_effect_query(window: str = "1m") -> str:
    """The straggler effect of the last step whose plan left work waiting on every device, shown only while
    such steps happen (within `window`); NaN, a gap, otherwise.

    Only where every device had work waiting could a plan fill every device's step, so only there is SE a
    measure of balance; at line rate a device with a light stream finishes early by design, and SE over
    every step swings widely while every device keeps up. The gate is 1 (1/1) while waiting steps happen
    and NaN (0/0) otherwise, so the panel keeps one series, gapped, rather than a stale value.
    """
    gate = f"(increase(streamtrain_coordinator_waiting_steps_total[{window}]) > bool 0)"
    return f"streamtrain_coordinator_straggler_effect_waiting_ratio * on(instance) ({gate} / {gate})"


@dataclass(frozen=True)
class PanelQuery:
    """One PromQL target of one panel."""

    dashboard: str
    panel: str
    ref: str
    expr: str

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref}: {self.expr}"


def dashboard_variables(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """Each template variable → what to put in its place (the All regex for query/custom multi-values)."""
    values: dict[str, str] = {}
    for var in dashboard.get("templating", {}).get("list", []):
        name, kind = var.get("name"), var.get("type")
        if not name:
            continue
        current = var.get("current") or {}
        value = current.get("value")
        if isinstance(value, list):
            value = value[0] if len(value) == 1 else None
        if kind in ("constant", "textbox"):
            values[name] = str(var.get("query") or value or "")
        elif kind == "interval":
            values[name] = "30s"
        elif kind == "datasource":
            values[name] = str(value or "")
        elif value and value != "$__all" and kind == "custom" and not var.get("includeAll"):
            values[name] = str(value)
        else:
            values[name] = str(var.get("allValue") or _ALL)
    return values


def expand_variables(expr: str, variables: Mapping[str, str]) -> str:
    """`expr` with every `$var`, `${var}`, `${var:fmt}` and `[[var]]` replaced; equality matchers on a
    regex-valued variable become regex matchers."""
    regexish = {n for n, v in variables.items() if any(c in v for c in ".*+|()[]")}
    for name in regexish:
        expr = re.sub(r'(\w+)\s*(!?)=\s*"(\$\{' + name + r'(?::\w+)?\}|\$' + name + r'\b|\[\[' + name + r'\]\])"',
                      lambda m: f'{m.group(1)}{m.group(2) or "="}~"{m.group(3)}"', expr)

    def replace(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in BUILTIN_RANGES:
            return BUILTIN_RANGES[name]
        return variables.get(name, m.group(0))

    return _VAR.sub(replace, expr)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # rows (collapsed rows keep their panels inside)


def dashboard_queries(dashboard: Mapping[str, Any], name: str) -> list[PanelQuery]:
    """Every PromQL target of every panel of one dashboard, variables expanded."""
    variables = dashboard_variables(dashboard)
    queries = []
    for panel in _panels(list(dashboard.get("panels") or [])):
        for target in panel.get("targets") or []:
            expr = target.get("expr")
            if isinstance(expr, str) and expr.strip():
                queries.append(PanelQuery(name, str(panel.get("title") or panel.get("id") or "?"),
                                          str(target.get("refId") or "?"), expand_variables(expr, variables)))
    return queries


def load_dashboard_queries(directory: Path) -> list[PanelQuery]:
    """The queries of every `*.json` dashboard in `directory` (a dashboard may be wrapped as {"dashboard": ...})."""
    queries: list[PanelQuery] = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        queries += dashboard_queries(data.get("dashboard", data), path.name)
    return queries
