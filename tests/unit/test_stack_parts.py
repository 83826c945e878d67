"""The stack's pure parts: service command lines (checked by the real config loader), ports, accounting,
report figures, the scrape configuration and the dashboard variable expansion."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from streamtrain.config import ProducerConfig, StreamtrainConfig, load_config, parse_assignment
from streamtrain.dashboards.queries import dashboard_queries, expand_variables
from streamtrain.net import free_port_block, free_ports, listening_range
from streamtrain.producers.sizes import make_size_sampler
from streamtrain.report.figures import build_report, build_series
from streamtrain.report.ledger import DeviceRecords, RunRecords, tally_devices
from streamtrain.report.schema import StackReport
from streamtrain.stack.prometheus import find_prometheus, scrape_config
from streamtrain.stack.services import (
    coordinator_spec,
    device_streams,
    producer_spec,
    trainer_spec,
)
from streamtrain.wire import DeadLetter, StepFeedback, ranges_of


def _config_of(argv: tuple[str, ...]) -> StreamtrainConfig:
    """What a child started with `argv` loads: its --set flags through the real loader (no environment)."""
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    return load_config(env={}, overrides=dict(parse_assignment(s) for s in sets))


def test_streams_cycle_rates_and_sizes_and_reject_bad_values() -> None:
    streams = device_streams(5, rates=[10, 20], sizes=[30])
    assert [s.rate for s in streams] == [10, 20, 10, 20, 10]
    assert {s.size_mean for s in streams} == {30}
    assert all(s.size_dif == pytest.approx(9.0) for s in streams)
    assert [s.device_id for s in streams] == ["0", "1", "2", "3", "4"]
    defaults = device_streams(4)
    assert len({(s.rate, s.size_mean) for s in defaults}) == 4  # heterogeneous by default
    with pytest.raises(ValueError, match="--rates"):
        device_streams(2, rates=[0])
    with pytest.raises(ValueError, match="--sizes"):
        device_streams(2, sizes=[0.5])


def test_any_dif_gets_a_size_distribution_the_producers_can_draw() -> None:
    """A normal that never goes below size 1 cannot have a std near its mean: such a DIF is a lognormal."""
    kinds = {dif: device_streams(1, sizes=[30], dif=dif)[0].size_kind for dif in (0.0, 9.0, 64.0)}
    assert kinds == {0.0: "fixed", 9.0: "normal", 64.0: "lognormal"}
    for dif in kinds:
        (stream,) = device_streams(1, sizes=[30], dif=dif)
        size = ProducerConfig.model_validate({"size": {"kind": stream.size_kind, "mean": 30, "dif": dif}}).size
        drawn = make_size_sampler(size)(np.random.default_rng(0), 20_000)
        assert drawn.min() >= 1 and abs(drawn.mean() - 30) < 3
        assert abs(drawn.std() - dif) < 0.3 * dif + 1  # a lognormal's sample std is noisy: a heavy tail


def test_service_command_lines_load_as_the_intended_configuration(tmp_path: Path) -> None:
    common: dict[str, object] = {"kafka.bootstrap_servers": "127.0.0.1:1234", "kafka.topic_prefix": "demo"}
    stream = device_streams(4)[2]
    prod = producer_spec(stream, 2, 7, 4567, common, ["--set", "job=x"])
    cfg = _config_of(prod.argv)
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:1234" and cfg.kafka.topic_prefix == "demo"
    assert cfg.producer.ids() == ["2"] and cfg.producer.metrics_port == 4567 and cfg.producer.seed == 9
    assert cfg.producer.rate.mean == stream.rate and cfg.producer.size.mean == stream.size_mean
    assert cfg.producer.size.kind == "normal" and cfg.producer.size.dif == stream.size_dif
    assert cfg.job == "x"
    assert prod.argv.index("--set") < prod.argv.index("produce")

    coord = coordinator_spec(["0", "1"], "static", "persist", 999, common, [])
    assert _config_of(coord.argv).coordinator.devices == ("0", "1")
    assert coord.argv[-6:] == ("coordinate", "--port", "999", "--policy", "static", "--truncation", "persist")[-6:]

    ranks = trainer_spec(["0", "1", "2"], 5000, tmp_path, 1, common, [])
    tcfg = _config_of(ranks.argv)
    assert tcfg.metrics.port == 5000 and tcfg.trainer.torch_threads == 1
    assert ranks.ports == (5000, 5001, 5002)
    assert "--local-ranks" in ranks.argv and ranks.argv[ranks.argv.index("--devices") + 1] == "0,1,2"


def test_free_ports_stay_out_of_the_ephemeral_range_and_are_distinct() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(p in listening_range() for p in ports)
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    assert listening_range().stop <= int(ephemeral[0])


def test_free_port_block_is_consecutive_and_bindable() -> None:
    base = free_port_block(3)
    socks = []
    try:
        for port in range(base, base + 3):
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            socks.append(sock)
    finally:
        for sock in socks:
            sock.close()


def test_scrape_config_is_json_yaml_with_every_target() -> None:
    doc = json.loads(scrape_config({"trainers": ["h:1", "h:2"], "coordinator": ["h:3"], "producers": []}, 1.0))
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert set(jobs) == {"streamtrain-trainers", "streamtrain-coordinator"}
    assert jobs["streamtrain-trainers"]["static_configs"][0]["targets"] == ["h:1", "h:2"]
    assert doc["global"]["scrape_interval"] == "1s"


def _fb(device: str, step: int, trained: range | list[int], dropped: range | list[int] = (),
        loss: float | None = 1.0, t: int = 0, floor: int = 0, compute: float = 0.1) -> StepFeedback:
    return StepFeedback(job="j", step=step, device_id=device, rank=int(device), plan_step=step, samples=len(trained),
                        total_size=len(trained) * 10, compute_seconds=compute, data_wait_seconds=0.01,
                        comm_seconds=0.0, step_seconds=compute + 0.01, memory_bytes=0, loss=loss,
                        dropped=len(dropped), lowest_unprocessed_offset=floor, buffer_depth=0, sent_at=1_000_000 + t,
                        trained_offsets=ranges_of(trained), dropped_offsets=ranges_of(dropped))


def _run(records: dict[str, DeviceRecords], committed: dict[str, int | None],
         feedback: list[StepFeedback], dead: list[DeadLetter]) -> tuple[StreamtrainConfig, RunRecords]:
    cfg = StreamtrainConfig(job="j")
    topics = cfg.kafka.topics
    run = RunRecords(list(records), records, committed={(topics.device(d), 0): c for d, c in committed.items()},
                     feedback=feedback, dead_letters=dead)
    return cfg, run


def _records(offsets: range, corrupt: tuple[int, ...] = (), seqs: list[int] | None = None) -> DeviceRecords:
    """Records at `offsets` (seq = offset unless given), appended at 1,000,000 + offset ms; `corrupt` undecodable;
    the identity of a record is its seq's (so equal seqs are one sample written twice)."""
    n = len(offsets)
    off = np.asarray(offsets, dtype=np.int64)
    seq = np.asarray(seqs if seqs is not None else offsets, dtype=np.int64)
    return DeviceRecords(np.zeros(n, np.int64), off, seq, ~np.isin(off, corrupt), 1_000_000 + off, np.full(n, 10),
                         seq * 7919 + 1)


