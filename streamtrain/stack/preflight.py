"""What `streamtrain up` checks of the user's own code before it starts a broker or a rank.

A model, collate function or objective of the user's (a dotted path in `trainer.model`, `trainer.collate`,
`trainer.objective`) is imported and run on a probe batch here, as every rank does at start-up
(`streamtrain.models.check_plugins`), so a plug-in that does not import or answers wrong stops `up` at once with
the setting named, not after the broker and the ranks have started and a rank has failed in its log.
"""

from __future__ import annotations

from streamtrain.config.trainer import BUILTIN_MODELS, BUILTIN_OBJECTIVES, TrainerConfig
from streamtrain.models import build_collate, build_model, check_plugins
from streamtrain.objectives import build_objective

__all__ = ["check_user_code"]


def check_user_code(trainer: TrainerConfig) -> None:
    """Import and probe the plug-ins `trainer` names, as a rank would (nothing to do when every one is built in).

    Raises:
        SetupError: naming the setting whose plug-in cannot be imported, raises, or answers in the wrong shape.
    """
    if trainer.model in BUILTIN_MODELS and trainer.objective in BUILTIN_OBJECTIVES and trainer.collate is None:
        return
    objective = build_objective(trainer)
    check_plugins(build_model(trainer, objective.output_width()), build_collate(trainer), trainer, objective)
