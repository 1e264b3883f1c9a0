// Dense projections of the CPU executor: y = x @ W^T in bf16 with W reordered once at load.
//
// Why our own: on the H200 box's Xeon, torch's bf16 linear (oneDNN on plain weights) streams
// weights at 55-66 GB/s up to 48 rows and falls to 20-40 GB/s from 63 rows (2.6 TF/s at 128,
// a tenth of what 14 AMX cores do), and oneDNN's prepacked inner product (the Inductor ops)
// falls off a cliff above 64 rows. The work here is laid out so that neither happens:
//
// * Packed layout: W [N, K] becomes N/32 column blocks, each [K/2, 32, 2] (the VNNI-2 order
//   AMX and vdpbf16ps read: two consecutive k of one output column side by side), so a block
//   is one contiguous 64*K-byte stream, read once per call from DRAM.
// * Work split: every thread owns a contiguous range of column blocks and does all rows for
//   them (no two threads read the same weight bytes).
// * x packed per call (AMX and portable paths): the rows become 32-row panels of 32-k steps,
//   [ceil(M/32)][K/32][32][32], so an x tile (16 rows x 32 k) is 1 KiB contiguous. Read in
//   place, a tile's 16 rows lie K*2 bytes apart (8 KiB at K = 4096, 28 KiB at K = 14336: all
//   in one L1 set, and 16 pages); on the H200 box's Xeon that cost 5-10 % at K = 4096 and
//   up to 3.4x at K = 14336 (.probe measurements in benchmarks/results/README.md).
// * Blocking (AMX and portable paths), per call from the rows and K (plan_blocking), over one
//   thread's blocks:
//   - Block-major, where x's 32-row panels, the block passed over and the next one fit
//     kL2Budget (1.5 MiB of SPR's 2 MiB L2: up to 128 rows at K = 4,096; never at K = 14,336)
//     and there are at most 4 panels: for each block, every panel passes over the whole K in
//     turn, its sums held in the tiles from the first k to the last. The first panel's pass
//     reads the block from DRAM (prefetching it into L1 a few steps ahead); the later ones
//     read it from L2, with x in L2 across blocks. Those later passes (or the only one, up to
//     32 rows) also prefetch the next block into L2 (prefetcht2), a few lines per k-step, so
//     DRAM keeps streaming while they compute: with DRAM idle through the later passes, the
//     64-row stages ran at half the read bandwidth on the box. y is stored per group of
//     kSumsBlocks / panels blocks (stored per block, 1-16 rows were 5-8 % slower).
//   - Panel-major otherwise (more rows, or K = 14,336 where x's 32 rows are 896 KiB): for each
//     k-chunk of kChunkK, every panel passes over a group of blocks whose chunk is
//     kChunkGroupBytes, L2-resident while the panels pass (each panel's chunk of x reused
//     across the group); fp32 sums per thread carried across chunks. Neither x's chunk nor the
//     weight's outgrows L2 at any K (unchunked, 32 rows of x at K = 14,336 and one weight block
//     were 1.8 MiB together, which thrashed SPR's 2 MiB L2 from 64 rows).
//   Measured on one thread of an AMX development machine (issue 18), against panel-major
//   everywhere: block-major with the L2 stream 1.05-1.2x faster at 16-128 rows at K = 4,096;
//   panel-major with such a stream 5-9 % slower on down up to 128 rows; block-major on down
//   (K split to fit L2) no faster; prefetching into L1, or every line of the next chunk over
//   all passes, slower. Either way the weight is read from DRAM once, and time grows with rows
//   only through compute: no cliffs. Tried at 33-64 rows and not kept (same machine, one
//   thread, issue 18): 4 x 1 tiles (the 64 rows x one 16-column half of a block per pass,
//   each weight tile loaded once for four x tiles; 5 tile loads per 4 multiplies against the
//   2 x 2 kernel's 4, so more L2 traffic, not less), 1.00-1.12x the time, and no faster with
//   the halves interleaved every 2-8 k-steps (sums stored and reloaded); the 2 x 2 kernel's
//   two panels interleaved every 4-8 k-steps (the block read from L2 once), 1.1-1.4x;
//   streaming the next block over every panel's pass (not only the later ones) 1.00-1.16x at
//   33-64 rows, mixed (0.93-1.05x) at 65-128.
// * Tiles: AMX on 32 x 32 fp32 tiles (our 2 x 2 tile kernel, the weight stream prefetched
//   into L1 ahead on the first panel's pass); or the same tiles through ATen's brgemm, oneDNN's
//   ukernel, which PyTorch's own CPU flash attention and Inductor's CPU GEMM templates call,
//   on x in place; AVX512-BF16 (vdpbf16ps, 4 rows x 32 columns of fp32 accumulators, the
//   weight stream prefetched ahead) where AMX is absent or rows are few; and a portable path
//   (plain C++, fp32 sums, the AMX path's packing and blocking) for every other CPU, which CI
//   runs to check the layout and the blocking on machines with neither.
//
// Ops (namespace dualpace_cpu):
//   pack_linear_weight(w [N, K] bf16) -> packed [ceil(N/32), K/2, 32, 2] bf16 (zero-padded)
//   packed_linear(x [M, K] bf16, packed, N, isa, ahead) -> y [M, N] bf16
//       isa: 0 portable, 1 avx512bf16, 2 AMX through ATen's brgemm, 3 our AMX tiles (the
//       caller checks the CPU has AMX); ahead: the AMX path's weight prefetch distance
//   tile_peak_flops(iters) -> FLOPs of iters x 4 tile multiplies per thread (the AMX ceiling)
//   dense_isas() -> the isa codes this build has: "012" where it was compiled for AVX512-BF16,
//       else "02" (AMX is ATen's brgemm, there in every build; whether the CPU has it is the
//       caller's to check)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define DP_DENSE_AVX512BF16 1
#else
#define DP_DENSE_AVX512BF16 0
#endif
#if DP_DENSE_AVX512BF16 && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define DP_DENSE_AMX 1
#else
#define DP_DENSE_AMX 0
#endif