def _dead(cfg: StreamtrainConfig, device: str, offset: int, reason: str = "corrupt") -> DeadLetter:
    return DeadLetter(topic=cfg.kafka.topics.device(device), partition=0, offset=offset, reason=reason, detail="",
                      service="trainer", failed_at=0)


def test_tally_puts_every_record_in_one_bin_by_offset() -> None:
    cfg = StreamtrainConfig(job="j")
    records = {"0": _records(range(10), corrupt=(3,)), "1": _records(range(6))}
    # Device 0: 0-2 and 4-7 trained, 8-9 dropped by truncation, 3 undecodable and dead-lettered.
    feedback = [_fb("0", 0, [0, 1, 2], dropped=[8, 9]), _fb("0", 1, [4, 5, 6, 7]), _fb("1", 0, [0, 1, 5])]
    cfg, run = _run(records, {"0": 10, "1": 2}, feedback, [_dead(cfg, "0", 3)])
    t0, t1 = tally_devices(cfg, run)
    f0, f1 = t0.fates, t1.fates
    assert (f0.records, f0.trained, f0.truncated, f0.dead_lettered, f0.pending, f0.unaccounted) == (10, 7, 2, 1, 0, 0)
    assert t0.dead_letter_reasons == {"corrupt": 1} and f0.undecodable == 1 and f0.complete
    # Device 1 stopped with a backlog: 2-4 were never processed (pending, not lost); 5 was trained out of order
    # above the committed offset: trained, not pending, and not counted twice.
    assert (f1.trained, f1.pending, f1.unaccounted, f1.retrained) == (3, 3, 0, 0)
    assert f1.settled and not f1.complete


