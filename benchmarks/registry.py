"""The benchmark set behind `streamtrain bench all`, and the refresher of `BENCHMARKS.md`.

Each `Bench` names a `streamtrain bench <name>` command, the JSON file it writes in `--out DIR`,
the arguments `bench all` gives it (full and `--quick`), a time limit, and how its JSON becomes a
Markdown section (a table, a plot, the targets). A benchmark whose command is not registered yet
is skipped, so adding one later is one `Bench(...)` line here (plus, optionally, a renderer).

`BENCHMARKS.md` keeps hand-written prose; only the text between `<!-- bench:NAME -->` and
`<!-- /bench:NAME -->` is regenerated.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: The multiplication sign of ratios in the Markdown (spelt out for the linter).
_X = "\N{MULTIPLICATION SIGN}"

__all__ = [
    "REGISTRY",
    "Bench",
    "RenderContext",
    "available",
    "command_names",
    "marker_names",
    "refresh_markdown",
    "render_sections",
]


@dataclass(frozen=True)
class RenderContext:
    """Where a renderer finds its JSON, writes its plot, and links the plot from."""

    data_dir: Path
    """Directory holding the benchmark's JSON; plots are written next to it."""
    markdown_dir: Path
    """Directory of the Markdown file (image links are relative to it)."""

    def plot_path(self, name: str) -> Path:
        return self.data_dir / name

    def link(self, path: Path) -> str:
        return Path(os.path.relpath(path.resolve(), self.markdown_dir.resolve())).as_posix()


Renderer = Callable[[dict[str, Any], RenderContext], str]


@dataclass(frozen=True)
class Bench:
    """One benchmark of the set."""

    name: str
    """The `streamtrain bench <name>` command."""
    json_name: str
    """File the command writes in --out DIR."""
    args: tuple[str, ...] = ()
    """Extra arguments `bench all` passes."""
    quick_args: tuple[str, ...] = ()
    """Extra arguments `bench all --quick` passes."""
    timeout_s: float = 600.0
    """Most seconds `bench all` lets it run."""
    render: Renderer | None = None
    """JSON → Markdown section; None: the generic table of `cells`."""


