"""streamtrain: Kafka-fed streaming online training with ETT-balanced batches.

This package is the shared core: the wire contract (`streamtrain.wire`), the configuration
(`streamtrain.config`), Kafka client factories (`streamtrain.kafka`), the embedded broker
(`streamtrain.broker`) and the CLI. The services live in `producers`, `coordinator`, `trainer`, `bridge`.

What a user imports is here: the bridge's decoder contract (`SourceRecord` in, `SampleFields` out, `Rejected`
for a record that cannot be used).
"""

from .decoders import Rejected, SampleFields, SourceRecord

__all__ = ["Rejected", "SampleFields", "SourceRecord"]

__version__ = "0.1.0"
