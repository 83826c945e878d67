"""Cross-service benchmarks that reproduce the papers' comparisons (`streamtrain bench balance|convergence|truncation|all`)."""
