"""Children that end when their parent ends, however it ends: a parent-death signal set just before exec.

`streamtrain up` and `streamtrain train --local-ranks` start long-lived children (the broker's JVM,
Prometheus, producers, the coordinator, ranks), each in its own session so that a Ctrl-C reaches only
the parent, which then stops them in order. A parent that is killed outright (SIGKILL, the OOM killer)
stops nothing: its children would run on, orphaned, holding their ports and data directories.

`tie_to_parent(argv)` prefixes a command with this module. In the child it asks Linux to SIGKILL the
child when its parent dies (`prctl(PR_SET_PDEATHSIG)`), checks that the parent has not died already
(the signal only covers deaths after it is set), then execs the command, which keeps the setting:

    subprocess.Popen(tie_to_parent(["java", "-cp", ..., "kafka.Kafka", props]), start_new_session=True)

SIGKILL because the one process that could have stopped the children in order is gone; whatever they
had not committed is resumed from Kafka's committed offsets. A tied child that starts children of its
own ties them the same way, so the kill cascades (`up` → `train --local-ranks` → ranks).

Linux sends the signal when the *thread* that forked the child exits, not the process: only a command
started from the main thread is tied (from another thread it would die with that thread). Elsewhere
than Linux no such signal exists, and commands run untied.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["can_tie", "set_parent_death_signal", "tie_to_parent"]

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
#: Exit status of a tied child whose parent died before it could exec (nothing was started).
ORPHANED_STATUS = 125


def can_tie() -> bool:
    """Whether this platform has a parent-death signal (Linux)."""
    return sys.platform.startswith("linux")


def set_parent_death_signal(signum: int = signal.SIGKILL) -> bool:
    """Have the kernel send `signum` to this process when its parent (thread) exits; False where unsupported."""
    if not can_tie():
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    return True


def tie_to_parent(argv: Sequence[str]) -> list[str]:
    """`argv` as a command that is SIGKILLed when this process dies (unchanged where it cannot be tied).

    Args:
        argv: The command (program and arguments; the program is looked up on PATH).

    Returns:
        The command to start instead, from this thread.
    """
    if not can_tie():
        logger.debug("no parent-death signal on %s: %s runs untied", sys.platform, argv[0])
        return list(argv)
    if threading.current_thread() is not threading.main_thread():
        logger.warning("%s is started from thread %s, whose exit would kill it: started untied", argv[0],
                       threading.current_thread().name)
        return list(argv)
    return [sys.executable, "-m", __name__, str(os.getpid()), "--", *argv]


def main(args: Sequence[str]) -> NoReturn:
    """`python -m streamtrain.lifeline PARENT_PID -- COMMAND...`: tie this process to PARENT_PID, exec COMMAND."""
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        sys.stderr.write("usage: python -m streamtrain.lifeline PARENT_PID -- COMMAND [ARG...]\n")
        raise SystemExit(2)
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != int(args[0]):
        # The parent died between fork and prctl: the signal will never come, so start nothing.
        raise SystemExit(ORPHANED_STATUS)
    command = list(args[2:])
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"cannot run {command[0]}: {exc}\n")
        raise SystemExit(127) from None


if __name__ == "__main__":
    main(sys.argv[1:])
