"""Pause one device's producer (SIGSTOP) for a few seconds, then resume it (SIGCONT), while the coordinator
and two trainer ranks run: the fleet keeps stepping (the starved device trains zero samples, and the
weighted aggregation takes a zero-weight rank), the resumed stream is trained, and nothing is lost.
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path

import pytest
from fault_helpers import FaultStack, assert_nothing_lost

from streamtrain.config import KafkaConfig

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]  # 30-45 s each

DEVICES = ("0", "1")
PER_DEVICE = 300
RATE = 25.0  # ~12 s of streaming per device
PAUSE_S = 4.0


def test_paused_producer_starves_its_rank_without_stalling_the_fleet_and_loses_nothing(
        kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    stack = FaultStack(kafka_cfg, tmp_path, "pause", DEVICES)
    try:
        coordinator = stack.coordinator().start()
        coordinator.wait_for(r"coordinating job", 60)
        trainer = stack.start_trainer()
        producers = {d: stack.producer(f"producer{d}", [d], PER_DEVICE, RATE, seed=int(d) + 1).start()
                     for d in DEVICES}
        stack.wait_trained(dict.fromkeys(DEVICES, 40), 60, watch=(coordinator, trainer))
        paused = producers["1"]
        paused.signal(signal.SIGSTOP)
        stopped_ms = time.time() * 1000
        time.sleep(PAUSE_S)
        during = stack.trained_seqs()
        paused.signal(signal.SIGCONT)
        resumed_ms = time.time() * 1000
        assert during["0"] < PER_DEVICE  # device 0 was still streaming through the pause
        stack.wait_trained(dict.fromkeys(DEVICES, PER_DEVICE), 60, watch=(coordinator, trainer))
        for name, producer in producers.items():
            assert producer.proc is not None and producer.proc.wait(30) == 0, (name, producer.tail())
        assert trainer.stop(60) == 0, trainer.tail()
        assert coordinator.stop(30) == 0, coordinator.tail()
    finally:
        stack.cleanup()

    fates, feedback = stack.account(dict.fromkeys(DEVICES, PER_DEVICE))
    assert_nothing_lost(fates)
    by_step: dict[int, dict[str, int]] = {}
    for f in feedback:
        by_step.setdefault(f.step, {})[f.device_id] = f.samples
        assert f.loss is None or math.isfinite(f.loss), f  # a zero-sample rank never poisons the model
    assert all(sorted(v) == list(DEVICES) for v in by_step.values())  # both ranks reported every step
    # Well inside the pause (the starved rank may first drain what it had buffered), the fleet kept
    # stepping: device 0 trained on while device 1, with nothing new, trained nothing.
    inside = [f.step for f in feedback if f.device_id == "0" and stopped_ms + 1500 <= f.sent_at <= resumed_ms]
    assert len(inside) >= 2, feedback
    assert all(by_step[s]["1"] == 0 for s in inside), [by_step[s] for s in inside]
    assert sum(by_step[s]["0"] for s in inside) > 0, [by_step[s] for s in inside]
    assert sum(f.samples for f in feedback if f.device_id == "1" and f.sent_at > resumed_ms) > 0  # resumed
