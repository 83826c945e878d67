"""What `streamtrain request` sends (the model's kind of samples, or a clear refusal), and serve's tally of the
requests it answered with an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamtrain.config import StreamtrainConfig, TrainerConfig
from streamtrain.datasets import DatasetError
from streamtrain.models import build_model
from streamtrain.serve.answers import RefusalTally
from streamtrain.serve.requests import request_payloads
from streamtrain.versions import spec_for, write_version
from streamtrain.wire import Prediction


def _one_feature_model(root: Path) -> None:
    cfg = TrainerConfig(model="seq", num_features=1, num_classes=11, hidden_size=8)
    spec = spec_for(cfg, job="streamtrain", version=55, step=1, class_names=None, offsets={}, metrics={})
    write_version(root, spec, build_model(cfg).state_dict())


def test_requests_that_do_not_fit_the_model_are_refused_naming_the_settings(tmp_path: Path) -> None:
    _one_feature_model(tmp_path)
    config = StreamtrainConfig.model_validate({"versions": {"dir": str(tmp_path)}})  # no dataset: the synthetic task
    with pytest.raises(DatasetError, match=r"the synthetic task \(trainer\.num_features=16\) are \(size, 16\), but "
                       r"version 55 .* takes \(size, 1\): serve would refuse every request as wrong-shape\. .*"
                       r"trainer\.eval_packaged"):
        request_payloads(config)
    synthetic = request_payloads(config.model_copy(update={"trainer": TrainerConfig(num_features=1)}))
    assert {a.shape[1] for a in synthetic[0]} == {1}


def test_requests_come_from_the_data_the_configuration_names(tmp_path: Path) -> None:
    pytest.importorskip("sktime")
    _one_feature_model(tmp_path)
    # What the demo's configuration names: PLAID replayed (producer.dataset.packaged), its test split requested.
    config = StreamtrainConfig.model_validate({"versions": {"dir": str(tmp_path)},
                                               "producer": {"dataset": {"packaged": "plaid"}}})
    arrays, labels, source = request_payloads(config, limit=50)
    assert len(arrays) == 50 and {a.shape[1] for a in arrays} == {1} and all(label is not None for label in labels)
    assert "PLAID_TEST.ts (producer.dataset.packaged)" in source


def test_refused_requests_are_told_at_most_once_per_interval_with_their_reasons() -> None:
    tally = RefusalTally(every_seconds=10.0)

    def answer(offset: int, error: str | None = None) -> Prediction:
        return Prediction(job="j", request_topic="r", request_partition=0, request_offset=offset, version=3,
                          error=error, error_detail="shape [50, 16] is not (size, 1)" if error else None)

    tally.count([answer(0, "wrong-shape"), answer(1), answer(2, "wrong-shape"), answer(3, "corrupt")])
    assert tally.report(now=tally._since + 1) is None  # not yet
    said = tally.report(now=tally._since + 10)
    assert said is not None and said.startswith("serve: 3 of 4 requests in the last 10 s answered with an error")
    assert "wrong-shape 2 (e.g. shape [50, 16] is not (size, 1)), corrupt 1" in said
    tally.count([answer(4)])
    assert tally.report(force=True) is None  # nothing refused since: nothing to say
