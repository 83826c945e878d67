"""Publishing a device's samples from an application: `DeviceProducer`, its delivery reports and its errors."""

from .errors import DeliveryError, DeviceProducerError, QueueFullError
from .producer import Delivery, DeliveryCallback, DeviceProducer
from .samples import EncodedSample, check_payload, encode_device_sample

__all__ = [
    "Delivery",
    "DeliveryCallback",
    "DeliveryError",
    "DeviceProducer",
    "DeviceProducerError",
    "EncodedSample",
    "QueueFullError",
    "check_payload",
    "encode_device_sample",
]
