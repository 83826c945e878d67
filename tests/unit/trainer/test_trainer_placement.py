"""Which device a rank trains: by global rank from --devices, by local rank from --node-devices."""

from __future__ import annotations

import pytest

from streamtrain.trainer.errors import TrainerSetupError
from streamtrain.trainer.placement import device_for_rank


def test_devices_are_picked_by_global_rank() -> None:
    assert device_for_rank(["a", "b", "c"], [], {"RANK": "2", "LOCAL_RANK": "0"}) == "c"
    assert device_for_rank(["a"], [], {}) == "a"  # no torchrun: a group of one
    with pytest.raises(TrainerSetupError, match="RANK 3 has no device in --devices"):
        device_for_rank(["a", "b"], [], {"RANK": "3"})


def test_node_devices_are_picked_by_local_rank_whatever_the_global_rank() -> None:
    # Node 2 of an elastic group: its ranks are 2, 3 in a world of 4, or 0, 1 once node 1 has left.
    for rank in ("2", "0"):
        env = {"RANK": rank, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}
        assert device_for_rank([], ["cam2", "cam3"], env) == "cam2"
    assert device_for_rank([], ["cam2", "cam3"], {"RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == "cam3"
    assert device_for_rank([], ["x", "y"], {"RANK": "1"}) == "y"  # no LOCAL_RANK: one node, the same


def test_node_devices_must_name_one_device_per_local_rank() -> None:
    with pytest.raises(TrainerSetupError, match="names 4 devices but this node runs 2 ranks"):
        device_for_rank([], ["a", "b", "c", "d"], {"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
    with pytest.raises(TrainerSetupError, match="LOCAL_RANK 2 has no device"):
        device_for_rank([], ["a", "b"], {"LOCAL_RANK": "2"})


def test_both_lists_or_neither_or_a_bad_environment_are_setup_errors() -> None:
    with pytest.raises(TrainerSetupError, match="not both"):
        device_for_rank(["a"], ["b"], {})
    with pytest.raises(TrainerSetupError, match="say which device"):
        device_for_rank([], [], {})
    with pytest.raises(TrainerSetupError, match="LOCAL_RANK='x' is not an integer"):
        device_for_rank([], ["a"], {"LOCAL_RANK": "x"})


def test_train_stops_at_start_with_exit_status_2_on_a_node_list_that_does_not_fit() -> None:
    from typer.testing import CliRunner

    from streamtrain.cli import app

    env = {"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3", "WORLD_SIZE": "3"}
    result = CliRunner().invoke(app, ["train", "--node-devices", "a,b"], env=env)
    assert result.exit_code == 2 and "--node-devices names 2 devices but this node runs 3 ranks" in result.output
