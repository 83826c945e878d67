"""Child processes of the stack: started in their own session, logged to a file, stopped by signal.

Each child leads its own process group, so the Ctrl-C a person types reaches only `streamtrain up`,
which then stops the services one kind at a time, in order; a child that ignores its signal is killed
together with its whole group (a trainer launcher's ranks included) after a grace period. Each child is
also tied to `streamtrain up` (`streamtrain.lifeline`): if `up` itself is killed, its children die with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from streamtrain.runtime.lifeline import tie_to_parent

from .options import StackError
from .services import ServiceSpec

__all__ = ["Child", "ChildSet", "http_ok", "wait_http"]

logger = logging.getLogger(__name__)


class Child:
    """One service process of the stack.

    Args:
        spec: what to run.
        log_dir: directory of its log file (`<name>.log`, stdout and stderr together).
        env: its environment.
    """

    def __init__(self, spec: ServiceSpec, log_dir: Path, env: Mapping[str, str]) -> None:
        self.spec = spec
        self.log_path = log_dir / f"{spec.name}.log"
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.stopped_by_us = False

    @property
    def name(self) -> str:
        return self.spec.name

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(tie_to_parent(self.spec.argv), stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, stdin=subprocess.DEVNULL, start_new_session=True)
        logger.debug("started %s (pid %d), log %s", self.name, self.proc.pid, self.log_path)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def send(self, signum: int) -> None:
        """Send `signum` to the child itself (a launcher forwards it to its ranks)."""
        if self.running():
            assert self.proc is not None
            self.stopped_by_us = True
            self.proc.send_signal(signum)

    def wait(self, timeout: float) -> bool:
        """True when the child has exited within `timeout` seconds."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=max(0.0, timeout))
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self, signum: int = signal.SIGTERM, grace: float = 30.0) -> int | None:
        """Signal, wait up to `grace` seconds, then kill the child's whole process group; returns its status."""
        if self.proc is None:
            return None
        self.send(signum)
        if not self.wait(grace):
            logger.warning("%s did not stop within %.0f s of %s; killing its process group", self.name, grace,
                           signal.Signals(signum).name)
            self.kill()
        self.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the child's process group (it leads its own session)."""
        if self.proc is None:
            return
        self.stopped_by_us = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.wait(10.0)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """Whether GET `url` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_http(url: str, timeout: float, child: Child | None = None) -> bool:
    """Poll `url` until it answers 200, `timeout` passes, or `child` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if http_ok(url):
            return True
        if child is not None and not child.running():
            return False
        time.sleep(0.25)
    return False


class ChildSet:
    """The stack's children: started with their logs under `log_dir`, awaited, and stopped one kind at a time.

    Args:
        log_dir: where each child's `<name>.log` goes.
        failures: where a stop that went wrong is told (a child that had to be killed, or exited with an error).
        tick: called while waiting on a child (the live view's refresh).
    """

    def __init__(self, log_dir: Path, failures: list[str], tick: Callable[[], None] = lambda: None) -> None:
        self.log_dir = log_dir
        self.failures = failures
        self.tick = tick
        self.children: list[Child] = []

    def spawn(self, spec: ServiceSpec, env: Mapping[str, str]) -> Child:
        """Start `spec` with `env` plus the spec's own variables."""
        child = Child(spec, self.log_dir, {**env, **spec.env})
        child.start()
        self.children.append(child)
        return child

    def discard(self, child: Child) -> None:
        """Stop `child` and forget it (a helper the stack runs without, such as a Prometheus that never got ready)."""
        child.stop(grace=5.0)
        self.children.remove(child)

    def of_kind(self, kind: str) -> list[Child]:
        return [c for c in self.children if c.spec.kind == kind]

    def dead(self) -> list[Child]:
        """Children that have exited."""
        return [c for c in self.children if not c.running()]

    def await_http(self, child: Child, url: str, timeout: float, stop: Callable[[], bool]) -> None:
        """Wait until `child` answers on `url`.

        Raises:
            StackError: `stop` said so, the child exited, or it did not answer within `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if stop():
                raise StackError("interrupted while starting")
            if wait_http(url, 0.5, child):
                return
            if not child.running():
                raise StackError(f"{child.name} exited with status {child.returncode} while starting; last lines of "
                                 f"{child.log_path}:\n{child.log_tail()}")
            self.tick()
        raise StackError(f"{child.name} did not answer on {url} within {timeout:.0f} s; see {child.log_path}")

    def stop_kind(self, kind: str, signum: int, grace: float) -> None:
        """Signal every child of `kind`, wait up to `grace` seconds for them all, then kill what is left."""
        children = self.of_kind(kind)
        for child in children:
            child.send(signum)
        deadline = time.monotonic() + grace
        for child in children:
            while not child.wait(0.5):
                self.tick()
                if time.monotonic() > deadline:
                    break
            if child.running():
                self.failures.append(f"{child.name} did not stop within {grace:.0f} s and was killed")
            code = child.stop(signal.SIGKILL, 0.0) if child.running() else child.returncode
            child.close()
            # Exiting by the signal itself (-signum, or 128 + signum from Python's KeyboardInterrupt) is a stop too:
            # whether anything was lost is for the Kafka accounting to say, not the exit status.
            if code not in (0, None, -signum, 128 + signum, -signal.SIGKILL):
                self.failures.append(f"{child.name} exited with status {code}; see {child.log_path}")

    def kill_all(self) -> None:
        """Kill whatever still runs."""
        for child in self.children:
            if child.running():
                child.kill()
