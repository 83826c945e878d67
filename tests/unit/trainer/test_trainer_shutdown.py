"""A rank's exit: everything that holds the process group is let go before the process leaves the group.

Left to interpreter exit, the DDP model (and its reducer and comm hook, which hold the group) was torn down while
gloo's threads could still hold work whose release needs the GIL; a process that had trained, committed and
checkpointed then aborted with "terminate called without an active exception" (about one exit in fifteen of a
two-rank gloo group on this machine), and the stack reported a finished run as a failed rank.
"""

from __future__ import annotations

import signal
import weakref
from typing import ClassVar

import pytest
import torch

import streamtrain.trainer.rank as rank_module
from streamtrain.config import StreamtrainConfig, load_config
from streamtrain.trainer.distributed import DistContext


class _HoldsTheGroup:
    """Stands in for the DDP model: what must be gone before the group is left."""


class _FakeRank:
    instances: ClassVar[list[weakref.ref[_HoldsTheGroup]]] = []

    def __init__(self, config: StreamtrainConfig, *_args: object) -> None:
        self.trainer = config.trainer  # start_rank reads whether to profile
        self.model = _HoldsTheGroup()
        self.model.owner = self  # type: ignore[attr-defined]  # a cycle, as DDP and its hooks make: only gc frees it
        _FakeRank.instances.append(weakref.ref(self.model))
        self.stop_requested = False

    def request_stop(self) -> None:
        self.stop_requested = True

    def resume(self) -> None:
        signal.raise_signal(signal.SIGTERM)  # the stack stopping it: the handler (a closure over the rank) runs
        assert self.stop_requested

    def run(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_rank_lets_go_of_its_model_before_it_leaves_the_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    alive_when_leaving: list[bool] = []
    monkeypatch.setattr(rank_module, "init_distributed",
                        lambda _cfg: DistContext(0, 1, 0, torch.device("cpu"), "gloo"))
    monkeypatch.setattr(rank_module, "TrainerRank", _FakeRank)
    monkeypatch.setattr(rank_module, "destroy_distributed",
                        lambda: alive_when_leaving.append(_FakeRank.instances[-1]() is not None))
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert rank_module.run_rank(load_config(env={}, overrides={"trainer.metrics": False,
                                                                      "trainer.startup_profile": False}), "0") == 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    # The signal handler still installed refers to no rank, and the model's cycle was collected before leaving.
    assert alive_when_leaving == [False]
