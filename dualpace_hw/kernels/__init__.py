"""The compute kernels: the host's C++ extension (paged decode attention and the dense kernel),
Triton decode attention on the GPU, and the reference attention the tests check them against."""
