"""TrainerConfig validation and the dotted-path plug-ins it names."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from streamtrain.config.core import StreamtrainConfig
from streamtrain.config.trainer import TrainerConfig
from streamtrain.models.batching import PackedBatch, collate_packed
from streamtrain.models.conv import PackedConvNet
from streamtrain.models.plugins import build_collate, build_model
from streamtrain.plugins import resolve_dotted
from streamtrain.wire import Sample


def test_defaults_fit_the_synthetic_task() -> None:
    config = TrainerConfig()
    assert (config.num_features, config.aggregation, config.weight_by, config.compression) == (
        16,
        "weighted",
        "samples",
        False,
    )
    assert TrainerConfig.model_fields["compression_delta"].description  # docstrings become descriptions


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kernel_size", 4),
        ("topk_ratio", 0.0),
        ("topk_ratio", 1.5),
        ("lr", -0.1),
        ("momentum", 1.0),
        ("base_batch", 0),
        ("compression_delta", -1.0),
        ("model", "not a path"),
        ("collate", "module_without_attr"),
        ("aggregation", "median"),
    ],
)
def test_bad_values_name_their_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as excinfo:
        TrainerConfig.model_validate({field: value})
    assert excinfo.value.errors()[0]["loc"] == (field,)


def test_unknown_keys_and_nccl_on_cpu_are_refused() -> None:
    with pytest.raises(ValidationError, match="lr_scale_typo"):
        TrainerConfig.model_validate({"lr_scale_typo": 1})
    with pytest.raises(ValidationError, match="nccl"):
        TrainerConfig(device="cpu", backend="nccl")


def test_root_config_carries_the_trainer_section() -> None:
    root = StreamtrainConfig.model_validate({"trainer": {"num_classes": 4, "compression": True}})
    assert root.trainer.num_classes == 4 and root.trainer.compression
    with pytest.raises(ValidationError) as excinfo:
        StreamtrainConfig.model_validate({"trainer": {"hidden_size": 0}})
    assert excinfo.value.errors()[0]["loc"] == ("trainer", "hidden_size")


class _TinyModel(nn.Module):
    def __init__(self, config: TrainerConfig) -> None:
        super().__init__()
        self.head = nn.Linear(config.num_features, config.num_classes)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        return self.head(batch.values[batch.cu_seqlens[:-1]])  # first frame of each sample


def make_tiny_model(config: TrainerConfig) -> nn.Module:
    return _TinyModel(config)


def make_not_a_model(config: TrainerConfig) -> object:
    return "nope"


def my_collate(samples: Sequence[Sample], config: TrainerConfig) -> PackedBatch:
    return collate_packed(samples, config)


NOT_CALLABLE = 3


def test_plugged_in_model_and_collate_are_used() -> None:
    config = TrainerConfig(model=f"{__name__}:make_tiny_model", collate=f"{__name__}:my_collate")
    assert isinstance(build_model(config), _TinyModel)
    assert build_collate(config) is my_collate
    default = TrainerConfig(precision="float64")
    model = build_model(default)
    assert isinstance(model, PackedConvNet) and next(model.parameters()).dtype == torch.float64
    assert build_collate(default) is collate_packed


def test_same_seed_builds_the_same_parameters() -> None:
    a, b = build_model(TrainerConfig(seed=5)), build_model(TrainerConfig(seed=5))
    c = build_model(TrainerConfig(seed=6))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_module_xyz:factory", "cannot import module 'no_such_module_xyz'"),
        (f"{__name__}:missing", "has no attribute 'missing'"),
        (f"{__name__}:NOT_CALLABLE", "is int, not a callable"),
        ("nocolon", "not of the form"),
    ],
)
def test_bad_dotted_paths_fail_naming_the_setting(path: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as excinfo:
        resolve_dotted(path, "trainer.model")
    assert str(excinfo.value).startswith("trainer.model: ")


def test_factory_returning_no_module_is_refused() -> None:
    with pytest.raises(ValueError, match=r"trainer.model: .* returned str, not nn.Module"):
        build_model(TrainerConfig(model=f"{__name__}:make_not_a_model"))
