"""The serving service (`[serve]` in the TOML file, STREAMTRAIN_SERVE__* in the environment)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .parsing import text_as_tuple

__all__ = ["GATE_METRICS", "ServeConfig"]

#: Metrics a version may carry that the promotion gate can compare (higher is better for accuracies, lower for
#: losses).
GATE_METRICS: tuple[str, ...] = tuple(f"{where}_{metric}" for where in ("heldout", "prequential") for metric in (
    "accuracy", "loss", "rmse", "mae", "f1_mean", "f1_micro"))  # every built-in objective's headline and loss


class ServeConfig(BaseModel):
    """How `streamtrain serve` answers requests and which model versions it promotes."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    gate_metrics: tuple[str, ...] = ()
    """Metrics the promotion gate compares, in order of preference: the first one both the new version and the
    live one carry decides (accuracies and F1: higher is better; losses, RMSE and MAE: lower). Empty (the
    default): the objective's own, held-out then test-then-train: `accuracy` for classification, `rmse` for
    regression, `f1_mean` for multi-label, `mae` for a forecast, `loss` for an objective of yours. E.g. `--set
    serve.gate_metrics=heldout_loss` (RMSE and MAE are in the target's units: set the tolerance to match)."""

    beat_baseline: bool = True
    """Refuse a version whose gate metric is worse than the trivial baseline's measured beside it (the training
    mean, the most common class, the last value: `heldout_baseline_rmse` beside `heldout_rmse`), the first version
    too, and say so: a model that loses to the mean is not worth serving. Off: only the live version is compared."""

    tolerance: float = Field(default=0.05, ge=0)
    """How much worse than the live version a new version may be on the gate metric and still be served
    (absolute: 0.05 lets an accuracy of 0.80 be replaced by one of 0.75, not 0.74). Online training wobbles
    by a few points between versions; a tighter gate holds the live version (and the freshness of what is
    served) until training beats it again."""

    min_samples: int = Field(default=100, ge=0, le=100_000_000)
    """Fewest samples a gate metric must be measured on, in both versions (`heldout_samples`,
    `prequential_samples`), for it to decide; a metric over fewer is passed over for the next one. A few dozen
    samples move an accuracy by more than the tolerance by chance alone. 0: any count."""

    unmeasured: Literal["accept", "reject"] = "accept"
    """A version the gate cannot compare (it and the live version share no gate metric: no held-out set, say):
    `accept` serves it (and says so), `reject` keeps the live version."""

    max_batch: int = Field(default=64, ge=1, le=65_536)
    """Most requests answered in one forward pass."""

    max_batch_size: int = Field(default=65_536, ge=1)
    """Most frames (total sample size) in one forward pass; a single larger request is answered alone."""

    batch_wait_seconds: float = Field(default=0.005, ge=0, le=10)
    """After the first request of a batch, how long serve waits for more before it answers (latency vs
    throughput)."""

    group_id: str | None = Field(default=None, min_length=1, max_length=200)
    """Consumer group serve commits request offsets under (default `<job>.serve`): a restarted serve resumes
    after the last request whose prediction was delivered."""

    torch_threads: int = Field(default=1, ge=0, le=1024)
    """Intra-op CPU threads of serve's forward passes (0 keeps torch's default). One: a request batch is small,
    and serve shares the host's cores with the trainers."""

    broker_timeout_seconds: float = Field(default=60.0, ge=0, le=86_400)
    """How long serve waits for an unreachable Kafka before it exits with status 1 (0: it waits for good). While
    Kafka is away nothing can be answered (requests wait in Kafka; none is lost, as a request's offset is
    committed only once its prediction is delivered) and serve logs the outage every 30 s instead of librdkafka's
    every reconnect. Exiting hands the outage to what supervises serve: compose's `restart: unless-stopped`,
    systemd or Kubernetes restart it, and the restart shows the outage."""

    request_rate: float = Field(default=20.0, gt=0, le=100_000)
    """`streamtrain request` (the load generator): requests per second it sends."""

    _gate_from_text = field_validator("gate_metrics", mode="before")(text_as_tuple)

    @field_validator("gate_metrics")
    @classmethod
    def _known_metrics(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [m for m in value if m not in GATE_METRICS]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown)) or 'nothing'}: name metrics among "
                             f"{', '.join(GATE_METRICS)}")
        return value
