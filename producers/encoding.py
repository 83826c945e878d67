"""Encoding samples on the producers' hot path through the shared wire codec."""

from __future__ import annotations

import numpy as np

from streamtrain.wire import Sample, encode
from streamtrain.wire.codec import HeaderList

__all__ = ["encode_sample"]


def encode_sample(
    device_id: str,
    seq: int,
    array: np.ndarray,
    label: int | None,
    produced_at: int,
    metadata: dict[str, str],
    target: np.ndarray | None = None,
) -> tuple[bytes, HeaderList, int]:
    """The (value, headers) of the Sample built from `array` (size = shape[0]) and its float `target`, and its size.

    Raises:
        ValueError: for a payload `Sample.from_array` refuses (no axis, unknown dtype).
    """
    sample = Sample.from_array(device_id, seq, array, label=label, produced_at=produced_at, metadata=metadata,
                               target=target)
    value, headers = encode(sample)
    return value, headers, sample.size
