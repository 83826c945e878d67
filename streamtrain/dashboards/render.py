"""Grafana dashboards drawn as PNGs from a plain Prometheus: `streamtrain dashboards render`.

Each dashboard's panels are placed on Grafana's grid (24 columns, 30 px rows, 8 px gaps) from their
`gridPos`, every target is evaluated with /api/v1/query_range over the last few minutes (variables
expanded as `streamtrain.dashboards.queries` does), and each series is drawn as one line named by the target's
`legendFormat`, in Grafana's dark theme, with the y axis in the panel's unit. A panel whose targets
all come back empty says "No data", as Grafana does, and is reported.

    streamtrain dashboards render --prometheus http://127.0.0.1:9090 --minutes 5 --out docs/dashboards
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from streamtrain.dashboards.queries import dashboard_variables, expand_variables

__all__ = ["Box", "DashboardRender", "Panel", "Series", "dashboard_panels", "dashboards_app", "grid_boxes",
           "legend_name", "query_range", "range_step", "render_dashboard", "render_dashboards"]

GRID_COLUMNS = 24
CELL_PX, GAP_PX, PAD_PX, HEADER_PX, TITLE_PX = 30, 8, 16, 48, 28
WIDTH_PX, DPI = 1600, 100
BACKGROUND, PANEL, BORDER, TEXT, MUTED, GRIDLINE = "#111217", "#181b1f", "#2c2f36", "#ccccdc", "#9fa1b3", "#2a2d35"
PALETTE = ("#73BF69", "#F2CC0C", "#8AB8FF", "#FF780A", "#F2495C", "#5794F2", "#B877D9", "#705DA0", "#37872D",
           "#FADE2A", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62", "#584477")
_LEGEND_VAR = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_Entry = tuple[float, int, str]  # a legend entry: x offset (px), series index, text


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel, variables expanded."""

    ref: str
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """What drawing one panel needs: its kind, place on the grid, unit and queries."""

    title: str
    kind: str
    x: int
    y: int
    w: int
    h: int
    unit: str = ""
    targets: tuple[Target, ...] = ()
    text: str = ""


@dataclass(frozen=True)
class Box:
    """A rectangle in pixels, from the image's top-left corner."""

    left: float
    top: float
    width: float
    height: float


@dataclass
class Series:
    """One line: its legend name and its samples (unix seconds, values)."""

    name: str
    t: list[float]
    v: list[float]


@dataclass
class DashboardRender:
    """What rendering one dashboard produced."""

    name: str
    path: Path
    boxes: dict[str, Box] = field(default_factory=dict)
    no_data: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    series: dict[str, int] = field(default_factory=dict)


def _walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        if panel.get("type") == "row" and not panel.get("collapsed"):
            yield from _walk(panel.get("panels") or [])  # a collapsed row hides its panels, as in Grafana


def dashboard_panels(dashboard: Mapping[str, Any]) -> list[Panel]:
    """The dashboard's visible panels in grid order, with their targets' variables expanded."""
    variables = dashboard_variables(dashboard)
    panels = []
    for raw in _walk(list(dashboard.get("panels") or [])):
        pos = raw.get("gridPos") or {}
        targets = tuple(Target(str(t.get("refId") or "?"), expand_variables(t["expr"], variables),
                               str(t.get("legendFormat") or ""))
                        for t in raw.get("targets") or [] if isinstance(t.get("expr"), str) and t["expr"].strip())
        unit = str(((raw.get("fieldConfig") or {}).get("defaults") or {}).get("unit") or raw.get("format") or "")
        panels.append(Panel(str(raw.get("title") or f"panel {raw.get('id', '?')}"), str(raw.get("type") or "graph"),
                            int(pos.get("x", 0)), int(pos.get("y", 0)), int(pos.get("w", 12)),
                            int(pos.get("h", 1 if raw.get("type") == "row" else 8)), unit, targets,
                            str((raw.get("options") or {}).get("content") or raw.get("content") or "")))
    return sorted(panels, key=lambda p: (p.y, p.x))


