"""Step 0 planned from the ranks' start-up profiles (LBB's profiling phase), and the warm start where one is missing."""

from __future__ import annotations

from dataclasses import replace

import pytest
from coordinator_helpers import feedback

from streamtrain.config import CoordinatorConfig, StreamtrainConfig
from streamtrain.coordinator.fleet import FleetTracker
from streamtrain.coordinator.policies import plan_step
from streamtrain.coordinator.service import Coordinator
from streamtrain.coordinator.state import Plan
from streamtrain.wire import DeviceProfile

DEVICES = ("0", "1", "2", "3")
FAST_A = 1e-4  # seconds per unit of size
MEAN_SIZE = 100.0


def _profile(device: str, a: float, b: float = 0.0, mean: float = MEAN_SIZE) -> DeviceProfile:
    sizes = (1600, 6400, 12800)  # a rank profiles 1/4, 1 and 2 times its share of global_batch (256 / 4 devices)
    return DeviceProfile(job="j", device_id=device, rank=int(device), sizes=sizes,
                         seconds=tuple(a * s + b for s in sizes), slope=a, intercept=b, mean_sample_size=mean,
                         profile_seconds=0.2, sent_at=1)


def _fleet(policy: str = "ett-stream", **kw: object) -> FleetTracker:
    fleet = FleetTracker(CoordinatorConfig(policy=policy, devices=DEVICES, global_batch=256, **kw))  # type: ignore[arg-type]
    for d in DEVICES:
        fleet.observe_offsets(d, log_start=0, end=1500, committed=None, at=0.0)
    return fleet


def _step0(fleet: FleetTracker) -> Plan:
    assert fleet.warm_start_step() == 0
    return plan_step(fleet.planning_state(0, now=0.0), fleet.config)


@pytest.mark.parametrize("policy", ["ett-stream", "lbbsp", "lbb"])
def test_step0_from_profiles_gives_a_4x_slower_device_a_quarter_and_balances_the_step(policy: str) -> None:
    fleet = _fleet(policy)
    for d in DEVICES:
        assert fleet.ingest_profile(_profile(d, FAST_A * (4 if d == "3" else 1)), received=0.0)
    plan = _step0(fleet)
    counts = {p.device_id: p.count for p in plan.devices}
    fast = [counts[d] for d in ("0", "1", "2")]
    assert max(fast) - min(fast) <= 1
    assert counts["3"] / (sum(fast) / 3) == pytest.approx(0.25, abs=0.03)
    predicted = [p.predicted_seconds for p in plan.devices]
    assert min(predicted) > 0 and max(predicted) / min(predicted) < 1.1  # balanced: no straggler at step 0
    assert plan.global_batch <= 256


def test_without_profiles_step0_is_the_equal_warm_share() -> None:
    plan = _step0(_fleet())
    assert [p.count for p in plan.devices] == [64, 64, 64, 64]  # what step 0 was before profiles: a static step


def test_a_device_without_a_profile_keeps_the_warm_start() -> None:
    fleet = _fleet()
    for d in ("0", "1", "2"):
        fleet.ingest_profile(_profile(d, FAST_A), received=0.0)
    states = {s.device_id: s for s in fleet.planning_state(0, now=0.0).devices}
    cfg = fleet.config
    warm = states["3"].model
    assert (warm.a, warm.b, warm.fitted) == (cfg.warm_start_a, cfg.warm_start_b, False)
    assert states["3"].mean_size == 1.0  # no size known for it either
    profiled = states["0"].model
    assert (profiled.a, profiled.b, profiled.fitted, profiled.largest) == (FAST_A, 0.0, True, 12800.0)
    assert states["0"].mean_size == MEAN_SIZE
    plan = _step0(fleet)
    counts = {p.device_id: p.count for p in plan.devices}
    assert counts["3"] == 64  # its warm share, by count
    assert counts["0"] != 64  # the profiled ones are planned from their profiles


def test_profiles_settle_when_all_are_in_or_after_the_wait() -> None:
    fleet = _fleet(profile_wait_seconds=3.0)
    assert fleet.profiles_settled(now=0.0) == frozenset()  # none: plan from the warm start at once
    fleet.ingest_profile(_profile("0", FAST_A), received=10.0)
    fleet.ingest_profile(_profile("1", FAST_A), received=10.5)
    assert fleet.profiles_settled(now=12.9) is None  # waiting for the others
    assert fleet.profiles_settled(now=13.0) == {"0", "1"}  # the wait is over: plan with those there are
    fleet.ingest_profile(_profile("2", FAST_A), received=13.1)
    fleet.ingest_profile(_profile("3", FAST_A), received=13.2)
    assert fleet.profiles_settled(now=13.2) == set(DEVICES)


