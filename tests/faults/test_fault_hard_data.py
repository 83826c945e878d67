"""Hard data into a running stack: a burst of valid samples of every wire dtype at the far end of its range, one
whose values do not fit the model's dtype, and samples a model plug-in answers with NaN. The loss and the
checkpoint stay finite, each step with a non-finite loss is skipped on every rank with its samples on the
dead-letter topic as `non-finite-loss` (their original records kept), and every record is accounted for."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from fault_helpers import FaultStack, scrape, until
from fuzzing import extreme_sample
from nan_model import MARKED_SIZE
from trainer_seq_log import committed_offsets

from streamtrain.config import KafkaConfig
from streamtrain.kafka import make_producer, produce
from streamtrain.report.ledger import collect_records
from streamtrain.trainer.checkpoint import load_checkpoint, non_finite_tensors
from streamtrain.wire import DTYPES, Sample, decode, encode, expand_ranges

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]

JOB = "hard"
DEVICES = ("0", "1")
PER_DEVICE = 120
BURST = 30  # extreme samples into device 0, every dtype in turn
MARKED = 2  # samples into device 1 that `nan_model` answers with NaN
FOREIGN_SEQ = 1_000_000_000  # the injecting "producer" numbers its own way


def _inject(kafka: KafkaConfig, kinds: tuple[str, ...]) -> dict[str, list[int]]:
    """Write the hard records of `kinds` ("burst", "overflow", "marked"); returns the offsets of each kind."""
    rng = np.random.default_rng(18)
    sizes = [s for s in range(1, 20) if s not in (MARKED_SIZE, 8)]  # 8: the producer's; 13: the marked size
    records: list[tuple[str, str, Sample]] = [
        ("burst", "0", extreme_sample("0", FOREIGN_SEQ + i, DTYPES[i % len(DTYPES)], rng, sizes[i % len(sizes)],
                                      num_classes=4)) for i in range(BURST)]
    records.append(("overflow", "0", Sample.from_array("0", FOREIGN_SEQ + BURST, np.full((4, 16), 1e300), label=1)))
    records += [("marked", "1", Sample.from_array("1", FOREIGN_SEQ + i, rng.standard_normal((MARKED_SIZE, 16))
                                                  .astype(np.float32), label=2)) for i in range(MARKED)]
    offsets: dict[str, list[int]] = {kind: [] for kind in kinds}
    producer = make_producer(kafka)
    for kind, device, sample in (r for r in records if r[0] in kinds):
        produce(producer, kafka.topics.device(device), *encode(sample),
                on_delivery=lambda err, msg, kind=kind: offsets[kind].append(msg.offset()) if err is None else None)
    assert producer.flush(60) == 0
    return offsets


def test_hard_data_leaves_the_model_finite_and_every_record_accounted(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    stack = FaultStack(kafka_cfg, tmp_path, JOB, DEVICES, trainer={"model": "nan_model:build"})
    try:
        coordinator = stack.coordinator().start()
        trainer = stack.start_trainer()
        producer = stack.producer("producer", DEVICES, PER_DEVICE, rate=40).start()
        stack.wait_trained(dict.fromkeys(DEVICES, 30), 120, watch=(coordinator, trainer))
        injected = _inject(kafka_cfg, ("burst", "overflow"))
        # The NaN-marked samples come once the burst is processed: a step holding both would be skipped, its
        # burst samples dead-lettered with it, and the burst is meant to be trained.
        last = max(injected["burst"] + injected["overflow"])
        group = stack.config().trainer_group_id
        until(lambda: committed_offsets(kafka_cfg, group, ("0",))["0"] > last, 120, "the burst processed")
        injected.update(_inject(kafka_cfg, ("marked",)))
        assert producer.proc is not None and producer.proc.wait(60) == 0, producer.tail()
        produced = {"0": PER_DEVICE + BURST + 1, "1": PER_DEVICE + MARKED}

        until(lambda: committed_offsets(kafka_cfg, group, DEVICES) == produced, 180,
              "every record processed and committed")
        skipped = {d: scrape(url).get("streamtrain_trainer_skipped_steps_total") for d, url in
                   stack.rank_metrics_urls(trainer).items()}
        assert trainer.stop(60) == 0, trainer.tail()
        assert coordinator.stop(30) == 0, coordinator.tail()
        accounts, feedback = stack.account(dict.fromkeys(DEVICES, PER_DEVICE))
        run = collect_records(stack.config(), DEVICES, timeout=30)
    finally:
        stack.cleanup()

    # Every record in one bin, nothing pending or lost, no record trained twice.
    for device in DEVICES:
        fates = accounts[device].fates
        assert fates.complete and fates.records == produced[device], fates.summary()
        assert fates.retrained == 0 and accounts[device].claimed_not_logged == 0, accounts[device]
    letters = {(d.topic, d.offset): d for d in run.dead_letters}
    reason = {(t, o): d.reason for (t, o), d in letters.items()}
    topic0, topic1 = kafka_cfg.topics.device("0"), kafka_cfg.topics.device("1")
    # The value that cannot be float32 is refused with its reason; the marked samples' steps were skipped.
    assert [reason.get((topic0, o)) for o in injected["overflow"]] == ["dtype-overflow"]
    assert [reason.get((topic1, o)) for o in injected["marked"]] == ["non-finite-loss"] * MARKED
    for (topic, offset), letter in letters.items():
        if letter.reason == "non-finite-loss":  # the original record, whole, with where it came from
            sample = decode(letter.value, list(letter.headers.items()), Sample)
            assert sample.device_id == ("1" if topic == topic1 else "0") and letter.offset == offset
    # The extreme burst was trained, not refused.
    trained0 = {int(o) for fb in feedback if fb.device_id == "0" for o in expand_ranges(fb.trained_offsets)}
    assert [o for o in injected["burst"] if o not in trained0] == [], [reason.get((topic0, o)) for o in
                                                                        injected["burst"]]
    # Finite throughout: every reported loss, and the checkpoint; both ranks counted the skipped steps.
    losses = [fb.loss for fb in feedback if fb.loss is not None]
    assert losses and all(math.isfinite(loss) for loss in losses)
    checkpoint = load_checkpoint(tmp_path / "ckpt")
    assert checkpoint is not None and non_finite_tensors({"m": checkpoint.model, "o": checkpoint.optimizer}) == []
    assert all(n is not None and n >= 1 for n in skipped.values()) and len(set(skipped.values())) == 1, skipped
    assert "skipped on every rank" in trainer.log.read_text()
