"""`streamtrain up`: the whole stack on this machine, a live view while it runs, a report when it stops."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .options import StackOptions

if TYPE_CHECKING:
    from streamtrain.config import StreamtrainConfig
    from streamtrain.report.schema import StackReport

    from .replay import DatasetReplay

__all__ = ["register"]

_PARAGRAPHS = (
    "Run the whole pipeline on this machine, without Docker, and write a report when it stops.",
    "Starts, as child processes with their own metrics ports and log files: an embedded Kafka broker (or the one "
    "at kafka.bootstrap_servers when that is set and answers), one producer per device with its own rate and sample "
    "sizes (15/30/45/60 samples/s, mean sizes 60/40/30/20, DIF 30% of the mean, cycled), the coordinator, one "
    "trainer rank per device (`streamtrain train --local-ranks N`: gloo on CPU, NCCL on GPUs) and Prometheus "
    "scraping all of them (when the `prometheus` binary is installed; the stack runs without it and says so). "
    "A live table shows each device's rate, batch, step time, lag, buffer and loss, and the straggler effect.",
    "It stops on Ctrl-C / SIGTERM, after --duration seconds or --steps steps (both counted once every service is "
    "up), in order: "
    "producers first, then the trainers once they have trained what was produced (at most --drain-timeout "
    "seconds; each rank finishes its step, checkpoints and commits), then the coordinator, Prometheus and the "
    "broker. A second Ctrl-C skips the drain.",
    "The report directory (--out) then holds report.json — samples produced, trained, truncated, dead-lettered, "
    "pending and unaccounted, each record of each device topic accounted by its offset from what Kafka holds "
    "(pending: not processed when the run stopped, still in Kafka and resumed from the committed offsets, so not "
    "lost; unaccounted: processed past with no record of being trained, truncated or dead-lettered), median "
    "straggler effect and step time, throughput, plan latency, loss — with series.json, plots/*.png, logs/*.log "
    "and prometheus/. Exit status 1 when a service failed, a sample is unaccounted for, or the run had samples but "
    "trained none (every one dead-lettered: the closing line names the reasons and the setting to check; no model "
    "is kept); pending samples alone are not a failure. A Ctrl-C while the run is read back abandons the report.",
    "Devices your application feeds: --external-devices 0,2 (or all) runs no producer for those devices. `up` "
    "creates their topics and prints where to publish: the Kafka address (the embedded broker takes port 9092 when "
    "it is free, or broker.port) and each device's topic, <prefix>.device.<id> (on an outside broker <prefix> is the "
    "run's own, <kafka.topic_prefix>.up-<date>-<time>); DIR/external/device-<id>.env holds "
    "the same as STREAMTRAIN_KAFKA__* settings, which streamtrain.DeviceProducer reads from the environment (on a "
    "--secure run with the device's own login). Publish while the run goes on: its records are trained, shown (rate: "
    "what arrives on the topic) and accounted like every other device's. The run ends as usual; the drain then "
    "waits at most --drain-timeout seconds for what is in Kafka by then, so a device that never sends holds "
    "nothing up, and what arrives later stays in Kafka, reported as pending.",
    "The trainers publish model versions to DIR/versions while they train (versions.publish_every_seconds) and a "
    "final one when they stop; the run's final model is kept in DIR/model (streamtrain.load_model('DIR/model')). "
    "With --serve, `streamtrain serve` answers requests sent at --request-rate (the held-out set's samples) with "
    "the newest version that passed its promotion gate, and the report adds freshness (model_out): from a sample's "
    "production to serve's first answer by a version that trained it, median and p99 over every trained sample, "
    "and apart for the samples produced at line rate and those produced while their device had a backlog. To "
    "serve from another terminal or send your own requests, use the broker address `up` prints (or fix it with "
    "--set broker.port=9092) and the same --config.",
    "Examples:\n\n"
    "  streamtrain up --duration 60\n\n"
    "  streamtrain up --steps 200 --policy static --out reports/static\n\n"
    "  streamtrain --set coordinator.max_lag_samples=200 up --devices 8 --rates 20,80 --sizes 64,16 "
    "--truncation bounded\n\n"
    "  streamtrain --set trainer.slowdowns=[1,1,1,4] up --backlog 3000 --steps 150 --dif 64   "
    "# balance: one rank 4x slower\n\n"
    "  streamtrain up --secure --duration 60   # SASL/SCRAM + ACLs, each service as its own principal\n\n"
    "  streamtrain up --devices 3 --external-devices 0,2 --duration 300   # your application feeds devices 0 and 2\n\n"
    "  streamtrain --set kafka.bootstrap_servers=kafka:9092 --set trainer.num_features=16 up --bridge bridge.toml "
    "--duration 60   # your own topics, bridged",
    "  streamtrain --config examples/plaid-demo.toml up --dataset plaid --rates 9,9,9,3 --duration 75   "
    "# make demo: PLAID, held-out accuracy",
)
_HELP = "\n\n".join(_PARAGRAPHS)


def _numbers(text: str | None, flag: str) -> list[float] | None:
    from streamtrain.runtime.commands import EXIT_CONFIG, die

    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        die(f"{flag} {text!r}: expected comma-separated numbers, e.g. 15,30,45,60", EXIT_CONFIG)
    if not values:
        die(f"{flag} {text!r}: no values", EXIT_CONFIG)
    return values


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add `streamtrain up` and `streamtrain dashboards render` to the root CLI (no benchmarks of their own)."""
    from streamtrain.dashboards.render import dashboards_app

    del bench
    app.command("up", help=_HELP)(up)
    app.add_typer(dashboards_app, name="dashboards")


