"""A supervisor killed outright takes its children with it: SIGKILL `streamtrain up` (broker JVM, Prometheus,
producers, coordinator, the rank launcher and its ranks) or `streamtrain train --local-ranks`, and within
seconds none of the processes they started is left (`streamtrain.lifeline`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_helpers import REPO, Service, until

from streamtrain.config import KafkaConfig
from streamtrain.runtime.commands import CLI_MODULE, module_command
from streamtrain.runtime.lifeline import ORPHANED_STATUS, can_tie, tie_to_parent

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "trainer"))
from trainer_seq_log import rank_environment, train_settings  # the trainer tests' helper

pytestmark = [pytest.mark.faults, pytest.mark.skipif(not can_tie(), reason="parent-death signals are Linux-only")]

#: Seconds the children get to be gone after their parent is killed.
GONE_WITHIN_S = 10.0


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _alive(pid: int, started: str) -> bool:
    """`pid` still runs the process that started at `started` (not a zombie, not a recycled pid)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and stat[19] == started


def _descendants(root: int) -> dict[int, str]:
    """Every live process below `root`, as pid -> its start time (field 22 of /proc/PID/stat)."""
    children: dict[int, list[int]] = {}
    started: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None and stat[0] != "Z":
            children.setdefault(int(stat[1]), []).append(int(entry.name))
            started[int(entry.name)] = stat[19]
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in started:
            found[pid] = started[pid]
            todo.extend(children.get(pid, []))
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


@pytest.fixture
def survivors() -> Iterator[dict[int, str]]:
    """Processes a test records as started by its parent; any still alive at the end are killed."""
    tree: dict[int, str] = {}
    yield tree
    for pid, started in tree.items():
        if _alive(pid, started):
            os.kill(pid, signal.SIGKILL)


def _kill_and_check(parent: subprocess.Popen[bytes], tree: dict[int, str]) -> None:
    parent.kill()  # the parent alone: its children lead sessions of their own, no group signal reaches them
    parent.wait(10)
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := {p: _command(p) for p, s in tree.items() if _alive(p, s)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"still alive {GONE_WITHIN_S:.0f} s after their parent was killed: {left}"


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_sigkill_of_up_leaves_no_child(tmp_path: Path, survivors: dict[int, str]) -> None:
    log = tmp_path / "up.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    cmd = module_command(CLI_MODULE, "up", "--devices", "2", "--rates", "20,40", "--sizes", "12,8", "--broker",
                         "embedded", "--no-live", "--out", str(tmp_path / "run"), sets={"trainer.hidden_size": 16})
    with log.open("wb") as out:
        up = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                              env={**env, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    try:
        until(lambda: "stack up:" in log.read_text(errors="replace") or up.poll() is not None, 240, "the stack")
        assert up.poll() is None, log.read_text(errors="replace")[-4000:]
        survivors.update(_descendants(up.pid))
        commands = [_command(p) for p in survivors]
        # The broker's JVM, Prometheus (when installed), 2 producers, the coordinator, the launcher and 2 ranks.
        assert any("kafka.Kafka" in c for c in commands), commands
        assert sum("--device-id" in c for c in commands) == 2, commands
        assert sum(" produce " in c for c in commands) == 2, commands
        if "Prometheus: no `prometheus` binary" not in log.read_text(errors="replace"):
            assert any("--storage.tsdb.path" in c for c in commands), commands
        _kill_and_check(up, survivors)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_sigkill_of_the_rank_launcher_leaves_no_rank(kafka_cfg: KafkaConfig, tmp_path: Path,
                                                     survivors: dict[int, str]) -> None:
    (tmp_path / "seqs").mkdir()
    trainer = Service("trainer", [*train_settings(kafka_cfg, "orphans", tmp_path / "ckpt"), "train",
                                  "--local-ranks", "2", "--devices", "a,b"],
                      tmp_path / "trainer.log", rank_environment(tmp_path / "seqs")).start()
    try:
        for rank in (0, 1):
            trainer.wait_for(rf"rank {rank} \(\S+\): resuming at step", 180)
        assert trainer.proc is not None
        survivors.update(_descendants(trainer.pid))
        assert sum("--device-id" in _command(p) for p in survivors) == 2, [_command(p) for p in survivors]
        _kill_and_check(trainer.proc, survivors)
    finally:
        trainer.cleanup()


#: A process that starts a tied copy of itself `depth` times down, plus (at the top) one untied `sleep`.
_CHAIN = """
import subprocess, sys, time
from streamtrain.runtime.lifeline import tie_to_parent
depth = int(sys.argv[1])
if depth > 0:
    subprocess.Popen(tie_to_parent([sys.executable, "-c", sys.argv[2], str(depth - 1), sys.argv[2]]))
if len(sys.argv) > 3:
    subprocess.Popen(["sleep", "300"], start_new_session=True)  # the control: an orphan nobody tied
time.sleep(300)
"""


def test_a_tied_chain_dies_with_its_root(survivors: dict[int, str]) -> None:
    """A tied child that ties its own child (as `up` ties the launcher, which ties the ranks) goes with the root;
    an untied child of the same root is orphaned, which is what the check must see."""
    root = subprocess.Popen([sys.executable, "-c", _CHAIN, "2", _CHAIN, "control"], cwd=REPO,
                            start_new_session=True)
    try:
        until(lambda: len(_descendants(root.pid)) == 3, 60, "two tied generations and the control")
        survivors.update(_descendants(root.pid))
        control = {p: s for p, s in survivors.items() if _command(p).startswith("sleep")}
        tied = {p: s for p, s in survivors.items() if p not in control}
        assert len(control) == 1 and len(tied) == 2, [_command(p) for p in survivors]
        _kill_and_check(root, tied)
        assert all(_alive(p, s) for p, s in control.items()), "the untied control should have been orphaned"
    finally:
        if root.poll() is None:
            root.kill()
            root.wait(10)


#: Prints this process's parent-death signal (prctl PR_GET_PDEATHSIG).
_READ_PDEATHSIG = ("import ctypes; libc = ctypes.CDLL(None); sig = ctypes.c_int(-1); "
                   "libc.prctl(2, ctypes.byref(sig), 0, 0, 0); print(sig.value)")


def test_the_signal_survives_exec_into_the_command() -> None:
    out = subprocess.run(tie_to_parent([sys.executable, "-c", _READ_PDEATHSIG]), capture_output=True, text=True,
                         timeout=60, check=True)
    assert int(out.stdout) == signal.SIGKILL
    untied = subprocess.run([sys.executable, "-c", _READ_PDEATHSIG], capture_output=True, text=True, timeout=60)
    assert int(untied.stdout) == 0  # the control: without the wrapper no signal is set


def test_a_parent_already_gone_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    not_the_parent = os.getpid() + 1 if os.getpid() + 1 != os.getppid() else os.getpid() + 2
    proc = subprocess.run([sys.executable, "-m", "streamtrain.runtime.lifeline", str(not_the_parent), "--", "touch",
                           str(marker)], timeout=60)
    assert proc.returncode == ORPHANED_STATUS and not marker.exists()


def test_usage_errors_exit_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "streamtrain.runtime.lifeline", "touch"], capture_output=True,
    text=True,
                          timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr
