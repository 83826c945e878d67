"""`LocalStack`: the whole pipeline as local processes, started and stopped in order, then a report.

Start order: Kafka broker (embedded, or an existing one: `stack.kafka_setup`) → Prometheus → (the bridge, whose
start-up check fails a run with bad sources or decoders before anything else starts) → coordinator → trainer
ranks → (serve) → producers → (the request load) (`stack.launch`). Stop order: producers
(SIGINT: they flush every accepted record), the bridge once it has caught up with its sources (`stack.bridging`),
then — once the trainers have worked off what was produced, or after `drain_timeout_s` — the trainers (SIGTERM:
each rank finishes its step, checkpoints, commits, publishes its final model version and exits 0), (the request
load and serve, `stack.serving`), the coordinator, and, after the records have been read back for the report
(`streamtrain.stack.run_report`), Prometheus and the broker. Every run that trained keeps its final model version in
`<out>/model`; one that trained no sample, though it had some, fails (`streamtrain.stack.run_report.nothing_trained`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from types import FrameType
from typing import Any

from confluent_kafka import KafkaException

from streamtrain.broker import EmbeddedBroker
from streamtrain.config import StreamtrainConfig
from streamtrain.kafka import make_consumer, tail_positions
from streamtrain.producers.service import ProducerError
from streamtrain.report.ledger import RunRecords
from streamtrain.report.objective import objective_for_report
from streamtrain.report.schema import StackReport
from streamtrain.stack.run_report import nothing_trained, read_back, run_settings, write_plots

from .backlog import produce_backlog
from .bridging import run_bridge_settings, wait_caught_up
from .external import broker_port, open_external_devices, publish_instructions
from .kafka_setup import embedded_broker, existing_kafka, start_embedded
from .launch import ServicePlan, plan_services, start_prometheus
from .monitor import Monitor, StackSnapshot
from .options import StackError, StackOptions
from .procs import Child, ChildSet
from .replay import produce_replay_backlog
from .secure import Identities
from .serving import forget_versions, keep_final_model, model_out_figures

__all__ = ["LocalStack", "StackError", "StackOptions"]

logger = logging.getLogger(__name__)


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
        self.devices = opts.devices
        self.out = opts.out
        self.log_dir = self.out / "logs"
        self.failures: list[str] = []
        self.children = ChildSet(self.log_dir, self.failures, tick=self._update)
        self.broker: EmbeddedBroker | None = None
        self.stop_event = threading.Event()
        self.hurry = threading.Event()
        self.reporting = False
        self.report_interrupted = threading.Event()
        """A Ctrl-C while the run was read back: the report is abandoned."""
        self.stopped_by = "running"
        self.prometheus_url: str | None = None
        self.monitor: Monitor | None = None
        self.kafka = cfg.kafka
        self.drained: bool | None = None
        self.final_status: dict[str, Any] = {}
        self.records: RunRecords | None = None
        """What the run left in Kafka, as read back for the report."""
        self.backlog_seconds: float | None = None
        self.identities = Identities.generate(cfg, self.devices) if opts.secure else None
        """The role principals of a secure run (`--secure`), None otherwise."""
        self.kafka_ready = False
        self.started = False
        self.started_at = datetime.now().astimezone()

    # ---- the whole run -------------------------------------------------------------------------

    def run(self) -> StackReport | None:
        """Start everything, run until a stop condition, stop in order, and write the report.

        Returns:
            The report (also written to `out/report.json`); None when there is none (see `failures`).

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
        if self.opts.external:
            self._open_external()
        if self.opts.backlog > 0:
            self._produce_backlog()
        plan = plan_services(self.cfg, self.opts, self.kafka, self.identities)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}
        self.monitor = plan.monitor(self.devices, objective_for_report(self.cfg.trainer))
        self.prometheus_url = start_prometheus(self.opts, plan, self.children, dict(os.environ), self.say)
        if self.prometheus_url is not None:
            self.monitor.notes.append(f"Prometheus {self.prometheus_url}  (try {self.prometheus_url}"
                                      "/graph?g0.expr=streamtrain_trainer_batch_samples)")
        self._start_services(plan, env)
        self.monitor.notes.append(f"run directory {self.out} (logs in {self.log_dir})")
        self.say(f"stack up: {len(self.devices)} devices, coordinator {plan.coordinator_url}/status"
                 + (f", Prometheus {self.prometheus_url}" if self.prometheus_url else ""))

    def _start_services(self, plan: ServicePlan, env: dict[str, str]) -> None:
        assert self.monitor is not None
        if plan.bridge is not None:  # first: its start-up check of the sources and decoders fails fast, on its own
            self.monitor.phase = "starting the bridge (checking its sources)"
            self._await(self.children.spawn(plan.bridge, env), f"http://{plan.host}:{plan.bridge.ports[0]}/metrics")
        self.monitor.phase = "starting the coordinator"
        coord = self.children.spawn(plan.coordinator, env)
        self._await(coord, f"{plan.coordinator_url}/status")
        # Ranks first: they take longest to start (torch), and a stream with nobody training it only builds lag.
        self.monitor.phase = "starting trainer ranks"
        ranks = self.children.spawn(plan.trainers, env)
        for port in plan.trainers.ports:
            self._await(ranks, f"http://{plan.host}:{port}/metrics")
        if plan.serve is not None:
            self.monitor.phase = "starting serve"
            serve = self.children.spawn(plan.serve, env)
            # The request load from the start, as clients are there before a model is: the first versions are
            # answered with (and measured) as they come, not once the load has started too.
            if plan.requests is not None:
                self.children.spawn(plan.requests, env)
            self._await(serve, f"http://{plan.host}:{plan.serve.ports[0]}/metrics")
        self.monitor.phase = "starting producers"
        producers = [self.children.spawn(spec, env) for spec in plan.producers]  # all at once: each takes a while
        for child, spec in zip(producers, plan.producers, strict=True):
            self._await(child, f"http://{plan.host}:{spec.ports[0]}/metrics")

    def _start_broker(self) -> None:
        kafka = existing_kafka(self.cfg, self.opts.broker, self.identities is not None, self.started_at, self.say)
        if kafka is None:
            port = broker_port(self.cfg.broker, bool(self.opts.external))  # where the user's clients look
            self.broker = embedded_broker(self.cfg, self.out, self.identities, port)  # stopped by _stop_all
            kafka = start_embedded(self.broker, self.cfg, self.devices, self.identities, self.say)
        self.kafka = kafka
        self.kafka_ready = True

    def _open_external(self) -> None:
        """Create the external devices' topics, and say where and until when to publish."""
        try:
            opened = open_external_devices(self.kafka, self.opts.external, self.out, self.identities)
        except KafkaException as exc:
            raise StackError(f"could not create the external devices' topics: {exc}") from None
        opts = self.opts
        ending = (f"the run stops {opts.duration_s:g} s after every service is up" if opts.duration_s is not None
                  else f"the run stops after {opts.steps} steps" if opts.steps is not None
                  else "the run goes on until Ctrl-C")
        for line in publish_instructions(self.kafka, opened, ending, self.identities is not None):
            self.say(line)

    def _produce_backlog(self) -> None:
        ids, opts = self.identities, self.opts
        try:
            if opts.replay:  # not with identities: `up` refuses --secure with --dataset
                self.backlog_seconds = produce_replay_backlog(
                    self.kafka, self.cfg.producer, opts.streams, opts.seed, opts.backlog)
            else:
                self.backlog_seconds = produce_backlog(
                    self.kafka, self.cfg.producer, opts.streams, opts.seed, opts.backlog,
                    kafka_for=partial(ids.producer_kafka, self.kafka) if ids is not None else None)
        except ProducerError as exc:
            raise StackError(f"the backlog could not be produced: {exc}") from None
        self.say(f"backlog: {opts.backlog} samples per device produced in {self.backlog_seconds:.1f} s")

    def _await(self, child: Child, url: str) -> None:
        self.children.await_http(child, url, self.opts.start_timeout_s, self.stop_event.is_set)

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
            if dead := self.children.dead():
                c = dead[0]
                self.failures.append(f"{c.name} exited with status {c.returncode}; see {c.log_path}")
                self.stopped_by = f"{c.name} exited"
                break
            self.monitor.poll_status()
            step = self.monitor.step()
            first_step = step if first_step is None else first_step
            if (reason := self._stop_reason(time.monotonic() - began, step, first_step)) is not None:
                self.stopped_by = reason
                break
            self._update()
            self.stop_event.wait(0.5)

    def _stop_reason(self, seconds: float, step: int | None, first_step: int | None) -> str | None:
        """Which of the run's own stop conditions holds now (None: none)."""
        opts = self.opts
        if opts.duration_s is not None and seconds >= opts.duration_s:
            return f"--duration {opts.duration_s:g}"
        if opts.steps is not None and step is not None and step - (first_step or 0) >= opts.steps:
            return f"--steps {opts.steps}"
        if opts.until_step is not None and step is not None and step >= opts.until_step:
            return f"step {opts.until_step}"
        return None

    # ---- stop ----------------------------------------------------------------------------------

    def _phase(self, phase: str) -> None:
        if self.monitor is not None:
            self.monitor.phase = phase

    def _stop_all(self) -> StackReport | None:
        report: StackReport | None = None
        series: dict[str, Any] = {}
        self.stop_event.set()  # from now on a Ctrl-C means "hurry": skip the drain
        try:
            self._phase("stopping producers")
            self.children.stop_kind("producer", signal.SIGINT, 120.0)
            self._stop_bridge()
            if self.started and not self.failures and self.opts.drain_timeout_s > 0:
                self._drain()
            self._phase("stopping trainers (final step, checkpoint, commit)")
            self.children.stop_kind("trainer", signal.SIGTERM, 120.0)
            if self.children.of_kind("serve"):
                self._stop_serving()
            if self.monitor is not None:
                self.final_status = self.monitor.poll_status()
            self._phase("stopping the coordinator")
            self.children.stop_kind("coordinator", signal.SIGTERM, 30.0)
            if self.started and self.kafka_ready:
                report, series = self._report()
        finally:
            self.children.stop_kind("prometheus", signal.SIGTERM, 30.0)
            self.children.kill_all()
            if self.broker is not None:
                self.broker.stop()
                self.say("embedded Kafka broker stopped")
        if report is not None:
            report = write_plots(report, series, self.out, self.failures)
        return report

    def _run_config(self) -> StreamtrainConfig:
        """The configuration on the Kafka the run uses, with the bridge's settings as the run gave them."""
        update: dict[str, Any] = {"kafka": self.kafka}
        if self.opts.bridge is not None:
            # The source cluster as the bridge has it: the --bridge file's, else the run's configuration's.
            section = {"source_cluster": self.cfg.bridge.source_cluster,
                       **run_bridge_settings(self.opts.bridge, self.kafka, self.devices)}
            update["bridge"] = self.cfg.bridge.model_validate(section)
        return self.cfg.model_copy(update=update)

    def _stop_bridge(self) -> None:
        """Give the bridge the drain timeout to catch up with its sources, then stop it (it commits what it holds)."""
        bridges = self.children.of_kind("bridge")
        if not bridges:
            return
        if self.started and not self.failures and self.opts.drain_timeout_s > 0 and not self.hurry.is_set():
            self._phase("draining: the bridge catches up with its sources")
            wait_caught_up(self._run_config(), self.opts.drain_timeout_s,
                           lambda: bridges[0].running() and not self.hurry.is_set(), self._update)
        self._phase("stopping the bridge")
        self.children.stop_kind("bridge", signal.SIGTERM, 60.0)

    def _stop_serving(self) -> None:
        """Give serve a moment to answer with the trainers' final version, then stop the requests and serve."""
        if not self.hurry.is_set():
            self.hurry.wait(1.5)  # the final version is announced as the ranks exit; a request at 20/s follows
        self.children.stop_kind("requests", signal.SIGTERM, 30.0)
        self.children.stop_kind("serve", signal.SIGTERM, 60.0)

    def _device_ends(self) -> dict[str, int] | None:
        """Each device topic's end offset now (summed over its partitions); None when the broker does not say."""
        consumer = make_consumer(self.kafka, f"streamtrain-up-drain-{os.getpid()}")
        try:
            return {d: sum(h for _, h in tail_positions(consumer, self.kafka.topics.device(d), None, 30.0).values())
                    for d in self.devices}
        except (KafkaException, TimeoutError) as exc:
            logger.warning("cannot read the device topics' ends (%s); skipping the drain", exc)
            return None
        finally:
            consumer.close()

    def _drain(self) -> None:
        """Wait until every device's lowest unprocessed offset reaches its topic's end (or the drain timeout)."""
        assert self.monitor is not None
        self.monitor.phase = "draining: trainers work off the backlog"
        ends = self._device_ends()
        if ends is None:
            return
        deadline = time.monotonic() + self.opts.drain_timeout_s
        while time.monotonic() < deadline and not self.hurry.is_set():
            floors = {d.get("device"): d.get("lowest_unprocessed") or 0
                      for d in self.monitor.poll_status().get("devices", [])}
            if all(floors.get(d, 0) >= ends[d] for d in self.devices):
                self.drained = True
                return
            if any(not c.running() for c in self.children.of_kind("trainer")):
                break
            self._update()
            time.sleep(0.5)
        self.drained = False
        logger.warning("the backlog did not drain within %.0f s (--drain-timeout); what is left stays in Kafka, "
                       "reported as pending", self.opts.drain_timeout_s)

    def _report(self) -> tuple[StackReport | None, dict[str, Any]]:
        self._phase("reading the run back from Kafka")
        self._update()
        cfg = self._run_config()
        settings = run_settings(cfg, self.opts, self.final_status, started_at=self.started_at.isoformat(
            timespec="seconds"), stopped_by=self.stopped_by, drained=self.drained, prometheus_url=self.prometheus_url,
            failures=list(self.failures))
        self.reporting = True
        try:
            back = read_back(cfg, self.devices, settings, self.out, self.report_interrupted.is_set)
        finally:
            self.reporting = False
        if back.failure is not None:
            self.failures.append(back.failure)
        self.records = back.records
        report = back.report
        why = nothing_trained(cfg, report, back.records) if report is not None and back.records is not None else None
        if why is not None:  # its versions are of a model that learned nothing: an earlier run's model stays
            self.failures.append(why)
            self.say("model: none kept, the run trained no sample (see the failure below)")
        kept = keep_final_model(self.out / "versions", self.out / "model", self.say) if why is None else None
        if report is not None:
            try:
                figures = model_out_figures(cfg, self.out / "model", serving=self.opts.serve, series=back.series)
            except (KafkaException, TimeoutError) as exc:
                self.failures.append(f"could not read the model versions and predictions back: {exc}")
            else:
                figures = figures if kept is not None else figures.model_copy(update={"model_dir": None})
                report = report.model_copy(update={"model_out": figures})
                report.write(self.out / "report.json", indent=2)
        return report, back.series