namespace {

constexpr int64_t kBlockN = 32;  // output columns per packed block (two AMX tiles wide)
constexpr int64_t kBlockM = 32;  // rows per tile (two AMX tiles high)
constexpr int64_t kGroupBytes = 1 << 20;  // x-in-place paths: weight bytes of the column
                                          // blocks that share one pass over the rows (half
                                          // of SPR's 2 MiB L2)
constexpr int64_t kStepK = 32;            // k per AMX tile step (and per x panel step)
constexpr int64_t kPanelStep = kBlockM * kStepK;  // elements of one panel step, 2 KiB
constexpr int64_t kBlockMajorPanels = 4;  // packed paths: at most this many panels (128
                                          // rows) block-major
constexpr int64_t kL2Budget = 3 << 19;    // block-major: x's panels, the block passed over and
                                          // the next one, in 1.5 MiB of SPR's 2 MiB L2
constexpr int64_t kSumsBlocks = 16;       // block-major: blocks x panels of sums (64 KiB) per
                                          // group, so y is stored in runs of lines
constexpr int64_t kChunkK = 1024;    // panel-major (more rows): k per chunk (a panel's chunk
                                     // is 64 KiB)
constexpr int64_t kChunkGroupBytes = 256 << 10;  // panel-major: weight bytes of a group's
                                                 // chunk, L2-resident while the panels pass
constexpr int64_t kRowsU = 4;    // rows per vector micro-kernel call

enum Isa : int64_t { kPortable = 0, kAvx512Bf16 = 1, kBrgemm = 2, kAmx = 3 };

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// The packed paths' portable chunk: c (32 rows x 32 fp32, `first` zeroes it) += the panel's
// rows times the block over k-steps [s0, s1), k2 pairs up to k2n (a last partial step of a K
// that is not a multiple of 32 reads the panel's zero padding only up to k2n).
void chunk_portable(const uint16_t* panel, const uint16_t* b, int64_t s0, int64_t s1,
                    int64_t k2n, int64_t rows, bool first, float* c) {
  if (first) std::fill(c, c + kBlockM * kBlockN, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    float* cr = c + r * kBlockN;
    for (int64_t s = s0; s < s1; ++s) {
      const uint16_t* xr = panel + s * kPanelStep + r * kStepK;
      for (int64_t j = 0; j < kStepK / 2 && s * kStepK / 2 + j < k2n; ++j) {
        const int64_t k2 = s * kStepK / 2 + j;
        const float x0 = bf16_to_float(xr[2 * j]), x1 = bf16_to_float(xr[2 * j + 1]);
        const uint16_t* bk = b + k2 * kBlockN * 2;
        for (int64_t n = 0; n < kBlockN; ++n) {
          cr[n] += x0 * bf16_to_float(bk[2 * n]) + x1 * bf16_to_float(bk[2 * n + 1]);
        }
      }
    }
  }
}

#if DP_DENSE_AVX512BF16
template <int R>
void micro_avx512bf16(const uint16_t* x, int64_t ldx, const uint16_t* b, int64_t k2n,
                      float* c) {
  constexpr int64_t kAhead = 16;  // k-pairs the weight stream is prefetched ahead (2 KiB)
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const int32_t* xp[R];
  for (int r = 0; r < R; ++r) xp[r] = reinterpret_cast<const int32_t*>(x + r * ldx);
  for (int64_t k2 = 0; k2 < k2n; ++k2) {
    const uint16_t* bk = b + k2 * kBlockN * 2;
    _mm_prefetch(reinterpret_cast<const char*>(bk + kAhead * kBlockN * 2), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(bk + kAhead * kBlockN * 2 + 32), _MM_HINT_T0);
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bk);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bk + 32);
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(xp[r][k2]);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + r * kBlockN, acc[r][0]);
    _mm512_storeu_ps(c + r * kBlockN + 16, acc[r][1]);
  }
}

