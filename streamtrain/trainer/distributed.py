"""Process-group set-up, device choice and memory probes for one trainer rank.

`init_distributed` reads the same environment as `torchrun` (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), so a rank runs unchanged under `torchrun --nproc-per-node N` or from
`streamtrain train --local-ranks N`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import resource
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from streamtrain.config.trainer import TrainerConfig
from streamtrain.net import free_port

from .errors import TrainerSetupError
from .placement import env_int

__all__ = [
    "DistContext",
    "allocator_environment",
    "destroy_distributed",
    "find_jemalloc",
    "free_port",
    "init_distributed",
    "keep_freed_memory",
    "malloc_in_use",
    "peak_memory_bytes",
    "reserve_memory",
    "reset_peak_memory",
    "select_device",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    """Where this rank sits in the group and what it computes on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs summaries and writes checkpoints."""
        return self.rank == 0


def select_device(config: TrainerConfig, local_rank: int) -> tuple[torch.device, str]:
    """The device and backend `config` asks for on this host.

    Raises:
        TrainerSetupError: CUDA or NCCL is requested on a host without CUDA.
    """
    has_cuda = torch.cuda.is_available()
    if config.device == "cuda" and not has_cuda:
        raise TrainerSetupError("trainer.device is 'cuda' but CUDA is not available on this host")
    if config.backend == "nccl" and not has_cuda:
        raise TrainerSetupError("trainer.backend is 'nccl' but CUDA is not available on this host")
    use_cuda = config.device == "cuda" or (config.device == "auto" and has_cuda)
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if use_cuda else torch.device("cpu")
    backend = config.backend if config.backend != "auto" else ("nccl" if use_cuda else "gloo")
    return device, backend


def _env_int(name: str, default: int) -> int:
    value = env_int(os.environ, name)
    return default if value is None else value


def init_distributed(
    config: TrainerConfig,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    timeout_s: float | None = None,
) -> DistContext:
    """Join (or create) the default process group; arguments override the torchrun environment.

    With neither arguments nor environment this is a group of one on a free local port.

    Args:
        config: Trainer settings (device, backend, CPU threads).
        rank: Global rank (default $RANK, else 0).
        world_size: Ranks in the group (default $WORLD_SIZE, else 1).
        local_rank: Rank on this host, picks the GPU (default $LOCAL_RANK, else `rank`).
        master_addr: Rendezvous host (default $MASTER_ADDR, else 127.0.0.1).
        master_port: Rendezvous port (default $MASTER_PORT; required when world_size > 1).
        timeout_s: Collective and rendezvous timeout (default `trainer.collective_timeout_seconds`).

    Returns:
        This rank's context.

    Raises:
        TrainerSetupError: Inconsistent rank / world size, a missing port, or an unavailable device.
    """
    rank = _env_int("RANK", 0) if rank is None else rank
    world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
    local_rank = _env_int("LOCAL_RANK", rank) if local_rank is None else local_rank
    if world_size < 1 or not 0 <= rank < world_size:
        raise TrainerSetupError(f"rank {rank} is not in a group of {world_size} (RANK / WORLD_SIZE)")
    device, backend = select_device(config, local_rank)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    addr = master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = master_port if master_port is not None else _env_int("MASTER_PORT", 0)
    if port == 0 and world_size > 1:
        raise TrainerSetupError("MASTER_PORT (or master_port) is required when WORLD_SIZE > 1")
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            raise TrainerSetupError(
                f"a process group of rank {dist.get_rank()}/{dist.get_world_size()} already exists; "
                f"cannot join as rank {rank}/{world_size}"
            )
        return DistContext(rank, world_size, local_rank, device, str(dist.get_backend()))
    port = port or free_port(addr)
    # Under torchrun the ranks may be clients of the elastic agent's store, which outlives a failed group:
    # after `--max-restarts` brings the group back, the old group's keys (e.g. gloo's peer addresses) are
    # still there, and a new rank would dial a dead peer. A prefix per restart keeps rounds apart; the
    # restart count is the agent's, so this holds on one node only. With TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    # (groups across nodes) rank 0 hosts a new store for every group instead, and no prefix is needed.
    timeout = timedelta(seconds=config.collective_timeout_seconds if timeout_s is None else timeout_s)
    store, _, _ = next(dist.rendezvous(f"tcp://{addr}:{port}", rank, world_size, timeout=timeout))
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is not None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.PrefixStore(f"streamtrain/restart{restart}", store)
        if world_size > _env_int("LOCAL_WORLD_SIZE", world_size):
            logger.warning("this group spans nodes on the elastic agents' shared store: after a failure the nodes "
                           "count restarts apart and may not meet again; start torchrun with "
                           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (each group then gets a store of its own)")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    logger.info("rank %d/%d joined %s:%d on %s with %s%s", rank, world_size, addr, port, device, backend,
                f" (torchrun restart {restart})" if restart is not None else "")
    return DistContext(rank, world_size, local_rank, device, backend)


def destroy_distributed() -> None:
    """Leave the process group, if any."""
    if dist.is_initialized():
        dist.destroy_process_group()


#: glibc mallopt parameters (malloc.h) and the largest mmap threshold it accepts on 64-bit (HEAP_MAX_SIZE / 2).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Make glibc keep the memory a CPU step frees for the next step instead of returning it to the OS.

    By default glibc serves every block over its mmap threshold (128 KiB, adapting upwards) with a fresh
    mmap and unmaps it on free, so each step's activations are page-faulted in anew: on the default model
    that was ~40% of a step's CPU time and, because a batch larger than any recent one faults more, the
    noisiest part of it. Raising the mmap and trim thresholds serves blocks up to 32 MiB from the heap and
    keeps them there: steps reuse memory, RSS stays at the largest step's (bounded, not growing). The
    effect of the same knobs as MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, set from inside the process.

    Returns:
        True when glibc accepted both settings; False elsewhere (musl, macOS), where nothing changes.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    if not ok:
        logger.info("glibc mallopt refused the thresholds: freed memory goes back to the OS as usual")
    return ok


#: jemalloc options for a rank: keep freed pages (no decay back to the OS), as keep_freed_memory does for glibc,
#: and no separate arena for blocks over 8 MiB (that one returns them at once), so a step's large tensors reuse
#: memory too.
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0"


def find_jemalloc() -> str | None:
    """The jemalloc shared library's name on the loader path (e.g. libjemalloc.so.2), or None."""
    return ctypes.util.find_library("jemalloc")