def grid_boxes(panels: list[Panel], width_px: float = WIDTH_PX) -> tuple[dict[str, Box], float]:
    """Each panel's pixel box on an image `width_px` wide laid out as Grafana lays out `gridPos`, and the
    image's height. Panels with the same title get a ` (2)` suffix in the returned keys."""
    column = (width_px - 2 * PAD_PX + GAP_PX) / GRID_COLUMNS
    row = CELL_PX + GAP_PX
    boxes: dict[str, Box] = {}
    for panel in panels:
        key, n = panel.title, 2
        while key in boxes:
            key, n = f"{panel.title} ({n})", n + 1
        boxes[key] = Box(PAD_PX + panel.x * column, HEADER_PX + panel.y * row,
                         panel.w * column - GAP_PX, panel.h * row - GAP_PX)
    bottom = max((p.y + p.h for p in panels), default=0)
    return boxes, HEADER_PX + bottom * row - GAP_PX + PAD_PX


def range_step(minutes: float, points: int = 200) -> float:
    """Seconds between points for about `points` of them over `minutes` (never under 1 s, the finest scrape)."""
    return max(1.0, round(minutes * 60.0 / points))


def query_range(base_url: str, expr: str, start: float, end: float, step: float,
                timeout: float = 15.0) -> list[dict[str, Any]]:
    """The matrix of `expr` over [start, end] from /api/v1/query_range.

    Raises:
        RuntimeError: when Prometheus rejects the query (the message carries its error).
        OSError: when Prometheus cannot be reached.
    """
    params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    url = f"{base_url.rstrip('/')}/api/v1/query_range?{params}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 400/422 carry Prometheus' own error text
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError):
            detail = json.loads(detail).get("error", detail)
        raise RuntimeError(f"HTTP {exc.code}: {detail}") from None
    if body.get("status") != "success":
        raise RuntimeError(f"{body.get('errorType')}: {body.get('error')}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def legend_name(fmt: str, metric: Mapping[str, str]) -> str:
    """A series' legend as Grafana writes it: `{{label}}` filled in, or `name{labels}` without a format."""
    if fmt and fmt != "__auto":
        return _LEGEND_VAR.sub(lambda m: str(metric.get(m.group(1), "")), fmt).strip()
    labels = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    name = metric.get("__name__", "")
    return f"{name}{{{labels}}}" if labels or not name else name


def _series(matrix: list[dict[str, Any]], fmt: str, step: float) -> list[Series]:
    lines = []
    for item in matrix:
        t: list[float] = []
        v: list[float] = []
        for ts, value in item.get("values") or []:
            if t and float(ts) - t[-1] > 2.5 * step:  # a gap breaks the line (Grafana's spanNulls off)
                t.append(t[-1] + step)
                v.append(math.nan)
            t.append(float(ts))
            v.append(float(value))
        lines.append(Series(legend_name(fmt, item.get("metric") or {}), t, v))
    return lines


def _number(value: float) -> str:
    """Three significant digits, never in exponent form for the sizes axes show."""
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) >= 1e-3 else f"{value:.2e}"


def _scaled(value: float, steps: tuple[tuple[float, str], ...]) -> str:
    for factor, suffix in steps:
        if abs(value) >= factor:
            return f"{_number(value / factor)}{suffix}"
    factor, suffix = steps[-1]
    return f"{_number(value / factor)}{suffix}"


