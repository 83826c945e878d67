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
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from streamtrain.lifeline import tie_to_parent

from .services import ServiceSpec

__all__ = ["Child", "http_ok", "wait_http"]

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
