"""Every metric family the producers, the coordinator, a trainer rank, serve and the bridge export, for tests that
audit them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from streamtrain.bridge.metrics import BridgeMetrics
from streamtrain.config.trainer import TrainerConfig
from streamtrain.coordinator.metrics import CoordinatorMetrics
from streamtrain.objectives import build_objective
from streamtrain.producers.metrics import ProducerMetrics
from streamtrain.serve.metrics import ServeMetrics
from streamtrain.trainer.metrics import ObjectiveMetrics, TrainerMetrics


def service_metric_families() -> list[tuple[str, Metric]]:
    """(service, metric family) of each service's metrics, declared on fresh registries with one device."""
    producer = CollectorRegistry()
    ProducerMetrics(producer, ["0"])
    trainer = CollectorRegistry()
    TrainerMetrics(trainer, "0", "job")
    ObjectiveMetrics(trainer, "0", "job", build_objective(TrainerConfig()), 10)
    coordinator = CoordinatorMetrics(CollectorRegistry(), "job")
    coordinator.add_device("0")
    serve = CollectorRegistry()
    ServeMetrics(serve, "job")
    bridge = CollectorRegistry()
    BridgeMetrics(bridge, "job", ["events"], ["0"])
    return [(service, family) for service, registry in
            (("producer", producer), ("trainer", trainer), ("coordinator", coordinator.registry), ("serve", serve),
             ("bridge", bridge)) for family in registry.collect()]
