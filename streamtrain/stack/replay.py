"""`streamtrain up --dataset`: a real dataset replayed into the device topics, one shard per device.

One producer process replays the dataset for every device (`producer.devices` = the stack's devices,
each with its own rate from the streams), so the dataset is loaded and sharded once and the shards
are disjoint; the sharding, loop, shuffle, bursts and schedules come from the `producer.*` settings as
for any producer. A sample's size is its length. The held-out set the trainers evaluate on is the
packaged dataset's test split, or the `<name>_TEST.<ext>` beside a `<name>_TRAIN.<ext>` (any format), unless
`trainer.eval_path` / `trainer.eval_packaged` already name one. Before anything starts, the dataset
is checked against the model's settings, so a mismatch fails with the setting to change, not with
every sample dead-lettered. A dataset whose classes are names (class directories, `.ts` classes, text
labels) gets `producer.dataset.class_names` from both splits, so the replayed samples and the held-out
set number every class alike even when one split lacks a class. The objective comes from the data
(`streamtrain.objectives.inference`: float targets, class labels, or neither) unless `trainer.objective` is
set, in which case the data is checked against it. One series over time (a CSV with no label, sample or target
column) is cut into windows, its tail held out (`streamtrain.stack.series`); any other dataset without a held-out
set has a share of its samples held out (`streamtrain.datasets.holdout`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamtrain.config import KafkaConfig, ProducerConfig, StreamtrainConfig, TrainerConfig
from streamtrain.datasets import (
    PACKAGED,
    Dataset,
    DatasetError,
    hold_out,
    is_one_series,
    load_dataset,
    packaged_file,
    subset,
    write_dataset,
)
from streamtrain.datasets.holdout import MIN_SAMPLES
from streamtrain.models.defaults import EMA_DECAY, default_model, default_training
from streamtrain.models.standardise import fit_input_scaling
from streamtrain.objectives.inference import fit_objective
from streamtrain.producers.service import ProducerError, StreamProducer
from streamtrain.runtime.commands import module_command

from .series import where_written, window_series
from .services import DeviceStream, ServiceSpec

__all__ = ["DatasetReplay", "produce_replay_backlog", "replay_producer_spec", "replay_settings", "resolve_replay"]


@dataclass(frozen=True)
class DatasetReplay:
    """What `--dataset` resolved to."""

    name: str
    """The packaged dataset's name, or the file or directory."""
    settings: dict[str, object]
    """Settings every child gets: what producers replay, and the held-out set when one was derived."""
    held_out: str | None
    """The held-out set in force (None: no evaluation)."""
    samples: int
    features: int
    classes: int
    objective: str = "classification"
    """The objective in force: `trainer.objective` as set, or the one the data is for."""
    objective_why: str = ""
    """Why this objective: read from the data (and what in it), or set (and what the data carries)."""
    warnings: tuple[str, ...] = ()
    """What in the data will not train as the user may expect (samples left out or to be dead-lettered)."""
    model_why: str = ""
    """Why `trainer.model` is the one in force: chosen from the data's shape, or set."""
    input_notes: tuple[str, ...] = ()
    """The input standardisation in force, for a person: where its figures came from, and columns of note."""
    series_note: str = ""
    """How one series over time was cut into windows, and its tail held out ("": the dataset is not one series)."""
    held_out_note: str = ""
    """How a share of a dataset without a held-out set was held out, or why none was ("": it has one, or is one
    series)."""


def _held_out_beside(path: Path) -> Path | None:
    """`<name>_TEST.<ext>` beside a `<name>_TRAIN.<ext>` file of any format (.ts, .npz, .npy, .csv), if it exists."""
    if path.is_file() and path.stem.upper().endswith("_TRAIN"):
        tail = path.stem[-len("_TRAIN"):]
        test = tail.replace("TRAIN", "TEST").replace("Train", "Test").replace("train", "test")
        sibling = path.with_name(path.stem[: -len(tail)] + test + path.suffix)
        return sibling if sibling.is_file() else None
    return None


