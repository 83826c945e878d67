"""Every benchmark of streamtrain: `streamtrain bench kafka | ingest | scheduler | convergence | balance | realdata |
truncation | soak`, `bench all` (the whole set) and `bench report` (BENCHMARKS.md, generated whole from their JSON).

Benchmarks sit above the services and the stack: they may import any of them; nothing imports them.

- `common`: what every benchmark shares (typed `Result`s with their measuring context, the `Bench` spec,
  `LaunchOptions`, targets, Markdown, progress and plot helpers); it imports nothing else of this package.
- one module per benchmark (two for `soak`; `balance` a package of one benchmark over two workloads, `bench
  balance` and `bench realdata`), each defining `Bench(name, command, result type, renderer, ...)`.
- `registry`: the set, in the order `bench all` runs it; a new benchmark is one line there.
- `live`: the live-cell runner the benchmarks on real processes share (a broker, a stack cell, the services,
  the probes); `streams`: device streams at a ScaDLES rate preset.
- `report`: BENCHMARKS.md; `suite`: `bench all`; `cli`: the commands (and the context each run records).
"""
