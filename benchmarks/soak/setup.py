"""What `bench soak` runs: the streams, the ranks, the producers, the two truncation phases."""

from __future__ import annotations

from ..streams import StreamsSetup

__all__ = ["SoakSetup"]


class SoakSetup(StreamsSetup):
    """What the soak runs (service logs and checkpoints in `work_dir`, default <out>/soak-run)."""

    minutes: float = 2.0
    """Length of the run, split evenly over the phases."""
    devices: int = 32
    ranks: int = 4
    """Gloo ranks training devices 0..ranks-1; the other streams are consumed by truncation alone."""
    producer_procs: int = 4
    b_max: int = 64
    size_mean: float = 16.0
    size_dif: float = 4.0
    sample_every_s: float = 5.0
    phases: tuple[str, ...] = ("truncate", "bounded")
    """The coordinator's truncation in each phase (restarted between them)."""
    serve: bool = False
    """The ranks publish a model version every second and `serve` answers a request load at `request_rate` with
    them, its memory sampled with the rest."""
    request_rate: float = 20.0

    def producer_groups(self) -> list[tuple[list[str], list[float]]]:
        """The devices (and their rates) of each producer process."""
        ids, rates = self.device_ids(), self.stream_rates()
        n = max(1, min(self.producer_procs, self.devices))
        return [(ids[i::n], rates[i::n]) for i in range(n)]