def up(
    ctx: typer.Context,
    devices: Annotated[int, typer.Option(min=1, max=64, help="Devices: one rank each, and a producer stream "
                                                                 "unless it is an --external-devices one.")] = 4,
    policy: Annotated[str | None, typer.Option(help="coordinator.policy: static, lbbsp, lbb, scadles, chronica "
                                               "or ett-stream (default).")] = None,
    truncation: Annotated[str | None, typer.Option(help="coordinator.truncation: persist (default), truncate or "
                                                   "bounded.")] = None,
    duration: Annotated[float | None, typer.Option(min=1.0, help="Stop after this many seconds of running "
                                                   "(counted once every service is up).")] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Stop once every rank has done at least this many "
                                              "more steps (counted once every service is up; checked twice a "
                                              "second, so short steps run on past it until the ranks stop).")]
    = None,
    out: Annotated[Path | None, typer.Option("--out", metavar="DIR", help="Report directory "
                                             "(default reports/up-<date>-<time>).")] = None,
    rates: Annotated[str | None, typer.Option(help="Per-device rates in samples/s, cycled over the devices.")]
    = None,
    sizes: Annotated[str | None, typer.Option(help="Per-device mean sample sizes, cycled over the devices.")]
    = None,
    dif: Annotated[float | None, typer.Option(min=0.0, help="DIF (std of sample sizes) of every device "
                                              "(default 30% of its mean): a normal where one that stays >= 1 "
                                              "can have it, else a lognormal of the same mean and std.")] = None,
    broker: Annotated[str, typer.Option(help="auto: the broker at kafka.bootstrap_servers when it is set and "
                                        "answers, else an embedded one; embedded; external. On an outside broker "
                                        "the run's topic prefix is kafka.topic_prefix + .up-<date>-<time>, so a "
                                        "run never reads an earlier one's topics.")] = "auto",
    prometheus: Annotated[bool, typer.Option(help="Run Prometheus scraping every service.")] = True,
    prometheus_bin: Annotated[str | None, typer.Option(help="Path of the prometheus binary (default: $PATH).")]
    = None,
    scrape_interval: Annotated[float, typer.Option(min=1.0, help="Prometheus scrape interval, seconds.")] = 1.0,
    drain_timeout: Annotated[float, typer.Option(min=0.0, help="Seconds the trainers get to work off the backlog "
                                                 "after the producers stop.")] = 30.0,
    torch_threads: Annotated[int, typer.Option(min=1, help="CPU threads per rank.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the producers' streams.")] = 0,
    live: Annotated[bool, typer.Option(help="Live table on a terminal (off when output is not a terminal).")]
    = True,
    keep_kafka: Annotated[bool, typer.Option(help="Keep the embedded broker's data under DIR/kafka.")] = False,
    backlog: Annotated[int, typer.Option(min=0, help="Instead of live streams, produce this many samples per "
                                         "device (each stream's sizes) before training starts: the fleet works "
                                         "through a fixed data set at full capacity, where balancing shows.")] = 0,
    secure: Annotated[bool, typer.Option(help="An embedded broker with SASL/SCRAM and Kafka's authorizer: every "
                                         "service logs in as its own role (acl.*: one producer principal per "
                                         "device, the trainers, the coordinator) with least-privilege ACLs, and "
                                         "the run is read back as the admin role.")] = False,
    dataset: Annotated[str | None, typer.Option(
        metavar="NAME|PATH", help="Replay a real dataset instead of synthetic streams: plaid (or the regression "
        "problems tecator, covid3month), or a .ts/.npz/.npy/.csv "
        "file or directory, one shard per device at the --rates (size = length). Its test split is the held-out set "
        "unless trainer.eval_path says otherwise")] = None,
    external_devices: Annotated[str | None, typer.Option(
        "--external-devices", "--external", metavar="IDS|all",
        help="Devices your own application feeds (comma-separated ids among 0 .. --devices - 1, or all): no "
        "producer of ours for them; their topics are created, and where to publish is printed and written to "
        "DIR/external/device-<id>.env (streamtrain.DeviceProducer reads its settings from the environment).")]
    = None,
    serve: Annotated[bool, typer.Option(help="Also run `streamtrain serve` with a request load, and report "
                                        "freshness (median and p99, overall, at line rate and during backlogs) "
                                        "and what serve answered.")] = False,
    request_rate: Annotated[float, typer.Option(min=0.1, help="Requests per second sent to serve (--serve).")]
    = 20.0,
    bridge: Annotated[Path | None, typer.Option(
        "--bridge", metavar="FILE", help="Instead of producers, the bridge writes the device topics from your own "
        "topics: the \\[bridge] table of FILE names them and their decoders (docs/guides/bridge.md). The devices are "
        "the ones bridge.devices names, else 0 .. --devices - 1. Your topics must be on the broker the run uses: "
        "kafka.bootstrap_servers, from --set or --config, or from FILE itself, which is the run's configuration "
        "file when no --config is given (a FILE with settings outside \\[bridge] and another --config is refused). "
        "The bridge starts first: a source or decoder that cannot work stops the run at once. The report accounts "
        "for every source record.")] = None,
) -> None:
    from streamtrain.plugins import SetupError
    from streamtrain.runtime.commands import EXIT_CONFIG, die

    from .external import parse_external
    from .preflight import check_user_code
    from .services import device_streams

    if external_devices is not None and (backlog or dataset is not None):
        die(f"--external-devices with {'--backlog' if backlog else '--dataset'}: that pre-produces or replays every "
            "device's stream, while an external device's stream is your application's; publish your own backlog "
            "to its topic instead", EXIT_CONFIG)
    if serve and secure:
        die("--serve with --secure: the request load has no role of its own yet; run serve as the `serve` role "
            "(acl.serve) against a cluster set up with `streamtrain acl apply`", EXIT_CONFIG)
    if broker not in ("auto", "embedded", "external"):
        die(f"--broker {broker!r}: choose auto, embedded or external", EXIT_CONFIG)
    section = _bridge_section(ctx, bridge, dataset, backlog, secure, external_devices)
    out = out or Path("reports") / f"up-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    cfg, replay = _configure(ctx, policy, truncation, dataset, secure, devices,
                             {"bridge": section} if section is not None else {}, out.resolve() / "dataset")
    named = list(cfg.bridge.devices) if section is not None else []
    try:
        check_user_code(cfg.trainer)  # before the broker and the ranks: a plug-in that fails, fails now
    except SetupError as exc:
        die(str(exc), EXIT_CONFIG)
    try:
        streams = device_streams(_bridge_device_count(ctx, devices, named), _numbers(rates, "--rates"),
                                 _numbers(sizes, "--sizes"), dif)
        streams = [replace(s, device_id=name) for s, name in zip(streams, named, strict=True)] if named else streams
        external = parse_external(external_devices, [s.device_id for s in streams])
    except ValueError as exc:
        die(str(exc), EXIT_CONFIG)
    opts = StackOptions(streams=streams, out=out.resolve(), policy=policy, truncation=truncation, duration_s=duration,
                        steps=steps, broker=broker, prometheus=prometheus,  # type: ignore[arg-type]
                        prometheus_binary=prometheus_bin, scrape_interval_s=scrape_interval,
                        drain_timeout_s=drain_timeout, torch_threads=torch_threads, seed=seed,
                        global_args=_global_args(ctx, replay), backlog=backlog, secure=secure,
                        replay=replay is not None, replay_samples=replay.samples if replay is not None else 0,
                        external=external, serve=serve, request_rate=request_rate,
                        bridge=section)
    _summarise(*_run(cfg, opts, live, keep_kafka), opts.out)


