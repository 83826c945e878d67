"""Training as `streamtrain up --dataset` would, in one process and without a broker: the model, optimiser, moving
average, standardisation and global batch `up` chooses for a dataset, on replayed batches. For the tests that hold
a built-in model's defaults to beating the mean on data of a given shape."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from streamtrain.config import StreamtrainConfig, TrainerConfig
from streamtrain.models import build_collate, build_model
from streamtrain.objectives import build_objective
from streamtrain.stack.replay import resolve_replay
from streamtrain.trainer.averaging import WeightAverage
from streamtrain.trainer.step import build_optimizer
from streamtrain.wire import Sample

__all__ = ["train_as_up_does", "trained_on"]


#: What a run gives: (held-out RMSE, the training mean's, the model, what a version records of its choice of head).
Outcome = tuple[float, float, str, dict[str, float]]


def train_as_up_does(train: Path, test: Path, steps: int) -> Outcome:
    """`up --dataset`'s choices for `train` (model, optimiser, moving average, standardisation, global batch), trained
    on replayed batches for `steps` steps in one process: (held-out RMSE, the training mean's, the model, the metrics
    a version of it would record of its choice of head)."""
    replay = resolve_replay(str(train), StreamtrainConfig(), devices=2)
    trainer = {k.removeprefix("trainer."): v for k, v in replay.settings.items() if k.startswith("trainer.")}
    trainer.pop("eval_path", None)
    config = TrainerConfig.model_validate(trainer)
    torch.manual_seed(0)  # the weights' initialisation and dropout: one figure per run, not a draw
    model, collate, objective = build_model(config), build_collate(config), build_objective(config)
    optimizer, average = build_optimizer(model, config), WeightAverage(model, config.ema_decay)
    data = np.load(train)
    pairs = zip(data["x"], data["y"][:, 0], strict=True)
    samples = [Sample.from_array("0", i, x, target=[float(t)]) for i, (x, t) in enumerate(pairs)]
    batch_size = int(replay.settings["coordinator.global_batch"])  # type: ignore[call-overload]
    order = np.random.default_rng(0).permutation(np.tile(np.arange(len(samples)), steps * batch_size // len(samples)
                                                         + 1))
    model.train()
    for step in range(steps):
        batch = collate([samples[i] for i in order[step * batch_size: (step + 1) * batch_size]], config)
        optimizer.zero_grad()
        objective.losses(model(batch), batch).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        average.update(model)
    held = np.load(test)
    batch = collate([Sample.from_array("0", i, x, target=[float(t)]) for i, (x, t) in
                     enumerate(zip(held["x"], held["y"][:, 0], strict=True))], config)
    average.module.eval()
    with torch.no_grad():
        predicted = objective.predicted(average.module(batch), batch)[:, 0].double().numpy()
    rmse = float(np.sqrt(np.mean((predicted - held["y"][:, 0]) ** 2)))
    metrics = getattr(average.module, "version_metrics", dict)()
    return rmse, float(np.sqrt(np.mean((data["y"].mean() - held["y"]) ** 2))), config.model, metrics


def trained_on(tmp_path: Path, seed: int, sizes: tuple[int, int],
               make: Callable[[int, np.random.Generator], tuple[np.ndarray, np.ndarray]]) -> Outcome:
    """`train_as_up_does` on a training and a held-out split of `sizes` samples drawn by `make` (arrays,
    targets)."""
    rng = np.random.default_rng(seed)
    for split, n in zip(("TRAIN", "TEST"), sizes, strict=True):
        x, y = make(n, rng)
        np.savez(tmp_path / f"{split}.npz", x=x, y=y[:, None])
    return train_as_up_does(tmp_path / "TRAIN.npz", tmp_path / "TEST.npz", steps=250)
