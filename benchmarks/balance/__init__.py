"""The balance benchmark: planning policies on the live stack under emulated heterogeneity, over two workloads.

`streamtrain bench balance` runs the synthetic workload described here; `streamtrain bench realdata` replays a
real dataset (below). Both share the fleets, the emulation, the runs and the window's figures.

Each cell is one `stack.runner.LocalStack` run — coordinator, `streamtrain train --local-ranks 4` (gloo on
the CPU), the real Kafka broker — differing only in the policy, the per-rank slow-down factors (the fleet:
one-slow 1,1,1,4 and two-slow 1,1,4,4 by default) and the DIF (std of sample sizes) of the device streams.

Emulated devices. Rank r's compute takes time_scale x factor_r x the CPU time its training thread used
(`trainer.slowdowns` on the CPU clock: the rank sleeps the difference after its step). CPU time, unlike
elapsed time, hardly changes when four ranks, the coordinator and the broker time-share two cores, and
time_scale (4) leaves each rank needing a fraction of a core, so a rank's step time is its plan's, not the
scheduler's. The ranks run on jemalloc with a memory reserve (`trainer.cpu_allocator`,
`trainer.memory_reserve_mb`): without them a batch larger than any before page-faults its new memory in,
which doubled single steps at random. What is left is the machine's own step-to-step CPU-time noise; the
optional control row (every factor 1, DIF 0, identical batches under static) measures it.

One embedded broker serves the whole benchmark; each cell gets its own topic prefix and job, and its
topics are deleted once its records are read back.

Fairness:

- the same data: before a cell's services start, every device topic is filled with the same fixed
  backlog (each device's stream drawn from its own seeded generator), and no live producer runs, so
  step times reflect the plan rather than arrival rates, and every cell of a DIF trains the same samples;
- the same global batch: `coordinator.global_batch` samples per step for the count-based policies
  (static, lbbsp, lbb, chronica); ett-stream, seeing only backlog, sets its step-time target to the
  equal time in which the fleet trains that many samples. scadles sizes batches by stream rate
  (b_i = S_i); a backlog has no rate, and equal streams would have equal rates, so its cells give
  every device b_min = global_batch / devices — what ScaDLES does with equal stream rates;
- the same model, seed, learning rate (trainer.base_batch = global_batch, so lr is `trainer.lr`) and
  weighted aggregation everywhere;
- a fixed window: the first `warmup_steps` steps (models still fitting) are left out of every figure
  but the time to the target loss, which counts from the start of step 0;
- a window that ends before any backlog drains: each device trains only its own stream, so a device
  whose backlog ran out idles whatever the policy. The backlog is sized for the hungriest device of the
  hungriest fleet, and the analysis checks from the feedback that every device's buffer still held
  samples after every measured step (`CellFigures.backlog_held`), flagging a cell otherwise.

The oracle of a fleet is the homogeneous control's wall period x n / sum(1 / s_i): the same global
batch split in proportion to speed, so that every device finishes together.

Figures per cell, all read back from the feedback topic: the slowest rank's step (LBB's iteration time), the
wall period and its split on the critical path, the straggler effect per step (LBB Eq. 4), samples/s and work/s
(sample size trained per second), the time to a target loss (per DIF, what static reaches mid-window).
"""

from ..common import Bench
from .figures import BalanceResult, RealdataResult
from .render import balance_targets, plot_balance, plot_realdata, realdata_targets, render_balance, render_realdata
from .run import balance_command, realdata_command

__all__ = ["BALANCE", "REALDATA", "REALDATA_ABOUT"]

REALDATA_ABOUT = """`streamtrain bench realdata`: time to a held-out accuracy on a real dataset, per planning policy.

PLAID (electrical appliance currents, 11 classes, series of 100 to 1,344 values; a sample's size is its length)
is replayed into four device topics from a backlog, and four gloo ranks train the `seq` model on it with one
rank emulated four times slower. `--dataset tecator` runs the same comparison on a regression problem (the fat
content of meat from its absorbance spectrum, series of 100 values, `trainer.objective = regression`), timed
to a held-out RMSE instead: balance does not depend on the loss. Each run is one `live.run_stack_cell`
(coordinator, ranks, the shared broker); the trainers evaluate the shared model on the dataset's test split
every few steps, and the Evaluation records read back from Kafka give each run's held-out accuracy (RMSE)
over training time.

Emulated devices: as in `bench balance`, rank r's compute takes time_scale x factor_r x its training thread's
CPU time (`trainer.slowdown_clock = "cpu"`). The demo slows by the wall clock, which is right for one run on a
machine to itself; here four ranks time-share two cores with other jobs, and a rank timed by the wall clock is
as slow as its neighbours are busy, so a policy's comparison would be the scheduler's. CPU time hardly changes
with contention, and time_scale leaves each rank needing a fraction of a core.

Fairness: the same data (every run replays the same shards in the same shuffled order), the same global batch per
step (count-based policies plan it; ett-stream plans the equal time in which the fleet trains that many), model,
seed and learning rate; rounds of every cell with the order rotated each round, so drift of the shared machine
falls on every policy; a homogeneous control run (ett-stream, every factor 1) in every round for the oracle.
"""

# `bench all` runs the acceptance matrix once (both default fleets, the control, DIF 0/16/64) with the three policies
# its targets name: all six on two fleets would take about twice the 25 minutes it may.
BALANCE = Bench("balance", balance_command, BalanceResult, render_balance, balance_targets, plot_balance,
                args=("--control", "--policy", "static", "--policy", "chronica", "--policy", "ett-stream"),
                quick_args=("--quick",), timeout_s=1500, about=__doc__ or "",
                command_line="--control --repeats 3 --policy static --policy chronica --policy ett-stream --dif 0,64")
# `bench all` runs one round of the dataset workload (its budget is shared with the whole set); the committed
# figures are from rounds enough to take medians.
REALDATA = Bench("realdata", realdata_command, RealdataResult, render_realdata, realdata_targets, plot_realdata,
                 args=("--repeats", "1"), quick_args=("--quick",), timeout_s=1200, about=REALDATA_ABOUT,
                 command_line="--repeats 3")