void tile_avx512bf16(const uint16_t* x, int64_t ldx, const uint16_t* b, int64_t k2n,
                     int64_t rows, float* c) {
  int64_t r = 0;
  for (; r + kRowsU <= rows; r += kRowsU) micro_avx512bf16<4>(x + r * ldx, ldx, b, k2n, c + r * kBlockN);
  switch (rows - r) {
    case 3: micro_avx512bf16<3>(x + r * ldx, ldx, b, k2n, c + r * kBlockN); break;
    case 2: micro_avx512bf16<2>(x + r * ldx, ldx, b, k2n, c + r * kBlockN); break;
    case 1: micro_avx512bf16<1>(x + r * ldx, ldx, b, k2n, c + r * kBlockN); break;
    default: break;
  }
}
#endif

void tile_brgemm(const uint16_t* x, int64_t ldx, const uint16_t* b, int64_t k, int64_t rows,
                 float* c) {
  at::native::cpublas::brgemm(rows, kBlockN, k, ldx, kBlockN, kBlockN, /*add_C=*/false,
                              reinterpret_cast<const at::BFloat16*>(x),
                              reinterpret_cast<const at::BFloat16*>(b), c, /*is_vnni=*/true);
}

#if DP_DENSE_AMX
// The block-major blocking's L2 stream: the weight lines of the next block a thread passes
// over, prefetched into L2 (prefetcht2) a few lines per k-step while the current block's later
// panels (or its only one) compute, so that DRAM keeps streaming through those passes.
struct L2Ahead {
  const char* next = nullptr;
  const char* end = nullptr;
  int64_t per_step = 0;  // lines per k-step
  void step() {
    for (int64_t l = 0; l < per_step && next < end; ++l, next += 64) {
      __builtin_prefetch(next, 0, 1);
    }
  }
};

// AMX tiles, 2 x 2: C tiles 0-3 (16 rows x 16 fp32 each) over x tiles 4-5 (16 rows x 32 k)
// and weight tiles 6-7 (16 k-pairs x 16 columns x 2). Rows fewer than 32 shrink the x and C
// tiles' row counts (one tile configuration per row count, loaded when it changes).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

