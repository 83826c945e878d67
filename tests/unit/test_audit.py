"""`streamtrain audit`'s verdict and JSON from tallies (tests/compose runs it against a live deployment)."""

from __future__ import annotations

import numpy as np

from streamtrain.report.accounting import account_records
from streamtrain.report.audit import Audit
from streamtrain.report.ledger import DeviceTally
from streamtrain.wire import DeviceLineage, ModelVersion


def _tally(device: str, records: int, trained: int, committed: int) -> DeviceTally:
    return DeviceTally(device, account_records(np.arange(records), trained=np.arange(trained), committed=committed),
                       {})


def test_every_record_trained_or_pending_passes_and_the_json_carries_the_lineage() -> None:
    version = ModelVersion("job", 3, 40, "/m/3", (DeviceLineage("0", 8), DeviceLineage("1", 5)))
    audit = Audit("job", [_tally("0", 10, 8, 8), _tally("1", 6, 5, 5)], version, 3, 0)
    assert audit.failures() == []
    summary = audit.summary()
    assert summary["records"] == 16 and summary["trained"] == 13 and summary["unaccounted"] == 0
    assert [d["in_newest_version"] for d in summary["devices"]] == [8, 5]
    assert [d["pending"] for d in summary["devices"]] == [2, 1]


def test_a_record_processed_past_without_a_fate_fails_naming_the_device_and_offset() -> None:
    audit = Audit("job", [_tally("0", 10, 6, 8)], None, 0, 0)  # offsets 6 and 7 below the commit, never trained
    [failure] = audit.failures()
    assert "device 0" in failure and "2 records unaccounted" in failure and "[6, 7]" in failure


def test_records_and_nothing_trained_fails() -> None:
    audit = Audit("job", [_tally("0", 4, 0, 0)], None, 0, 0)
    assert audit.failures() == ["4 records in the device topics and none trained"]


def test_what_a_running_deployment_trained_after_the_read_is_left_out() -> None:
    from streamtrain.config import load_config
    from streamtrain.report.ledger import DeviceRecords, RunRecords, tally_devices
    from streamtrain.wire import StepFeedback, ranges_of

    cfg = load_config(env={})
    offsets = np.arange(10)
    records = DeviceRecords(np.zeros(10, np.int64), offsets, offsets, np.ones(10, bool), offsets, offsets, offsets)
    topic = cfg.kafka.topics.device("0")
    # Steps trained offsets 0..14 by the time the feedback was read; the topic had been read to offset 9.
    feedback = StepFeedback(cfg.job, 1, "0", 0, 1, 15, 15, 0.1, 0.0, 0.0, 0.1, 0, 15, 0,
                            trained_offsets=ranges_of(range(15)))
    run = RunRecords(["0"], {"0": records}, {(topic, 0): 0}, {(topic, 0): 10}, {(topic, 0): 8}, [feedback])
    [stopped] = tally_devices(cfg, run)
    [running] = tally_devices(cfg, run, running=True)
    assert stopped.fates.unaccounted == 5  # offsets 10..14: claimed, never read
    assert running.fates.unaccounted == 0 and running.fates.trained == 10
