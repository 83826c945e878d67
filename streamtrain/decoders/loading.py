"""A source's decoder from its settings: a built-in one, or a user's `package.module:function` checked on load.

A setting that cannot work fails here, before anything is read, with `DecoderSetupError` naming it: a module
that does not import, a name it lacks, something not callable, options the function does not take.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from ..config import SourceConfig
from ..plugins import resolve_dotted
from .builtin import JsonDecoder, RawDecoder
from .contract import SampleFields, SourceRecord

__all__ = ["Decoder", "DecoderSetupError", "build_decoder"]

#: The decoder contract as a type: a record in, the sample's fields (or None: skip it) out.
Decoder = Callable[[SourceRecord], SampleFields | None]

_PROBE = SourceRecord(topic="probe", partition=0, offset=0, key=None, value=None)


class DecoderSetupError(ValueError):
    """A source's decoder setting that cannot work; the message names the setting."""


def build_decoder(source: SourceConfig, setting: str) -> Decoder:
    """The decoder `source` names.

    Args:
        source: the source's settings.
        setting: how the settings name this source, e.g. "bridge.sources.0" (for messages).

    Raises:
        DecoderSetupError: naming `<setting>.decoder` or `<setting>.options`.
    """
    if source.decoder == "json":
        return JsonDecoder(source.mapping)
    if source.decoder == "raw":
        return RawDecoder(source.layout)
    return _user_decoder(source, setting)


def _user_decoder(source: SourceConfig, setting: str) -> Decoder:
    where = f"{setting}.decoder = {source.decoder!r}"
    function = resolve_dotted(source.decoder, f"{setting}.decoder", DecoderSetupError)
    name = source.decoder.partition(":")[2]
    try:
        inspect.signature(function).bind(_PROBE, **source.options)
    except TypeError as exc:
        options = f" with {setting}.options {sorted(source.options)}" if source.options else ""
        raise DecoderSetupError(f"{where}: it cannot be called as {name}(record{', **options' if options else ''})"
                                f"{options}: {exc}") from None
    except ValueError:
        pass  # a builtin or C function without a signature: the start-up check on real records will tell
    return functools.partial(function, **source.options) if source.options else function
