"""End to end on the real broker, no coordinator: the producers stream the synthetic task to four
devices while `streamtrain train --local-ranks 4` trains on local plans. The loss falls, and every
seq the producers made is accounted for: trained exactly once, truncated, or (for records that
were never samples) dead-lettered with a reason while training went on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from trainer_seq_log import (
    committed_offsets,
    feedback_records,
    high_watermarks,
    rank_environment,
    read_ledger,
    train_settings,
)

from streamtrain.config import KafkaConfig, ProducerConfig
from streamtrain.kafka import make_producer, read_to_end
from streamtrain.producers.service import ProducerSummary, StreamProducer
from streamtrain.runtime.commands import module_command
from streamtrain.wire import DeadLetter, Sample, decode, encode

pytestmark = pytest.mark.integration

JOB = "pipe"
DEVICES = ("0", "1", "2", "3")
PER_DEVICE = 192
BATCH = 16
STEPS = 20  # 12 steps of data at full batches; the rest find the streams drained (or catch up)


def _producer(kafka: KafkaConfig) -> StreamProducer:
    cfg = ProducerConfig.model_validate({
        "devices": len(DEVICES), "max_samples": PER_DEVICE, "duration_seconds": 60, "metrics": False, "seed": 3,
        "rate": {"kind": "constant", "mean": 60.0},  # streams for ~3 s, while the ranks start and train
        "size": {"kind": "fixed", "mean": 12}, "synthetic": {"classes": 4, "signal": 1.0, "task_seed": 5},
    })
    return StreamProducer(kafka, cfg)


def _inject_malformed(kafka: KafkaConfig, device: str) -> None:
    producer = make_producer(kafka)
    topic = kafka.topics.device(device)
    producer.produce(topic, value=b"\x00not an avro sample")  # no single-object marker, no header
    wrong = Sample.from_array(device, 10_000, np.zeros((5, 3), np.float32), label=1)  # 3 features, not 16
    value, headers = encode(wrong)
    producer.produce(topic, value=value, headers=headers)
    assert producer.flush(30) == 0


def test_producers_to_four_ranks_loss_falls_and_every_seq_is_accounted_for(
    kafka_cfg: KafkaConfig, tmp_path: Path
) -> None:
    started = time.monotonic()
    log_dir = tmp_path / "seqs"
    log_dir.mkdir()
    producer = _producer(kafka_cfg)
    producer.ensure_topics()
    sets = train_settings(kafka_cfg, JOB, tmp_path / "ckpt", **{
        "trainer.num_classes": 4, "trainer.local_batch": BATCH, "trainer.checkpoint_every": 5, "trainer.seed": 1,
    })
    cmd = module_command("streamtrain.trainer", "train", "--local-ranks", str(len(DEVICES)),
                         "--devices", ",".join(DEVICES), "--steps", str(STEPS), global_args=sets)
    with (tmp_path / "train.log").open("wb") as log:
        train = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=rank_environment(log_dir),
                                 start_new_session=True)
    summary: list[ProducerSummary] = []
    worker = threading.Thread(target=lambda: summary.append(producer.run()), daemon=True)
    worker.start()
    try:
        assert producer.wait_started()
        while producer.snapshot().sent_own[1] < 40:  # malformed records land mid-stream on device 1
            assert worker.is_alive()
            time.sleep(0.05)
        _inject_malformed(kafka_cfg, "1")
        worker.join(60)
        assert summary and summary[0].ok and summary[0].final.sent_own.tolist() == [PER_DEVICE] * len(DEVICES)
        code = train.wait(240)  # ~25 s on an idle 2-core machine; far more while other suites share it
    finally:
        if train.poll() is None:
            os.killpg(train.pid, signal.SIGKILL)  # the launcher and its ranks
    if code != 0:
        print((tmp_path / "train.log").read_text()[-8000:])
    assert code == 0

    # Dead-lettered: exactly the two injected records, each with its reason; none of the producers' samples.
    records = read_to_end(kafka_cfg, [kafka_cfg.topics.dead_letter])
    letters = [decode(m.value(), m.headers(), DeadLetter) for m in records]
    assert sorted(dl.reason for dl in letters) == ["corrupt", "untrainable"]
    assert all(dl.topic == kafka_cfg.topics.device("1") and dl.service == "trainer" for dl in letters)
    assert all(dl.offset >= 40 for dl in letters)  # mid-stream: training went on around them

    # Trained: every produced seq exactly once, and nothing else.
    ledger = read_ledger(log_dir)
    for device in DEVICES:
        account = ledger.account(device, PER_DEVICE)
        assert account.exact, account
    feedback = feedback_records(kafka_cfg)
    assert len(feedback) == STEPS * len(DEVICES)
    assert sum(f.dropped for f in feedback) == 0  # local plans truncate nothing
    # Offsets agree: every record of each device topic is committed as trained or dead-lettered.
    ends = high_watermarks(kafka_cfg, DEVICES)
    assert ends == {d: PER_DEVICE + (2 if d == "1" else 0) for d in DEVICES}
    assert committed_offsets(kafka_cfg, f"{JOB}.trainers", DEVICES) == ends
    for device in DEVICES:
        assert sum(f.samples for f in feedback if f.device_id == device) == PER_DEVICE

    # The loss falls: sample-weighted mean over the ranks, first three training steps against the last three.
    losses = []
    for step in range(STEPS):
        rows = [f for f in feedback if f.step == step and f.loss is not None]
        if rows:
            losses.append(sum(f.loss * f.samples for f in rows if f.loss is not None) / sum(f.samples for f in rows))
    assert len(losses) >= 8
    first, last = float(np.mean(losses[:3])), float(np.mean(losses[-3:]))
    print(f"loss {first:.3f} -> {last:.3f} over {len(losses)} steps with data; {time.monotonic() - started:.1f} s")
    assert last < 0.75 * first