def format_value(value: float, unit: str) -> str:
    """`value` written in a Grafana unit (the common ones; anything else as a plain number)."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return {"percentunit": "0%", "percent": "0%", "s": "0 s", "ms": "0 ms", "bytes": "0 B",
                "ops": "0 ops/s"}.get(unit, "0")
    if unit == "percentunit":
        return f"{_number(value * 100)}%"
    if unit == "percent":
        return f"{_number(value)}%"
    if unit in ("s", "ms"):
        seconds = value / 1000 if unit == "ms" else value
        return _scaled(seconds, ((3600, " h"), (60, " min"), (1, " s"), (1e-3, " ms"), (1e-6, " µs"), (1e-9, " ns")))
    if unit in ("bytes", "decbytes"):
        k = 1024.0 if unit == "bytes" else 1000.0
        names = (" TiB", " GiB", " MiB", " KiB", " B") if unit == "bytes" else (" TB", " GB", " MB", " kB", " B")
        return _scaled(value, tuple((k ** (4 - i), n) for i, n in enumerate(names)))
    si = ((1e9, " B"), (1e6, " M"), (1e3, " K"), (1.0, ""))
    if unit == "ops":
        return _scaled(value, si).rstrip() + " ops/s"
    return _scaled(value, si).rstrip()


def _fractions(box: Box, width: float, height: float) -> tuple[float, float, float, float]:
    return box.left / width, 1 - (box.top + box.height) / height, box.width / width, box.height / height


def _binary_locator(ticks: int) -> Any:
    """Round byte ticks (16 KiB, 32 KiB, ...): MaxNLocator's nice steps in the axis' own power of 1024."""
    import numpy as np
    from matplotlib import ticker

    class BinaryLocator(ticker.MaxNLocator):
        def tick_values(self, vmin: float, vmax: float) -> Any:
            scale = 1024.0 ** max(0, int(math.log(max(abs(vmin), abs(vmax), 1.0), 1024)))
            return np.asarray(super().tick_values(vmin / scale, vmax / scale)) * scale

    return BinaryLocator(ticks, steps=[1, 2, 2.5, 4, 5, 8, 10])


def _draw_panel(fig: Any, panel: Panel, box: Box, size: tuple[float, float], lines: list[Series] | None,  # noqa: PLR0915  one dashboard panel type per branch, drawn from its JSON as Grafana would
                error: str, span: tuple[float, float]) -> None:
    from matplotlib import dates as mdates
    from matplotlib import ticker
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyBboxPatch

    width, height = size
    left, bottom, w, h = _fractions(box, width, height)
    title_y = 1 - (box.top + TITLE_PX / 2) / height
    if panel.kind == "row":
        fig.text(left, title_y, panel.title, color=TEXT, fontsize=12, fontweight="bold", va="center")
        return
    fig.add_artist(FancyBboxPatch((left, bottom), w, h, boxstyle="round,pad=0,rounding_size=0.002",
                                  transform=fig.transFigure, facecolor=PANEL, edgecolor=BORDER, linewidth=1, zorder=-1))
    fig.text(left + 8 / width, title_y, panel.title, color=TEXT, fontsize=10, fontweight="bold", va="center")
    inner = Box(box.left + 8, box.top + TITLE_PX, box.width - 16, box.height - TITLE_PX - 8)
    centre = (left + w / 2, 1 - (inner.top + inner.height / 2) / height)
    if panel.kind == "text":
        fig.text(left + 8 / width, 1 - (inner.top + 4) / height, panel.text[:400], color=TEXT, fontsize=9, va="top",
                 wrap=True)
        return
    if error:
        fig.text(*centre, f"query error: {error}"[:160], color="#F2495C", fontsize=9, ha="center", va="center",
                 wrap=True)
        return
    if not lines or not any(s.t for s in lines):
        fig.text(*centre, "No data", color=MUTED, fontsize=13, ha="center", va="center")
        return
    drawn = [s for s in lines if s.t]
    if panel.kind in ("stat", "gauge", "singlestat"):
        last = next((v for v in reversed(drawn[0].v) if math.isfinite(v)), math.nan)
        fig.text(*centre, format_value(last, panel.unit), color=PALETTE[0], fontsize=28, fontweight="bold",
                 ha="center", va="center")
        return
    legend = _legend_rows(fig, drawn, inner.width)
    legend_px = 15 * len(legend) + 4
    axis_px = 50  # room for the y tick labels
    plot = Box(inner.left + axis_px, inner.top + 4, inner.width - axis_px - 4, inner.height - legend_px - 22)
    ax = fig.add_axes(_fractions(plot, width, height))
    ax.set_facecolor(PANEL)
    for i, s in enumerate(drawn):
        ax.plot([datetime.fromtimestamp(t) for t in s.t], s.v, color=PALETTE[i % len(PALETTE)], lw=1.2)
    ax.set_xlim(datetime.fromtimestamp(span[0]), datetime.fromtimestamp(span[1]))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if span[1] - span[0] < 3600 else "%H:%M"))
    ax.xaxis.set_major_locator(ticker.MaxNLocator(max(2, int(plot.width // 110))))
    ticks = max(2, int(plot.height // 40))
    ax.yaxis.set_major_locator(_binary_locator(ticks) if panel.unit == "bytes" else ticker.MaxNLocator(ticks))
    values = [v for s in drawn for v in s.v if math.isfinite(v)]
    if values and min(values) == max(values) == 0:
        ax.set_ylim(0, 1)  # an all-zero panel: a zero line at the bottom, as Grafana draws it
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _pos: format_value(value, panel.unit)))
    ax.tick_params(colors=MUTED, labelsize=7.5, length=0, pad=3)
    ax.grid(color=GRIDLINE, linewidth=0.8)
    for spine in ax.spines.values():
        spine.set_visible(False)
    top = inner.top + inner.height - legend_px + 6
    for row, entries in enumerate(legend):
        for offset, i, text in entries:
            y = 1 - (top + 15 * row + 6) / height
            x = (inner.left + offset) / width
            if i >= 0:
                fig.add_artist(Line2D([x, x + 14 / width], [y, y], transform=fig.transFigure,
                                      color=PALETTE[i % len(PALETTE)], lw=2.5, solid_capstyle="round"))
            fig.text(x + 19 / width, y, text, color=TEXT, fontsize=7.5, va="center")


def _legend_rows(fig: Any, lines: list[Series], width_px: float, max_rows: int = 4) -> list[list[_Entry]]:
    """Grafana's list legend: entries left to right, wrapping, at most `max_rows` rows (Grafana would scroll;
    a last `+N more` says what was left out). Each entry is (x offset px, series index or -1, text)."""
    renderer = fig.canvas.get_renderer()
    rows: list[list[_Entry]] = [[]]
    x = 0.0
    for i, s in enumerate(lines):
        text = s.name or " "
        probe = fig.text(0, 0, text, fontsize=7.5)
        entry = 19 + probe.get_window_extent(renderer).width + 14
        probe.remove()
        if x and x + entry > width_px:
            if len(rows) == max_rows:
                rows[-1][-1] = (rows[-1][-1][0], -1, f"+{len(lines) - i + 1} more")
                break
            rows.append([])
            x = 0.0
        rows[-1].append((x, i, text))
        x += entry
    return rows


def render_dashboard(dashboard: Mapping[str, Any], name: str, base_url: str, minutes: float, out: Path,
                     end: float | None = None) -> DashboardRender:
    """Query every panel of `dashboard` over the last `minutes` and write `out/<name>.png`.

    Raises:
        OSError: when Prometheus cannot be reached.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = time.time() if end is None else end
    start, step = end - minutes * 60.0, range_step(minutes)
    panels = dashboard_panels(dashboard)
    boxes, height = grid_boxes(panels)
    result = DashboardRender(name, out / f"{name}.png", boxes)
    fig = plt.figure(figsize=(WIDTH_PX / DPI, height / DPI), dpi=DPI, facecolor=BACKGROUND)
    title = str(dashboard.get("title") or name)
    fig.text(PAD_PX / WIDTH_PX, 1 - (HEADER_PX / 2) / height, title, color=TEXT, fontsize=14, fontweight="bold",
             va="center")
    stamp = f"last {minutes:g} min to {datetime.fromtimestamp(end):%Y-%m-%d %H:%M:%S}, step {step:g} s"
    fig.text(1 - PAD_PX / WIDTH_PX, 1 - (HEADER_PX / 2) / height, stamp, color=MUTED, fontsize=9, ha="right",
             va="center")
    for (key, box), panel in zip(boxes.items(), panels, strict=True):
        lines: list[Series] = []
        errors = []
        for target in panel.targets:
            try:
                lines += _series(query_range(base_url, target.expr, start, end, step), target.legend, step)
            except RuntimeError as exc:
                errors.append(f"{target.ref}: {exc}")
                result.errors.append(f"{key} / {target.ref}: {target.expr}: {exc}")
        result.series[key] = sum(1 for s in lines if s.t)
        if panel.targets and not errors and not result.series[key] and panel.kind != "row":
            result.no_data.append(key)
        _draw_panel(fig, panel, box, (WIDTH_PX, height), lines, "; ".join(errors), (start, end))
    out.mkdir(parents=True, exist_ok=True)
    _save_small(fig, result.path)
    plt.close(fig)
    return result


