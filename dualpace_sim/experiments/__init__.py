"""Driving the simulator: one run, sweeps over offered load and their executors, capacity
searches and paper studies."""
