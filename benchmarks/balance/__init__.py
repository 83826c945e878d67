"""The balance benchmark: planning policies on the live stack under emulated heterogeneity, over two workloads —
`bench balance` (synthetic streams) and `bench realdata` (a packaged dataset replayed). How they measure:
docs/benchmarks/balance.md and realdata.md."""

from ..common import Bench, about
from .figures import BalanceResult, RealdataResult
from .render import balance_targets, plot_balance, plot_realdata, realdata_targets, render_balance, render_realdata
from .run import balance_command, realdata_command

__all__ = ["BALANCE", "REALDATA"]

# `bench all` runs the acceptance matrix once (both default fleets, the control, DIF 0/16/64) with the three policies
# its targets name: all six on two fleets would take about twice the 25 minutes it may.
BALANCE = Bench("balance", balance_command, BalanceResult, render_balance, balance_targets, plot_balance,
                args=("--control", "--policy", "static", "--policy", "chronica", "--policy", "ett-stream"),
                quick_args=("--quick",), timeout_s=1500, about=about("balance"),
                command_line="--control --repeats 3 --policy static --policy chronica --policy ett-stream --dif 0,64")
# `bench all` runs one round of the dataset workload (its budget is shared with the whole set); the committed
# figures are from rounds enough to take medians.
REALDATA = Bench("realdata", realdata_command, RealdataResult, render_realdata, realdata_targets, plot_realdata,
                 args=("--repeats", "1"), quick_args=("--quick",), timeout_s=1200, about=about("realdata"),
                 command_line="--repeats 3")
