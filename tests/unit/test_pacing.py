"""The report hold shared by the trainer and the simulator (`streamtrain.pacing`)."""

from __future__ import annotations

import pytest

from streamtrain.pacing import report_hold_seconds


def test_a_drained_group_holds_until_the_target() -> None:
    assert report_hold_seconds(0.15, 0.03, group_backlog=0, max_hold_s=1.0) == pytest.approx(0.12)


def test_no_hold_with_a_backlog_a_filled_step_no_target_or_holding_off() -> None:
    assert report_hold_seconds(0.15, 0.03, group_backlog=1, max_hold_s=1.0) == 0.0
    assert report_hold_seconds(0.15, 0.20, group_backlog=0, max_hold_s=1.0) == 0.0
    assert report_hold_seconds(0.0, 0.03, group_backlog=0, max_hold_s=1.0) == 0.0
    assert report_hold_seconds(0.15, 0.03, group_backlog=0, max_hold_s=0.0) == 0.0


def test_the_hold_is_capped() -> None:
    assert report_hold_seconds(5.0, 0.1, group_backlog=0, max_hold_s=1.0) == 1.0