def _configure(ctx: typer.Context, policy: str | None, truncation: str | None, dataset: str | None, secure: bool,
               devices: int, extra: dict[str, object],
               workdir: Path | None = None) -> tuple[StreamtrainConfig, DatasetReplay | None]:
    """The run's configuration (the root options, the flags, `extra` settings and a dataset's own settings) and the
    dataset to replay, said to the person; exits with a configuration error naming the flag. One series over time is
    cut into windows written under `workdir`."""
    from rich.markup import escape

    from streamtrain.runtime.commands import EXIT_CONFIG, config_from, console, die

    from .replay import resolve_replay

    flags: dict[str, object] = {"coordinator.policy": policy, "coordinator.truncation": truncation, **extra}
    cfg = config_from(ctx, flags)
    if dataset is None:
        return cfg, None
    if secure:
        die("--dataset with --secure: the replay producer writes every device's topic as one client, while "
            "--secure gives each device's producer its own principal; run one of them (or the producers yourself, "
            "one per device, with `streamtrain produce --dataset`)", EXIT_CONFIG)
    try:
        replay = resolve_replay(dataset, cfg, devices, workdir)
    except ValueError as exc:
        die(str(exc), EXIT_CONFIG)
    say = functools.partial(console.print, highlight=False)
    kind = f"{replay.classes} classes" if replay.objective == "classification" else replay.objective
    say(f"dataset {replay.name}: {replay.samples} samples of {replay.features} dimension(s), {kind}, sharded over "
        f"{devices} devices; held-out set: {replay.held_out or 'none (no evaluation)'}")
    if replay.series_note:
        say(f"one series over time: {escape(replay.series_note)}")
    if replay.held_out_note:
        say(f"held out: {escape(replay.held_out_note)}")
    say(f"objective: {replay.objective} ({replay.objective_why})")
    say(f"model: {replay.model_why}")
    for note in replay.input_notes:
        say(escape(note))
    said_apart = ("trainer.objective", "trainer.eval_path", "trainer.eval_packaged", "trainer.num_features",
                  "trainer.num_classes", "trainer.model", "trainer.input_shift", "trainer.input_scale",
                  "trainer.optimizer", "trainer.lr", "trainer.lr_scaling")
    shape = [f"{k}={v}" for k, v in replay.settings.items() if k.startswith("trainer.") and k not in said_apart]
    if shape:
        say(f"set from the data: {escape(', '.join(shape))}")
    for warning in replay.warnings:
        say(f"[yellow]note:[/] {escape(warning)}")
    names = replay.settings.get("producer.dataset.class_names")
    if isinstance(names, list) and any(str(n) != str(i) for i, n in enumerate(names)):  # not 0=0, 1=1, ...
        shown = ", ".join(f"{n}={i}" for i, n in enumerate(names[:20])) + (", ..." if len(names) > 20 else "")
        say(f"classes by name: {shown} (producer.dataset.class_names, for the replay and the held-out set alike)")
    if "coordinator.global_batch" in replay.settings:
        say(f"global batch {replay.settings['coordinator.global_batch']}: an eighth of the dataset "
            f"(--set coordinator.global_batch=N to choose)")
    return config_from(ctx, {**flags, **replay.settings}), replay


