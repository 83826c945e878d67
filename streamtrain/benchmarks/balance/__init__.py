"""The balance benchmark: planning policies on the live stack under emulated heterogeneity, over two workloads —
`bench balance` (synthetic streams) and `bench realdata` (a packaged dataset replayed). How they measure:
docs/benchmarks/balance.md and realdata.md."""

from ..common import Bench
from .figures import BalanceResult, RealdataResult
from .render import balance_targets, plot_balance, plot_realdata, realdata_targets, render_balance, render_realdata
from .run import balance_command, realdata_command

__all__ = ["BALANCE", "REALDATA"]

# `bench all` runs the matrix once with the three policies the targets name (all six would take twice its 25 minutes).
BALANCE = Bench("balance", balance_command, BalanceResult, render_balance, balance_targets, plot_balance,
                args=("--control", "--policy", "static", "--policy", "chronica", "--policy", "ett-stream"),
                quick_args=("--quick",), timeout_s=1500,
                command_line="--control --repeats 3 --policy static --policy chronica --policy ett-stream --dif 0,64")
# `bench all` runs one round; the committed figures are from rounds enough to take medians.
REALDATA = Bench("realdata", realdata_command, RealdataResult, render_realdata, realdata_targets, plot_realdata,
                 args=("--repeats", "1"), quick_args=("--quick",), timeout_s=1200,
                 command_line="--repeats 3")
