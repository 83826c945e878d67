"""Every benchmark of streamtrain: `streamtrain bench kafka | ingest | scheduler | convergence | balance | realdata |
truncation | freshness | soak`, `bench all` (the whole set) and `bench report` (BENCHMARKS.md, generated whole from
their JSON).

Benchmarks sit above the services and the stack: they may import any of them; nothing imports them.

- `common`: what every benchmark shares — typed `Result`s with their measuring context, the `Bench` spec and
  `publish`, the shared options, targets, Markdown, progress and plot helpers; it imports nothing else of this package.
- `live`: the live-cell runner of the benchmarks on real processes (a broker, a stack cell, the services, the probes).
- one module per benchmark (`balance` a package of one benchmark over two workloads, `bench balance` and `bench
  realdata`), each defining `Bench(name, command, result type, renderer, targets, plot, ...)`; `registry`: the set.
- `report`: BENCHMARKS.md; `cli`: the commands, `bench all` and `bench report`.
"""
