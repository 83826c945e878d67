"""A run with samples that trained none of them fails, naming the dead letters' reasons and the setting at fault."""

from __future__ import annotations

from streamtrain.config import StreamtrainConfig
from streamtrain.report.ledger import RunRecords
from streamtrain.report.schema import BridgeFigures, StackReport
from streamtrain.stack.run_report import nothing_trained
from streamtrain.wire import DeadLetter

CFG = StreamtrainConfig()


def _letters(topic: str, reason: str, detail: str, n: int) -> list[DeadLetter]:
    return [DeadLetter(topic=topic, partition=0, offset=i, reason=reason, detail=detail, service="trainer")
            for i in range(n)]


def test_every_sample_dead_lettered_fails_naming_the_reasons_and_the_setting() -> None:
    device = CFG.kafka.topics.device("0")
    run = RunRecords(devices=["0"], dead_letters=[
        *_letters(device, "untrainable", "sample 0#4: shape [126, 1] is not (size, 16)", 118),
        *_letters(device, "dtype-not-accepted", "sample 0#9: dtype int16 is not in trainer.accepted_dtypes "
                  "(float32)", 2)])
    report = StackReport(samples_produced=120, samples_trained=0, samples_dead_lettered=120)
    why = nothing_trained(CFG, report, run)
    assert why is not None and why.startswith("none of the 120 samples was trained: the trainers dead-lettered "
                                              "118 untrainable (e.g. sample 0#4: shape [126, 1] is not (size, 16)); "
                                              "2 dtype-not-accepted")
    assert why.endswith("check trainer.num_features (every sample's features per frame: its shape's 2nd axis), "
                        "trainer.accepted_dtypes")


def test_a_run_that_trained_or_only_has_samples_pending_is_no_such_failure() -> None:
    run = RunRecords(devices=["0"])
    assert nothing_trained(CFG, StackReport(samples_produced=10, samples_trained=1, samples_dead_lettered=9), run) \
        is None
    assert nothing_trained(CFG, StackReport(samples_produced=10, samples_pending=10), run) is None
    assert nothing_trained(CFG, StackReport(), run) is None


def test_a_bridge_that_rejected_every_source_record_fails_naming_its_reasons() -> None:
    cfg = StreamtrainConfig.model_validate({"bridge": {"sources": [{"topic": "events"}]}})
    run = RunRecords(devices=["0"], dead_letters=_letters("events", "missing-field", "no field 'data' in the object "
                                                          "(has values)", 3))
    bridged = BridgeFigures(group="g", sources=["events"], source_records=3, source_bridged=0, source_rejected=3,
                            source_skipped=0, source_pending=0, source_lost=0, source_unknown=0, source_duplicated=0)
    why = nothing_trained(cfg, StackReport(bridge=bridged), run)
    assert why == ("nothing to train: the bridge rejected every one of its 3 source records, 3 missing-field (e.g. "
                   "no field 'data' in the object (has values)) — check bridge.sources (the decoder's settings)")