def _theme_palette() -> list[int]:
    """256 RGB colours for the saved PNG: the theme's own, and each line and text colour blended into the
    panel at 13 strengths (anti-aliased edges), so the theme colours stay exact and the file small."""
    def rgb(colour: str) -> tuple[int, int, int]:
        return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)

    colours = [rgb(c) for c in (BACKGROUND, PANEL, BORDER, TEXT, MUTED, GRIDLINE, "#F2495C")]
    for ink in (*PALETTE, TEXT, MUTED):
        for k in range(1, 14):
            (pr, pg, pb), (ir, ig, ib), f = rgb(PANEL), rgb(ink), k / 13
            colours.append((round(pr + (ir - pr) * f), round(pg + (ig - pg) * f), round(pb + (ib - pb) * f)))
    colours = list(dict.fromkeys(colours))[:256]
    colours += [colours[0]] * (256 - len(colours))
    return [channel for colour in colours for channel in colour]


def _save_small(fig: Any, path: Path) -> None:
    """The PNG with a 256-colour palette of the theme: a third of the RGBA file (README images stay small)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, facecolor=BACKGROUND)
    buffer.seek(0)
    palette = Image.new("P", (1, 1))
    palette.putpalette(_theme_palette())
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(palette=palette, dither=Image.Dither.NONE).save(path, optimize=True)


def _dashboard_name(path: Path, dashboard: Mapping[str, Any]) -> str:
    uid = str(dashboard.get("uid") or path.stem)
    return uid.removeprefix("streamtrain-") or path.stem


def render_dashboards(directory: Path, base_url: str, minutes: float, out: Path,
                      end: float | None = None) -> list[DashboardRender]:
    """`render_dashboard` for every `*.json` in `directory` (a dashboard may be wrapped as {"dashboard": ...});
    each PNG is named by the dashboard's uid less its `streamtrain-` prefix."""
    renders = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        dashboard = data.get("dashboard", data)
        renders.append(render_dashboard(dashboard, _dashboard_name(path, dashboard), base_url, minutes, out, end))
    return renders


