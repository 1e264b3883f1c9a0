"""The real runtime (PyTorch executors, profiler); installed with the `hw` extra."""
