"""`Predictions.from_records`: serve's answers put back into the shape a loaded model's `predict` answers in."""

from __future__ import annotations

import numpy as np
import pytest

from streamtrain import Predictions
from streamtrain.wire import Prediction, decode, encode


def _answer(offset: int, **out: object) -> Prediction:
    return Prediction(job="j", request_topic="p.requests", request_partition=0, request_offset=offset, version=4,
                      **out)  # type: ignore[arg-type]


def test_a_forecast_comes_back_in_its_shape() -> None:
    values = np.arange(12.0).reshape(2, 3, 2)  # two answers of (horizon 3, 2 features)
    records = [_answer(i, objective="forecast", values=tuple(values[i].ravel()), value_shape=(3, 2))
               for i in range(2)]
    decoded = [decode(*encode(r), Prediction) for r in records]
    got = Predictions.from_records(decoded)
    assert got.objective == "forecast" and got.values is not None and got.values.shape == (2, 3, 2)
    np.testing.assert_array_equal(got.values, values)
    assert got.versions is not None and got.versions.tolist() == [4, 4] and len(got) == 2


def test_classification_and_multilabel_rows() -> None:
    got = Predictions.from_records([_answer(0, objective="classification", label=2, label_name="c",
                                            probabilities=(0.1, 0.2, 0.7))])
    assert got.labels is not None and got.labels.tolist() == [2] and got.names == ("c",)
    tags = Predictions.from_records([_answer(0, objective="multilabel", probabilities=(0.9, 0.1, 0.8), tags=(0, 2))],
                                    num_tags=3)
    assert tags.tags is not None and tags.tags.tolist() == [[True, False, True]]


def test_a_refusal_is_named_not_turned_into_a_row() -> None:
    with pytest.raises(ValueError, match="1 of 2 requests were refused: wrong-shape"):
        Predictions.from_records([_answer(0, objective="regression", values=(1.0,)),
                                  _answer(1, error="wrong-shape", error_detail="(5, 3): 3 features, not 1")])

