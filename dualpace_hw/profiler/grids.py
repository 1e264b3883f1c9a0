"""The shapes a profile measures. Full grids span what serving needs; `--quick` grids are
tiny so that CI can run the whole profiler on the CPU with a tiny model."""

from __future__ import annotations

from dataclasses import dataclass


def pow2(lo: int, hi: int) -> list[int]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return out


@dataclass(frozen=True)
class Grids:
    gpu_tokens: list[int]  # pre/post-attention and pre-layer widths
    gpu_rows: list[int]  # post-layer rows
    prefill_chunks: list[int]
    prefill_contexts: list[int]
    decode_batches: list[int]  # GPU and CPU paged decode attention
    decode_totals: list[int]  # total context tokens of a decode batch
    max_request_context: int  # per-request context cap; beyond it time scales linearly
    cpu_batches: list[int]  # CPU dense stages, Assist Buffer, Dense Assist rows

    @classmethod
    def full(cls) -> Grids:
        return cls(
            gpu_tokens=pow2(1, 16384), gpu_rows=pow2(1, 1024),
            # Every power of two from 256 to 4096 for chunks and contexts: prefill attention
            # grows with chunk x context, and a chunk between two grid rows interpolated
            # linearly came out 30 % high on the H200 box (a lone 2,048-token chunk: 204 ms
            # modelled against 159 ms real with rows at 1,024 and 4,096 only). From 1 token:
            # serving's last chunks and shortest prompts are a few tokens (the Azure runs on
            # the H200 box had 2-token chunks), below which the table would be extrapolated.
            prefill_chunks=[1, 16, 64, 256, 512, 1024, 2048, 4096],
            prefill_contexts=[1, 16, 256, 512, 1024, 2048, 4096, 8192, 32768],
            decode_batches=[1, 4, 16, 64, 256, 512],
            decode_totals=[1, 64, 1024, 16384, 262144, 2097152],
            max_request_context=32768,
            cpu_batches=pow2(1, 512),
        )

    @classmethod
    def quick(cls) -> Grids:
        # Just enough points for the fits (K = 5 token counts for the plateau). The per-request
        # cap is 1,024 so that the longest contexts extend a slope read over 512 tokens (over
        # 32, a little timing noise became seconds at 65,536 tokens).
        return cls(
            gpu_tokens=pow2(1, 512), gpu_rows=[1, 8], prefill_chunks=[4, 64, 512],
            prefill_contexts=[16, 512], decode_batches=[1, 4, 16], decode_totals=[16, 1024, 65536],
            max_request_context=1024, cpu_batches=[1, 4, 16],
        )