# ---------------------------------------------------------------------------------------------
# Formatting helpers


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 10 ** -digits):
            return f"{value:.3g}"
        return f"{value:,.{digits}f}"
    if isinstance(value, list | tuple):
        return ", ".join(_num(v, digits) for v in value)
    return str(value)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_num(v) if not isinstance(v, str) else v for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _verdict(ok: bool | None) -> str:
    return "—" if ok is None else ("**met**" if ok else "**not met**")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> Path:
    """Lay out, write (PNG, 110 dpi) and close a benchmark's figure; returns `path`."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# Renderers


def render_kafka(doc: dict[str, Any], ctx: RenderContext) -> str:
    medians: dict[str, float] = doc["records_per_s_median"]
    perf = medians.get("kafka_perf_tool") or 0.0
    labels = {"python_raw": "Python producer, raw bytes", "python_sample": "Python producer, Avro `Sample`",
              "kafka_perf_tool": "`kafka-producer-perf-test` (same jars)"}
    rows = [[labels.get(k, k), round(v), f"{v / perf:.2f}{_X}" if perf else "—"] for k, v in medians.items()]
    starts = doc["broker_start"]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.barh([labels.get(k, k).replace("`", "") for k in medians], list(medians.values()), color="tab:blue")
    ax.set_xlabel("records/s (median)")
    ax.set_title(f"{doc['record_size_bytes']}-byte records, acks=all, idempotent", fontsize=9)
    fig.tight_layout()
    png = ctx.plot_path("kafka.png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return "\n\n".join([
        f"Measured: {doc['records_per_run']:,} records of {doc['record_size_bytes']:,} bytes per run, "
        f"{doc['repeats']} alternating repeats (medians).",
        _table(["producer", "records/s", "vs perf tool"], rows),
        f"Broker start (embedded KRaft, median): fresh {starts['fresh_median_s']:.2f} s, "
        f"restart on its data {starts['restart_median_s']:.2f} s.",
        f"![kafka]({ctx.link(png)})",
    ])


def render_ingest(doc: dict[str, Any], ctx: RenderContext) -> str:
    rows, worst = [], {}
    for cell in doc["rate_cells"]:
        rates = np.asarray(cell["achieved_rates"], dtype=float)
        target = float(cell["target_rate"])
        dev = float(np.max(np.abs(rates / target - 1.0))) if len(rates) else float("nan")
        worst[(cell["streams"], target)] = dev
        rows.append([cell["streams"], target, float(rates.min()), float(np.median(rates)), float(rates.max()),
                     f"{dev * 100:.1f}%"])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    for target in sorted({float(c["target_rate"]) for c in doc["rate_cells"]}):
        cells = sorted((c for c in doc["rate_cells"] if float(c["target_rate"]) == target), key=lambda c: c["streams"])
        x = [c["streams"] for c in cells]
        shares = [np.asarray(c["achieved_rates"], float) / target for c in cells]
        med = [float(np.median(r)) for r in shares]
        err = [[m - float(r.min()) for m, r in zip(med, shares, strict=True)],
               [float(r.max()) - m for m, r in zip(med, shares, strict=True)]]
        ax.errorbar(x, med, yerr=err, marker="o", capsize=3, label=f"{target:g} samples/s per device")
    ax.axhspan(0.95, 1.05, color="green", alpha=0.1, label="±5% target")
    ax.set_xscale("log", base=2)
    streams = sorted({int(c["streams"]) for c in doc["rate_cells"]})
    ax.set_xticks(streams, [str(n) for n in streams])
    ax.set(xlabel="concurrent device streams", ylabel="achieved / target rate",
           title="every device's achieved rate: median, min-max bars", ylim=(0.9, 1.1))
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = ctx.plot_path("ingest.png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    at_32_600 = worst.get((32, 600.0))
    ratio = doc.get("producer_vs_kafka_tool")
    target_rows: list[list[Any]] = [
        ["32 streams at 600 samples/s, every device within ±5%",
         "not measured" if at_32_600 is None else f"worst device off by {at_32_600 * 100:.1f}%",
         "ScaDLES Fig. 6: 100/s held for 1-32 streams; 600/s sagged beyond 16 streams",
         _verdict(None if at_32_600 is None else at_32_600 <= 0.05)],
        [f"unpaced producers ≥ 0.5{_X} Kafka's perf tool",
         "—" if ratio is None else f"{doc['producer_records_per_s']:,.0f} vs "
         f"{doc['kafka_perf_tool_records_per_s']:,.0f} records/s = {ratio:.2f}{_X}",
         "not reported", _verdict(None if ratio is None else ratio >= 0.5)],
    ]
    trainer, per_cpu = doc.get("trainer_samples_per_s"), doc.get("trainer_samples_per_cpu_s")
    target_rows.append([
        "trainer consume → decode → collate ≥ 20,000 samples/s on one core (judged per CPU second of its thread)",
        "not measured" if per_cpu is None else f"{per_cpu:,.0f} per CPU second ({_num(trainer, 0)} samples/s wall), "
        f"{doc.get('trainer_record_bytes', 0):,}-byte records",
        "not reported", _verdict(None if per_cpu is None else per_cpu >= 20_000)])
    targets = _table(["target", "measured", "paper", "verdict"], target_rows)
    return "\n\n".join([
        f"Record size {doc['record_bytes']:,} bytes, window {doc.get('window_s', '?')} s per cell.",
        targets,
        _table(["streams", "target/s", "min", "median", "max", "worst deviation"], rows),
        f"![ingest]({ctx.link(png)})",
    ])


def render_scheduler(doc: dict[str, Any], ctx: RenderContext) -> str:
    cells = doc["cells"]
    rows = [[c["policy"], c["devices"], c["pending_per_device"], c["latency_ms_median"], c["latency_ms_p99"]]
            for c in cells]

    def median_at(policy: str, devices: int, pending: int) -> float | None:
        for c in cells:
            if (c["policy"], c["devices"], c["pending_per_device"]) == (policy, devices, pending):
                return float(c["latency_ms_median"])
        return None

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    for policy in sorted({c["policy"] for c in cells}):
        for pending in sorted({c["pending_per_device"] for c in cells}):
            pts = sorted((c["devices"], c["latency_ms_median"]) for c in cells
                         if c["policy"] == policy and c["pending_per_device"] == pending)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{policy}, {pending} pending")
    ax.set_xscale("log", base=2)
    devices = sorted({int(c["devices"]) for c in cells})
    ax.set_xticks(devices, [str(n) for n in devices])
    ax.set_yscale("log")
    ax.set(xlabel="devices", ylabel="plan latency, median (ms)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    png = ctx.plot_path("scheduler.png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    a, b = median_at("ett-stream", 32, 4096), median_at("ett-stream", 1024, 256)
    targets = _table(["target (ett-stream)", "measured median", "paper", "verdict"], [
        [f"≤ 5 ms at 32 devices {_X} 4096 pending", "—" if a is None else f"{a:.2f} ms", "not reported",
         _verdict(None if a is None else a <= 5.0)],
        [f"≤ 50 ms at 1024 devices {_X} 256 pending", "—" if b is None else f"{b:.2f} ms", "not reported",
         _verdict(None if b is None else b <= 50.0)],
    ])
    return "\n\n".join([targets, _table(["policy", "devices", "pending/device", "median ms", "p99 ms"], rows),
                        f"![scheduler]({ctx.link(png)})"])


def _stay(cell: Mapping[str, Any]) -> str:
    samples = cell.get("samples_to_stay_at_target")
    return "never settles at it within the run" if samples is None else f"stays at it from {samples:,} samples"


def render_convergence(doc: dict[str, Any], ctx: RenderContext) -> str:
    from .convergence import plot_convergence

    png = plot_convergence(doc, ctx.plot_path("convergence.png"))
    setup, sched = doc["setup"], doc["schedule"]
    rows = [[c["aggregation"], c["samples_to_target"], c["steps_to_target"],
             "—" if c["ratio_to_sgd"] is None else f"{c['ratio_to_sgd']:.3f}",
             "never" if c["samples_to_stay_at_target"] is None else c["samples_to_stay_at_target"],
             f"{c['final_accuracy']:.3f}", f"{c['final_heldout_loss']:.3f}"] for c in doc["cells"]]
    by_name = {c["aggregation"]: c for c in doc["cells"]}
    weighted, plain, sgd = by_name.get("weighted", {}), by_name.get("plain", {}), by_name.get("sgd", {})
    ratio = weighted.get("ratio_to_sgd")
    gap = None if not plain or not sgd else sgd["final_accuracy"] - plain["final_accuracy"]
    targets = _table(["target", "measured", "paper", "verdict"], [
        ["weighted: samples to target within 5% of single-process SGD",
         "—" if ratio is None else f"{ratio:.3f}{_X} SGD ({weighted['samples_to_target']:,} vs "
         f"{sgd['samples_to_target']:,} samples); parameters differ by "
         f"{doc['weighted_vs_sgd_max_param_diff']:.1e} after {setup['steps']} steps",
         "LB-BSP §3.4: weighted aggregation gives \"identical statistical efficiency\" to BSP",
         _verdict(None if ratio is None else abs(ratio - 1.0) <= 0.05)],
        ["plain averaging shows its bias",
         "—" if gap is None else f"final accuracy {plain['final_accuracy']:.3f} vs SGD {sgd['final_accuracy']:.3f} "
         f"({gap * 100:.1f} points {'lower' if gap > 0 else 'higher'}), held-out loss "
         f"{plain['final_heldout_loss']:.3f} vs {sgd['final_heldout_loss']:.3f}; first reaches the target at "
         f"{_num(plain['ratio_to_sgd'], 3)}{_X} SGD's samples but {_stay(plain)} (SGD {_stay(sgd)})",
         "LB-BSP §3.4: naive averaging reached 43% training accuracy vs 59% for BSP (Inception-V3, 20 epochs)",
         _verdict(None if gap is None else gap > 0)],
    ])
    return "\n\n".join([
        f"Setup: {setup['world']} gloo ranks on the CPU, {setup['steps']} steps, expected per-rank shares "
        f"{_num(setup['shares'])} of a global batch drawn in [{setup['batch_min']}, {setup['batch_max']}], each rank "
        f"idle with probability {setup['idle_probability']} ({sched['idle_rank_steps']} of {sched['rank_steps']} "
        f"rank-steps idle, {sched['empty_steps']} empty steps); non-IID ({setup['labels_per_device']} of "
        f"{setup['classes']} classes per device), sizes normal mean {setup['size_mean']:g} DIF "
        f"{setup['size_dif']:g}, signal {setup['signal']:g}. Target: held-out accuracy "
        f"{doc['target_accuracy']:.2f} (trailing mean of {setup['smooth_steps']} steps); held-out set of "
        f"{setup['heldout']:,} samples from the same device streams in the same proportions. "
        f"Run time {doc['seconds']:.0f} s.",
        targets,
        _table(["aggregation", "samples to target", "steps", "ratio to SGD", "samples to stay at target",
                "final accuracy", "final held-out loss"], rows),
        f"![convergence]({ctx.link(png)})",
    ])


def render_balance(doc: dict[str, Any], ctx: RenderContext) -> str:
    from .balance import render_balance as render

    return render(doc, ctx)


def render_truncation(doc: dict[str, Any], ctx: RenderContext) -> str:
    from .truncation import render_truncation as render

    return render(doc, ctx)


def render_soak(doc: dict[str, Any], ctx: RenderContext) -> str:
    from .soak import render_soak as render

    return render(doc, ctx)


def render_cells(doc: dict[str, Any], ctx: RenderContext) -> str:
    """Generic: every scalar key of `cells` as a column (for benchmarks without their own renderer)."""
    del ctx
    cells = doc.get("cells", [])
    if not cells:
        return "No cells in the JSON."
    keys = [k for k in cells[0] if not isinstance(cells[0][k], dict)]
    return _table(keys, [[c.get(k) for k in keys] for c in cells])


#: The benchmark set, in the order `bench all` runs it. Benchmarks whose command does not exist yet
#: are skipped; give a new one its line here.
REGISTRY: tuple[Bench, ...] = (
    Bench("kafka", "kafka.json", ("--records", "100000", "--repeats", "3"), ("--records", "20000", "--repeats", "1"),
          timeout_s=420, render=render_kafka),
    Bench("ingest", "ingest.json", ("--seconds", "10"), ("--seconds", "5", "--streams", "1,8,32"), timeout_s=900,
          render=render_ingest),
    Bench("scheduler", "scheduler.json", (), ("--repeats", "5"), timeout_s=300, render=render_scheduler),
    Bench("convergence", "convergence.json", (), ("--quick",), timeout_s=600, render=render_convergence),
    Bench("balance", "balance.json", ("--control",), ("--quick",), timeout_s=1500, render=render_balance),
    Bench("truncation", "truncation.json", (), ("--quick",), timeout_s=600, render=render_truncation),
    Bench("soak", "soak.json", ("--minutes", "5"), ("--minutes", "1"), timeout_s=600, render=render_soak),
)


def command_names(app: Any) -> set[str]:
    """Names of the commands registered on a typer app (as the CLI spells them)."""
    names = set()
    for info in app.registered_commands:
        name = info.name or (info.callback.__name__.replace("_", "-") if info.callback else None)
        if name:
            names.add(name)
    return names


def available(commands: Iterable[str]) -> list[Bench]:
    """The benchmarks of `REGISTRY` whose command exists, in registry order."""
    present = set(commands)
    return [b for b in REGISTRY if b.name in present]


_MARKER = re.compile(r"<!-- bench:([\w-]+) -->(.*?)<!-- /bench:\1 -->", re.DOTALL)


def marker_names(text: str) -> list[str]:
    """Names of the generated sections present in a Markdown text."""
    return [m.group(1) for m in _MARKER.finditer(text)]


def refresh_markdown(text: str, sections: Mapping[str, str]) -> tuple[str, list[str]]:
    """Replace the body of each `<!-- bench:NAME -->` … `<!-- /bench:NAME -->` section named in `sections`.

    Everything outside the markers, and sections not named, are kept byte for byte.

    Returns:
        The new text, and the names in `sections` that have no markers in `text`.
    """
    found: set[str] = set()

    def swap(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in sections:
            return match.group(0)
        found.add(name)
        return f"<!-- bench:{name} -->\n{sections[name].strip()}\n<!-- /bench:{name} -->"

    new = _MARKER.sub(swap, text)
    return new, [name for name in sections if name not in found]


def render_runs(doc: dict[str, Any]) -> str:
    """The `all` section: what the last `bench all` ran, how it ended and how long it took."""
    runs = doc.get("runs", [])
    total = sum(float(r.get("seconds", 0.0)) for r in runs)
    rows = [[f"`bench {r['name']}`", r["status"], f"{float(r.get('seconds', 0.0)):.0f} s"] for r in runs]
    mode = "`--quick`" if doc.get("quick") else "full"
    ran = sum(1 for r in runs if not str(r["status"]).startswith("not run"))
    return "\n\n".join([f"Last `streamtrain bench all` ({mode}): {ran} of {len(runs)} benchmarks run, "
                         f"in {total / 60:.1f} minutes.",
                         _table(["benchmark", "status", "time"], rows)])


def render_sections(data_dirs: Sequence[Path], markdown_dir: Path,
                    benches: Sequence[Bench] = REGISTRY) -> dict[str, str]:
    """Markdown bodies of every benchmark whose JSON is in one of `data_dirs` (the first found wins).

    The `all` section summarises `all.json` (the last `bench all`) of the first directory holding one.
    """
    out = {}
    for data_dir in data_dirs:
        if (data_dir / "all.json").is_file():
            out["all"] = render_runs(json.loads((data_dir / "all.json").read_text()))
            break
    for bench in benches:
        for data_dir in data_dirs:
            path = data_dir / bench.json_name
            if path.is_file():
                doc = json.loads(path.read_text())
                renderer = bench.render or render_cells
                link = Path(os.path.relpath(path.resolve(), markdown_dir.resolve())).as_posix()
                source = f"_Generated from `{link}` by `streamtrain bench report`._"
                out[bench.name] = renderer(doc, RenderContext(data_dir, markdown_dir)) + "\n\n" + source
                break
    return out