def _bridge_section(ctx: typer.Context, path: Path | None, dataset: str | None, backlog: int, secure: bool,
                    external: str | None) -> dict[str, object] | None:
    """The `[bridge]` table of `--bridge FILE` (None without it); exits 2 when it cannot be used.

    FILE's other settings (`[kafka]`, `[trainer]`, `job`) are not lost: without `--config`, FILE becomes the run's
    configuration file (for `up` and every service it starts); with another `--config`, they are refused.
    """
    import os

    from streamtrain.config.loader import CONFIG_FILE_ENV
    from streamtrain.runtime.commands import EXIT_CONFIG, GlobalOptions, console, die

    from .bridging import bridge_section

    if path is None:
        return None
    if dataset is not None or backlog or external is not None:
        die("--bridge with --dataset, --backlog or --external-devices: the bridge writes every device topic in the "
            "producers' place; choose one source of samples", EXIT_CONFIG)
    if secure:
        die("--bridge with --secure: --secure runs a fresh embedded broker, which holds none of your topics; run "
            "the bridge as its own principal on your cluster (`streamtrain acl apply`, docs/guides/bridge.md)",
            EXIT_CONFIG)
    try:
        section, others = bridge_section(path)
    except ValueError as exc:
        die(str(exc), EXIT_CONFIG)
    root = ctx.find_root().obj
    given = root.config_file if isinstance(root, GlobalOptions) else None
    current = given or os.environ.get(CONFIG_FILE_ENV) or None
    if others and current is None and isinstance(root, GlobalOptions):
        root.config_file = str(path)  # config_from and the services' --config read it from here
        console.print(f"--bridge {path}: its settings outside [bridge] ({', '.join(others)}) are the run's "
                      "configuration, as with --config", highlight=False, markup=False)
    elif others and current is not None and Path(current).resolve() != path.resolve():
        die(f"--bridge {path} has settings outside its [bridge] table ({', '.join(others)}), while the run's "
            f"configuration file is {current}: up takes only the [bridge] table of --bridge FILE. Move them to "
            f"{current} (or --set them), or give {path} as --config", EXIT_CONFIG)
    return section


