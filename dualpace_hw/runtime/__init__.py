"""The engines as processes: the DualPace and vLLM runtimes and NEO's, the CPU engine's worker,
the GPU ranks, and process start-up and shutdown."""
