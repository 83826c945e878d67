"""The benchmark registry, the measuring context `bench` records, BENCHMARKS.md generated whole, and the
convergence analysis."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from streamtrain.benchmarks.cli import choose, register, with_context
from streamtrain.benchmarks.common import Bench, LaunchOptions, interleaved, trailing_mean
from streamtrain.benchmarks.convergence import BENCH as CONVERGENCE
from streamtrain.benchmarks.convergence import ConvergenceResult, ConvergenceSetup, Curve, analyse
from streamtrain.benchmarks.registry import REGISTRY
from streamtrain.benchmarks.report import BenchRun, SuiteRuns, render_markdown, render_sections
from streamtrain.cli import app, bench_app


def _fake_bench(tmp: Path) -> Bench[ConvergenceResult]:
    """A benchmark whose command writes a small convergence result into --out, as a real one does."""

    def command(out: Path = Path("x")) -> None:
        setup = ConvergenceSetup(steps=4, smooth_steps=1)
        curves = {name: _curve([0.2, 0.5, 0.9, 0.9]) for name in ("sgd", "weighted", "plain")}
        out.mkdir(parents=True, exist_ok=True)
        ConvergenceResult(setup=setup, curves=curves, weighted_vs_sgd_max_param_diff=1e-7,
                          plain_vs_sgd_max_param_diff=0.3, seconds=1.0).write(out / "convergence.json")

    return Bench("convergence", command, ConvergenceResult, CONVERGENCE.render, CONVERGENCE.targets,
                 CONVERGENCE.plot)


def test_bench_records_the_context_its_figures_were_measured_in(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _fake_bench(tmp_path)
    # the command line as `streamtrain bench` saw it (pytest's own argv differs from run to run)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/streamtrain", "bench", "convergence", "--out", "my dir"])
    with_context(bench)(out=tmp_path / "data")
    result = ConvergenceResult.load(tmp_path / "data" / "convergence.json")
    context = result.context
    assert context is not None and context.cores and context.load_start and context.load_end
    assert context.command == "streamtrain bench convergence --out 'my dir'"
    assert context.seconds is not None and context.seconds >= 0
    assert context.commit is None or len(context.commit.removesuffix("+dirty")) == 12
    body = bench.section(tmp_path / "data" / "convergence.json", tmp_path)
    assert body.startswith("Measured ") and f"Command: `{context.command}`" in body
    assert body.endswith("![convergence](data/convergence.png)")
    # A file from before contexts were recorded still renders, and says so.
    bare = result.model_copy(update={"context": None})
    bare.write(tmp_path / "old.json")
    assert bench.section(tmp_path / "old.json", tmp_path).startswith("Measuring context not recorded.")


def test_every_benchmark_of_the_registry_is_a_bench_command() -> None:
    names = [b.name for b in REGISTRY]
    assert names == ["ingest", "bridge", "scheduler", "convergence", "balance", "realdata", "overhead", "truncation",
                     "freshness", "soak", "quality"]
    assert all(b.json_name == f"{b.name}.json" for b in REGISTRY)
    registered = {info.name for info in bench_app.registered_commands}
    assert registered >= {*names, "all", "report"}
    # The registry is the one place: a fresh group gets exactly its benchmarks, `all` and `report`.
    fresh = typer.Typer()
    register(typer.Typer(), fresh)
    assert [info.name for info in fresh.registered_commands] == [*names, "all", "report"]


def test_only_and_skip_choose_in_registry_order() -> None:
    assert [b.name for b in choose(["soak", "ingest"], [])] == ["ingest", "soak"]
    assert "balance" not in [b.name for b in choose([], ["balance"])]
    with pytest.raises(ValueError, match="nosuch"):
        choose(["nosuch"], [])


def test_every_registered_benchmark_accepts_the_arguments_bench_all_gives_it() -> None:
    runner = CliRunner()
    for bench in REGISTRY:
        for args in (bench.args, bench.quick_args):
            # --help after the arguments: click parses (and rejects unknown) options before acting on it.
            result = runner.invoke(app, ["bench", bench.name, "--out", "x", *args, "--help"])
            assert result.exit_code == 0, (bench.name, args, result.output)


def test_bench_all_rejects_an_unknown_benchmark() -> None:
    result = CliRunner().invoke(app, ["bench", "all", "--only", "nosuch"])
    assert result.exit_code == 1
    assert "nosuch" in result.output


def _curve(accuracy: list[float], per_step: int = 10) -> Curve:
    n = len(accuracy)
    return Curve(step=list(range(1, n + 1)), samples=[per_step * (i + 1) for i in range(n)], accuracy=accuracy,
                 loss=[1.0 - a for a in accuracy])


def test_analysis_judges_the_target_on_the_smoothed_curve() -> None:
    setup = ConvergenceSetup(target_accuracy=0.5, smooth_steps=2)
    curves = {
        "sgd": _curve([0.1, 0.4, 0.6, 0.6, 0.7, 0.7]),       # smoothed: .1 .25 .5 .6 .65 .7 -> step 3
        "weighted": _curve([0.1, 0.4, 0.6, 0.6, 0.7, 0.7]),
        "plain": _curve([0.9, 0.1, 0.9, 0.6, 0.2, 0.2]),     # smoothed: .9 .5 .5 .75 .4 .2 -> hit at 1, never stays
    }
    rows = analyse(setup, curves)
    assert list(rows) == ["sgd", "weighted", "plain"]
    assert rows["sgd"].samples_to_target == 30 and rows["sgd"].steps_to_target == 3
    assert rows["sgd"].samples_to_stay_at_target == 30
    assert rows["weighted"].ratio_to_sgd == 1.0
    assert rows["plain"].samples_to_target == 10 and rows["plain"].ratio_to_sgd == pytest.approx(1 / 3, 1e-3)
    assert rows["plain"].samples_to_stay_at_target is None
    assert trailing_mean([1.0, 0.0, 1.0], 2) == [1.0, 0.5, 0.5]


def test_repeats_alternate_so_drift_falls_on_every_kind_alike() -> None:
    order: list[tuple[str, int]] = []
    runs = interleaved(["a", "b", "c"], 3, lambda kind, r: order.append((kind, r)) or float(r))
    assert [k for k, _ in order] == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert runs == {"a": [0.0, 1.0, 2.0], "b": [0.0, 1.0, 2.0], "c": [0.0, 1.0, 2.0]}


def test_setup_rejects_inconsistent_splits() -> None:
    with pytest.raises(ValueError, match="shares"):
        ConvergenceSetup(world=2)
    with pytest.raises(ValueError, match="labels_per_device"):
        ConvergenceSetup(world=4, shares=(1, 1, 1, 1), classes=6)


def test_schedule_is_uneven_with_idle_ranks_and_reproducible() -> None:
    setup = ConvergenceSetup(steps=30, heldout=40)
    counts = setup.counts()
    assert (counts == 0).any() and (counts.mean(axis=0)[0] > 5 * counts.mean(axis=0)[-1])
    first, again = setup.schedule(), setup.schedule()
    assert [[len(d) for d in step] for step in first] == counts.tolist()
    assert first[3][0][0].data == again[3][0][0].data
    labels = {s.label for step in first for s in step[1]}
    assert labels <= {2, 3}  # non-IID: device 1 streams classes 2 and 3 only


def test_report_renders_benchmarks_md_whole_with_relative_plot_links(tmp_path: Path) -> None:
    data = tmp_path / "reports" / "bench"
    with_context(_fake_bench(tmp_path))(out=data)
    runs = [BenchRun(name="ingest", status="ok", seconds=90.0), BenchRun(name="convergence", status="ok", seconds=60)]
    SuiteRuns(quick=False, runs=runs).write(data / "all.json")
    sections = render_sections([data], tmp_path)
    assert set(sections) == {"convergence", "all"}
    assert "2 of 2 benchmarks run, in 2.5 minutes" in sections["all"]
    assert "| `bench ingest` | ok | 90 s |" in sections["all"]
    body = sections["convergence"]
    assert "![convergence](reports/bench/convergence.png)" in body
    assert (data / "convergence.png").stat().st_size > 1000
    assert "**met**" in body and "| weighted | 30 | 3 | 1.000 |" in body

    md = tmp_path / "BENCHMARKS.md"
    md.write_text("hand-written text that does not survive\n")
    result_cli = CliRunner().invoke(app, ["bench", "report", "--out", str(data), "--markdown", str(md)])
    assert result_cli.exit_code == 0, result_cli.output
    text = md.read_text()
    assert text == render_markdown([data], tmp_path) and "hand-written" not in text
    assert text.startswith("# Benchmarks\n\n<!-- Generated by `streamtrain bench report` from the JSON in "
                           "`reports/bench`")
    # Every benchmark has its section: its description from its code, then its figures or "not measured yet".
    for bench in REGISTRY:
        assert f"\n## {bench.name}\n\n{bench.about.strip()}\n" in text
    assert "Not measured yet: no `balance.json` in `reports/bench`." in text
    assert "\n## convergence\n" in text and "Measured " in text.split("## convergence")[1]


def test_launch_options_pass_the_root_options_on_under_the_benchmarks_own_settings(tmp_path: Path) -> None:
    toml = tmp_path / "st.toml"
    toml.write_text('job = "from-file"\n[coordinator]\nglobal_batch = 64\n')
    launch = LaunchOptions(str(toml), ("coordinator.b_max=7", "trainer.log_every=5"))
    cfg = launch.config({"coordinator.global_batch": 96, "coordinator.devices": ["0", "1"]})
    assert (cfg.job, cfg.coordinator.b_max, cfg.coordinator.global_batch) == ("from-file", 7, 96)
    argv = launch.command("streamtrain.coordinator", "coordinate", settings={"coordinator.devices": ["0", "1"]})
    assert argv[1:3] == ("-m", "streamtrain.coordinator") and argv[-1] == "coordinate"
    # Root options first, as given; the benchmark's settings after them (so they win), lists as JSON.
    assert list(argv[3:-1]) == ["--config", str(toml), "--set", "coordinator.b_max=7", "--set",
                                "trainer.log_every=5", "--set", 'coordinator.devices=["0", "1"]']
    assert launch.argv({"kafka.topic_prefix": "p"})[-2:] == ["--set", "kafka.topic_prefix=p"]
    assert launch.overrides() == {"coordinator.b_max": "7", "trainer.log_every": "5"}
