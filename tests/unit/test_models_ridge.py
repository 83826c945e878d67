"""The ridge head fitted in closed form (`streamtrain.models.ridge`): its fit equals scikit-learn's ridge on
standardised features at the penalty scikit-learn's own GCV chooses, it counts a replayed sample once, it leaves a
constant feature out, and it keeps a loaded fit until it has seen as many samples."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import Ridge, RidgeCV
from sklearn.preprocessing import StandardScaler

from streamtrain.models.ridge import PENALTIES, RidgeHead


def _table(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """40 features of very different levels and scales (one constant), a weak linear signal in two outputs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 40)) * rng.uniform(0.1, 10.0, 40) + rng.uniform(-50.0, 50.0, 40)
    x[:, 3] = 7.0
    y = np.stack([x[:, :5] @ rng.standard_normal(5) * 0.1, x[:, 5] * 0.05], axis=1) + rng.standard_normal((n, 2))
    return x, y


def _fitted(x: np.ndarray, y: np.ndarray, batch: int = 30) -> RidgeHead:
    head = RidgeHead(x.shape[1], y.shape[1])
    for start in range(0, len(x), batch):
        head.observe(torch.tensor(x[start:start + batch], dtype=torch.float32),
                     torch.tensor(y[start:start + batch]))
    head.refit()
    return head


def test_the_fit_is_scikit_learns_ridge_at_the_penalty_its_gcv_chooses() -> None:
    x, y = _table(300, seed=0)
    head = _fitted(x, y)
    assert float(head.fitted) == 300
    standard = StandardScaler().fit_transform(x)  # the constant column comes out 0, as the head leaves it out
    # scikit-learn's penalty is on summed squares; the head's on the mean square (of a correlation matrix).
    chosen = RidgeCV(alphas=PENALTIES.numpy() * len(x), gcv_mode="eigen").fit(standard, y).alpha_ / len(x)
    np.testing.assert_allclose(float(head.penalty), chosen, rtol=1e-6)
    predicted = head.outputs(torch.tensor(x, dtype=torch.float32)).double().numpy()
    np.testing.assert_allclose(predicted, Ridge(alpha=chosen * len(x)).fit(standard, y).predict(standard), atol=1e-4)
    assert float(head.weight[:, 3].abs().max()) == 0.0  # the constant feature


def test_a_sample_replayed_counts_once_and_one_left_out_may_come_in_later() -> None:
    x, y = _table(90, seed=1)
    features, targets = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    draws = torch.from_numpy(np.random.default_rng(1).random(90).astype(np.float32))
    held = torch.arange(90) < 10
    replayed = RidgeHead(40, 2)
    for _ in range(5):  # five passes over the same 90 samples, the first 10 held out
        replayed.observe(features, targets, ~held, draws)
    replayed.refit()
    once = _fitted(x[10:], y[10:], batch=90)
    assert float(replayed.fitted) == 80
    torch.testing.assert_close(replayed.weight, once.weight)
    assert float(replayed.penalty) == float(once.penalty)
    replayed.observe(features, targets, draws=draws)  # all of them now: the 10 held out come in, no others
    replayed.refit()
    assert float(replayed.fitted) == 90


def test_a_fit_from_fewer_samples_than_the_loaded_one_does_not_replace_it() -> None:
    x, y = _table(200, seed=2)
    head = _fitted(x, y)
    restarted = RidgeHead(40, 2)
    restarted.load_state_dict(head.state_dict())
    restarted.observe(torch.tensor(x[:50], dtype=torch.float32), torch.tensor(y[:50]))
    restarted.refit()
    torch.testing.assert_close(restarted.weight, head.weight)
    assert float(restarted.fitted) == 200
    restarted.observe(torch.tensor(x[50:], dtype=torch.float32), torch.tensor(y[50:]))
    restarted.refit()  # as many again: refitted from its own sums
    assert float(restarted.fitted) == 200 and torch.isfinite(restarted.weight).all()
