"""The engines as processes: the harness every runtime runs its engine threads in, the DualPace,
vLLM and NEO runtimes, the Dense Assist server, the GPU engine's executor recipe, the CPU
engine's worker, the GPU ranks, and process start-up and shutdown."""
