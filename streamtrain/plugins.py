"""A user's code named by a dotted path (`package.module:attribute`), and the error a setting that cannot work raises.

Every plug-in setting loads through `resolve_dotted`: the model and collate function (`trainer.model`,
`trainer.collate`), the objective (`trainer.objective`) and the bridge's decoders (`bridge.sources.N.decoder`), so
each names its setting the same way when the module does not import or the attribute is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SetupError", "resolve_dotted"]


class SetupError(ValueError):
    """A setting, environment variable or topic layout a service cannot start with; the message names it.

    `streamtrain train` and `streamtrain serve` report these as configuration errors (exit 2). Any other
    exception is a bug or an outage and surfaces with its traceback.
    """


def resolve_dotted(path: str, setting: str, error: type[Exception] = SetupError) -> Any:
    """Import `package.module:attr` (attr may itself be dotted) and return the attribute, which must be callable.

    Args:
        path: The dotted path.
        setting: The setting it came from, named in every error.
        error: The exception type raised (a service's own setup error).

    Raises:
        error: The path is malformed, its module does not import, or the attribute is missing or not callable.
    """
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise error(f"{setting}: {path!r} is not of the form package.module:attribute")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # anything the user's module raises on import says the same: it does not load
        raise error(f"{setting}: cannot import module {module_name!r} of {path!r} ({type(exc).__name__}: {exc}); "
                    "is its directory on PYTHONPATH?") from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise error(f"{setting}: {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(target):
        raise error(f"{setting}: {path!r} is {type(target).__name__}, not a callable")
    return target
