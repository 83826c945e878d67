"""Coordinator service: per-step ETT-balanced plans and truncation from feedback and Kafka lag.

The planning core is pure and broker-free: `state` (inputs and plans), `perfmodel` (per-device
time models), `policies` (one module per policy, `plan_step`), `truncation`, `metrics`, and the
simulator in `sim`.
"""