thread_local int64_t configured_rows = -1;

void release_tiles() {
  _tile_release();
  configured_rows = -1;
}

void configure_tiles(int64_t rows) {
  int64_t& current = configured_rows;
  if (current == rows) return;
  TileConfig cfg;
  const uint8_t r1 = static_cast<uint8_t>(std::min<int64_t>(rows, 16));
  const uint8_t r2 = static_cast<uint8_t>(std::max<int64_t>(rows - 16, 1));
  const uint8_t tile_rows[8] = {r1, r1, r2, r2, r1, r2, 16, 16};
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = tile_rows[t];
    cfg.colsb[t] = 64;
  }
  // Not _tile_loadconfig: GCC 12's declares a read of 8 bytes only, so the stores of the row
  // and column counts above it were dead to the optimizer and could be dropped (a build of
  // this file did, and its ldtilecfg faulted); an operand of the whole struct keeps them.
  asm volatile("ldtilecfg %0" ::"m"(cfg));
  current = rows;
}

// One chunk of the packed paths on AMX: c (32 x 32 fp32 as 2 x 2 tiles; `first` starts from
// zero, else from c) += the panel's rows times the block over k-steps [s0, s1).
// ahead: k-steps the weight stream is prefetched ahead into L1 within the chunk, 0 for none (the
// first panel's pass reads the chunk from DRAM; the tile loads alone leave its latency exposed,
// since the next load of a weight tile waits for the multiplies still reading that tile
// register). next: the L2 stream this pass advances each k-step, or null.
void chunk_amx(const uint16_t* panel, const uint16_t* b, int64_t s0, int64_t s1, int64_t rows,
               int64_t ahead, bool first, float* c, L2Ahead* next) {
  configure_tiles(rows);
  const bool two = rows > 16;
  const int64_t sc = kBlockN * 4, sb = kBlockN * 2 * 2, sx = kStepK * 2;  // row strides, bytes
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
      _tile_zero(2);
      _tile_zero(3);
    }
  } else {
    _tile_loadd(0, c, sc);
    _tile_loadd(1, c + 16, sc);
    if (two) {
      _tile_loadd(2, c + 16 * kBlockN, sc);
      _tile_loadd(3, c + 16 * kBlockN + 16, sc);
    }
  }
  const int64_t step_elems = (kStepK / 2) * kBlockN * 2;  // one k-step of the block, 2 KiB
  for (int64_t s = s0; s < s1; ++s) {
    const uint16_t* bk = b + s * step_elems;
    if (ahead && s + ahead < s1) {
      const char* p = reinterpret_cast<const char*>(bk + ahead * step_elems);
      for (int line = 0; line < 32; ++line) _mm_prefetch(p + 64 * line, _MM_HINT_T0);
    }
    if (next) next->step();
    const uint16_t* xs = panel + s * kPanelStep;
    _tile_loadd(6, bk, sb);
    _tile_loadd(7, bk + 32, sb);
    _tile_loadd(4, xs, sx);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, xs + 16 * kStepK, sx);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, sc);
  _tile_stored(1, c + 16, sc);
  if (two) {
    _tile_stored(2, c + 16 * kBlockN, sc);
    _tile_stored(3, c + 16 * kBlockN + 16, sc);
  }
}

// Peak of the tiles alone: `iters` x 4 TDPBF16PS per thread on data in tile registers.
double amx_tile_peak(int64_t iters) {
  alignas(64) static uint16_t zeros[16 * 32] = {};
  double flops = 0;
#pragma omp parallel reduction(+ : flops)
  {
    configure_tiles(32);
    _tile_loadd(4, zeros, 64);
    _tile_loadd(5, zeros, 64);
    _tile_loadd(6, zeros, 64);
    _tile_loadd(7, zeros, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t i = 0; i < iters; ++i) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    alignas(64) float sink[16 * 16];
    _tile_stored(0, sink, 64);
    release_tiles();  // the next AMX user configures its own tiles
    flops += static_cast<double>(iters) * 4 * 16 * 16 * 32 * 2 + sink[0] * 0;
  }
  return flops;
}
#endif

