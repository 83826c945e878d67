"""`streamtrain bench truncation`: what `persist`, `truncate` and `bounded` retain when streams outrun training.

ScaDLES §III-D / Table IV: streams at S2 rates (uniform, mean 300 samples/s per device) arrive faster
than the devices train, so persistence keeps a backlog that grows without bound, while stream
truncation keeps about one step's worth of the newest samples and reaches the same accuracy.

Each policy runs live, one after the other, on one broker and on the same data: the same device
streams (rates drawn once from the S2 preset with `--seed`, the same synthetic task and sample
sizes), a coordinator with `--truncation <policy>` (and DeleteRecords on for `truncate` and
`bounded`, so truncated records leave the broker), and one gloo rank per device. The coordinator's
per-device batch cap `coordinator.b_max` is what makes the streams outrun training: at most
`b_max` samples per device per step. Every `--sample-every` seconds the benchmark reads from Kafka
the records each device topic retains (high watermark - log start offset) and the trainers'
`StepFeedback` (buffer depth, loss, samples dropped). After N steps counted from the moment the
producers start, the trainers are stopped (they checkpoint) and the final model is scored on a
held-out set of the same task.

Modules: `setup`, `run`, `results` (typed figures, the comparison to persist), `render`, `command`.
"""

from ..common import Bench
from .command import truncation_command
from .render import render_truncation
from .results import TruncationResult

__all__ = ["BENCH"]

BENCH = Bench("truncation", truncation_command, TruncationResult, render_truncation, quick_args=("--quick",),
              timeout_s=600)
