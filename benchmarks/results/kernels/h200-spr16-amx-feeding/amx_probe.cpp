// AMX feeding probe: where does a tile GEMM's time go on this box?
#include <torch/extension.h>
#include <immintrin.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

struct alignas(64) Cfg {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void cfg16() {
  Cfg c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void pin(const std::vector<int64_t>& cores) {
  const int t = omp_get_thread_num();
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(static_cast<int>(cores[t % cores.size()]), &s);
  sched_setaffinity(0, sizeof(s), &s);
}

uint16_t* alloc(size_t bytes) {
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  std::memset(p, 0, bytes);
  return static_cast<uint16_t*>(p);
}

// 1. TDPs on registers only: flop/s of all threads.
double tdp_only(std::vector<int64_t> cores, int64_t iters) {
  const int n = cores.size();
  double t0 = 0, t1 = 0;
#pragma omp parallel num_threads(n)
  {
    pin(cores);
    alignas(64) static uint16_t z[16 * 32] = {};
    cfg16();
    _tile_loadd(4, z, 64); _tile_loadd(5, z, 64); _tile_loadd(6, z, 64); _tile_loadd(7, z, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
#pragma omp barrier
#pragma omp master
    t0 = now();
    for (int64_t i = 0; i < iters; ++i) {
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    alignas(64) float sink[256];
    _tile_stored(0, sink, 64);
#pragma omp barrier
#pragma omp master
    t1 = now();
    _tile_release();
  }
  return double(n) * iters * 4 * 16384 / (t1 - t0);
}

// 2. The 2x2 micro-kernel fed from L1: per step 2 B loads (stride 128) + 2 A loads + 4 TDP.
//    mode 0: A and B in L1 (A stride 64); mode 1: loads only, no TDP; mode 2: A with stride
//    8192 bytes (the x row pitch at K = 4096), cycling 32 rows (set conflicts); returns steps/s
//    per thread (mean) and flop/s.
std::vector<double> l1_fed(std::vector<int64_t> cores, int64_t iters, int64_t mode) {
  const int n = cores.size();
  double t0 = 0, t1 = 0;
#pragma omp parallel num_threads(n)
  {
    pin(cores);
    uint16_t* b = alloc(4096);
    uint16_t* a = alloc(mode == 2 ? 32 * 8192 : 2048);
    const int64_t sa = mode == 2 ? 8192 : 64;
    cfg16();
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
#pragma omp barrier
#pragma omp master
    t0 = now();
    if (mode == 1) {
      for (int64_t i = 0; i < iters; ++i) {
        _tile_loadd(6, b, 128); _tile_loadd(7, b + 32, 128);
        _tile_loadd(4, a, sa); _tile_loadd(5, reinterpret_cast<char*>(a) + 16 * sa, sa);
      }
    } else {
      for (int64_t i = 0; i < iters; ++i) {
        _tile_loadd(6, b, 128); _tile_loadd(7, b + 32, 128);
        _tile_loadd(4, a, sa);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, reinterpret_cast<char*>(a) + 16 * sa, sa);
        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
      }
    }
    alignas(64) float sink[256];
    _tile_stored(0, sink, 64);
#pragma omp barrier
#pragma omp master
    t1 = now();
    _tile_release();
    std::free(a);
    std::free(b);
  }
  const double dt = t1 - t0;
  return {iters / dt, double(n) * iters * 4 * 16384 / dt};
}

// One 32 x 32 block over K: C 2x2 tiles; A either strided rows (lda elements) or packed
// ([K/32][32 rows][32]); B the packed weight block [K/2][32][2]. ahead: prefetch of B.
inline void block_2x2(const uint16_t* a, int64_t lda, bool packed_a, const uint16_t* b,
                      int64_t k, int64_t ahead, float* c) {
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  const int64_t steps = k / 32;
  for (int64_t s = 0; s < steps; ++s) {
    const uint16_t* bk = b + s * 16 * 64;
    if (ahead && s + ahead < steps) {
      const char* p = reinterpret_cast<const char*>(bk + ahead * 16 * 64);
      for (int l = 0; l < 32; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
    }
    _tile_loadd(6, bk, 128);
    _tile_loadd(7, bk + 32, 128);
    if (packed_a) {
      const uint16_t* as = a + s * 32 * 32;
      _tile_loadd(4, as, 64);
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, as + 16 * 32, 64);
    } else {
      _tile_loadd(4, a + s * 32, lda * 2);
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, a + 16 * lda + s * 32, lda * 2);
    }
    _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128);
  _tile_stored(2, c + 512, 128); _tile_stored(3, c + 512 + 16, 128);
}

// One 32 x 32 block over k-steps [s0, s1) of packed A; C accumulated in memory (c, 32 floats a
// row) unless first.
inline void chunk_2x2(const uint16_t* a, const uint16_t* b, int64_t s0, int64_t s1, int64_t steps,
                      int64_t ahead, bool first, float* c) {
  if (first) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
  else {
    _tile_loadd(0, c, 128); _tile_loadd(1, c + 16, 128);
    _tile_loadd(2, c + 512, 128); _tile_loadd(3, c + 512 + 16, 128);
  }
  for (int64_t s = s0; s < s1; ++s) {
    const uint16_t* bk = b + s * 16 * 64;
    if (ahead && s + ahead < steps) {
      const char* p = reinterpret_cast<const char*>(bk + ahead * 16 * 64);
      for (int l = 0; l < 32; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
    }
    _tile_loadd(6, bk, 128);
    _tile_loadd(7, bk + 32, 128);
    const uint16_t* as = a + s * 32 * 32;
    _tile_loadd(4, as, 64);
    _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, as + 16 * 32, 64);
    _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128);
  _tile_stored(2, c + 512, 128); _tile_stored(3, c + 512 + 16, 128);
}

// 3. L2-resident panel: 32 rows x K = 4096, nblocks weight blocks (256 KiB each), reps passes.
std::vector<double> l2_panel(std::vector<int64_t> cores, int64_t nblocks, int64_t reps,
                             bool packed_a) {
  const int n = cores.size();
  const int64_t k = 4096;
  double t0 = 0, t1 = 0;
#pragma omp parallel num_threads(n)
  {
    pin(cores);
    uint16_t* a = alloc(32 * k * 2);
    uint16_t* b = alloc(nblocks * k * 32 * 2);
    alignas(64) float c[32 * 32];
    cfg16();
    for (int64_t blk = 0; blk < nblocks; ++blk) block_2x2(a, k, packed_a, b + blk * k * 32, k, 0, c);
#pragma omp barrier
#pragma omp master
    t0 = now();
    for (int64_t r = 0; r < reps; ++r)
      for (int64_t blk = 0; blk < nblocks; ++blk)
        block_2x2(a, k, packed_a, b + blk * k * 32, k, 0, c);
#pragma omp barrier
#pragma omp master
    t1 = now();
    _tile_release();
    std::free(a);
    std::free(b);
  }
  const double dt = t1 - t0;
  return {dt, double(n) * reps * nblocks * 2.0 * 32 * 32 * k / dt};
}

// Pack x [m, k] rows into [ceil(m/32)][k/32][32][32] (zero rows past m).
void pack_a(const uint16_t* x, int64_t m, int64_t k, uint16_t* out) {
  const int64_t mb = (m + 31) / 32, steps = k / 32;
#pragma omp parallel for collapse(2)
  for (int64_t i = 0; i < mb; ++i)
    for (int64_t s = 0; s < steps; ++s) {
      uint16_t* dst = out + (i * steps + s) * 1024;
      for (int64_t r = 0; r < 32; ++r) {
        const int64_t row = i * 32 + r;
        if (row < m) std::memcpy(dst + r * 32, x + row * k + s * 32, 64);
        else std::memset(dst + r * 32, 0, 64);
      }
    }
}

// 4. The streaming GEMM as dense.cpp runs it: x [m, k] against packed weight blocks (nb of
//    them, 32 columns each), every thread a contiguous block range, groups of `group` blocks,
//    32-row passes; variant 0 strided A, 1 packed A (packed inside the call, timed with it).
double stream(std::vector<int64_t> cores, torch::Tensor x, torch::Tensor w, int64_t group,
              int64_t variant, int64_t ahead, int64_t kc) {
  const int n = cores.size();
  const int64_t m = x.size(0), k = x.size(1), nb = w.size(0);
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  static uint16_t* ap = nullptr;
  static int64_t ap_bytes = 0;
  const int64_t need = ((m + 31) / 32) * 32 * (k + 32) * 2;
  if (need > ap_bytes) { std::free(ap); ap = alloc(need); ap_bytes = need; }
  const double t0 = now();
  if (variant == 1 || variant == 3) pack_a(xp, m, k, ap);
  if (variant == 2) {  // rows padded by 64 bytes: the same strided loads, no 4 KiB pitch
#pragma omp parallel for
    for (int64_t r = 0; r < m; ++r) std::memcpy(ap + r * (k + 32), xp + r * k, k * 2);
  }
  if (variant == 3) {
    const int64_t steps = k / 32, cs = std::max<int64_t>(1, kc / 32), mb = (m + 31) / 32;
#pragma omp parallel num_threads(n)
    {
      pin(cores);
      const int t = omp_get_thread_num();
      const int64_t lo = nb * t / n, hi = nb * (t + 1) / n;
      float* c = reinterpret_cast<float*>(std::aligned_alloc(64, mb * 1024 * 4));
      cfg16();
      for (int64_t blk = lo; blk < hi; ++blk) {
        const uint16_t* b = wp + blk * k * 32;
        for (int64_t s0 = 0; s0 < steps; s0 += cs)
          for (int64_t i = 0; i < mb; ++i)
            chunk_2x2(ap + i * 32 * k, b, s0, std::min(steps, s0 + cs), steps, ahead, s0 == 0,
                      c + i * 1024);
      }
      _tile_release();
      std::free(c);
    }
    return now() - t0;
  }
#pragma omp parallel num_threads(n)
  {
    pin(cores);
    const int t = omp_get_thread_num();
    const int64_t lo = nb * t / n, hi = nb * (t + 1) / n;
    alignas(64) float c[32 * 32];
    cfg16();
    for (int64_t g = lo; g < hi; g += group) {
      const int64_t ge = std::min(hi, g + group);
      for (int64_t m0 = 0; m0 < m; m0 += 32) {
        for (int64_t blk = g; blk < ge; ++blk) {
          const uint16_t* b = wp + blk * k * 32;
          if (variant == 1) block_2x2(ap + (m0 / 32) * 32 * k, k, true, b, k, ahead, c);
          else if (variant == 2) block_2x2(ap + m0 * (k + 32), k + 32, false, b, k, ahead, c);
          else block_2x2(xp + m0 * k, k, false, b, k, ahead, c);
        }
      }
    }
    _tile_release();
  }
  return now() - t0;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tdp_only", &tdp_only);
  m.def("l1_fed", &l1_fed);
  m.def("l2_panel", &l2_panel);
  m.def("stream", &stream);
}