_DEFAULT_DASHBOARDS = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards"

dashboards_app = typer.Typer(help="Grafana dashboards without Grafana: draw them from a Prometheus.",
                             no_args_is_help=True)


@dashboards_app.command("render", help=(
    "Draw each Grafana dashboard as a PNG from a running Prometheus, laid out as Grafana lays it out.\n\n"
    "Every panel's PromQL (variables expanded to their All value, $__rate_interval to 30s) is evaluated with "
    "/api/v1/query_range over the last --minutes (about 200 points a line), one line per series named by the "
    "target's legendFormat, y axis in the panel's unit, dark theme. Writes OUT/<dashboard>.png (uid without "
    "`streamtrain-`) and lists the panels that had no data. Exit status 1 when Prometheus rejects a query or "
    "cannot be reached.\n\n"
    "Example, against a running `streamtrain up` (it prints its Prometheus URL when the stack is up):\n\n"
    "  streamtrain dashboards render --prometheus http://127.0.0.1:9090 --minutes 2 --out docs/dashboards"))
def render_command(
    prometheus: Annotated[str, typer.Option(metavar="URL", help="Prometheus base URL, e.g. http://127.0.0.1:9090.")],
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="Where the PNGs go (created).")],
    dashboards: Annotated[Path, typer.Option("--dashboards", metavar="DIR", help="Directory of Grafana dashboard "
                                             "JSON files.")] = _DEFAULT_DASHBOARDS,
    minutes: Annotated[float, typer.Option(min=0.1, help="Time range: the last this many minutes.")] = 15.0,
) -> None:
    from streamtrain.runtime.commands import EXIT_CONFIG, console, die

    if not dashboards.is_dir() or not any(dashboards.glob("*.json")):
        die(f"--dashboards {dashboards}: no *.json dashboards there", EXIT_CONFIG)
    if not prometheus.startswith(("http://", "https://")):
        die(f"--prometheus {prometheus!r}: expected a URL such as http://127.0.0.1:9090", EXIT_CONFIG)
    try:
        renders = render_dashboards(dashboards, prometheus, minutes, out)
    except OSError as exc:
        die(f"--prometheus {prometheus}: cannot query it ({exc})")
    failed = False
    for render in renders:
        drawn = sum(1 for n in render.series.values() if n)
        console.print(f"{render.path}: {drawn}/{len(render.series)} panels with data, "
                      f"{sum(render.series.values())} series", highlight=False)
        for panel in render.no_data:
            console.print(f"  no data: {render.name} / {panel}", highlight=False)
        for error in render.errors:
            console.print(f"  [bold red]query error:[/] {error}", highlight=False)
            failed = True
    if failed:
        raise typer.Exit(1)
