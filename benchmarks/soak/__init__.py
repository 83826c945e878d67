"""`streamtrain bench soak`: 32 device streams at ScaDLES S2 rates through the stack, memory and backlog bounded.

One broker, `--producer-procs` producer processes sharing the 32 streams (rates drawn once from the
S2 preset: uniform, mean 300, std 112 samples/s per device, about 9,600 samples/s in all), one
coordinator, and `--ranks` gloo ranks training devices 0..R-1. A trainer rank is one process per
device (`streamtrain train` has no multi-device rank) and costs about half a GiB of resident memory,
so 32 of them do not fit this 2-core machine: the other 32 - R streams are consumed by truncation
alone — the benchmark's *truncation follower* (in the benchmark process) commits, for those
devices, exactly the truncate-before offsets the coordinator's plans give, as a rank that trains
nothing would; the coordinator's DeleteRecords then removes them from the broker (it never deletes
past what the trainers' group committed).

The coordinator runs with `truncate` for the first half of the run, then is restarted with
`bounded` for the second half, while producers and ranks keep running. Every `--sample-every`
seconds it records the resident memory (RSS, from /proc) of every process — broker, producers,
coordinator, trainer launcher, each rank, and the benchmark itself — the records each device topic
retains (high watermark - log start offset) and each device's lag (high watermark - committed).
Boundedness is judged on Theil-Sen slopes (robust to single steps) over the second half of each phase.

`--minutes 2` (the default) is a smoke-sized run; `--minutes 30` is the real soak.

Modules: `setup`, `run` (the services, the follower, the samples), `results` (typed figures and
verdicts), `render`, `command`.
"""

from ..common import Bench
from .command import soak_command
from .render import render_soak
from .results import SoakResult

__all__ = ["BENCH"]

BENCH = Bench("soak", soak_command, SoakResult, render_soak, args=("--minutes", "5"), quick_args=("--minutes", "1"),
              timeout_s=600)
