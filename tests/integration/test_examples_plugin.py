"""The README's "your own model on your own data" path, run as a user would: the plug-in module in `examples/`,
its toy `.ts` data, `streamtrain up --dataset` on the real broker; and a broken plug-in stopping `up` at start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamtrain.config import KafkaConfig
from streamtrain.runtime.commands import CLI_MODULE, module_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _up(tmp_path: Path, sets: list[str], *args: str, timeout: float = 400, paths: tuple[Path, ...] = (EXAMPLES,),
        kafka: KafkaConfig | None = None) -> subprocess.CompletedProcess[str]:
    """`up` on its embedded broker, or with `kafka` on that broker (the session's: no broker start of its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    env.update(COLUMNS="200", PYTHONPATH=os.pathsep.join([*map(str, paths), env.get("PYTHONPATH", "")]))
    if kafka is not None:
        sets = [*sets, f"kafka.bootstrap_servers={kafka.bootstrap_servers}", f"kafka.topic_prefix={kafka.topic_prefix}"]
    cmd = module_command(CLI_MODULE, "up", *args, "--broker", "embedded" if kafka is None else "external",
                         "--no-prometheus", "--no-live", "--out",
                         str(tmp_path / "run"), global_args=[a for s in sets for a in ("--set", s)])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


PLUGIN = ["trainer.model=series_plugin:build_model", "trainer.collate=series_plugin:collate",
          "trainer.num_features=2", "trainer.num_classes=3", "trainer.hidden_size=16", "trainer.eval_every=5"]


@pytest.mark.timeout(450)
def test_the_example_plugin_trains_on_its_own_ts_data_through_up(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    written = subprocess.run([sys.executable, str(EXAMPLES / "toy_series.py"), str(tmp_path / "data")],
                             capture_output=True, text=True, check=True)
    assert written.stdout.split() == [str(tmp_path / "data" / "Toy_TRAIN.ts"), str(tmp_path / "data" / "Toy_TEST.ts")]
    proc = _up(tmp_path, PLUGIN, "--dataset", "data/Toy_TRAIN.ts", "--devices", "2", "--rates", "20,30",
               "--steps", "15", "--drain-timeout", "60", kafka=kafka_cfg)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert "held-out set: " + str(tmp_path / "data" / "Toy_TEST.ts") in proc.stdout.replace("\n", "")
    # What the model learned, as `make demo` ends: test-then-train accuracy, then held-out accuracy beside it.
    closing = proc.stdout.replace("\n", " ")
    assert closing.index("test-then-train accuracy (") < closing.index("held-out accuracy (")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["samples_unaccounted"] == 0 and report["samples_dead_lettered"] == 0
    assert report["samples_trained"] > 0 and report["failures"] == []
    assert report["heldout_dataset"].endswith("Toy_TEST.ts") and report["heldout_samples"] == 90
    assert report["heldout_evaluations"] >= 3  # every 5 steps, and after the last
    assert 0.0 <= report["heldout_accuracy_final"] <= 1.0 and report["heldout_loss_final"] > 0
    assert (tmp_path / "run" / "plots" / "heldout.png").is_file()
    trainers = (tmp_path / "run" / "logs" / "trainers.log").read_text()
    assert "plug-in check passed: model 'series_plugin:build_model', collate 'series_plugin:collate'" in trainers


@pytest.mark.timeout(300)
def test_a_plugin_with_the_wrong_class_count_stops_up_at_start_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    subprocess.run([sys.executable, str(EXAMPLES / "toy_series.py"), str(tmp_path / "data")], check=True,
                   capture_output=True)
    # num_classes=5 for a 3-class dataset is allowed; the plug-in answering 3 logits is not.
    (tmp_path / "wrong_plugin.py").write_text(
        "from series_plugin import PaddedConvNet\n\n"
        "def build_model(config):\n    return PaddedConvNet(config.num_features, 3, 8)\n")
    sets = [s.replace("trainer.num_classes=3", "trainer.num_classes=5").replace(
        "series_plugin:build_model", "wrong_plugin:build_model") for s in PLUGIN]
    proc = _up(tmp_path, sets, "--dataset", "data/Toy_TRAIN.ts", "--devices", "2", "--steps", "5", timeout=280,
               paths=(tmp_path, EXAMPLES))
    assert proc.returncode != 0
    text = " ".join((proc.stdout + proc.stderr).split())  # however the console wrapped the message
    assert "trainer.model: 'wrong_plugin:build_model' returned outputs of shape (3, 3)" in text
    assert "expected (3, 5)" in text
    assert "embedded Kafka broker on" not in text  # up checks the plug-in before it starts anything
