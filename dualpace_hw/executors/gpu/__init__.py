"""The GPU executor: runs the core's GpuPlans over the paged HBM pool, stage by stage.

`GpuExecutor` (executor.py) turns a committed plan into a `Round` and its `Forward`, the paper's
stage tasks, and serves Dense Assist; the modules beside it have one part each:

* batch.py: a plan flattened into rows, host lists then device tensors;
* forward.py: the round as plain data and its forward's stage tasks;
* stages.py: the stage kernels (fused Triton on CUDA, the model's own on the CPU);
* to_cpu.py: Prefill-to-CPU, a chunk's attention over GPU staging and its pages to the host;
* graphs.py, chunked_graphs.py: the CUDA graphs of decode-only rounds and of chunked rounds;
* assist.py: Dense Assist's entry points and their pinned staging.

The executor and the types its users hold are imported from here.
"""

from dualpace_hw.executors.gpu.batch import Batch
from dualpace_hw.executors.gpu.executor import GpuExecutor
from dualpace_hw.executors.gpu.forward import Forward, ForwardState, Round

__all__ = ["Batch", "Forward", "ForwardState", "GpuExecutor", "Round"]