def test_tally_finds_lost_unknown_retrained_and_written_twice() -> None:
    cfg = StreamtrainConfig(job="j")
    # Offset 4 repeats offset 3's sample (same seq and bytes): written twice. Seqs start at 2e9, with gaps.
    seqs = [2_000_000_000, 2_000_000_007, 2_000_000_100, 2_000_000_101, 2_000_000_101, 2_000_000_500]
    feedback = [_fb("0", 0, [0, 1]), _fb("0", 1, [1, 3, 4, 9])]  # 1 trained twice; 9 is not in the topic
    cfg, run = _run({"0": _records(range(6), seqs=seqs)}, {"0": 5}, feedback, [])
    (t,) = tally_devices(cfg, run)
    assert t.fates.lost.tolist() == [2]  # below the committed offset, and nothing says what became of it
    assert t.fates.unknown.tolist() == [9] and t.fates.unaccounted == 2
    assert (t.fates.retrained, t.fates.written_twice, t.fates.pending) == (1, 1, 1)


def test_records_deleted_after_processing_are_accounted_from_the_feedback() -> None:
    cfg = StreamtrainConfig(job="j")
    cfg, run = _run({"0": _records(range(4, 8))}, {"0": 8}, [_fb("0", 0, [0, 1, 4, 5, 6, 7], dropped=[2, 3])], [])
    run.log_start[(cfg.kafka.topics.device("0"), 0)] = 4  # 0-3 deleted (DeleteRecords) once committed past
    (t,) = tally_devices(cfg, run)
    assert (t.fates.records, t.fates.trained, t.fates.truncated, t.fates.unaccounted) == (8, 6, 2, 0)


def test_report_has_the_required_figures_and_series(tmp_path: Path) -> None:
    records = {"0": _records(range(4)), "1": _records(range(4))}
    feedback = [_fb("0", 0, [0, 1], t=100, floor=2, compute=0.1), _fb("1", 0, [0, 1], t=110, floor=2, compute=0.3),
                _fb("0", 1, [2, 3], t=200, floor=4, loss=0.5), _fb("1", 1, [2, 3], t=210, floor=4, loss=0.25),
                # An idle step (the streams drained): counted, but not in the step figures.
                _fb("0", 2, [], t=500, floor=4, loss=None, compute=0.001),
                _fb("1", 2, [], t=510, floor=4, loss=None)]
    cfg, run = _run(records, {"0": 4, "1": 4}, feedback, [])
    figures = build_report(run, tally_devices(cfg, run))
    written = StackReport.model_validate({**dict(figures), "policy": "ett-stream", "plan_latency_ms_median": 1.0})
    on_disk = json.loads(written.write(tmp_path / "report.json", indent=2).read_text())
    for key in ("policy", "devices", "steps", "samples_produced", "samples_trained", "samples_truncated",
                "samples_dead_lettered", "samples_unaccounted", "straggler_effect_median", "step_seconds_median",
                "throughput_samples_per_s", "plan_latency_ms_median", "final_loss"):
        assert key in on_disk, key
    assert StackReport.load(tmp_path / "report.json") == written  # what `up` writes reads back as it was
    report = figures.model_dump()
    assert report["samples_produced"] == 8 and report["samples_trained"] == 8 and report["samples_unaccounted"] == 0
    assert report["steps"] == 3 and report["steps_idle"] == 1 and report["devices"] == 2
    assert report["straggler_effect_median"] == pytest.approx((0.2 / 0.2 + 0.0) / 2)  # step 0: SE 1, step 1: SE 0
    # Two steps trained: the first is the initial loss, the second the final one (the ends never overlap, else a
    # run that trained in a few steps reports one figure twice).
    assert report["initial_loss"] == pytest.approx(1.0)
    assert report["final_loss"] == pytest.approx((0.5 * 2 + 0.25 * 2) / 4)
    assert report["step_period_seconds_median"] == pytest.approx(0.1)  # the steps' last reports: 110 and 210 ms
    # Appended at 0-3 ms; device 0's offsets 0-1 were passed by its report at 100 ms, 2-3 at 200 ms; device 1 +10.
    assert report["sample_delay_seconds_median"] == pytest.approx((0.110 + 0.197) / 2)
    assert report["sample_delay_seconds_p99"] == pytest.approx(0.208, abs=1e-3)
    series = build_series(run)
    lag = series["devices"]["0"]["lag"]
    assert lag == [2, 0, 0]  # all 4 appended before step 0 ended, 2 processed; then all 4
    assert sum(sum(r["trained_per_s"]) for r in series["rates"]["devices"].values()) == 8


