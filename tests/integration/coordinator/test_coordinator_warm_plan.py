"""On the real broker: step-0 plans before any feedback, and plan latency as a fraction of the step."""

from __future__ import annotations

import json
import threading
import time

import pytest
from coordinator_it_helpers import JOB, Plans, Trainers, config, get, produce_samples

from streamtrain.config import KafkaConfig
from streamtrain.coordinator.service import Coordinator

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("ahead", [1, 0])
def test_step_zero_is_planned_from_warm_start_then_feedback_takes_over(kafka_cfg: KafkaConfig, ahead: int) -> None:
    sizes = produce_samples(kafka_cfg, {"cam0": 30, "cam1": 50})
    service = Coordinator(config(kafka_cfg, devices=("cam0", "cam1"), policy="ett-stream", plan_ahead=ahead,
                                 global_batch=16))
    thread = threading.Thread(target=service.run, name="coordinator-warm")
    trainers, plans = Trainers(kafka_cfg), Plans(kafka_cfg)
    try:
        started = time.monotonic()
        thread.start()
        # No feedback was ever sent: step 0 only. With plans made ahead too, step 1 waits for step 0's feedback
        # (a plan ahead from nothing but guesses would cost a static step on an uneven fleet).
        warm = plans.wait(0, timeout=30)
        assert warm.job == JOB and warm.policy == "ett-stream" and warm.basis_step == -1
        for device in ("cam0", "cam1"):
            part = warm.for_device(device)
            # No index, no sample size and no speed known yet: each device's share of global_batch, by count.
            assert part is not None and not part.offsets and part.count == 8 and part.size_budget is None
        with pytest.raises(AssertionError, match="no plan for step 1"):
            plans.wait(1, timeout=1.5)
        _ctype, body = get(service.port, "/status")
        status = json.loads(body)
        assert status["last_plan"]["step"] == 0 and status["last_plan"]["warm_start"] is True
        assert status["plan_latency_step_fraction_median"] is None  # no step has run yet
        reg = service.metrics.registry
        assert reg.get_sample_value("streamtrain_coordinator_plans_warm_start_total", {"job": JOB}) == 1

        # The trainers ran step 0 on that plan (taking their 8 oldest) and report: the next plans have offsets,
        # made from that feedback (with plans ahead, plan 2 too, without plan 1's samples).
        for rank, device in enumerate(("cam0", "cam1")):
            n = len(sizes[device])
            trainers.report(0, device, rank, [(o, sizes[device][o]) for o in range(8, n)], lowest=8, depth=n - 8,
                            seconds=2.0)
        after = [plans.wait(s) for s in range(1, 2 + ahead)]
        for device in ("cam0", "cam1"):
            parts = [p.for_device(device) for p in after]
            assert all(p is not None and p.offsets and min(p.offsets) >= 8 for p in parts)
            assert all(p.basis_step == 0 for p in after)
            if ahead:
                assert not set(parts[0].offsets) & set(parts[1].offsets)  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while True:
            status = json.loads(get(service.port, "/status")[1])
            if status["last_plan"]["step"] == 1 + ahead:
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        fraction = status["last_plan"]["latency_step_fraction"]
        assert fraction == pytest.approx(status["last_plan"]["latency_ms"] / 1e3 / 2.0)
        assert 0 < fraction < 0.01 and 0 < status["plan_latency_step_fraction_median"] < 0.01
        if not ahead:  # one plan made from a step's feedback so far (with plans ahead, two: plans 1 and 2)
            assert status["plan_latency_step_fraction_median"] == pytest.approx(fraction)
        gauge = reg.get_sample_value("streamtrain_coordinator_plan_latency_step_ratio", {"job": JOB})
        assert gauge == pytest.approx(fraction)
        assert reg.get_sample_value("streamtrain_coordinator_plans_warm_start_total", {"job": JOB}) == 1
        assert time.monotonic() - started < 60
    finally:
        service.stop()
        thread.join(30)
        trainers.close()
        plans.close()
    assert not thread.is_alive()
