"""`streamtrain bench balance` end to end, small: 2 ranks (one 3x slower), 2 policies, 1 DIF, a few steps."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from streamtrain.benchmarks.balance.figures import BalanceResult, combine, comparisons
from streamtrain.benchmarks.balance.render import target_cells
from streamtrain.runtime.commands import CLI_MODULE, module_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_bench_balance_writes_cells_for_every_policy(tmp_path: Path, broker: Any) -> None:
    out = tmp_path / "bench"
    # b_max 64: a model this small costs almost nothing per sample, so in the first steps (before the time models
    # settle) ett-stream could hand the fast rank its whole backlog and leave the window with one rank idle.
    cmd = [*module_command(CLI_MODULE, sets={"kafka.bootstrap_servers": broker.bootstrap, "trainer.hidden_size": 16,
                                             "trainer.num_layers": 1, "coordinator.b_max": 64}),
           "bench", "balance", "--external", "--out", str(out), "--policy", "static", "--policy", "ett-stream",
           "--dif", "16", "--slowdowns", "1,3", "--global-batch", "96", "--warmup", "3", "--steps", "4",
           "--work-dir", str(tmp_path / "runs")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=230, env={**env, "COLUMNS": "200"})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"

    doc = BalanceResult.load(out / "balance.json")
    assert (out / "balance.png").stat().st_size > 0
    cells = {c.fig.policy: c.fig for c in combine(doc.runs)}
    assert sorted(cells) == ["ett-stream", "static"]
    for cell in cells.values():
        assert cell.slowdowns == (1.0, 3.0) and cell.dif == 16.0 and cell.error is None
        assert cell.steps_measured == 4 and cell.samples_unaccounted == 0
        assert cell.step_seconds_median is not None and 0 < cell.step_seconds_median < 30
        assert cell.samples_per_s is not None and cell.samples_per_s > 0
        assert cell.straggler_effect_median is not None and cell.straggler_effect_median >= 0
        assert cell.wall_step_seconds_median is not None
        # The window is split on its critical path, and the backlog outlasted it (checked from the feedback).
        split = cell.step_period_split_median or {}
        assert {"compute", "communication", "plan_wait", "data_wait", "hold"} <= set(split) and split["compute"] > 0
        assert cell.plan_wait_seconds_median is not None and cell.plan_wait_seconds_median >= 0
        assert cell.backlog_held is True
        # the same DIF-16 backlog in both cells
        assert cell.size_dif_measured is not None and abs(cell.size_dif_measured - 16.0) < 3.0
    # static splits the batch evenly; ett-stream gives the 3x slower rank less.
    static = cells["static"]
    assert static.rank_samples_median["0"] == static.rank_samples_median["1"]
    ett = cells["ett-stream"].rank_samples_median
    assert (ett["1"] or 0) < (ett["0"] or 0)
    # The target loss is static's own at mid-window, so static reaches it.
    assert doc.target_loss["16"] is not None and static.seconds_to_target is not None
    fleet, dif, ett_cell, static_cell = target_cells(doc)
    assert (fleet, dif) == ((1.0, 3.0), 16.0) and ett_cell is not None and static_cell is not None
    assert [p.dif for p in comparisons(doc.runs, doc.setup)] == [16.0]