// fp32 tile rows -> bf16 output columns [n0, n0 + cols), round to nearest even.
void store_rows(const float* c, int64_t rows, int64_t cols, at::BFloat16* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* cr = c + r * kBlockN;
    at::BFloat16* yr = y + r * ldy;
#if DP_DENSE_AVX512BF16
    if (cols == kBlockN) {
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(cr + 16), _mm512_loadu_ps(cr));
      _mm512_storeu_si512(yr, (__m512i)v);
      continue;
    }
#endif
    for (int64_t n = 0; n < cols; ++n) yr[n] = c10::BFloat16(cr[n]);
  }
}

at::Tensor pack_linear_weight(at::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16, "want a 2-D bf16 weight");
  TORCH_CHECK(w.size(1) % 2 == 0, "in_features must be even (VNNI pairs), got ", w.size(1));
  w = w.contiguous();
  const int64_t n = w.size(0), k = w.size(1), nb = (n + kBlockN - 1) / kBlockN, k2n = k / 2;
  at::Tensor packed = at::zeros({nb, k2n, kBlockN, 2}, w.options());
  const uint16_t* src = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  uint16_t* dst = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nb; ++blk) {
    uint16_t* out = dst + blk * k2n * kBlockN * 2;
    const int64_t cols = std::min(kBlockN, n - blk * kBlockN);
    for (int64_t j = 0; j < cols; ++j) {
      const uint16_t* row = src + (blk * kBlockN + j) * k;
      for (int64_t k2 = 0; k2 < k2n; ++k2) {
        out[(k2 * kBlockN + j) * 2] = row[2 * k2];
        out[(k2 * kBlockN + j) * 2 + 1] = row[2 * k2 + 1];
      }
    }
  }
  return packed;
}

// The x-in-place paths (AVX512-BF16, brgemm): the column blocks [lo, hi) of one thread, all
// rows, in groups of kGroupBytes, each group passed over by every kBlockM-row block of x.
void run_rows(const uint16_t* x, int64_t m, int64_t k, const uint16_t* packed, int64_t n,
              int64_t lo, int64_t hi, int64_t isa, at::BFloat16* y) {
  alignas(64) float c[kBlockM * kBlockN];
  const int64_t k2n = k / 2, block_elems = k2n * kBlockN * 2;
  const int64_t group = std::max<int64_t>(1, kGroupBytes / (block_elems * 2));
  for (int64_t g = lo; g < hi; g += group) {
    const int64_t g_end = std::min(hi, g + group);
    for (int64_t m0 = 0; m0 < m; m0 += kBlockM) {
      const int64_t rows = std::min(kBlockM, m - m0);
      const uint16_t* xm = x + m0 * k;
      for (int64_t blk = g; blk < g_end; ++blk) {
        const uint16_t* b = packed + blk * block_elems;
#if DP_DENSE_AVX512BF16
        if (isa == kAvx512Bf16) {
          tile_avx512bf16(xm, k, b, k2n, rows, c);
        } else
#endif
        {
          tile_brgemm(xm, k, b, k, rows, c);
        }
        const int64_t n0 = blk * kBlockN;
        store_rows(c, rows, std::min(kBlockN, n - n0), y + m0 * n + n0, n);
      }
    }
  }
}

