"""`LocalStack`: the whole pipeline as local processes, started and stopped in order, then a report.

Start order: Kafka broker (embedded, or an existing one) → Prometheus → coordinator → trainer ranks
→ (serve) → producers → (the request load). Stop order: producers (SIGINT: they flush every accepted
record), then — once the trainers have worked off what was produced, or after `drain_timeout_s` — the
trainers (SIGTERM: each rank finishes its step, checkpoints, commits, publishes its final model version and
exits 0), (the request load and serve, `stack.serving`), the coordinator, and, after the records have been
read back for the report, Prometheus and the broker. Every run keeps its final model version in `<out>/model`.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from confluent_kafka import KafkaException

from producers.service import ProducerError
from streamtrain.broker import BrokerError, EmbeddedBroker
from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.kafka import make_consumer, tail_positions
from streamtrain.net import free_port_block, free_ports

from .backlog import produce_backlog
from .balance import balance_figures
from .ledger import ReadInterrupted, RunRecords, collect_records, tally_devices
from .monitor import Monitor, StackSnapshot
from .plots import plot_series
from .procs import Child, wait_http
from .prometheus import INSTALL_HINT, find_prometheus, scrape_config
from .replay import held_out_chance, produce_replay_backlog, replay_producer_spec
from .report import build_report, build_series, write_json
from .secure import Identities, secure_broker_config, set_up_secure_broker
from .services import (
    DeviceStream,
    coordinator_spec,
    producer_spec,
    prometheus_spec,
    trainer_spec,
)
from .serving import forget_versions, keep_final_model, request_spec, serve_spec, serving_figures

__all__ = ["LocalStack", "StackError", "StackOptions"]

logger = logging.getLogger(__name__)

BrokerMode = Literal["auto", "embedded", "external"]


class StackError(RuntimeError):
    """The stack could not start or a service failed; the message names the service and its log."""


@dataclass(frozen=True)
class StackOptions:
    """How `streamtrain up` runs (its flags)."""

    streams: Sequence[DeviceStream]
    out: Path
    policy: str | None = None
    truncation: str | None = None
    duration_s: float | None = None
    steps: int | None = None
    broker: BrokerMode = "auto"
    prometheus: bool = True
    prometheus_binary: str | None = None
    scrape_interval_s: float = 1.0
    drain_timeout_s: float = 30.0
    start_timeout_s: float = 180.0
    torch_threads: int = 1
    seed: int = 0
    global_args: Sequence[str] = field(default_factory=tuple)
    backlog: int = 0
    """Samples pre-produced per device (each stream's own seed and sizes) before the coordinator and the
    trainers start; with a backlog no live producers run, so training works through a fixed data set at
    full capacity (benchmarks). 0: live producers at the streams' rates."""
    replay: bool = False
    """Replay the configured dataset (`producer.dataset.*`, see `stack.replay`) into the device topics, one shard
    per device at each stream's rate, instead of the synthetic streams."""
    until_step: int | None = None
    """Stop once every rank has finished this many steps in all, counted from step 0 (unlike `steps`,
    which counts from the first step seen after start-up)."""
    secure: bool = False
    """Run the embedded broker with SASL/SCRAM and ACLs, each service as its own role's principal
    (`stack.secure`)."""
    serve: bool = False
    """Run `serve` and a request load at `request_rate` beside the trainers (`stack.serving`)."""
    request_rate: float = 20.0
    """Requests per second the load sends with `serve`."""


def _default_bootstrap() -> str:
    return str(KafkaConfig.model_fields["bootstrap_servers"].default)


class LocalStack:
    """Runs the stack described by `opts` on top of the configuration `cfg`.

    Args:
        cfg: the configuration the parent command was given (file < env < --set).
        opts: the stack's own options.
        on_update: called with a fresh `StackSnapshot` about twice a second (the live view).
        say: prints one line for a person.
    """

    def __init__(self, cfg: StreamtrainConfig, opts: StackOptions,
                 on_update: Callable[[StackSnapshot], None] | None = None,
                 say: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.opts = opts
        self.on_update = on_update
        self.say = say
        self.devices = [s.device_id for s in opts.streams]
        self.out = opts.out
        self.log_dir = self.out / "logs"
        self.children: list[Child] = []
        self.broker: EmbeddedBroker | None = None
        self.stop_event = threading.Event()
        self.hurry = threading.Event()
        self.reporting = False
        self.report_interrupted = threading.Event()
        """A Ctrl-C while the run was read back: the report is abandoned."""
        self.stopped_by = "running"
        self.failures: list[str] = []
        self.prometheus_url: str | None = None
        self.monitor: Monitor | None = None
        self.kafka = cfg.kafka
        self.drained: bool | None = None
        self.final_status: dict[str, Any] = {}
        self.series: dict[str, Any] = {}
        self.records: RunRecords | None = None
        """What the run left in Kafka, as read back for the report."""
        self.backlog_seconds: float | None = None
        self.identities = Identities.generate(cfg, self.devices) if opts.secure else None
        """The role principals of a secure run (`--secure`), None otherwise."""
        self.kafka_ready = False
        self.started = False
        self.started_at = datetime.now().astimezone()

    # ---- the whole run -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Start everything, run until a stop condition, stop in order, and write the report.

        Returns:
            The report (also written to `out/report.json`).

        Raises:
            StackError: when the stack cannot start (nothing is left running).
        """
        forget_versions(self.out / "versions", self.say)  # the earlier run's final model stays in out/model
        for stale in ("logs", "checkpoints", "plots", "prometheus", "kafka"):  # a reused --out starts afresh:
            shutil.rmtree(self.out / stale, ignore_errors=True)  # an old checkpoint would skip new offsets
        self.log_dir.mkdir(parents=True, exist_ok=True)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            try:
                self._start_all()
                self.started = True
                self._run_until_stopped()
            finally:
                report = self._stop_all()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return report

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.reporting:
            self.report_interrupted.set()  # reading a large run back can take a while: stop it
        if self.stop_event.is_set():
            self.hurry.set()  # a second Ctrl-C: skip the drain, stop now (still in order)
        self.stopped_by = self.stopped_by if self.stop_event.is_set() else signal.Signals(signum).name
        self.stop_event.set()

    # ---- start ---------------------------------------------------------------------------------

    def _start_all(self) -> None:
        self._start_broker()
        if self.opts.backlog > 0:
            ids = self.identities
            try:
                if self.opts.replay:  # not with identities: `up` refuses --secure with --dataset
                    self.backlog_seconds = produce_replay_backlog(
                        self.kafka, self.cfg.producer, self.opts.streams, self.opts.seed, self.opts.backlog)
                else:
                    self.backlog_seconds = produce_backlog(
                        self.kafka, self.cfg.producer, self.opts.streams, self.opts.seed, self.opts.backlog,
                        kafka_for=partial(ids.producer_kafka, self.kafka) if ids is not None else None)
            except ProducerError as exc:
                raise StackError(f"the backlog could not be produced: {exc}") from None
            self.say(f"backlog: {self.opts.backlog} samples per device produced in {self.backlog_seconds:.1f} s")
        bind = self.cfg.metrics.bind_address
        host = "127.0.0.1" if bind in ("0.0.0.0", "::") else bind
        n = len(self.devices)
        ports = free_ports(n + 3, bind)
        producer_ports, coord_port, prom_port, serve_port = ports[:n], ports[n], ports[n + 1], ports[n + 2]
        trainer_base = free_port_block(n, bind, avoid=ports)
        common: dict[str, object] = {"kafka.bootstrap_servers": self.kafka.bootstrap_servers,
                                     "kafka.topic_prefix": self.kafka.topic_prefix,
                                     "versions.dir": str(self.out / "versions")}
        args = list(self.opts.global_args)
        if self.opts.backlog > 0:
            producers = []
        elif self.opts.replay:  # one producer for every device: the dataset is loaded and sharded once
            producers = [replay_producer_spec(self.opts.streams, self.opts.seed, producer_ports[0], common, args)]
        else:
            producers = [producer_spec(s, i, self.opts.seed, producer_ports[i], common, args)
                         for i, s in enumerate(self.opts.streams)]
        producer_ports = producer_ports[: len(producers)]
        coordinator = coordinator_spec(self.devices, self.opts.policy, self.opts.truncation, coord_port, common, args)
        # The ranks check each plan's truncation against the policy the coordinator was told to follow.
        trainer_sets = {**common, "coordinator.truncation": self.opts.truncation} if self.opts.truncation else common
        trainers = trainer_spec(self.devices, trainer_base, self.out / "checkpoints", self.opts.torch_threads,
                                trainer_sets, args)
        if (ids := self.identities) is not None:  # each service logs in as its own role
            producers = [replace(p, env=ids.env(ids.producers[s.device_id]))
                         for p, s in zip(producers, self.opts.streams, strict=False)]
            coordinator = replace(coordinator, env=ids.env(ids.coordinator))
            trainers = replace(trainers, env=ids.env(ids.trainer))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}
        self.monitor = Monitor(self.devices, f"http://{host}:{coord_port}",
                               {d: f"http://{host}:{trainer_base + r}/metrics" for r, d in enumerate(self.devices)},
                               {s.device_id: f"http://{host}:{producer_ports[min(i, len(producers) - 1)]}/metrics"
                                for i, s in enumerate(self.opts.streams) if producers})
        self._start_prometheus(host, prom_port, {
            "producers": [f"{host}:{p}" for p in producer_ports], "coordinator": [f"{host}:{coord_port}"],
            "trainers": [f"{host}:{p}" for p in trainers.ports], "serve": [f"{host}:{serve_port}"] if self.opts.serve
            else []})
        self.monitor.phase = "starting the coordinator"
        coord = self._spawn(coordinator, env)
        self._await(coord, f"http://{host}:{coord_port}/status")
        # Ranks first: they take longest to start (torch), and a stream with nobody training it only builds lag.
        self.monitor.phase = "starting trainer ranks"
        ranks = self._spawn(trainers, env)
        for port in trainers.ports:
            self._await(ranks, f"http://{host}:{port}/metrics")
        if self.opts.serve:
            self.monitor.phase = "starting serve"
            self._await(self._spawn(serve_spec(serve_port, common, args), env), f"http://{host}:{serve_port}/metrics")
        self.monitor.phase = "starting producers"
        for spec in producers:
            self._spawn(spec, env)
        for child, port in zip(self._kind("producer"), producer_ports, strict=False):
            self._await(child, f"http://{host}:{port}/metrics")
        if self.opts.serve:
            self._spawn(request_spec(self.opts.request_rate, common, args), env)
        self.monitor.notes.append(f"run directory {self.out} (logs in {self.log_dir})")
        self.say(f"stack up: {n} devices, coordinator http://{host}:{coord_port}/status"
                 + (f", Prometheus {self.prometheus_url}" if self.prometheus_url else ""))

    def _start_broker(self) -> None:
        mode = self.opts.broker
        configured = self.cfg.kafka.bootstrap_servers
        settings = self.cfg.kafka.security_settings()
        if self.identities is not None and mode == "external":
            raise StackError("--secure runs its own embedded broker (with fresh users and ACLs); on another cluster "
                             "set up users and ACLs with `streamtrain acl apply` and give each service its role")
        if self.identities is None and mode in ("auto", "external") and (
                mode == "external" or configured != _default_bootstrap()):
            if EmbeddedBroker.answers(configured, timeout=5.0, settings=settings):
                stamp = self.started_at.strftime("%Y%m%d-%H%M%S")
                prefix = f"{self.cfg.kafka.topic_prefix}.up-{stamp}"
                self.kafka = self.cfg.kafka.model_copy(update={"topic_prefix": prefix})
                self.kafka_ready = True
                self.say(f"using the Kafka broker at {configured} (kafka.bootstrap_servers), topics "
                         f"{self.kafka.topic_prefix}.*")
                return
            if mode == "external":
                raise StackError(f"no Kafka broker answers at {configured} (kafka.bootstrap_servers)")
            self.say(f"no Kafka broker answers at {configured} (kafka.bootstrap_servers): starting an embedded one")
        broker_cfg = self.cfg.broker.model_copy(update={"data_dir": self.out / "kafka", "port": 0,
                                                        "controller_port": 0})
        if self.identities is not None:
            broker_cfg = secure_broker_config(broker_cfg, self.identities)
        self.broker = EmbeddedBroker(broker_cfg, die_with_parent=True)  # the run's own: it ends with `up`
        began = time.monotonic()
        try:
            bootstrap = self.broker.start()
        except BrokerError as exc:
            raise StackError(f"the embedded Kafka broker did not start: {exc}") from None
        self.kafka = self.cfg.kafka.model_copy(update={"bootstrap_servers": bootstrap})
        if self.identities is not None:
            try:
                set_up_secure_broker(self.broker, self.cfg.model_copy(update={"kafka": self.kafka}), self.devices)
            except (KafkaException, ValueError) as exc:
                raise StackError(f"could not set up the secure broker's ACLs and topics: {exc}") from None
            self.kafka = self.identities.kafka(self.kafka, self.identities.admin)  # reads the run back as admin
            users = ", ".join(sorted(self.identities.passwords))
            self.say(f"security: SASL/SCRAM with ACLs, each service as its own principal ({users})")
        self.kafka_ready = True
        self.say(f"embedded Kafka broker on {bootstrap} after {time.monotonic() - began:.1f} s "
                 f"(data in {broker_cfg.data_dir})")

    def _start_prometheus(self, host: str, port: int, targets: dict[str, list[str]]) -> None:
        if not self.opts.prometheus:
            self.say("Prometheus: off (--no-prometheus)")
            return
        binary = find_prometheus(self.opts.prometheus_binary)
        if binary is None:
            self.say(f"Prometheus: no `prometheus` binary found, running without it ({INSTALL_HINT}); "
                     "the live view and the report do not need it")
            return
        prom_dir = self.out / "prometheus"
        prom_dir.mkdir(parents=True, exist_ok=True)
        config = prom_dir / "prometheus.yml"
        config.write_text(scrape_config(targets, self.opts.scrape_interval_s))
        child = self._spawn(prometheus_spec(binary, config, prom_dir / "data", host, port), dict(os.environ))
        url = f"http://{host}:{port}"
        if not wait_http(f"{url}/-/ready", 30.0, child):
            self.say(f"Prometheus did not become ready (see {child.log_path}); running without it")
            child.stop(grace=5.0)
            self.children.remove(child)
            return
        self.prometheus_url = url
        assert self.monitor is not None
        self.monitor.notes.append(f"Prometheus {url}  (try {url}/graph?g0.expr=streamtrain_trainer_batch_samples)")

    def _spawn(self, spec: Any, env: dict[str, str]) -> Child:
        child = Child(spec, self.log_dir, {**env, **spec.env})
        child.start()
        self.children.append(child)
        return child

    def _await(self, child: Child, url: str) -> None:
        deadline = time.monotonic() + self.opts.start_timeout_s
        while time.monotonic() < deadline:
            if self.stop_event.is_set():
                raise StackError("interrupted while starting")
            if wait_http(url, 0.5, child):
                return
            if not child.running():
                raise StackError(f"{child.name} exited with status {child.returncode} while starting; last lines of "
                                 f"{child.log_path}:\n{child.log_tail()}")
            self._update()
        raise StackError(f"{child.name} did not answer on {url} within {self.opts.start_timeout_s:.0f} s; "
                         f"see {child.log_path}")

    # ---- run -----------------------------------------------------------------------------------

    def _update(self) -> None:
        if self.on_update is not None and self.monitor is not None:
            self.on_update(self.monitor.snapshot())

    def _run_until_stopped(self) -> None:
        assert self.monitor is not None
        began = time.monotonic()
        first_step: int | None = None  # --steps counts from here: the ranks may have stepped on no data before
        self.monitor.phase = "running"
        while not self.stop_event.is_set():
            dead = [c for c in self.children if not c.running()]
            if dead:
                c = dead[0]
                self.failures.append(f"{c.name} exited with status {c.returncode}; see {c.log_path}")
                self.stopped_by = f"{c.name} exited"
                break
            if self.opts.duration_s is not None and time.monotonic() - began >= self.opts.duration_s:
                self.stopped_by = f"--duration {self.opts.duration_s:g}"
                break
            self.monitor.poll_status()
            step = self.monitor.step()
            if first_step is None:
                first_step = step
            if self.opts.steps is not None and step is not None and step - (first_step or 0) >= self.opts.steps:
                self.stopped_by = f"--steps {self.opts.steps}"
                break
            if self.opts.until_step is not None and step is not None and step >= self.opts.until_step:
                self.stopped_by = f"step {self.opts.until_step}"
                break
            self._update()
            self.stop_event.wait(0.5)

    # ---- stop ----------------------------------------------------------------------------------

    def _kind(self, kind: str) -> list[Child]:
        return [c for c in self.children if c.spec.kind == kind]

    def _stop_kind(self, kind: str, signum: int, grace: float) -> None:
        children = self._kind(kind)
        for child in children:
            child.send(signum)
        deadline = time.monotonic() + grace
        for child in children:
            while not child.wait(0.5):
                self._update()
                if time.monotonic() > deadline:
                    break
            if child.running():
                self.failures.append(f"{child.name} did not stop within {grace:.0f} s and was killed")
            code = child.stop(signal.SIGKILL, 0.0) if child.running() else child.returncode
            child.close()
            # Exiting by the signal itself (-signum, or 128 + signum from Python's KeyboardInterrupt) is a stop too:
            # whether anything was lost is for the Kafka accounting to say, not the exit status.
            if code not in (0, None, -signum, 128 + signum, -signal.SIGKILL):
                self.failures.append(f"{child.name} exited with status {code}; see {child.log_path}")

    def _stop_all(self) -> dict[str, Any]:
        monitor = self.monitor
        report: dict[str, Any] = {}
        self.stop_event.set()  # from now on a Ctrl-C means "hurry": skip the drain
        try:
            if monitor is not None:
                monitor.phase = "stopping producers"
            self._stop_kind("producer", signal.SIGINT, 120.0)
            if self.started and not self.failures and self.opts.drain_timeout_s > 0:
                self._drain()
            if monitor is not None:
                monitor.phase = "stopping trainers (final step, checkpoint, commit)"
            self._stop_kind("trainer", signal.SIGTERM, 120.0)
            if self._kind("serve"):
                self._stop_serving()
            keep_final_model(self.out / "versions", self.out / "model", self.say)
            if monitor is not None:
                self.final_status = monitor.poll_status()
                monitor.phase = "stopping the coordinator"
            self._stop_kind("coordinator", signal.SIGTERM, 30.0)
            if self.started and self.kafka_ready:
                report = self._report()
        finally:
            self._stop_kind("prometheus", signal.SIGTERM, 30.0)
            for child in self.children:
                if child.running():
                    child.kill()
            if self.broker is not None:
                self.broker.stop()
                self.say("embedded Kafka broker stopped")
        if report:
            self._plots(report)
        return report

    def _stop_serving(self) -> None:
        """Give serve a moment to answer with the trainers' final version, then stop the requests and serve."""
        if not self.hurry.is_set():
            self.hurry.wait(1.5)  # the final version is announced as the ranks exit; a request at 20/s follows
        self._stop_kind("requests", signal.SIGTERM, 30.0)
        self._stop_kind("serve", signal.SIGTERM, 60.0)

    def _drain(self) -> None:
        """Wait until every device's lowest unprocessed offset reaches its topic's end (or the drain timeout)."""
        assert self.monitor is not None
        self.monitor.phase = "draining: trainers work off the backlog"
        consumer = make_consumer(self.kafka, f"streamtrain-up-drain-{os.getpid()}")
        try:
            ends = {d: sum(h for _, h in tail_positions(consumer, self.kafka.topics.device(d), None, 30.0).values())
                    for d in self.devices}
        except (KafkaException, TimeoutError) as exc:
            logger.warning("cannot read the device topics' ends (%s); skipping the drain", exc)
            return
        finally:
            consumer.close()
        deadline = time.monotonic() + self.opts.drain_timeout_s
        while time.monotonic() < deadline and not self.hurry.is_set():
            floors = {d.get("device"): d.get("lowest_unprocessed") or 0
                      for d in self.monitor.poll_status().get("devices", [])}
            if all(floors.get(d, 0) >= ends[d] for d in self.devices):
                self.drained = True
                return
            if any(not c.running() for c in self._kind("trainer")):
                break
            self._update()
            time.sleep(0.5)
        self.drained = False
        logger.warning("the backlog did not drain within %.0f s (--drain-timeout); what is left stays in Kafka, "
                       "reported as pending", self.opts.drain_timeout_s)

    def _report(self) -> dict[str, Any]:
        if self.monitor is not None:
            self.monitor.phase = "reading the run back from Kafka"
            self._update()
        cfg = self.cfg.model_copy(update={"kafka": self.kafka})
        self.reporting = True
        try:
            run = collect_records(cfg, self.devices, timeout=60.0, stop=self.report_interrupted.is_set)
        except (KafkaException, TimeoutError) as exc:
            self.failures.append(f"could not read the run back from Kafka: {exc}")
            return {}
        except ReadInterrupted:
            self.failures.append("interrupted while reading the run back from Kafka: no report written")
            return {}
        finally:
            self.reporting = False
        self.records = run
        tallies = tally_devices(cfg, run)
        status = self.final_status or {}
        extra = {
            "policy": status.get("policy") or self.opts.policy or cfg.coordinator.policy,
            "truncation": status.get("truncation") or self.opts.truncation or cfg.coordinator.truncation,
            "plan_ahead": status.get("plan_ahead", cfg.coordinator.plan_ahead),
            "job": cfg.job, "topic_prefix": self.kafka.topic_prefix, "bootstrap_servers": self.kafka.bootstrap_servers,
            "started_at": self.started_at.isoformat(timespec="seconds"), "stopped_by": self.stopped_by,
            "drained": self.drained, "backlog_per_device": self.opts.backlog or None,
            "plan_latency_ms_median": status.get("plan_latency_ms_median"),
            "plan_latency_step_fraction_median": status.get("plan_latency_step_fraction_median"),
            "streams": [{"device": s.device_id, "rate": s.rate, "size_mean": s.size_mean, "size_dif": s.size_dif}
                        for s in self.opts.streams],
            "prometheus_url": self.prometheus_url, "failures": list(self.failures),
        }
        report = build_report(run, tallies, extra)
        try:
            report.update(serving_figures(cfg, self.opts.serve), model_dir=str(self.out / "model"))
        except (KafkaException, TimeoutError) as exc:
            self.failures.append(f"could not read the model versions and predictions back: {exc}")
        self.series = build_series(run)
        report.update(balance_figures(run, self.series), num_classes=cfg.trainer.num_classes,
                      heldout_chance=held_out_chance(cfg) if run.evaluations else None)
        self.series["heldout"] = report.get("heldout", [])
        write_json(self.out / "report.json", report)
        write_json(self.out / "series.json", self.series)
        return report

    def _plots(self, report: dict[str, Any]) -> None:
        title = f"{report['policy']} · {report['devices']} devices · {report['steps']} steps"
        try:
            paths = plot_series(self.series, self.out / "plots", title)
        except (ValueError, RuntimeError) as exc:  # a plot must never lose the report
            logger.warning("plots failed: %s", exc)
            return
        report["plots"] = [str(p.relative_to(self.out)) for p in paths]
        report["failures"] = list(self.failures)
        write_json(self.out / "report.json", report)
