"""When a rank reports a step that its plan could not fill: the one rule the trainer and the simulator share.

A plan's `step_time_target` T is the compute time every device is filled to. Under a backlog the
batches fill T and the group steps again as soon as the next plan arrives. At line rate the devices
hold fewer samples than T can train: every pending sample is planned, the step ends early, and if
the ranks reported at once the next plan would again hold only what arrived during that short step.
Steps would shrink to a few samples each and be made of fixed costs (communication, the plan's and
the data's round trip, the optimizer step), which T was chosen to keep within
`coordinator.max_overhead_fraction` of a step.

So a rank holds its report until T has passed since its step began, when the whole group drained
what its plans could see (no rank kept back a sample a plan saw and left, and truncation dropped
none: `group_backlog` is 0; a truncated stream is one that outruns training, where holding would idle
it). The samples that arrive meanwhile are reported with the step and planned together, and the
step that trains them has about T's worth. The hold costs freshness (a sample waits at most T
longer), never throughput: a group with a backlog does not hold, and the samples arrive whether or
not it waits. With plans made a step ahead, the plan a step's report feeds is the one after next, so
what a plan could see ends one report earlier (`trainer.backlog`): samples reported a moment ago wait
for the plan made from them and are no backlog yet.
"""

from __future__ import annotations

__all__ = ["report_hold_seconds"]


def report_hold_seconds(target_s: float, elapsed_s: float, group_backlog: int, max_hold_s: float) -> float:
    """Seconds a rank waits after its step before reporting it (0: report now).

    Args:
        target_s: the plan's step-time target T (0 or less when the plan has none).
        elapsed_s: seconds since the step began (plan wait, data wait, compute, communication).
        group_backlog: samples the group's ranks still hold after taking the step's batches that a plan saw
            and no plan names, plus the samples truncation dropped in the step; above 0 the plans could not
            take everything there was, so steps are not short for want of data and holding would only delay
            (or drop) more.
        max_hold_s: the longest hold (`trainer.hold_max_seconds`); 0 turns holding off.
    """
    if group_backlog > 0 or target_s <= 0 or max_hold_s <= 0:
        return 0.0
    return min(max(target_s - elapsed_s, 0.0), max_hold_s)
