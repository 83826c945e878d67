"""`streamtrain bench realdata`: time to a held-out accuracy on a real dataset, per planning policy.

PLAID (electrical appliance currents, 11 classes, series of 100 to 1,344 values; a sample's size is its length)
is replayed into four device topics from a backlog, and four gloo ranks train the `seq` model on it with one
rank emulated four times slower. Each run is one `stack_cell.run_stack_cell` (coordinator, ranks, the shared
broker); the trainers evaluate the shared model on PLAID's test split every few steps, and the Evaluation
records read back from Kafka give each run's held-out accuracy over training time.

Emulated devices: as in `bench balance`, rank r's compute takes time_scale x factor_r x its training thread's
CPU time (`trainer.slowdown_clock = "cpu"`). The demo slows by the wall clock, which is right for one run on a
machine to itself; here four ranks time-share two cores with other jobs, and a rank timed by the wall clock is
as slow as its neighbours are busy, so a policy's comparison would be the scheduler's. CPU time hardly changes
with contention, and time_scale leaves each rank needing a fraction of a core.

Fairness: the same data (every run replays the same shards in the same shuffled order), the same global batch per
step (count-based policies plan it; ett-stream plans the equal time in which the fleet trains that many), model,
seed and learning rate; rounds of every cell with the order rotated each round, so drift of the shared machine
falls on every policy; a homogeneous control run (ett-stream, every factor 1) in every round for the oracle.

Modules: `setup` (the cells, the schedule, the oracle), `run` (the runs on the live stack), `analysis` (accuracy
over time from the records, the target, medians, verdicts), `results` (typed figures, the JSON), `render` (plot,
BENCHMARKS.md section), `command` (the CLI).
"""

from ..common import Bench
from .command import realdata_command
from .render import render_realdata
from .results import RealdataResult

__all__ = ["BENCH"]

# `bench all` runs one round (its budget is shared with the whole set); the committed figures are from rounds
# enough to take medians (the command in BENCHMARKS.md).
BENCH = Bench("realdata", realdata_command, RealdataResult, render_realdata, args=("--repeats", "1"),
              quick_args=("--quick",), timeout_s=1200)
