"""A device outside the compose network: run inside another network namespace, it publishes samples through Kafka's
external listener with `DeviceProducer` and prints what happened as one JSON line.

    python remote_device.py SETTINGS_JSON DEVICE COUNT FEATURES

SETTINGS_JSON: the device's Kafka settings as dotted keys (bootstrap address, SASL_SSL, its user and password, the
CA). Exit 0 with {"delivered": N, "offsets": [...]} when Kafka acknowledged every sample; exit 1 with {"error": ...}
when the connection or the login was refused.
"""

from __future__ import annotations

import json
import logging
import sys

import numpy as np

from streamtrain import DeviceProducer
from streamtrain.config import load_config


def main(settings: str, device: str, count: int, features: int) -> int:
    # librdkafka's own lines (through the "librdkafka" logger) say why a connection is refused.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    cfg = load_config(env={}, overrides=json.loads(settings))
    offsets: list[int] = []
    rng = np.random.default_rng(7)
    try:
        with DeviceProducer(cfg.kafka, device=device, queue_wait_seconds=30,
                            settings={"delivery.timeout.ms": 20000, "socket.timeout.ms": 10000}) as producer:
            for i in range(count):
                producer.send(rng.normal(size=(30, features)).astype(np.float32), label=i % 2,
                              on_delivery=lambda d: offsets.append(d.offset) if d.offset is not None else None)
            producer.flush(30)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "delivered": len(offsets)}))
        return 1
    print(json.dumps({"delivered": len(offsets), "offsets": sorted(offsets)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
