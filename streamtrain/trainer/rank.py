"""One trainer rank: its device's stream in, one DDP step per plan, feedback, commits and checkpoints out.

Run one rank per device, e.g. under torchrun (each rank picks `--devices`[RANK]):

    torchrun --nproc-per-node 2 -m trainer train --devices cam0,cam1

or `streamtrain train --local-ranks 2 --devices cam0,cam1`. Every rank runs the same global step
numbers and calls `run_step` once per step, with however many samples its plan gives it (possibly
none), so the DDP collectives always line up. The only other thing ranks must agree on is when to
stop: a stop request (SIGTERM on any rank) rides on each step's weight all-reduce, so every rank
learns from the same sum to stop after that step, without a collective of its own.
"""

from __future__ import annotations

import gc
import logging
import signal
import time
from types import FrameType

import torch.distributed as dist
from confluent_kafka import KafkaError, Message
from prometheus_client import CollectorRegistry

from streamtrain.config import StreamtrainConfig, TrainerConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_control_producer, produce
from streamtrain.metrics import serve_metrics
from streamtrain.models.standardise import InputEstimate, online_inputs
from streamtrain.pacing import report_hold_seconds
from streamtrain.wire import Assignment, Evaluation, StepFeedback, encode, ranges_of

from .backlog import ReportLog, hold_backlog, named_by
from .checkpoint import Checkpoint, NonFiniteCheckpointError, load_checkpoint, resume_offset, save_checkpoint
from .consumer import RankConsumer
from .distributed import DistContext, destroy_distributed, init_distributed
from .emulation import slow_device
from .evaluation import HeldOutEvaluator, HeldOutResult, held_out_source
from .metrics import ObjectiveMetrics, TrainerMetrics
from .plan_checks import PartCheck
from .plans import LocalPlanner, PlanBook, Selection, selection_from
from .publish import VersionPublisher, heldout_metrics
from .startup_profile import start_rank
from .step import NON_FINITE_LOSS, StepResult, build_step_runner

__all__ = ["TrainerRank", "run_rank"]

logger = logging.getLogger(__name__)

#: Seconds a commit waits for the feedback and dead letters before it (retried at the next commit).
COMMIT_FLUSH_S = 10.0


