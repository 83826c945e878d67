"""Every benchmark of streamtrain: `streamtrain bench kafka | ingest | scheduler | convergence | balance |
truncation | soak`, `bench all` (the whole set) and `bench report` (BENCHMARKS.md from their JSON).

Benchmarks sit above the services and the stack: they may import any of them; nothing imports them.

- `common`: what every benchmark shares (typed `Record` results, the `Bench` spec, `LaunchOptions`,
  Markdown and plot helpers); it imports nothing else of this package.
- one module or package per benchmark, each defining `BENCH = Bench(name, command, result type,
  renderer, ...)`; the larger ones are packages split into `setup`, `run`, `results`, `render`, `command`.
- `registry`: the set, in the order `bench all` runs it; a new benchmark is one line there.
- `live`: the broker, service processes and probes the live benchmarks share.
- `report`: the BENCHMARKS.md refresher; `suite`: `bench all`; `cli`: the commands.
"""
