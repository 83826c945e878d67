"""The local Prometheus server: finding the binary, its scrape configuration, and instant queries.

The scrape configuration is written as JSON, which is YAML too, so no YAML library is needed. Its
scrape jobs are named as in docker compose's deploy/prometheus/prometheus.yml (streamtrain-producers,
-coordinator, -trainers), and labelled the same way (streamtrain's own `job` label becomes
`exported_job`), so the dashboards' PromQL means the same thing here and there.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["INSTALL_HINT", "find_prometheus", "instant_query", "scrape_config", "targets_up"]

INSTALL_HINT = "install it with `apt-get install prometheus` (or `make system-deps`)"
_CANDIDATES = ("/usr/bin/prometheus", "/usr/local/bin/prometheus", "/opt/prometheus/prometheus")


def find_prometheus(configured: str | None = None) -> str | None:
    """Path of the `prometheus` binary: `configured`, then $PATH, then the usual install places; None if absent."""
    if configured:
        return configured if Path(configured).is_file() else shutil.which(configured)
    found = shutil.which("prometheus")
    if found:
        return found
    return next((c for c in _CANDIDATES if Path(c).is_file()), None)


def scrape_config(targets: Mapping[str, Sequence[str]], interval_s: float) -> str:
    """prometheus.yml (as JSON): a scrape job streamtrain-<name> per entry of `targets`, every `interval_s` s."""
    interval = f"{max(1, round(interval_s))}s"
    jobs = [{"job_name": f"streamtrain-{kind}", "scrape_interval": interval,
             "scrape_timeout": interval, "static_configs": [{"targets": list(addrs), "labels": {"service": kind}}]}
            for kind, addrs in targets.items() if addrs]
    return json.dumps({"global": {"scrape_interval": interval, "evaluation_interval": interval},
                       "scrape_configs": jobs}, indent=2) + "\n"


def _get(url: str, timeout: float) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body: dict[str, Any] = json.loads(resp.read())
    return body


def instant_query(base_url: str, expr: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The result vector of `expr` evaluated now through /api/v1/query (a scalar comes back as one sample).

    Raises:
        RuntimeError: when Prometheus rejects the expression (the message carries its error).
    """
    url = f"{base_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        body = _get(url, timeout)
    except urllib.error.HTTPError as exc:  # 400/422 carry Prometheus' own error text
        detail = exc.read().decode(errors="replace")
        raise RuntimeError(f"{expr!r}: HTTP {exc.code}: {detail}") from None
    if body.get("status") != "success":
        raise RuntimeError(f"{expr!r}: {body.get('errorType')}: {body.get('error')}")
    data = body["data"]
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    result: list[dict[str, Any]] = data["result"]
    return result


def targets_up(base_url: str, timeout: float = 5.0) -> dict[str, bool]:
    """Each active scrape target's `host:port` → whether its last scrape succeeded."""
    body = _get(f"{base_url.rstrip('/')}/api/v1/targets?state=active", timeout)
    return {t["labels"].get("instance", t["scrapeUrl"]): t["health"] == "up" and t.get("lastScrape", "").find(
        "0001-01-01") < 0 for t in body["data"]["activeTargets"]}
