"""Simulator: the coordinator's policies on simulated fleets, for thousands of devices and steps."""

from .engine import SimResult, simulate
from .scenario import PRESETS, Scenario, Slowdown, build_scenario

__all__ = ["PRESETS", "Scenario", "SimResult", "Slowdown", "build_scenario", "simulate"]
