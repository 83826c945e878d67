"""The trainer's one error type for settings and environments that cannot work (the core's `SetupError`)."""

from __future__ import annotations

from streamtrain.plugins import SetupError

__all__ = ["TrainerSetupError"]

#: The trainer's name for `streamtrain.models.SetupError`: the model and collate checks raise it from the core.
TrainerSetupError = SetupError
