"""A run read back from Kafka and written down: every record's fate (`ledger`, `accounting`, and the bridge's
sources in `source_accounting`), the figures and time series of `report.json` (`figures`, `run_balance`,
`objective`), its typed schema (`schema`, on the `Record` base of every JSON document the project writes) and the
plots. The local stack (`streamtrain up`), the multi-host test bed and the benchmarks use it; it starts nothing."""
