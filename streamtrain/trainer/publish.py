"""Model versions out of a training group: when to publish, what each rank contributes, what rank 0 writes.

Every rank keeps a count of the samples it trained since the last version, by produced_at
(`ProducedHistogram`: the version's lineage), and the objective's test-then-train metric sums of its last
`trainer.prequential_window` steps that trained (each sample scored by the forward pass before the step trained
it; the version's weights have trained them all): summed over the ranks, the version's prequential metrics
(`prequential_accuracy` for classification, `prequential_rmse` for regression, ...) with `prequential_samples`
and `prequential_step`, at no extra cost. A window rather than the samples since the last version: a version
published a step or two after the one before it (the run's final one, often after a step that trained nothing)
still carries figures, over enough samples to tell two versions apart.

A version is due when `versions.publish_every_seconds` have passed on some rank: the rank says so on the step's
weight all-reduce (the same ride the stop flag takes), so every rank learns from the same sum that this step
publishes, with no collective of its own. Publishing is then one collective: an
all-gather of each rank's (device, lowest unprocessed offset, samples trained since the last version, its
window's test-then-train sums), after
which rank 0 alone writes the version atomically (`streamtrain.versions.write_version`), keeps the newest
`versions.keep`, and announces it on `<prefix>.models`. The announcement follows the rename: whoever reads it
finds the files in place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import torch.distributed as dist
from confluent_kafka import KafkaError, Message, Producer
from torch import nn

from streamtrain.config import StreamtrainConfig
from streamtrain.kafka import produce
from streamtrain.objectives import Objective, SumWindow, add_sums, build_objective
from streamtrain.versions import VersionError, next_version, spec_for, write_version
from streamtrain.versions.freshness import ProducedHistogram
from streamtrain.wire import DeviceLineage, ModelVersion, ProducedCount, Sample, encode

from .distributed import DistContext
from .evaluation import HeldOutResult
from .metrics import TrainerMetrics

__all__ = ["VersionPublisher", "heldout_metrics", "prequential_metrics"]

logger = logging.getLogger(__name__)

#: What each rank contributes to a version: (device, lowest unprocessed offset, resolution ms, [(ms, count)],
#: the test-then-train metric sums of its last `trainer.prequential_window` steps that trained).
Contribution = tuple[str, int, int, list[tuple[int, int]], dict[str, float]]


def heldout_metrics(result: HeldOutResult | None) -> dict[str, float]:
    """A version's figures from the latest held-out evaluation: the objective's metrics as `heldout_<metric>`
    (`heldout_accuracy`, `heldout_rmse`, their baseline's, `heldout_loss`), with the samples and the step it was
    made at; none: no figures."""
    if result is None:
        return {}
    return {**{f"heldout_{k}": v for k, v in result.metrics.items()}, "heldout_loss": result.loss,
            "heldout_samples": float(result.samples), "heldout_step": float(result.step)}


def prequential_metrics(objective: Objective, sums: Mapping[str, float], step: int) -> dict[str, float]:
    """A version's test-then-train figures from the ranks' summed window sums: the objective's metrics as
    `prequential_<metric>`, with the samples they are over and the step the window ends at (none trained: none)."""
    seen = sums.get("count", 0.0)
    if not seen:
        return {}
    return {**{f"prequential_{k}": v for k, v in objective.summarise(sums).items()}, "prequential_samples": seen,
            "prequential_step": float(step)}


class VersionPublisher:
    """One rank's part in publishing model versions (`versions.*`); does nothing when `versions.dir` is unset.

    Args:
        config: The whole configuration (job, topics, versions, trainer, class names).
        ctx: This rank's place in the group.
        producer: The rank's control producer (rank 0 announces versions with it).
        metrics: The rank's metrics.
        objective: Turns the summed test-then-train sums into the version's metrics (default: `trainer.objective`'s).
    """

    def __init__(self, config: StreamtrainConfig, ctx: DistContext, producer: Producer,
                 metrics: TrainerMetrics, objective: Objective | None = None) -> None:
        self.settings = config.versions
        self.directory = self.settings.dir
        self.config = config
        self.ctx = ctx
        self.producer = producer
        self.metrics = metrics
        self.topic = config.kafka.topics.models
        self.trained = ProducedHistogram()
        self.objective = objective if objective is not None else build_objective(config.trainer)
        self._scored = SumWindow(config.trainer.prequential_window)
        """Test-then-train metric sums of this rank's last `trainer.prequential_window` steps that trained."""
        self.published_step: int | None = None
        self._last = time.monotonic()
        self._asked: float | None = None
        """When `due` was last asked (a step ago)."""
        self._carry: dict[str, ProducedHistogram] = {}
        """Rank 0: per device, samples of versions that could not be written (they go into the next one)."""
        self._next = next_version(self.directory) if self.directory is not None and ctx.is_main else 0
        self.announce_failed = 0

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def due(self, samples: int = 0) -> bool:
        """Whether this rank asks for a version after the step it is about to train on `samples` samples (the group
        publishes when any rank asks; call once a step, before it).

        Asked when the last version will have aged `versions.publish_every_seconds` by the end of this step (the
        time between two calls is the step's estimate: a version goes out at the step that crosses the interval,
        not a step later), and only when something was trained since it, this step included: an idle fleet writes
        no new versions of unchanged weights.
        """
        now = time.monotonic()
        step = now - self._asked if self._asked is not None else 0.0
        self._asked = now
        every = self.settings.publish_every_seconds
        if not (self.enabled and every > 0) or (samples <= 0 and not len(self.trained)):
            return False
        return now + step - self._last >= every

    def note_trained(self, samples: Sequence[Sample], scored: Mapping[str, float]) -> None:
        """Count samples this rank just trained (a step that was not skipped), with their test-then-train metric sums
        (`StepResult.prequential`: scored by the forward pass before the step)."""
        if self.enabled:
            for sample in samples:
                self.trained.add(sample.produced_at)
            self._scored.add(scored)

    def publish(self, step: int, model: nn.Module, device_id: str, offset: int,
                metrics: Mapping[str, float]) -> int | None:
        """Collective: every rank contributes its lineage; rank 0 writes and announces the version.

        Args:
            step: Steps the weights have trained.
            model: The bare model (not its DDP wrapper): the same weights on every rank.
            device_id: This rank's device.
            offset: This rank's lowest unprocessed offset (every record below it trained, dropped or
                dead-lettered).
            metrics: The version's figures (held-out evaluation, ...).

        Returns:
            On rank 0, the version written (None when writing failed); None on the other ranks.
        """
        if not self.enabled:
            return None
        started = time.perf_counter()
        mine: Contribution = (device_id, offset, self.trained.resolution_ms,
                              [(c.produced_at, c.count) for c in self.trained.counts()], self._scored.recent)
        gathered: list[Contribution | None] = [None] * self.ctx.world_size
        if dist.is_initialized() and self.ctx.world_size > 1:
            dist.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        self.trained.clear()
        self._last = time.monotonic()
        self.published_step = step
        if not self.ctx.is_main:
            return None
        contributions = [g for g in gathered if g is not None]
        lineage = self._lineage(contributions)
        summed: dict[str, float] = {}
        for contribution in contributions:
            add_sums(summed, contribution[4])
        # A model may add figures of its own (`seqflat`: the dropout it chose, on what held-out scores).
        chosen = getattr(model, "version_metrics", None)
        figures = {**metrics, **prequential_metrics(self.objective, summed, step), **(chosen() if chosen else {})}
        written = self._write(step, model, lineage, figures)
        self.metrics.version_seconds.set(time.perf_counter() - started)
        return written

    def _lineage(self, contributions: Sequence[Contribution]) -> list[tuple[str, int, ProducedHistogram]]:
        out = []
        for device, offset, resolution, bins, *_scores in contributions:
            histogram = self._carry.pop(device, None) or ProducedHistogram()
            histogram.add_counts((ProducedCount(at, n) for at, n in bins), resolution)
            out.append((device, offset, histogram))
        return out

    def _write(self, step: int, model: nn.Module, lineage: list[tuple[str, int, ProducedHistogram]],
               metrics: Mapping[str, float]) -> int | None:
        assert self.directory is not None
        version = self._next
        offsets = {device: offset for device, offset, _ in lineage}
        spec = spec_for(self.config.trainer, job=self.config.job, version=version, step=step,
                        class_names=self.config.producer.dataset.class_names, offsets=offsets, metrics=metrics,
                        tag_names=self.config.producer.dataset.target_columns)
        try:
            path = write_version(self.directory, spec, model.state_dict(), keep=self.settings.keep)
        except (OSError, VersionError) as exc:
            for device, _offset, histogram in lineage:  # its samples are first served by the next version
                self._carry[device] = histogram
            self.metrics.versions_failed.inc()
            logger.error("model version %d (step %d) not written: %s", version, step, exc)
            return None
        self._next = version + 1
        # One resolution for the whole record: the coarsest any device's histogram needed.
        resolution = max((h.resolution_ms for _, _, h in lineage), default=ProducedHistogram().resolution_ms)
        for _, _, histogram in lineage:
            histogram.coarsen(resolution)
        record = ModelVersion(job=self.config.job, version=version, step=step, location=str(path.resolve()),
                              lineage=tuple(DeviceLineage(d, o, h.counts()) for d, o, h in lineage),
                              metrics=dict(metrics), produced_at_resolution_ms=resolution)
        value, headers = encode(record)
        produce(self.producer, self.topic, value, headers, self._announced, self.config.job.encode())
        self.metrics.versions_published.inc()
        self.metrics.version_number.set(version)
        logger.info("model version %d of step %d written to %s and announced (%s)", version, step, path,
                    ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()) or "no metrics")
        return version

    def _announced(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.announce_failed += 1
            logger.error("a model version announcement could not be delivered: %s", err)