def test_report_splits_each_step_wall_period_along_its_slowest_rank() -> None:
    records = {"0": _records(range(4)), "1": _records(range(4))}

    def timed(fb: StepFeedback, **timings: float) -> StepFeedback:
        return replace(fb, **timings)

    feedback = [_fb("0", 0, range(2), t=100, floor=2), _fb("1", 0, range(2), t=110, floor=2),
                # Step 1 ends 300 ms after step 0: rank 1 (the slower) computed 200 ms, waited 2 ms for its plan
                # (made ahead) and 10 ms for data, 10 ms in the all-reduce, and held its report 50 ms.
                timed(_fb("0", 1, range(2, 4), t=400, floor=4), plan_wait_seconds=0.3, hold_seconds=0.05),
                timed(_fb("1", 1, range(2, 4), t=410, floor=4, compute=0.2), comm_seconds=0.01, plan_wait_seconds=0.002,
                      hold_seconds=0.05)]
    cfg, run = _run(records, {"0": 4, "1": 4}, feedback, [])
    report = build_report(run, tally_devices(cfg, run)).model_dump()
    split = report["step_period_split_median"]
    assert list(split) == ["compute", "communication", "plan_wait", "data_wait", "hold", "other"]
    assert split == pytest.approx({"compute": 0.2, "communication": 0.01, "plan_wait": 0.002, "data_wait": 0.01,
                                   "hold": 0.05, "other": 0.3 - 0.272})
    assert report["plan_wait_seconds_median"] == pytest.approx(0.002)
    assert report["plan_wait_step_fraction_median"] == pytest.approx(0.002 / 0.3)
    series = build_series(run)["devices"]["1"]
    assert series["plan_wait_seconds"] == [0.0, 0.002] and series["hold_seconds"] == [0.0, 0.05]


def test_dashboard_variables_expand_to_queries_prometheus_can_run() -> None:
    dashboard = {
        "templating": {"list": [
            {"name": "device", "type": "query", "query": "label_values(streamtrain_trainer_completed_steps, device)",
             "includeAll": True, "current": {"value": ["$__all"]}},
            {"name": "ds", "type": "datasource", "current": {"value": "prom"}},
            {"name": "q", "type": "constant", "query": "0.99"},
        ]},
        "panels": [
            {"title": "batch",
             "targets": [{"refId": "A", "expr": 'streamtrain_trainer_batch_samples{device="$device"}'}]},
            {"type": "row", "title": "r", "panels": [
                {"title": "rate", "targets": [
                    {"refId": "B", "expr": 'sum by (device) (rate(streamtrain_trainer_samples_total'
                                           '{device=~"${device}"}[$__rate_interval]))'},
                    {"refId": "C", "expr": "histogram_quantile($q, rate(x_bucket[$__interval]))"},
                    {"refId": "D", "expr": ""}]}]},
        ],
    }
    exprs = [q.expr for q in dashboard_queries(dashboard, "d.json")]
    assert exprs == ['streamtrain_trainer_batch_samples{device=~".*"}',
                     'sum by (device) (rate(streamtrain_trainer_samples_total{device=~".*"}[30s]))',
                     "histogram_quantile(0.99, rate(x_bucket[5s]))"]
    assert expand_variables('a{d!="$v"}', {"v": ".*"}) == 'a{d!~".*"}'


def test_a_missing_prometheus_binary_is_reported_as_none(tmp_path: Path) -> None:
    assert find_prometheus(str(tmp_path / "no-such-prometheus")) is None
    fake = tmp_path / "prometheus"
    fake.write_text("#!/bin/sh\n")
    assert find_prometheus(str(fake)) == str(fake)