def allocator_environment(choice: str, device: torch.device | str = "cpu") -> dict[str, str]:
    """Environment variables that give a CPU rank process the allocator `choice` (trainer.cpu_allocator).

    Returns {} for `system`, for CUDA ranks (their tensors live in the caching CUDA allocator), and for
    `auto` without jemalloc installed.

    Raises:
        TrainerSetupError: `jemalloc` was asked for but is not installed.
    """
    if choice == "system" or torch.device(device).type == "cuda":
        return {}
    lib = find_jemalloc()
    if lib is None:
        if choice == "jemalloc":
            raise TrainerSetupError("trainer.cpu_allocator=jemalloc but no libjemalloc is installed (Debian: "
                                    "apt-get install libjemalloc2); use auto or system")
        return {}
    preload = " ".join(p for p in (os.environ.get("LD_PRELOAD", ""), lib) if p)
    return {"LD_PRELOAD": preload, "MALLOC_CONF": os.environ.get("MALLOC_CONF", JEMALLOC_CONF)}


def malloc_in_use() -> str:
    """"jemalloc" when this process runs on jemalloc (preloaded), else "system"."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "system"
    return "jemalloc" if "jemalloc" in maps else "system"


_reserved_mb = 0


def reserve_memory(megabytes: int, block_mb: int = 16) -> None:
    """Fault in `megabytes` of heap and free it, so steps carve their tensors from memory already mapped.

    A CPU step whose tensors need more memory than any step before it maps new pages, and each page
    faults on first touch (on a VM, ~10 us each: a 60 MB step then costs twice its compute). With the
    allocator keeping freed memory (`keep_freed_memory`, or jemalloc with decay off), a reserve paid
    once at start-up takes those faults out of the steps. Blocks stay under glibc's mmap threshold.
    """
    global _reserved_mb
    if megabytes <= _reserved_mb:  # the memory is kept: once per process is enough
        return
    blocks = [torch.ones(block_mb * 1024 * 1024 // 4) for _ in range(megabytes // block_mb)]
    del blocks
    _reserved_mb = megabytes


#: This process's /proc files the per-step memory figure reads, kept open: opening two files a step was a fixed cost
#: of every step (bench overhead). Keyed by pid: a forked child's /proc/self is its own.
_proc_fds: dict[tuple[int, str], int] = {}


def _proc_fd(name: str, flags: int) -> int:
    key = (os.getpid(), name)
    fd = _proc_fds.get(key)
    if fd is None:
        fd = _proc_fds[key] = os.open(f"/proc/self/{name}", flags | os.O_CLOEXEC)
    return fd


def reset_peak_memory(device: torch.device) -> None:
    """Restart peak-memory tracking so the next `peak_memory_bytes` covers one step."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    # Linux: writing 5 resets VmHWM (peak RSS) of this process to its current RSS. Without /proc or
    # permission, peak_memory_bytes falls back to the process-lifetime peak.
    with contextlib.suppress(OSError):
        os.write(_proc_fd("clear_refs", os.O_WRONLY), b"5")


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory since the last reset: CUDA max allocated bytes, or peak RSS (VmHWM) on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    with contextlib.suppress(OSError):
        status = os.pread(_proc_fd("status", os.O_RDONLY), 16384, 0)
        at = status.find(b"VmHWM:")
        if at >= 0:
            return int(status[at + 6:status.index(b"kB", at)]) * 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux
