"""`streamtrain bench convergence`: weighted vs plain gradient aggregation with uneven batches.

Every cell trains the trainer's real code path — the packed conv net (`streamtrain.models.conv`), packing
(`streamtrain.models.batching`), the step runner with its weighted-aggregation DDP hook (`trainer.step`,
`trainer.aggregation`) — on the same stream of samples in the same order:

- `sgd`: one process (a DDP group of one) trains the union of every device's samples of a step;
- `weighted`: `world` gloo ranks on the CPU, rank r trains device r's share of the step, the hook
  weights rank r by λ_r / Σλ (λ = samples), which is exactly SGD on the union (LB-BSP Eq. 7);
- `plain`: the same ranks and samples with conventional DDP averaging (every rank 1/world, idle
  ranks included), which over-weights samples in small batches (LB-BSP Eq. 6).

The data is the producers' synthetic stream (`producers.sources.SyntheticSource`): non-IID
devices (each sees only `labels_per_device` classes), variable sizes (normal with DIF), and
deliberately uneven per-step shares, with ranks idle at random. Accuracy is measured after every
step on a held-out set drawn from the same device streams in the same proportions (the population
the union of the streams represents). "Samples to target" is the global samples trained up to the
first step whose held-out accuracy reaches `target_accuracy`.

Modules: `setup` (what runs), `run` (the ranks), `results` (typed figures and their analysis),
`render` (plot, BENCHMARKS.md section), `command` (the CLI); the run (torch) loads when it runs.
"""

from ..common import Bench
from .command import convergence_command
from .render import render_convergence
from .results import ConvergenceResult

__all__ = ["BENCH"]

BENCH = Bench("convergence", convergence_command, ConvergenceResult, render_convergence, quick_args=("--quick",),
              timeout_s=600)
