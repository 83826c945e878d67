"""Write a small variable-length, two-dimensional `.ts` dataset to try a plug-in on (no download needed).

Three classes of noisy waves — sine, square, sawtooth — of 30 to 300 steps, in two dimensions (the
second is the first's derivative), written as the UEA/UCR archive writes them:

    .venv/bin/python examples/toy_series.py data/        # data/Toy_TRAIN.ts (240 series), data/Toy_TEST.ts (90)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

__all__ = ["write_toy"]

CLASSES = ("sine", "square", "saw")


def _series(kind: str, rng: np.random.Generator) -> np.ndarray:
    n = int(rng.integers(30, 301))
    phase = rng.uniform(0, 2 * np.pi) + np.arange(n) * rng.uniform(0.1, 0.3)
    if kind == "sine":
        wave = np.sin(phase)
    elif kind == "square":
        wave = np.sign(np.sin(phase))
    else:
        wave = (phase / np.pi) % 2.0 - 1.0
    wave = wave * rng.uniform(0.5, 20.0) + 0.2 * rng.standard_normal(n)
    return np.stack([wave, np.gradient(wave)], axis=1)


def _write(path: Path, count: int, rng: np.random.Generator) -> None:
    lines = ["# toy waves written by examples/toy_series.py", "@problemName Toy", "@timeStamps false",
             "@missing false", "@univariate false", "@dimensions 2", "@equalLength false",
             f"@classLabel true {' '.join(CLASSES)}", "@data"]
    for i in range(count):
        kind = CLASSES[i % len(CLASSES)]
        series = _series(kind, rng)
        dims = [",".join(f"{v:.5g}" for v in series[:, d]) for d in range(series.shape[1])]
        lines.append(":".join([*dims, kind]))
    path.write_text("\n".join(lines) + "\n")


def write_toy(directory: Path, train: int = 240, test: int = 90, seed: int = 0) -> tuple[Path, Path]:
    """Write `Toy_TRAIN.ts` and `Toy_TEST.ts` under `directory`; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = directory / "Toy_TRAIN.ts", directory / "Toy_TEST.ts"
    _write(paths[0], train, rng)
    _write(paths[1], test, rng)
    return paths


if __name__ == "__main__":
    for written in write_toy(Path(sys.argv[1] if len(sys.argv) > 1 else "data")):
        print(written)
