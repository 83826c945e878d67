"""SIGKILL the (private) broker while the producers stream and the coordinator and two trainer ranks run,
restart it on the same data directory and ports: every service rides through the outage without a
restart of its own, training resumes, and every produced seq is trained exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_helpers import FaultStack, assert_nothing_lost

from streamtrain.broker import EmbeddedBroker
from streamtrain.config import KafkaConfig

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]  # 30-45 s each

DEVICES = ("0", "1")
PER_DEVICE = 300
RATE = 20.0  # ~15 s of streaming: the kill lands in the middle (a restart takes 5-20 s on a busy machine)
OUTAGE_S = 3.0


def test_services_ride_through_a_broker_crash_and_restart_and_lose_nothing(
        broker_factory: Callable[..., EmbeddedBroker], tmp_path: Path) -> None:
    broker = broker_factory(heap="512m")
    bootstrap = broker.start()
    kafka = KafkaConfig(bootstrap_servers=bootstrap, topic_prefix="bkill")
    stack = FaultStack(kafka, tmp_path, "bkill", DEVICES)
    try:
        coordinator = stack.coordinator().start()
        coordinator.wait_for(r"coordinating job", 60)
        trainer = stack.start_trainer()
        producer = stack.producer("producer", DEVICES, PER_DEVICE, RATE).start()
        stack.wait_trained(dict.fromkeys(DEVICES, 60), 60, watch=(coordinator, trainer, producer))

        broker.kill()
        down = stack.trained_seqs()
        time.sleep(OUTAGE_S)
        for svc in (coordinator, trainer, producer):
            assert svc.alive(), f"{svc.name} exited while the broker was down:\n{svc.tail()}"
        assert broker.start() == bootstrap  # same data directory, same ports

        stack.wait_trained({d: n + 40 for d, n in down.items()}, 60, watch=(coordinator, trainer))
        stack.wait_trained(dict.fromkeys(DEVICES, PER_DEVICE), 90, watch=(coordinator, trainer))
        assert producer.proc is not None and producer.proc.wait(30) == 0, producer.tail()
        assert trainer.stop(60) == 0, trainer.tail()
        assert coordinator.stop(30) == 0, coordinator.tail()
        assert (coordinator.starts, trainer.starts, producer.starts) == (1, 1, 1)  # nothing needed a restart
        fates, feedback = stack.account(dict.fromkeys(DEVICES, PER_DEVICE))
    finally:
        stack.cleanup()

    # Exactly once: nothing lost, and no step retrained (no service restarted, so none re-read its input).
    assert_nothing_lost(fates)
    for device in DEVICES:
        steps = sorted((f.step, f.plan_step) for f in feedback if f.device_id == device)
        assert [s for s, _ in steps] == list(range(len(steps)))  # every step's feedback delivered once
        # The restarted broker carried plans again: the run ends mostly on the coordinator's plans, not
        # local ones (one late plan on a loaded machine falls back locally, by design).
        assert sum(p == s for s, p in steps[-10:]) >= 7, steps[-10:]
