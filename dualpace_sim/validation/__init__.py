"""Simulated against real: `dualpace-sim validate` and the validation limits."""
