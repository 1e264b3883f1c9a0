"""Executing a plan's work: the model and its weights, sampling, tensor-parallel sharding,
checkpoints, the CPU dense kernel's packed weights, and the GPU, CPU and NEO executors."""