#: `up --dataset` makes the global batch at most this fraction of the training split when the user did not set it.
STEPS_PER_PASS = 8


def resolve_replay(choice: str, cfg: StreamtrainConfig, devices: int = 1, workdir: Path | None = None) -> DatasetReplay:
    """Resolve `--dataset CHOICE` (a packaged dataset's name, or a file or directory) against `cfg`.

    `trainer.num_features` and `trainer.num_classes` the user did not set are taken from the dataset (its
    series' dimensions, its classes); ones they set are checked against it. An unset `coordinator.global_batch`
    larger than an eighth of the dataset becomes that eighth (at least one sample per device): the default
    256 would train a dataset of a hundred series in two steps per pass. One series over time is cut into windows
    written under `workdir` (`streamtrain.stack.series`), its tail held out.

    Raises:
        ValueError: the dataset cannot be loaded, or it does not fit `trainer.num_features` /
            `trainer.num_classes` as set (the message says which setting to change).
    """
    settings: dict[str, object] = {}
    trainer = cfg.trainer
    try:
        if choice in PACKAGED:
            path = packaged_file(choice, "train")
            settings["producer.dataset.packaged"] = choice
            derived: tuple[str, object] | None = ("trainer.eval_packaged", choice)
        else:
            path = Path(choice).resolve()
            settings["producer.dataset.path"] = str(path)
            beside = _held_out_beside(path)
            derived = ("trainer.eval_path", str(beside)) if beside is not None else None
        reading = cfg.producer.dataset
        dataset = load_dataset(path, reading.label_column, reading.sample_column, reading.class_names,
                               reading.target_columns)
    except DatasetError as exc:
        raise ValueError(f"--dataset {choice}: {exc}") from None
    dataset, held_out, series_note = _one_series(choice, dataset, cfg, workdir, _held_out(trainer, derived, settings),
                                                 settings)
    held_out_note = ""
    if held_out is None and not series_note:
        dataset, held_out, held_out_note = _hold_out_share(choice, dataset, cfg, workdir, settings)
    features = {s.shape[1:] for s in dataset.samples}
    explicit = set(trainer.model_fields_set)  # set by the file, the environment or a flag; the rest are defaults
    only = next(iter(features)) if len(features) == 1 else ()
    if "num_features" not in explicit and len(only) == 1:  # the user left it: the model takes the dataset's
        settings["trainer.num_features"] = only[0]
        trainer = trainer.model_copy(update={"num_features": only[0]})
    if features != {(trainer.num_features,)}:
        shape = " or ".join("(size, " + ", ".join(map(str, f)) + ")" for f in sorted(features))
        hint = f" (--set trainer.num_features={next(iter(features))[0]})" if len(features) == 1 and len(
            next(iter(features))) == 1 else ""
        raise ValueError(f"--dataset {choice}: its samples have shape {shape} but the model takes "
                         f"(size, {trainer.num_features}): set trainer.num_features{hint}")
    fit = fit_objective(dataset, trainer, explicit, f"--dataset {choice}", reading.target_columns)
    settings |= fit.settings
    trainer = trainer.model_copy(update={k.removeprefix("trainer."): v for k, v in fit.settings.items()})
    classes = (_classes(choice, cfg, trainer, explicit, dataset, held_out, settings)
               if fit.objective == "classification" else 0)
    model_why, input_notes = _model(dataset, trainer, explicit, settings), _inputs(dataset, trainer, explicit,
                                                                                    fit.objective, settings)
    if "global_batch" not in cfg.coordinator.model_fields_set and (
            cfg.coordinator.global_batch * STEPS_PER_PASS > len(dataset)):
        settings["coordinator.global_batch"] = max(devices, len(dataset) // STEPS_PER_PASS)
    return DatasetReplay(choice, settings, held_out, len(dataset), trainer.num_features, classes, fit.objective,
                         fit.why, (*_left_out(dataset), *fit.warnings), model_why, input_notes, series_note,
                         held_out_note)


def _held_out(trainer: TrainerConfig, derived: tuple[str, object] | None, settings: dict[str, object]) -> str | None:
    """The held-out set in force: the one `trainer.eval_path` / `eval_packaged` names, else the one `derived` from the
    dataset (its setting added to `settings`), else None."""
    if trainer.eval_path is not None or trainer.eval_packaged is not None:
        return str(trainer.eval_path or trainer.eval_packaged)
    if derived is None:
        return None
    settings[derived[0]] = derived[1]
    return str(derived[1])


def _one_series(choice: str, dataset: Dataset, cfg: StreamtrainConfig, workdir: Path | None, held_out: str | None,
                settings: dict[str, object]) -> tuple[Dataset, str | None, str]:
    """A dataset of one series over time, to forecast, cut into windows (`streamtrain.stack.series`): the windows to
    train on, the held-out set in force and what was cut, with their settings added to `settings`; any other dataset
    as it is."""
    trainer = cfg.trainer
    if not is_one_series(dataset) or ("objective" in trainer.model_fields_set and trainer.objective != "forecast"):
        return dataset, held_out, ""
    beside = _held_out_beside(Path(dataset.sources[0]))
    windows = window_series(f"--dataset {choice}", dataset, cfg.producer.dataset, trainer, workdir, held_out,
                            beside if beside is not None and held_out == str(beside) else None)
    settings |= windows.settings
    held = windows.settings.get("trainer.eval_path", held_out)
    return windows.dataset, None if held is None else str(held), windows.note


def _hold_out_share(choice: str, dataset: Dataset, cfg: StreamtrainConfig, workdir: Path | None,
                    settings: dict[str, object]) -> tuple[Dataset, str | None, str]:
    """A dataset without a held-out set, `producer.dataset.held_out_share` of its samples held out
    (`streamtrain.datasets.holdout`): both sides written under `workdir` (a new temporary directory when None), the
    producer pointed at the training side and the ranks at the held-out one (added to `settings`). Returns the
    samples to train on, the held-out set and what was done; the dataset whole, None and why when it is too small."""
    share = cfg.producer.dataset.held_out_share
    split = hold_out(dataset, share, cfg.producer.seed)
    if split is None:
        why = (f"{len(dataset)} samples are too few to hold some out (at least {MIN_SAMPLES})" if len(dataset) <
               MIN_SAMPLES else "some of its samples are labelled and some are not")
        return dataset, None, f"none: {why}; name a held-out set with trainer.eval_path"
    folder, stem = where_written(Path(choice), workdir)
    train = subset(dataset, split.train)
    settings["producer.dataset.path"] = str(write_dataset(train, folder / f"{stem}_TRAIN.npz"))
    held = write_dataset(subset(dataset, split.held_out), folder / f"{stem}_TEST.npz")
    settings["trainer.eval_path"] = str(held)
    how = ", class by class" if split.stratified else ""
    return train, str(held), (f"{len(split.held_out)} of its {len(dataset)} samples held out at random{how} "
                              f"(producer.dataset.held_out_share={share:g}, producer.seed={cfg.producer.seed}), "
                              f"never trained on; the other {len(train)} replayed; both written to {folder}")


def _model(dataset: Dataset, trainer: TrainerConfig, explicit: set[str], settings: dict[str, object]) -> str:
    """`trainer.model` from the data's shape when the user left it unset, and its optimiser settings when they are
    all unset (`streamtrain.models.defaults`); why."""
    if "model" in explicit:
        name, why = trainer.model, f"{trainer.model}, set by trainer.model"
    else:
        choice = default_model(dataset.sizes, trainer.num_features)
        name = choice.name
        settings |= {"trainer.model": name, **{k: v for k, v in choice.settings.items()
                                                 if k.removeprefix("trainer.") not in explicit}}
        why = f"{name}, chosen from the data's shape: {choice.why} (--set trainer.model=... to choose)"
    training = default_training(name)
    if training and not explicit & {"optimizer", "lr", "lr_scaling"}:
        settings |= training
        why += (f"; trained with {training['trainer.optimizer']} at lr {training['trainer.lr']}, no linear lr "
                "scaling (the quality panel's defaults; --set trainer.optimizer / lr / lr_scaling to choose)")
    if training and "ema_decay" not in explicit:
        settings["trainer.ema_decay"] = EMA_DECAY
        why += (f"; evaluated and published as the moving average of its weights (trainer.ema_decay={EMA_DECAY:g}; "
                "0: the last step's)")
    return why


def _inputs(dataset: Dataset, trainer: TrainerConfig, explicit: set[str], objective: str,
            settings: dict[str, object]) -> tuple[str, ...]:
    """`trainer.input_shift` / `input_scale` fitted on the training split unless set or off; what to say of them."""
    if not trainer.input_standardise:
        return ("inputs: not standardised (trainer.input_standardise=false)",)
    if objective == "forecast":
        return ("inputs: not standardised (a forecast normalises each series itself)",)
    if "input_shift" in explicit or "input_scale" in explicit:
        return ("inputs: standardised by trainer.input_shift / input_scale as set",)
    scaling = fit_input_scaling(dataset.samples)
    settings |= scaling.settings()
    pairs = ", ".join(f"{s:g}/{c:g}" for s, c in zip(scaling.shift[:6], scaling.scale[:6], strict=True))
    more = f", ... ({len(scaling.shift)} features)" if len(scaling.shift) > 6 else ""
    return (f"inputs standardised per feature, (x - shift) / scale from the training split's median and IQR "
            f"(trainer.input_shift / input_scale; shift/scale: {pairs}{more})", *scaling.notes)


def _left_out(dataset: Dataset) -> list[str]:
    """What `up` says of the samples the load left out one by one (their file's other samples replay)."""
    left = dataset.skipped_samples
    if not left:
        return []
    by_file: dict[str, list[int]] = {}
    for s in left:
        by_file.setdefault(s.path, []).append(s.index)
    where = "; ".join(f"{path}: sample{'s' if len(ix) > 1 else ''} {', '.join(map(str, ix[:8]))}"
                      f"{', ...' if len(ix) > 8 else ''}" for path, ix in list(by_file.items())[:3])
    return [f"{len(left)} sample{'s' if len(left) > 1 else ''} left out: {left[0].reason} ({where})"]


def _classes(choice: str, cfg: StreamtrainConfig, trainer: TrainerConfig, explicit: set[str], dataset: Dataset,
             held_out: str | None, settings: dict[str, object]) -> int:
    """The classes of a classification dataset: `trainer.num_classes` and `producer.dataset.class_names` set in
    `settings` where the user left them unset, checked where they set them.

    Raises:
        ValueError: the labels go beyond `trainer.num_classes` as set.
    """
    names = dataset.class_names
    # Numbered apart, a held-out split lacking a class would number the ones after it differently: one list of
    # names for both, the training split's first (their numbers unchanged), then any only the held-out split has.
    share_names = names is not None and cfg.producer.dataset.class_names is None
    # Numbers as written: the held-out split may hold a class the training split lacks, which needs an output too.
    count_held_out = names is None and dataset.labelled and "num_classes" not in explicit
    held = _held_out_dataset(held_out, cfg) if held_out is not None and (share_names or count_held_out) else None
    if share_names and names is not None:
        only_held_out = [n for n in held.class_names or () if n not in names] if held is not None else []
        names = (*names, *only_held_out)
        settings["producer.dataset.class_names"] = list(names)
    classes = len(names) if names is not None else int(dataset.labels.max()) + 1 if dataset.labelled else 0
    if count_held_out and held is not None and len(held.labels):
        classes = max(classes, int(held.labels.max()) + 1)
    if "num_classes" not in explicit and classes:
        settings["trainer.num_classes"] = max(classes, 2)
        trainer = trainer.model_copy(update={"num_classes": max(classes, 2)})
    if classes > trainer.num_classes:
        raise ValueError(f"--dataset {choice}: its labels go up to {classes - 1} but trainer.num_classes is "
                         f"{trainer.num_classes} (--set trainer.num_classes={classes})")
    return classes


def _held_out_dataset(held_out: str, cfg: StreamtrainConfig) -> Dataset:
    """The held-out set, read as the ranks read it (the `producer.dataset` settings).

    Raises:
        ValueError: it cannot be read (the message names it).
    """
    try:
        return _read_held_out(held_out, cfg)
    except DatasetError as exc:
        raise ValueError(f"held-out set {held_out}: {exc}") from None


def _read_held_out(held_out: str, cfg: StreamtrainConfig) -> Dataset:
    """The held-out set named as `trainer.eval_packaged` (a packaged name) or `trainer.eval_path`.

    Raises:
        DatasetError: it cannot be read.
    """
    path = packaged_file(held_out, "test") if held_out in PACKAGED else Path(held_out)
    reading = cfg.producer.dataset
    return load_dataset(path, reading.label_column, reading.sample_column, reading.class_names,
                        reading.target_columns)


def held_out_chance(cfg: StreamtrainConfig) -> float | None:
    """The accuracy of always answering the held-out set's most common class: the baseline a run's held-out
    accuracy is read against. 1 / num_classes would be wrong for a set whose classes are uneven or numbered with
    gaps (labels 3, 7 and 10 make 11 outputs, three of them used). None without a readable held-out set."""
    held_out = cfg.trainer.eval_path or cfg.trainer.eval_packaged
    if held_out is None:
        return None
    try:
        labels = _read_held_out(str(held_out), cfg).labels
    except DatasetError:
        return None  # the ranks said why at start-up
    if not len(labels) or (labels < 0).any():
        return None  # empty or unlabelled: the ranks evaluated nothing
    return float(np.bincount(labels).max() / len(labels))


def replay_settings(streams: Sequence[DeviceStream], seed: int) -> dict[str, object]:
    """The `producer.*` settings of the one producer that replays the dataset for every stream, at its rate."""
    return {
        "producer.devices": len(streams), "producer.device_ids": [s.device_id for s in streams],
        "producer.rate.kind": "constant", "producer.rate.rates": [s.rate for s in streams],
        "producer.seed": seed,
    }


def replay_producer_spec(streams: Sequence[DeviceStream], seed: int, port: int, common: dict[str, object],
                         global_args: Sequence[str]) -> ServiceSpec:
    """`streamtrain produce` replaying the configured dataset into every device topic (one shard each)."""
    sets: dict[str, object] = {
        **common, **replay_settings(streams, seed),
        "producer.duration_seconds": 0, "producer.metrics_port": port, "producer.tick_seconds": 0.01,
    }
    argv = module_command("streamtrain.producers", "produce", "--no-progress", global_args=global_args, sets=sets)
    return ServiceSpec("producer-replay", "producer", argv, (port,))


def produce_replay_backlog(kafka: KafkaConfig, base: ProducerConfig, streams: Sequence[DeviceStream], seed: int,
                           samples: int) -> float:
    """Publish `samples` records of every device's shard before training starts; returns the seconds it took.

    Raises:
        ProducerError: when a sample cannot be delivered or the producer fails.
    """
    began = time.monotonic()
    tree: dict[str, Any] = base.model_dump()
    tree.update(devices=len(streams), device_ids=[s.device_id for s in streams], seed=seed, max_samples=samples,
                duration_seconds=None, metrics=False, metrics_port=None)
    tree["rate"] = {**tree["rate"], "kind": "unlimited", "preset": None, "rates": None, "schedule": [],
                    "bursts": None, "trace": None}
    producer = StreamProducer(kafka, ProducerConfig.model_validate(tree))
    summary = producer.run()
    want = samples * len(streams)
    if not summary.ok or int(producer.sent.sum()) != want:
        raise ProducerError(f"dataset backlog: {int(producer.sent.sum())} of {want} samples delivered "
                            f"({int(summary.final.failed.sum())} failed)")
    return time.monotonic() - began