// x [m, k] -> 32-row panels [ceil(m/32)][steps][32][32] (the header says why), shared by the
// team: each thread packs a share of the (panel, step) slots. Rows past m are not written (the
// kernels read `rows` rows only); k past K in the last step is zero.
void pack_panels(const uint16_t* x, int64_t m, int64_t k, int64_t steps, uint16_t* panels) {
  const int64_t mb = (m + kBlockM - 1) / kBlockM;
#pragma omp for collapse(2) schedule(static)
  for (int64_t i = 0; i < mb; ++i) {
    for (int64_t s = 0; s < steps; ++s) {
      uint16_t* dst = panels + (i * steps + s) * kPanelStep;
      const int64_t k0 = s * kStepK, kn = std::min(kStepK, k - k0);
      for (int64_t r = 0; r < std::min(kBlockM, m - i * kBlockM); ++r) {
        uint16_t* d = dst + r * kStepK;
        const uint16_t* src = x + (i * kBlockM + r) * k + k0;
        if (kn == kStepK) {
          std::memcpy(d, src, kStepK * 2);  // a constant size: one 64-byte move
        } else {
          std::memcpy(d, src, kn * 2);
          std::memset(d + kn, 0, (kStepK - kn) * 2);
        }
      }
    }
  }
}

// How the packed paths block one call (the header says why): k-steps per chunk, column blocks
// per group, and the order of the passes inside a (group, chunk).
struct Blocking {
  int64_t chunk, group;
  bool block_major;  // per block, every panel in turn (else per panel, every block)
};

Blocking plan_blocking(int64_t mb, int64_t steps) {
  const int64_t step_bytes = kStepK * kBlockN * 2;  // one k-step of a block (or of a panel)
  if (mb <= kBlockMajorPanels && (mb + 2) * steps * step_bytes <= kL2Budget) {
    return {steps, std::max<int64_t>(1, kSumsBlocks / mb), true};
  }
  const int64_t chunk = std::min(steps, kChunkK / kStepK);
  return {chunk, std::max<int64_t>(1, kChunkGroupBytes / (chunk * step_bytes)), false};
}

#if DP_DENSE_AMX
// The block-major L2 stream over block blk: the thread's next block (all of K), spread over
// `steps_left` k-steps of the passes that stream.
L2Ahead l2_ahead(const uint16_t* packed, int64_t block_elems, int64_t blk, int64_t hi,
                 int64_t steps_left) {
  L2Ahead a;
  if (blk + 1 >= hi) return a;
  a.next = reinterpret_cast<const char*>(packed + (blk + 1) * block_elems);
  a.end = a.next + block_elems * 2;
  a.per_step = (block_elems * 2 / 64 + steps_left - 1) / steps_left;
  return a;
}
#endif

// The packed paths (AMX, portable): the column blocks [lo, hi) of one thread over the panels,
// blocked as plan_blocking says; partial sums stay in fp32 in a per-thread buffer until the
// last chunk, then become bf16 y.
void run_panels(const uint16_t* panels, int64_t m, int64_t k, int64_t steps,
                const uint16_t* packed, int64_t n, int64_t lo, int64_t hi, int64_t isa,
                int64_t ahead, at::BFloat16* y) {
  const int64_t k2n = k / 2, block_elems = k2n * kBlockN * 2;
  const int64_t mb = (m + kBlockM - 1) / kBlockM;
  const Blocking plan = plan_blocking(mb, steps);
  thread_local std::vector<float> sums;  // kept across calls: no page faults per call
  sums.resize(static_cast<size_t>(mb * plan.group * kBlockM * kBlockN));
#if DP_DENSE_AMX
  L2Ahead stream;
#endif
  for (int64_t g = lo; g < hi; g += plan.group) {
    const int64_t g_end = std::min(hi, g + plan.group), blocks = g_end - g;
    for (int64_t s0 = 0; s0 < steps; s0 += plan.chunk) {
      const int64_t s1 = std::min(steps, s0 + plan.chunk);
      for (int64_t pass = 0; pass < mb * blocks; ++pass) {
        const int64_t i = plan.block_major ? pass % mb : pass / blocks;
        const int64_t blk = g + (plan.block_major ? pass / mb : pass % blocks);
        const int64_t rows = std::min(kBlockM, m - i * kBlockM);
        const uint16_t* panel = panels + i * steps * kPanelStep;
        float* c = sums.data() + (i * plan.group + (blk - g)) * kBlockM * kBlockN;
        const uint16_t* b = packed + blk * block_elems;
#if DP_DENSE_AMX
        if (isa == kAmx) {
          // the first panel's pass reads the chunk from DRAM and prefetches it ahead into L1;
          // block-major, the passes after it (or the only one) stream the next block into L2
          const bool streams = plan.block_major && (i > 0 || mb == 1);
          if (streams && i == std::min<int64_t>(1, mb - 1)) {  // the block's first to stream
            const int64_t streaming_steps = std::max<int64_t>(1, mb - 1) * steps;
            stream = l2_ahead(packed, block_elems, blk, hi, streaming_steps);
          }
          chunk_amx(panel, b, s0, s1, rows, i == 0 ? ahead : 0, s0 == 0, c,
                    streams ? &stream : nullptr);
          continue;
        }
#endif
        chunk_portable(panel, b, s0, s1, k2n, rows, s0 == 0, c);
      }
    }
    for (int64_t i = 0; i < mb; ++i) {
      const int64_t rows = std::min(kBlockM, m - i * kBlockM);
      for (int64_t blk = g; blk < g_end; ++blk) {
        const int64_t n0 = blk * kBlockN;
        store_rows(sums.data() + (i * plan.group + (blk - g)) * kBlockM * kBlockN, rows,
                   std::min(kBlockN, n - n0), y + i * kBlockM * n + n0, n);
      }
    }
  }
}

