"""Bad targets on the real broker: a regression rank dead-letters every sample without the target its objective needs
(none, the wrong width, not finite) with a reason naming the field, trains every other sample exactly once, and
reports its test-then-train sums for exactly those."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from trainer_seq_log import feedback_records, rank_environment, read_ledger, train_settings

from streamtrain.config import KafkaConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer, read_to_end
from streamtrain.runtime.commands import module_command
from streamtrain.wire import DeadLetter, Sample, decode, encode

pytestmark = pytest.mark.integration

JOB = "targets"
GOOD = 48
#: (seq, target, the dead-letter reason and a word of its detail) of the bad samples, mid-stream.
BAD = {
    1000: (None, "missing-target", "target is missing"),
    1001: ((1.0, 2.0), "target-width", "target has 2 values, not trainer.target_width=1"),
    1002: ((float("nan"),), "invalid-target", "target holds NaN or infinity"),
    1003: ((float("inf"),), "invalid-target", "target holds NaN or infinity"),
}


def _publish(kafka: KafkaConfig) -> None:
    """Good regression samples (target: the mean of the first feature) with the bad ones in the middle."""
    ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, kafka.topics.device("0"))])
    producer = make_producer(kafka)
    rng = np.random.default_rng(4)
    samples = []
    for seq in range(GOOD):
        values = rng.standard_normal((int(rng.integers(4, 12)), 2)).astype(np.float32)
        samples.append(Sample.from_array("0", seq, values, target=float(values[:, 0].mean())))
    bad = [Sample.from_array("0", seq, np.ones((5, 2), np.float32), target=target)
           for seq, (target, _, _) in BAD.items()]
    for sample in samples[:GOOD // 2] + bad + samples[GOOD // 2:]:
        value, headers = encode(sample)
        producer.produce(kafka.topics.device("0"), value=value, headers=headers)
    assert producer.flush(30) == 0


def test_samples_without_their_target_are_dead_lettered_naming_the_field(kafka_cfg: KafkaConfig,
                                                                          tmp_path: Path) -> None:
    _publish(kafka_cfg)
    log_dir = tmp_path / "seqs"
    log_dir.mkdir()
    sets = train_settings(kafka_cfg, JOB, tmp_path / "ckpt", **{
        "trainer.objective": "regression", "trainer.num_features": 2, "trainer.local_batch": 8,
    })
    cmd = module_command("streamtrain.trainer", "train", "--local-ranks", "1", "--devices", "0", "--steps", "8",
                         global_args=sets)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=rank_environment(log_dir))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    records = read_to_end(kafka_cfg, [kafka_cfg.topics.dead_letter])
    letters = [decode(m.value(), m.headers(), DeadLetter) for m in records]
    by_seq = {decode(dl.value, dl.headers, Sample, validate=False).seq: dl for dl in letters}
    assert sorted(by_seq) == sorted(BAD)
    for seq, (_, reason, words) in BAD.items():
        assert by_seq[seq].reason == reason and words in by_seq[seq].detail, by_seq[seq]

    account = read_ledger(log_dir).account("0", GOOD)  # every good sample trained exactly once, no bad one
    assert account.exact, account
    feedback = feedback_records(kafka_cfg)
    trained = [fb for fb in feedback if fb.samples]
    assert sum(fb.samples for fb in trained) == GOOD
    assert all(fb.loss is not None and math.isfinite(fb.loss) for fb in trained)
    assert sum(fb.prequential["count"] for fb in trained) == GOOD  # scored test-then-train: exactly the trained
    assert all(fb.prequential["values"] == fb.samples and fb.prequential["squared_error_sum"] >= 0 for fb in trained)