def _bridge_device_count(ctx: typer.Context, devices: int, named: list[str]) -> int:
    """The run's device count: --devices, or the number of devices bridge.devices names (a different --devices
    exits 2)."""
    from streamtrain.runtime.commands import EXIT_CONFIG, die

    if not named:
        return devices
    given = ctx.get_parameter_source("devices")  # typer's own click: its enum, compared by name
    if given is not None and given.name == "COMMANDLINE" and devices != len(named):
        die(f"--devices {devices} with bridge.devices {named} in --bridge FILE: the run's devices are the ones the "
            "bridge names; drop --devices, or bridge.devices for devices 0 .. --devices - 1", EXIT_CONFIG)
    return len(named)


def _global_args(ctx: typer.Context, replay: DatasetReplay | None) -> list[str]:
    """The root options every service is started with: the parent's --config and --set, then the dataset's."""
    from streamtrain.runtime.commands import GlobalOptions, set_args

    root = ctx.find_root().obj
    given = root if isinstance(root, GlobalOptions) else GlobalOptions()
    args = ([f"--config={given.config_file}"] if given.config_file else []) + [
        a for s in given.sets for a in ("--set", s)]
    return args + (set_args(replay.settings) if replay is not None else [])


def _run(cfg: StreamtrainConfig, opts: StackOptions, live: bool,
         keep_kafka: bool) -> tuple[StackReport | None, list[str]]:
    """Run the stack with the live view on a terminal; returns the report and the failures."""
    import shutil

    from rich.live import Live

    from streamtrain.runtime.commands import console, die

    from .monitor import render_snapshot
    from .runner import LocalStack, StackError

    if opts.duration_s is None and opts.steps is None:
        console.print("running until Ctrl-C (or use --duration / --steps)")
    view = Live(console=console, refresh_per_second=2, transient=False) if live and console.is_terminal else None
    stack = LocalStack(cfg, opts, on_update=(lambda snap: view.update(render_snapshot(snap))) if view else None,
                       say=lambda line: console.print(line, highlight=False, soft_wrap=True))
    try:
        with view if view is not None else contextlib.nullcontext():
            report = stack.run()
    except StackError as exc:
        die(str(exc))
    finally:
        if not keep_kafka and (opts.out / "kafka").is_dir() and stack.broker is not None:
            shutil.rmtree(opts.out / "kafka", ignore_errors=True)
    return report, stack.failures