// The calling thread's x-panel buffer, kept across calls (a fresh one, hundreds of KiB, was
// page-faulted in on every call) and grown as needed; at::empty aligns it to 64 bytes.
uint16_t* panel_buffer(int64_t elems, const at::TensorOptions& options) {
  thread_local at::Tensor buf;
  if (!buf.defined() || buf.numel() < elems) buf = at::empty({elems}, options);
  return reinterpret_cast<uint16_t*>(buf.data_ptr<at::BFloat16>());
}

at::Tensor packed_linear(at::Tensor x, at::Tensor packed, int64_t n, int64_t isa,
                         int64_t ahead) {
  // Shapes, dtypes and the isa are checked by the Python caller (dualpace_hw/packed.py): a
  // C++ exception from an op crashed the process under torch 2.11 on the H200 box.
  const int64_t m = x.size(0), k = x.size(1), nb = packed.size(0);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0) return y;
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  const bool panelled = isa == kAmx || isa == kPortable;
  const int64_t steps = (k + kStepK - 1) / kStepK, mb = (m + kBlockM - 1) / kBlockM;
  uint16_t* pp = panelled ? panel_buffer(mb * steps * kPanelStep, x.options()) : nullptr;
  const int threads = static_cast<int>(std::clamp<int64_t>(at::get_num_threads(), 1, nb));
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = nb * t / nt, hi = nb * (t + 1) / nt;  // contiguous, balanced to one block
    if (panelled) {
      pack_panels(xp, m, k, steps, pp);  // ends in the team's barrier
      run_panels(pp, m, k, steps, wp, n, lo, hi, isa, ahead, yp);
    } else {
      run_rows(xp, m, k, wp, n, lo, hi, isa, yp);
    }
    if (isa == kBrgemm) at::native::cpublas::brgemm_release(/*is_vnni=*/true);
#if DP_DENSE_AMX
    if (isa == kAmx) release_tiles();
#endif
  }
  return y;
}

std::string dense_isas() {
  std::string isas = "0";
#if DP_DENSE_AVX512BF16
  isas += "1";
#endif
  isas += "2";
#if DP_DENSE_AMX
  isas += "3";
#endif
  return isas;
}

double tile_peak_flops(int64_t iters) {
#if DP_DENSE_AMX
  return amx_tile_peak(iters);
#else
  return 0.0;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dualpace_cpu, m) {
  m.def("pack_linear_weight(Tensor w) -> Tensor", &pack_linear_weight);
  m.def("packed_linear(Tensor x, Tensor packed, int n, int isa, int ahead=4) -> Tensor",
        &packed_linear);
  m.def("dense_isas() -> str", &dense_isas);
  m.def("tile_peak_flops(int iters) -> float", &tile_peak_flops);
}