def test_a_profile_after_feedback_or_with_profiles_off_is_ignored() -> None:
    fleet = _fleet()
    fleet.ingest_feedback(feedback(0, "0", seconds=0.3), received=0.0)
    assert not fleet.ingest_profile(_profile("0", FAST_A), received=0.0)
    assert fleet.devices["0"].profile is None
    off = _fleet(use_profiles=False)
    assert not off.ingest_profile(_profile("0", FAST_A), received=0.0)
    assert off.planning_state(0, now=0.0).devices[0].model.fitted is False


def test_after_the_first_feedback_the_model_is_the_feedbacks_as_without_a_profile() -> None:
    profiled, plain = _fleet(), _fleet()
    profiled.ingest_profile(_profile("0", FAST_A, b=0.01), received=0.0)
    assert profiled.devices["0"].model.a == FAST_A
    for fleet in (profiled, plain):
        fleet.ingest_feedback(feedback(0, "0", new=range(5), seconds=0.3), received=0.0)
    assert profiled.devices["0"].model == plain.devices["0"].model  # only step 0 is planned from the profile
    assert profiled.devices["0"].mean_size == plain.devices["0"].mean_size == 10.0  # the first real size


def test_a_device_that_sat_step0_out_is_planned_from_its_profile_scaled_as_its_peers_steps_proved() -> None:
    fleet = _fleet()
    for d in DEVICES:
        fleet.ingest_profile(_profile(d, FAST_A * (4 if d == "3" else 1), b=0.01), received=0.0)
    assert fleet.profile_scale() == 1.0  # nothing measured yet: the profiles as the ranks measured them
    for i, d in enumerate(("0", "1", "2")):  # a step costs more than forward and backward: 2x, 2.5x, 3x the profile
        fleet.ingest_feedback(feedback(0, d, seconds=(2 + i / 2) * (FAST_A * 40 + 0.01)), received=0.0)
    fleet.ingest_feedback(replace(feedback(0, "3", seconds=0.05), samples=0, total_size=0), received=0.0)
    assert fleet.profile_scale() == pytest.approx(2.5)
    sat_out = fleet.planning_state(1, now=0.0).devices[3].model
    assert (sat_out.a, sat_out.b) == (pytest.approx(2.5 * 4 * FAST_A), pytest.approx(0.025))
    assert fleet.devices["3"].model.a == 4 * FAST_A  # as measured (the status page)


def test_service_plans_step0_again_once_every_profile_is_in() -> None:
    cfg = StreamtrainConfig(job="j", coordinator=CoordinatorConfig(devices=DEVICES, global_batch=256,
                                                                   profile_wait_seconds=3.0))
    service = Coordinator(cfg, serve_http=False)
    published: list[dict[str, int]] = []

    def publish(step: int, complete: bool, basis: int, warm: bool = False) -> None:
        assert (step, basis, warm) == (0, -1, True)
        plan = plan_step(service.fleet.planning_state(0, now=0.0), service.ccfg)
        published.append({p.device_id: p.count for p in plan.devices})

    service._publish = publish  # type: ignore[method-assign]
    for d in DEVICES:
        service.fleet.observe_offsets(d, log_start=0, end=1500, committed=None, at=0.0)
    service._publish_warm(now=0.0)
    assert published == [{"0": 64, "1": 64, "2": 64, "3": 64}]  # no profile yet: the warm start, at once
    service._publish_warm(now=1.0)
    assert len(published) == 1  # nothing changed: not again
    for d in ("0", "1", "2"):
        service._on_profile(_profile(d, FAST_A))
    service._publish_warm(now=time_after(service, 1.0))
    assert len(published) == 1  # waiting for device 3's profile (the ranks wait for this plan)
    service._on_profile(_profile("3", 4 * FAST_A))
    service._publish_warm(now=time_after(service, 1.1))
    assert len(published) == 2
    assert published[1]["3"] < published[1]["0"] / 3  # the slow device's share shrank from its profile
    service.fleet.ingest_feedback(feedback(0, "0"), received=0.0)
    service._on_profile(_profile("1", FAST_A))
    service._publish_warm(now=time_after(service, 9.0))
    assert len(published) == 2  # feedback is in: plans follow it, not profiles


def time_after(service: Coordinator, seconds: float) -> float:
    """`seconds` after the first profile arrived, on the clock the fleet was given."""
    first = service.fleet._first_profile
    assert first is not None
    return first + seconds