class TrainerRank:
    """The rank loop of one device: plan, gather, train, report, commit, checkpoint.

    Args:
        config: The whole configuration (job, Kafka, trainer).
        device_id: The device whose topic this rank consumes.
        ctx: This rank's process group (`init_distributed`).
        registry: Prometheus registry of this rank's metrics (a fresh one when not given).
    """

    def __init__(  # noqa: PLR0915  a rank's parts wired in order, one statement each (model, Kafka, metrics, state)
        self, config: StreamtrainConfig, device_id: str, ctx: DistContext, registry: CollectorRegistry | None = None
    ) -> None:
        self.config = config
        self.trainer = config.trainer
        self.device_id = device_id
        self.ctx = ctx
        self.group_id = config.trainer_group_id
        topics = config.kafka.topics
        self.feedback_topic = topics.feedback
        self.slow = slow_device(self.trainer, ctx)  # bad slow-downs or plug-ins fail before Kafka is touched
        self.runner = build_step_runner(self.trainer, ctx)
        # Devices fed from outside carry no fitted input scaling: the group estimates it (models.standardise).
        self.runner.inputs = InputEstimate(self.trainer) if online_inputs(self.trainer) else None
        # A benchmark's or demo's emulated slower device (`trainer.slowdowns`) wraps the step; nothing else does.
        self.train_step = self.slow.wrap(self.runner.run_step) if self.slow is not None else self.runner.run_step
        self.evaluator = (HeldOutEvaluator(self.trainer, ctx, self.runner.collate, config.producer.dataset,
                                           objective=self.runner.objective)
                          if held_out_source(self.trainer) is not None else None)
        self._evaluated_step: int | None = None
        own = [topics.device(device_id), topics.feedback, topics.assignments, topics.dead_letter]
        own += [topics.evaluations] if self.evaluator is not None else []
        own += [topics.models] if config.versions.dir is not None else []
        ensure_topics(make_admin(config.kafka), [TopicSpec.from_config(config.kafka, name) for name in own])
        self.producer = make_control_producer(config.kafka)
        self.plans = PlanBook(config.job, window=self.trainer.plan_window_steps)
        self.consumer = RankConsumer(config.kafka, self.trainer, device_id, self.group_id, self.plans,
                                     self.producer, dead_letter_plans=ctx.is_main, objective=self.runner.objective)
        self.part_check = PartCheck(device_id, config.coordinator, self.consumer.high_watermark, self._wait_for)
        self.buffer = self.consumer.buffer
        self.local = LocalPlanner(self.trainer.local_batch)
        self.reports = ReportLog()
        self.metrics = TrainerMetrics(registry if registry is not None else CollectorRegistry(), device_id, config.job)
        self.scores = ObjectiveMetrics(self.metrics.registry, device_id, config.job, self.runner.objective,
                                       self.trainer.prequential_window)
        self.publisher = VersionPublisher(config, ctx, self.producer, self.metrics, self.runner.objective)
        self.group_publish = False
        """Some rank asked for a model version: the group publishes one after the step that told it."""
        self._heldout: HeldOutResult | None = None
        self.step = 0
        self.plans_late = 0
        self.samples_trained = 0
        """Samples this rank trained, over the run (its final log line says it)."""
        self.committed: int | None = None
        self.feedback_failed = 0
        self.stop_requested = False
        self.group_idle = False
        self.group_stop = False
        """Some rank asked to stop: the group stops after the step that told it."""
        self._offsets: dict[str, int] = {}
        self._ahead: dict[str, list[tuple[int, int]]] = {}
        self._checkpointed_step: int | None = None
        self._dead_lettered_seen = 0

    # ---- start-up -------------------------------------------------------------------------------------

    def resume(self) -> int:
        """Restore the newest checkpoint (rank 0 reads it, everyone receives it) and start consuming.

        Returns:
            The step training resumes at.
        """
        box: list[Checkpoint | None] = [load_checkpoint(self.trainer.checkpoint_dir) if self.ctx.is_main else None]
        dist.broadcast_object_list(box, src=0)  # no shared filesystem needed across nodes
        checkpoint = box[0]
        own: int | None = None
        ahead: list[tuple[int, int]] = []
        if checkpoint is not None:
            self.runner.model.module.load_state_dict(checkpoint.model)
            if self.runner.average is not None:
                self.runner.average.reset(self.runner.model.module)
            self.runner.optimizer.load_state_dict(checkpoint.optimizer)
            self.step = self._checkpointed_step = checkpoint.step
            self._offsets = dict(checkpoint.offsets)
            self._ahead = dict(checkpoint.done_ahead)
            if checkpoint.inputs and self.runner.inputs is not None:  # the scale the weights were trained on
                self.runner.inputs.frozen = True
                shift, scale = checkpoint.inputs
                self._adopt(self.trainer.model_copy(update={"input_shift": tuple(shift), "input_scale": tuple(scale)}))
                self.runner.config = self.trainer
            own = checkpoint.offsets.get(self.device_id)
            ahead = checkpoint.done_ahead.get(self.device_id, []) if own is not None else []
        committed = self.consumer.committed_offset()
        self.plans.forget_before(self.step)  # before the plans are read back: a window from the resumed step
        start = self.consumer.start(resume_offset(own, committed))
        self.buffer.skip_ahead(o for a, b in ahead for o in range(a, b))  # trained out of order before the stop
        self.committed = committed
        logger.info("rank %d (%s): resuming at step %d from offset %d (committed %s; %d offsets above it already "
                    "processed)", self.ctx.rank, self.device_id, self.step, start, committed,
                    sum(b - a for a, b in ahead))
        return self.step

    # ---- the loop -------------------------------------------------------------------------------------

    def request_stop(self, *_: object) -> None:
        """Finish the current step, then commit, checkpoint and return from `run` (signal-handler safe)."""
        self.stop_requested = True

    def _limit_reached(self) -> bool:
        return 0 < self.trainer.max_steps <= self.step  # the same on every rank: they run the same step numbers

    def run(self) -> int:
        """Train until SIGTERM on any rank or `trainer.max_steps`; returns the steps run in this call.

        A SIGTERM on one rank is carried by the next step's weight all-reduce, so the whole group
        finishes that step and stops after it together."""
        first = self.step
        self.group_stop = False
        while not self.group_stop and not self._limit_reached():
            self.run_step()
            self._due_work(self.step)  # unless the step's hold did it: either way before the checkpoint's collective
            self._after_step()
            if self.group_idle and not self.group_stop:
                self.consumer.wait_until(lambda: len(self.buffer) > 0 or self.stop_requested,
                                         time.perf_counter() + self.trainer.idle_wait_seconds)
        self._finish()
        return self.step - first

    def run_step(self) -> StepFeedback:  # noqa: PLR0915  one step of a rank in order (plan, gather, train, dead-letter, report, commit): the order is the semantics
        """One step: wait (bounded) for the plan, gather its samples, train, report the feedback."""
        started = time.perf_counter()
        step = self.step
        arrived = self._wait_for_plan(step, started + self.trainer.plan_wait_seconds)
        planned = time.perf_counter()
        plan_wait = planned - started
        plan = self._checked(arrived)  # None too when this device's part may not be obeyed: a local plan runs
        if plan is not None:
            selection = selection_from(plan, self.device_id)
        else:
            selection = self.local.selection(waited_s=plan_wait)
        if arrived is None:
            self.plans_late += 1
        if selection.truncate_before is not None:
            self.buffer.truncate_before(selection.truncate_before)
        reserved = named_by(self.plans.later(step), self.device_id)  # plans made ahead: not this step's to take
        offsets = self._gather(selection, time.perf_counter() + self.trainer.data_wait_seconds, reserved)
        data_wait = time.perf_counter() - planned  # includes a check's wait for planned records on their way
        samples = self.buffer.take(offsets)
        # Samples a plan saw and left behind, and any truncation dropped (streams outran training): either way
        # not a step short for want of data, so no rank holds its report (`_hold`).
        backlog = hold_backlog(self.buffer, self.device_id, plan, self.plans.later(step), self.reports)
        result = self.train_step(samples, stop=self.stop_requested, backlog=backlog,
                                 publish=self.publisher.due(len(samples)))
        if self.runner.config is not self.trainer:
            self._adopt(self.runner.config)
        self.group_stop = result.stop
        self.group_publish = result.publish
        if not result.skipped:
            self.publisher.note_trained(samples, result.prequential)
        self.group_idle = result.global_samples == 0
        if result.skipped:
            self._dead_letter_step(step, result)
        trained = () if result.skipped else ranges_of(entry.offset for entry in self.buffer.in_flight())
        dropped = self.buffer.drain_dropped()
        self.buffer.complete_step()  # the optimizer step is done (or its samples dead-lettered): processed
        self.local.observe(result.total_size, result.compute_seconds)
        if plan is not None:
            self.local.remember(plan, plan.for_device(self.device_id), result.samples)
        held = self._hold(plan, started, result, step + 1)
        feedback = StepFeedback(
            job=self.config.job, step=step, device_id=self.device_id, rank=self.ctx.rank,
            plan_step=selection.plan_step, samples=0 if result.skipped else result.samples,
            total_size=0 if result.skipped else result.total_size,
            compute_seconds=result.compute_seconds, data_wait_seconds=data_wait, comm_seconds=result.comm_seconds,
            step_seconds=result.step_seconds, memory_bytes=result.memory_bytes,
            lowest_unprocessed_offset=self.buffer.lowest_unprocessed(), buffer_depth=len(self.buffer),
            loss=None if result.skipped else result.loss, dropped=len(dropped), new_samples=self.buffer.drain_new(),
            trained_offsets=trained, dropped_offsets=ranges_of(dropped),
            plan_wait_seconds=plan_wait, hold_seconds=held,
            plan_round_trip_seconds=self.reports.time_plans(self.plans.received()),
            prequential=result.prequential,
        )
        self.reports.record(step, self.buffer.first_unreported)
        value, headers = encode(feedback)
        produce(self.producer, self.feedback_topic, value, headers, self._feedback_delivered, self.device_id.encode())
        self.step += 1
        self.samples_trained += feedback.samples
        self.plans.forget_before(self.step)
        dead = self.consumer.dead_lettered - self._dead_lettered_seen
        self._dead_lettered_seen = self.consumer.dead_lettered
        compressed = result.buckets > 0 and result.compressed_buckets == result.buckets
        self.metrics.record_step(feedback, late=arrived is None, compressed=compressed, dead_lettered=dead)
        self.scores.record_step(feedback.prequential)
        self.metrics.count_rejected(self.plans.rejected)
        self.metrics.buffer_bytes.set(self.buffer.nbytes)
        if self.step % self.trainer.log_every == 0:
            self._log(feedback)
        return feedback

    def _adopt(self, trainer: TrainerConfig) -> None:
        """The settings the step ran under (the online input scaling): evaluated and published under them too."""
        self.trainer = trainer
        self.config = self.config.model_copy(update={"trainer": trainer})
        self.publisher.config = self.config
        if self.evaluator is not None:
            self.evaluator.collate_with(trainer, self.runner.collate)

    def _dead_letter_step(self, step: int, result: StepResult) -> None:
        """Every rank skipped the step (a loss or the aggregated gradient not finite): its samples, not trained,
        go to the dead-letter topic, so that committing past them loses nothing."""
        entries = self.buffer.in_flight()
        loss = "none" if result.loss is None else f"{result.loss:.4g}"
        detail = (f"step {step} skipped on every rank: this rank's loss {loss}, aggregated gradient norm "
                  f"{result.grad_norm}")
        self.consumer.dead_letter_buffered(entries, NON_FINITE_LOSS, detail)
        self.metrics.steps_skipped.inc()
        logger.warning("rank %d (%s): step %d skipped on every rank, a loss or the aggregated gradient is not finite "
                       "(this rank's loss %s, gradient norm %s): model and optimizer unchanged, its %d samples "
                       "dead-lettered as %s", self.ctx.rank, self.device_id, step, loss, result.grad_norm,
                       len(entries), NON_FINITE_LOSS)

    def _hold(self, plan: Assignment | None, started: float, result: StepResult, done: int) -> float:
        """Hold the step's report until the plan's target time when the group drained its buffers
        (`streamtrain.pacing`); the samples that arrive meanwhile go into this step's feedback. Returns
        the seconds held, reported apart from the step's timings and waits: the coordinator's overhead
        estimate must not count a wait it asked for. The work due after step `done` (evaluation, version) is done
        in the hold first: a version goes out a hold sooner, an evaluation that fits costs the stream nothing. Ranks
        may disagree on holding; the work's collectives still come in one order (before the checkpoint's)."""
        if plan is None or result.stop or not result.stepped:
            return 0.0  # a local plan has no target; an empty group step waits in `run` instead
        now = time.perf_counter()
        hold = report_hold_seconds(plan.step_time_target, now - started, result.group_backlog,
                                   self.trainer.hold_max_seconds)
        if hold <= 0:
            return 0.0
        self._due_work(done)
        self.consumer.wait_until(lambda: self.stop_requested, now + hold)
        return time.perf_counter() - now

    def _due_work(self, done: int) -> None:
        """Collective: the held-out evaluation and the model version due after step `done`, each once."""
        if self.evaluator is not None and done % self.trainer.eval_every == 0 and self._evaluated_step != done:
            self.evaluate(done)
        if self.group_publish and self.publisher.published_step != done:
            self.publish(done)

    def _checked(self, plan: Assignment | None) -> Assignment | None:
        """`plan`, or None when this device's part of it is one the rank must not obey (dead-lettered, counted)."""
        rejected = self.part_check.problem(plan) if plan is not None else None
        if plan is None or rejected is None:
            return plan
        self.plans.rejected[rejected.reason] += 1
        source = self.plans.source(plan.step)
        if source is not None:
            self.consumer.dead_letter(source, rejected.reason, rejected.detail)
        else:
            logger.warning("plan for step %d rejected: %s (%s)", plan.step, rejected.reason, rejected.detail)
        return None

    def _wait_for(self, offset: int) -> None:
        """Wait (at most the data wait) until this rank has fetched up to `offset` of its topic."""
        self.consumer.wait_until(lambda: offset < self.buffer.position,
                                 time.perf_counter() + self.trainer.data_wait_seconds)

    def _wait_for_plan(self, step: int, deadline: float) -> Assignment | None:
        # A plan for a later step means this step's plan is never coming: fall back at once.
        self.consumer.wait_until(lambda: self.plans.get(step) is not None or self.plans.has_newer(step), deadline)
        return self.plans.get(step)

    def _gather(self, selection: Selection, deadline: float, reserved: set[int]) -> list[int]:
        """Wait (bounded) for the selection's samples to be fetched, then name the offsets to train.

        A selection without offsets takes the oldest samples, passing over the `reserved` ones a plan for a
        later step already names (a fallback must not rob the plan after it).
        """
        if selection.offsets:
            wanted = selection.offsets
            last = max(wanted)
            self.consumer.wait_until(lambda: last < self.buffer.position, deadline)
            return list(wanted)  # planned offsets that never arrived (or were dead-lettered) are skipped
        if selection.count != 0:
            self.consumer.wait_until(lambda: len(self.buffer) > len(reserved), deadline)
        return self.buffer.select_oldest(selection.count, selection.size_budget, exclude=reserved)

    def evaluate(self, step: int) -> None:
        """Collective: evaluate the shared model (the moving average of its weights when `trainer.ema_decay` is set) on
        the held-out set after `step`; rank 0 publishes the result."""
        assert self.evaluator is not None
        result = self.evaluator.evaluate(self.runner.handed_out, step)
        self._evaluated_step = step
        self._heldout = result
        self.metrics.record_heldout(result.step, result.accuracy, result.loss, result.seconds)
        self.scores.record_heldout(result.metrics)
        if self.ctx.is_main:
            record = Evaluation(job=self.config.job, step=result.step, dataset=self.evaluator.name,
                                samples=result.samples, accuracy=result.accuracy, loss=result.loss,
                                seconds=result.seconds, objective=self.runner.objective.name, metrics=result.metrics)
            value, headers = encode(record)
            produce(self.producer, self.config.kafka.topics.evaluations, value, headers, self._feedback_delivered,
                    self.config.job.encode())
            objective = self.runner.objective
            shown = ", ".join(f"{k} {result.metrics[k]:.4g}" for k in (objective.headline, objective.baseline, "loss")
                              if k is not None and k in result.metrics)
            logger.info("held-out %s after step %d: %s (%d samples, %.2f s)", self.evaluator.name, result.step,
                        shown, result.samples, result.seconds)

    def publish(self, step: int) -> None:
        """Collective: publish a model version of the current weights or their moving average (`trainer.ema_decay`)
        after `step`, held-out evaluated first when `versions.evaluate`, so the version's metrics are its own."""
        if self.evaluator is not None and self.config.versions.evaluate and self._evaluated_step != step:
            self.evaluate(step)
        self.publisher.publish(step, self.runner.handed_out, self.device_id, self.buffer.lowest_unprocessed(),
                               heldout_metrics(self._heldout))

    def _feedback_delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.feedback_failed += 1
            logger.error("feedback could not be delivered: %s", err)

    # ---- offsets and checkpoints --------------------------------------------------------------------------

    def _after_step(self) -> None:
        if self.trainer.checkpoint_dir is not None and self.step % self.trainer.checkpoint_every == 0:
            self.checkpoint()
        elif self.trainer.checkpoint_dir is None or not self.trainer.commit_after_checkpoint:
            self._commit(self.buffer.lowest_unprocessed())

    def _reports_delivered(self, offset: int) -> bool:
        """Wait for this rank's feedback and dead letters to be in Kafka before `offset` is committed or
        checkpointed: once a commit passes a record, only they say it was trained, dropped or dead-lettered."""
        undelivered = self.producer.flush(COMMIT_FLUSH_S)
        if undelivered:
            logger.warning("%d feedback / dead-letter records not delivered in %.0f s: offset %d not committed yet",
                           undelivered, COMMIT_FLUSH_S, offset)
        return not undelivered

    def _commit(self, offset: int, delivered: bool = False) -> None:
        if offset == self.committed or not (delivered or self._reports_delivered(offset)):
            return
        if self.consumer.commit(offset):
            self.committed = offset
            self.metrics.committed_offset.set(offset)

    def checkpoint(self) -> bool:
        """Collective: rank 0 writes the group's checkpoint, then every rank commits the offset it holds.

        Returns:
            Whether the checkpoint was written (offsets are committed only then).
        """
        offset = self.buffer.lowest_unprocessed()
        delivered = self._reports_delivered(offset)
        ahead = [(r.start, r.end) for r in ranges_of(self.buffer.processed_ahead())]
        gathered: list[tuple[str, int, list[tuple[int, int]]] | None] = [None] * self.ctx.world_size
        # A rank whose reports are not in Kafka yet sends nothing new: its device keeps the previous checkpoint's.
        dist.all_gather_object(gathered, (self.device_id, offset, ahead) if delivered else None)
        ok: list[bool] = [True]
        if self.ctx.is_main and self.trainer.checkpoint_dir is not None:
            for device, device_offset, device_ahead in (g for g in gathered if g is not None):
                self._offsets[device], self._ahead[device] = device_offset, device_ahead
            state = Checkpoint(step=self.step, model=self.runner.model.module.state_dict(),
                               optimizer=self.runner.optimizer.state_dict(), offsets=dict(self._offsets),
                               job=self.config.job, world_size=self.ctx.world_size, done_ahead=dict(self._ahead),
                               inputs=[list(self.trainer.input_shift), list(self.trainer.input_scale)]
                               if self.runner.inputs is not None and self.trainer.input_shift else [])
            try:
                save_checkpoint(self.trainer.checkpoint_dir, state)
            except (OSError, NonFiniteCheckpointError) as exc:
                logger.error("checkpoint of step %d failed, offsets stay uncommitted: %s", self.step, exc)
                ok = [False]
        dist.broadcast_object_list(ok, src=0)
        if ok[0]:
            self._checkpointed_step = self.step
            if delivered:
                self._commit(offset, delivered=True)
        return bool(ok[0])

    def _finish(self) -> None:
        evaluated = self.evaluator is not None and self._evaluated_step != self.step
        if evaluated:
            self.evaluate(self.step)  # the model the run ends with; every rank stops after the same step
        if self.publisher.enabled and (self.publisher.published_step != self.step or evaluated):
            self.publish(self.step)  # the run's final version, with the figures of the last evaluation: its own
        if self.trainer.checkpoint_dir is not None:
            if self._checkpointed_step != self.step:
                self.checkpoint()
        else:
            self._commit(self.buffer.lowest_unprocessed())
        logger.info("rank %d (%s) stopped after step %d: %d samples trained, %d dead-lettered, %d truncated; "
                    "committed offset %s, %d plans late", self.ctx.rank, self.device_id, self.step,
                    self.samples_trained, self.consumer.dead_lettered, self.buffer.dropped_total, self.committed,
                    self.plans_late)

    def _log(self, fb: StepFeedback) -> None:
        loss = f"{fb.loss:.4f}" if fb.loss is not None else "-"
        logger.info("%s step %d: %d samples (size %d) loss %s | compute %.3fs plan wait %.3fs data wait %.3fs "
                    "comm %.3fs hold %.3fs | buffer %d next %d | %s, %d late, %d dropped, %d dead-lettered",
                    self.device_id, fb.step, fb.samples, fb.total_size, loss, fb.compute_seconds, fb.plan_wait_seconds,
                    fb.data_wait_seconds, fb.comm_seconds, fb.hold_seconds, fb.buffer_depth,
                    fb.lowest_unprocessed_offset, "local plan" if fb.plan_step < 0 else f"plan {fb.plan_step}",
                    self.plans_late, self.buffer.dropped_total, self.consumer.dead_lettered)

    def close(self) -> None:
        """Flush feedback and dead letters, leave Kafka."""
        self.consumer.close()
        left = self.producer.flush(30)
        if left:
            logger.error("%d feedback / dead-letter records were not delivered", left)


