"""Cross-service benchmarks that reproduce the papers' comparisons.

`streamtrain bench convergence | all | report` (and balance / truncation / soak as they land); the
set and the `BENCHMARKS.md` refresher are in `benchmarks.registry`.
"""
