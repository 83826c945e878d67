"""Producers service: one stream of variable-size samples per device, each to its own topic."""