def run_rank(config: StreamtrainConfig, device_id: str) -> int:
    """Run one rank to completion in this process (torchrun environment); returns the exit status.

    SIGTERM and SIGINT finish the current step, then commit, checkpoint and return 0.
    """
    ctx = init_distributed(config.trainer)
    rank: TrainerRank | None = None
    try:
        rank = TrainerRank(config, device_id, ctx)

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            logger.info("rank %d: %s, stopping after this step", ctx.rank, signal.Signals(signum).name)
            if rank is not None:
                rank.request_stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        if config.trainer.metrics:
            base = config.metrics.port
            # Ranks on one host need distinct ports; ranks on different hosts (or containers) do not.
            port = serve_metrics(rank.metrics.registry, config.metrics.bind_address,
                                 base + ctx.local_rank if base else 0)
            logger.info("rank %d (%s): metrics on http://%s:%d/metrics", ctx.rank, device_id,
                        config.metrics.bind_address, port)
        try:
            start_rank(rank)  # resume, then the start-up profile (LBB's profiling phase)
            rank.run()
        finally:
            rank.close()
    finally:
        # Let go of the DDP model, its reducer and comm hook (all of which hold the process group) while the
        # interpreter is whole, then leave the group. Left to interpreter exit, gloo's threads could still hold
        # work whose release needs the GIL, and about one exit in fifteen aborted ("terminate called without an
        # active exception"): a finished run reported as a failed rank.
        rank = None
        gc.collect()
        destroy_distributed()
    return 0
