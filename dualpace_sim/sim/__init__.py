"""SimPy backend: executes the core's plans against the cost model's times."""

from .engine import SimOutput, SimStats, Simulation, SimulationStalled

__all__ = ["SimOutput", "SimStats", "Simulation", "SimulationStalled"]
