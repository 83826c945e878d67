"""Index arithmetic the fast planners share: every device's samples flattened into one array, in segments.

The fast paths of `ett_stream` and `chronica` pack a whole fleet with a few numpy passes over
concatenated per-device arrays instead of a Python loop per sample; these are the pieces both use.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ranges", "run_heads"]


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenated index ranges [starts[i], starts[i] + counts[i]), in order.

    Args:
        starts: first index of each range.
        counts: length of each range (>= 0).

    Returns:
        One int array of `counts.sum()` indices.
    """
    firsts = np.cumsum(counts) - counts
    return np.repeat(starts - firsts, counts) + np.arange(int(counts.sum()))


def run_heads(keys: np.ndarray) -> np.ndarray:
    """Positions where a run of equal consecutive `keys` begins (position 0 always, when there are keys).

    Args:
        keys: e.g. the owning device of each element, grouped by device.

    Returns:
        Ascending positions into `keys`.
    """
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
