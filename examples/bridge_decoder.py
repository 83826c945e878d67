"""Your own decoder for the bridge: records of a topic in your format in, the sample's fields out.

The format here is a line of text per record, as many a legacy sensor gateway writes:

    <device>;<unix seconds>;<label>;<v1>,<v2>,...,<vN>

N values are frames of `features` readings each (a setting of this decoder, given in the source's `options`).
A line starting with `#` is a heartbeat: skipped on purpose (return None). Anything else that does not parse
is rejected with a reason, and goes to the dead-letter topic; the bridge goes on.

Bridge a topic with it (examples/ on PYTHONPATH, so `bridge_decoder` imports):

    [[bridge.sources]]
    topic = "gateway-lines"
    decoder = "bridge_decoder:decode"
    options = { features = 3 }

    PYTHONPATH=examples streamtrain --config bridge.toml bridge
"""

from __future__ import annotations

from streamtrain import Rejected, SampleFields, SourceRecord


def decode(record: SourceRecord, features: int = 1) -> SampleFields | None:
    """One gateway line → a sample of shape (frames, features), its label and its production time.

    Args:
        record: the Kafka record (key, value, headers, timestamp, topic/partition/offset).
        features: readings per frame (`options.features` of the source).

    Returns:
        The sample's fields, or None for a heartbeat line.

    Raises:
        Rejected: the line is not in the format (its reason is the dead letter's).
    """
    text = (record.value or b"").decode("utf-8", errors="replace").strip()
    if text.startswith("#"):
        return None
    parts = text.split(";")
    if len(parts) != 4:
        raise Rejected("bad-line", f"expected device;seconds;label;values, got {len(parts)} fields: {text[:80]!r}")
    device, seconds, label, values = parts
    try:
        readings = [float(v) for v in values.split(",")]
        when = round(float(seconds) * 1000)
        cls = int(label)
    except ValueError as exc:
        raise Rejected("bad-number", f"{exc} in {text[:80]!r}") from None
    if len(readings) % features:
        raise Rejected("bad-length", f"{len(readings)} readings are not whole frames of {features}")
    return {"device": device, "data": [readings[i:i + features] for i in range(0, len(readings), features)],
            "label": cls, "produced_at": when, "metadata": {"gateway": record.key_text or "unknown"}}
