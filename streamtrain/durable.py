"""Files that survive a crash or a power cut: written, fsynced, renamed into place, the directory fsynced.

A rename is atomic on POSIX, so a reader sees the old file (or directory) or the new one, never a torn one;
the fsyncs make the new contents and the rename itself durable before the writer goes on (a commit of Kafka
offsets, an announcement on a topic) as if they were.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "fsync_file", "write_synced"]


def fsync_dir(directory: Path) -> None:
    """Make the entries of `directory` (a rename into it, say) durable; a filesystem that cannot is skipped."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some filesystems cannot open a directory; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush a file's contents to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Write `data` to `path` (a new file, or one nobody reads yet) and fsync it."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