def _summarise(report: StackReport | None, failures: list[str], out: Path) -> None:
    from rich.table import Table

    from streamtrain.report.objective import heldout_rows
    from streamtrain.report.run_balance import closing_lines
    from streamtrain.runtime.commands import console, die

    if report is None:
        die(f"no report: {'; '.join(failures) or 'the run did not start'} (logs in {out / 'logs'})")
    table = Table(title=f"streamtrain up — {out / 'report.json'}", show_header=False)
    for key in ("policy", "plan_ahead", "devices", "steps", "stopped_by", "samples_produced", "samples_trained",
                "samples_truncated", "samples_dead_lettered", "samples_pending", "samples_duplicated",
                "samples_unaccounted", "straggler_effect_median", "step_seconds_median", "step_period_seconds_median",
                "plan_wait_seconds_median", "throughput_samples_per_s", "sample_delay_seconds_median",
                "plan_latency_ms_median", "plan_latency_step_fraction_median", "initial_loss", "final_loss",
                "heldout_accuracy_final", "devices_keeping_up", "straggler_effect_waiting_median"):
        rows = [(key, getattr(report, key))]
        if key == "heldout_accuracy_final":  # held-out in the objective's terms (rmse, f1_mean, ...), when evaluated
            rows = heldout_rows(report.objective) or rows
        for name, value in rows:
            table.add_row(name, f"{value:.4g}" if isinstance(value, float) else str(value))
    out_figures = report.model_out
    for key in ("versions_published", "versions_served", "requests_answered", "freshness_seconds_median",
                "freshness_seconds_p99", "freshness_line_rate_seconds_median", "freshness_line_rate_seconds_p99",
                "freshness_backlog_seconds_median", "freshness_backlog_seconds_p99"):
        value = getattr(out_figures, key) if out_figures is not None else None
        if value is not None:  # the serving figures: with --serve only
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
    for line in closing_lines(report):
        console.print(line, highlight=False)
    console.print(f"report: {out / 'report.json'}  plots: {out / 'plots'}  logs: {out / 'logs'}", highlight=False)
    pending = report.samples_pending
    if pending:
        console.print(f"{pending:,} samples pending: still in Kafka, not processed when the run stopped; a later run "
                      "of this job resumes them from the committed offsets", highlight=False)
    if (bridged := report.bridge) is not None:
        console.print(f"bridge: {bridged.source_records:,} source records of {', '.join(bridged.sources)}: "
                      f"{bridged.source_bridged:,} bridged, {bridged.source_rejected:,} rejected, "
                      f"{bridged.source_skipped:,} skipped, {bridged.source_pending:,} pending, "
                      f"{bridged.source_lost:,} lost, {bridged.source_duplicated:,} duplicated", highlight=False)
    for failure in failures:
        console.print(f"[bold red]failure:[/] {failure}", highlight=False)
    if failures or report.samples_unaccounted or (report.bridge is not None and report.bridge.unaccounted):
        raise typer.Exit(1)
