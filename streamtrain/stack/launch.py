"""What a run starts, and where each service listens: the `ServicePlan` of `streamtrain up`.

`plan_services` picks free ports and builds one command line per service (`stack.services`): the producers
(none with a backlog or a bridge; one for every device when a dataset is replayed), the bridge (`up --bridge`), the
coordinator, the trainer ranks (publishing model versions to `<out>/versions`) and, with `--serve`, serve and its
request load (`stack.serving`), each logged in as its own role on a secure run. The plan then knows every URL the
live view polls and Prometheus scrapes. A new kind of service the stack starts belongs here, as a spec and its port.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.net import free_port_block, free_ports
from streamtrain.objectives import Objective

from .bridging import bridge_spec, run_bridge_settings
from .monitor import Monitor
from .options import StackOptions
from .procs import ChildSet, wait_http
from .prometheus import INSTALL_HINT, find_prometheus, scrape_config
from .replay import replay_producer_spec
from .secure import Identities
from .services import ServiceSpec, coordinator_spec, producer_spec, prometheus_spec, trainer_spec
from .serving import request_spec, serve_spec

__all__ = ["ServicePlan", "plan_services", "start_prometheus"]


@dataclass(frozen=True)
class ServicePlan:
    """The services of one run, and the address each listens on."""

    host: str
    """Where the services' HTTP endpoints answer (the metrics bind address, or loopback for a wildcard)."""
    producers: list[ServiceSpec]
    producer_ports: dict[str, int]
    """Device -> the metrics port of the producer writing its topic (none for an external device)."""
    coordinator: ServiceSpec
    trainers: ServiceSpec
    prometheus_port: int
    serve: ServiceSpec | None = None
    """`streamtrain serve` (with `--serve`)."""
    requests: ServiceSpec | None = None
    """Its request load (with `--serve`)."""
    bridge: ServiceSpec | None = None
    """The bridge (`up --bridge`), which writes the device topics in the producers' place."""

    @property
    def coordinator_url(self) -> str:
        return f"http://{self.host}:{self.coordinator.ports[0]}"

    def monitor(self, devices: list[str], objective: Objective | None = None) -> Monitor:
        """The live view's poller: the coordinator's status, each rank's and each producer's metrics (with the
        ranks' test-then-train metrics in `objective`'s terms when it is given)."""
        return Monitor(devices, self.coordinator_url,
                       {d: f"http://{self.host}:{port}/metrics" for d, port in zip(devices, self.trainers.ports,
                                                                                   strict=True)},
                       {d: f"http://{self.host}:{port}/metrics" for d, port in self.producer_ports.items()}, objective)

    def scrape_targets(self) -> dict[str, list[str]]:
        """Prometheus's jobs: every service's `host:port`."""
        return {"producers": [f"{self.host}:{p.ports[0]}" for p in self.producers],
                "coordinator": [f"{self.host}:{self.coordinator.ports[0]}"],
                "trainers": [f"{self.host}:{p}" for p in self.trainers.ports],
                "serve": [f"{self.host}:{p}" for p in (self.serve.ports if self.serve is not None else ())],
                "bridge": [f"{self.host}:{self.bridge.ports[0]}"] if self.bridge is not None else []}


def plan_services(cfg: StreamtrainConfig, opts: StackOptions, kafka: KafkaConfig,
                  identities: Identities | None) -> ServicePlan:
    """Every service of the run on free ports, on the Kafka of `kafka`, started with the parent's options."""
    bind = cfg.metrics.bind_address
    devices = opts.devices
    n = len(devices)
    ports = free_ports(n + 4, bind)
    producer_ports, coord_port, prom_port, serve_port = ports[:n], ports[n], ports[n + 1], ports[n + 2]
    bridge_port = ports[n + 3]
    trainer_base = free_port_block(n, bind, avoid=ports)
    common: dict[str, object] = {"kafka.bootstrap_servers": kafka.bootstrap_servers,
                                 "kafka.topic_prefix": kafka.topic_prefix, "versions.dir": str(opts.out / "versions")}
    args = list(opts.global_args)
    bridge = (bridge_spec(bridge_port, run_bridge_settings(opts.bridge, kafka, devices), common, args)
              if opts.bridge is not None else None)
    if opts.backlog > 0 or bridge is not None:
        producers, writes = [], {}
    elif opts.replay:  # one producer for every device: the dataset is loaded and sharded once
        producers = [replay_producer_spec(opts.streams, opts.seed, producer_ports[0], common, args)]
        writes = dict.fromkeys(devices, producer_ports[0])
    else:  # none for an external device: the user's application writes its topic
        producers = [producer_spec(s, i, opts.seed, producer_ports[i], common, args) for i, s in opts.produced]
        writes = {s.device_id: producer_ports[i] for i, s in opts.produced}
    coordinator = coordinator_spec(devices, opts.policy, opts.truncation, coord_port, common, args)
    # The ranks check each plan's truncation against the policy the coordinator was told to follow.
    trainer_sets = {**common, "coordinator.truncation": opts.truncation} if opts.truncation else common
    trainers = trainer_spec(devices, trainer_base, opts.out / "checkpoints", opts.torch_threads, trainer_sets, args)
    if identities is not None:  # each service logs in as its own role
        producers = [replace(p, env=identities.env(identities.producers[s.device_id]))
                     for p, (_, s) in zip(producers, opts.produced, strict=False)]
        coordinator = replace(coordinator, env=identities.env(identities.coordinator))
        trainers = replace(trainers, env=identities.env(identities.trainer))
    host = "127.0.0.1" if bind in ("0.0.0.0", "::") else bind
    serve = serve_spec(serve_port, common, args) if opts.serve else None
    requests = request_spec(opts.request_rate, common, args) if opts.serve else None
    return ServicePlan(host, producers, writes, coordinator, trainers, prom_port, serve, requests, bridge)


def start_prometheus(opts: StackOptions, plan: ServicePlan, children: ChildSet, env: dict[str, str],
                     say: Callable[[str], None]) -> str | None:
    """Start Prometheus scraping every service of `plan`; returns its URL, or None when the run goes without it."""
    if not opts.prometheus:
        say("Prometheus: off (--no-prometheus)")
        return None
    binary = find_prometheus(opts.prometheus_binary)
    if binary is None:
        say(f"Prometheus: no `prometheus` binary found, running without it ({INSTALL_HINT}); "
            "the live view and the report do not need it")
        return None
    prom_dir = opts.out / "prometheus"
    prom_dir.mkdir(parents=True, exist_ok=True)
    config = prom_dir / "prometheus.yml"
    config.write_text(scrape_config(plan.scrape_targets(), opts.scrape_interval_s))
    child = children.spawn(prometheus_spec(binary, config, prom_dir / "data", plan.host, plan.prometheus_port), env)
    url = f"http://{plan.host}:{plan.prometheus_port}"
    if not wait_http(f"{url}/-/ready", 30.0, child):
        say(f"Prometheus did not become ready (see {child.log_path}); running without it")
        children.discard(child)
        return None
    return url
