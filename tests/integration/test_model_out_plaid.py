"""Acceptance: after a short `up --dataset plaid` (make demo's command), the docs' load snippet loads `<out>/model`
and predicts PLAID's test split with the held-out accuracy the run printed: the same number, on the same samples."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
from pathlib import Path

import pytest

from streamtrain.datasets import DatasetError, packaged_file
from streamtrain.runtime.commands import CLI_MODULE, module_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def load_snippet() -> str:
    """The Python block after `<!-- load-snippet -->` in docs/guides/serving.md."""
    page = (ROOT / "docs" / "guides" / "serving.md").read_text()
    found = re.search(r"<!-- load-snippet -->\n```python\n(.*?)```", page, re.S)
    assert found, "docs/guides/serving.md has no load snippet"
    return found.group(1)


def test_the_docs_snippet_predicts_plaid_with_the_accuracy_up_printed(broker: object, tmp_path: Path) -> None:
    try:
        packaged_file("plaid", "test")
    except DatasetError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "demo"
    # A few seconds of training make a model: what is checked is that the snippet reproduces the printed accuracy.
    argv = module_command(CLI_MODULE, "up", "--dataset", "plaid", "--rates", "9,9,9,3", "--duration", "6",
                          "--drain-timeout", "5", "--no-prometheus", "--no-live", "--broker", "external", "--out",
                          str(out), global_args=["--config", str(ROOT / "examples" / "plaid-demo.toml")],
                          sets={"kafka.bootstrap_servers": broker.bootstrap})  # type: ignore[attr-defined]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    printed = report["heldout_accuracy_final"]
    said = " ".join(run.stdout.split())  # as the person running it read it, however the terminal wrapped it
    assert f"{printed:.3f} at the last" in said
    assert f"load it with import streamtrain; model = streamtrain.load_model('{out / 'model'}')" in said

    snippet = load_snippet().replace("reports/demo/model", str(out / "model"))
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        exec(compile(snippet, "docs/guides/serving.md", "exec"), {})
    version, step, accuracy = shown.getvalue().split()
    spec = json.loads((out / "model" / "model.json").read_text())
    assert int(version) == spec["version"] and int(step) == spec["step"] == spec["metrics"]["heldout_step"]
    assert float(accuracy) == pytest.approx(printed, abs=1e-12)
    assert spec["metrics"]["heldout_samples"] == report["heldout_samples"]
    # The final version carries its test-then-train figures too, not only the held-out ones.
    assert spec["metrics"]["prequential_samples"] > 0 and 0 <= spec["metrics"]["prequential_accuracy"] <= 1
