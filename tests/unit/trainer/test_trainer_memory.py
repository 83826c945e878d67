"""A CPU rank's memory: the allocator its launcher gives it, glibc kept from unmapping freed memory, and a
start-up reserve that takes page faults out of the steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streamtrain.config import load_config
from streamtrain.trainer import distributed
from streamtrain.trainer.distributed import allocator_environment, find_jemalloc, keep_freed_memory, malloc_in_use
from streamtrain.trainer.errors import TrainerSetupError
from streamtrain.trainer.launch import child_environment

needs_jemalloc = pytest.mark.skipif(find_jemalloc() is None, reason="libjemalloc is not installed")

# Maps `reserve` MiB in (after the allocator tuning a rank does), then allocates and fills 64 MiB of
# tensors the way a step does, and reports the page faults that took.
_PROBE = """
import json, resource, sys, torch
from streamtrain.trainer.distributed import keep_freed_memory, malloc_in_use, reserve_memory
if malloc_in_use() == "system":
    keep_freed_memory()
reserve_memory(int(sys.argv[1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
tensors = [torch.ones(1024 * 1024) for _ in range(16)]
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before,
                  "allocator": malloc_in_use()}))
"""


def _probe(reserve_mb: int, env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(reserve_mb)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **env}, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_system_allocator_and_cuda_ranks_get_no_preload() -> None:
    assert allocator_environment("system") == {}
    assert allocator_environment("auto", "cuda") == {}
    assert allocator_environment("jemalloc", "cuda") == {}


def test_jemalloc_asked_for_but_missing_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed, "find_jemalloc", lambda: None)
    assert allocator_environment("auto") == {}  # auto falls back to the system allocator
    with pytest.raises(TrainerSetupError, match=r"trainer.cpu_allocator=jemalloc.*libjemalloc2"):
        allocator_environment("jemalloc")


@needs_jemalloc
def test_local_ranks_on_the_cpu_run_on_jemalloc_keeping_freed_pages() -> None:
    cfg = load_config(env={}, overrides={"trainer.device": "cpu"})
    env = child_environment(cfg, 0, 2, 29500)
    assert "jemalloc" in env["LD_PRELOAD"] and "dirty_decay_ms:-1" in env["MALLOC_CONF"]
    assert _probe(0, env)["allocator"] == "jemalloc"
    system = child_environment(load_config(env={}, overrides={"trainer.device": "cpu",
                                                              "trainer.cpu_allocator": "system"}), 0, 2, 29500)
    assert "jemalloc" not in system.get("LD_PRELOAD", "")


def test_glibc_accepts_the_keep_freed_memory_thresholds() -> None:
    if malloc_in_use() != "system":
        pytest.skip("this test process runs on a preloaded allocator")
    assert keep_freed_memory() is True


@pytest.mark.parametrize("allocator", ["system", pytest.param("jemalloc", marks=needs_jemalloc)])
def test_a_reserve_takes_the_page_faults_out_of_later_allocations(allocator: str) -> None:
    env = allocator_environment(allocator)
    cold = _probe(0, env)
    warm = _probe(128, env)
    assert cold["allocator"] == warm["allocator"] == allocator
    # 64 MiB of fresh tensors fault in ~16k pages; with the memory already mapped, almost none.
    assert int(cold["faults"]) > 8000  # type: ignore[call-overload]
    assert int(warm["faults"]) < int(cold["faults"]) // 5  # type: ignore[call-overload]
