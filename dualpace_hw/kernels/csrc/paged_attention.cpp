// Paged decode attention over the host KV pool's HND pages, for the CPU executor.
//
// One query token per request attends to its paged history with GQA. K/V pages are
// [blocks, kv_heads, block_size, head_dim] (a head's tokens contiguous inside a page), q is
// [B, n_heads, head_dim]; q, K and V are bf16 (or fp32 / fp16), every sum is fp32, and the
// softmax is the online (streaming) one, block by block. Work is parallel over (request, kv
// head) and, when that gives too few units for the threads, over partitions of a request's
// blocks (split-K, merged at the end), with OpenMP dynamic scheduling over the units.
//
// Vector path: AVX-512 (q.k with AVX512-BF16 `vdpbf16ps` when the compiler targets it, else
// bf16 -> fp32 conversion and FMA; a vectorized exp; P.V with FMA), for head_dim in
// {16, 32, 64, 128, 256}. Scalar path: everything else, and the build on CPUs without AVX-512.
// The extension is built with -march=native for the machine that runs it (dualpace_hw/
// cpu_attention.py names the build after the CPU's feature flags so caches never mix CPUs).
//
// Ops (namespace dualpace_cpu):
//   paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, force_scalar,
//                          prefetch_blocks) -> out [B, n_heads, head_dim]
//   stream_read(t) -> checksum (a streaming read of every byte of t with all threads)
//   pin_threads(cores) -> threads pinned (each OpenMP thread of the caller's team to one core)
//   omp_threads() -> threads a parallel region of the calling thread would use
//   empty_hugepage(nbytes) -> uint8 tensor in memory advised for transparent huge pages
//   vector_isa() -> "avx512bf16" | "avx512" | "scalar"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <omp.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define DP_AVX512 1
#else
#define DP_AVX512 0
#endif
#if DP_AVX512 && defined(__AVX512BF16__)
#define DP_AVX512BF16 1
#else
#define DP_AVX512BF16 0
#endif

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Profiling only (results are wrong when set): 1 skips q.k, 2 skips P.V in the vector path.
std::atomic<int> g_profile_skip{0};

inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_f(c10::Half x) { return static_cast<float>(x); }

template <typename T>
inline T from_f(float x) { return static_cast<T>(x); }

// Where the pages lie; strides in elements, head_dim contiguous.
struct Geo {
  int64_t G, D, BS;
  int pf_mode;  // 0: next page's rows into L1 as the current page's rows are read; 1: the same
                // into L2; 2: the whole next page into L2 before the current one; 3: into L1
  int64_t k_blk, k_head, k_tok;
  int64_t v_blk, v_head, v_tok;
  float scale;
};

// One work unit: request b, kv heads [h0, h1), blocks [blk_begin, blk_end) of its table. The
// unit walks its blocks in order and, inside a block, its heads in order, so with all kv heads
// in one unit it streams each block's pages (all heads of a block are contiguous) front to back.
struct Unit {
  int32_t b, h0, h1, blk_begin, blk_end, part;  // part: this partition's index for request b
};

// Running softmax state of the heads of one unit.
struct Scratch {
  std::vector<float> s;    // [G, BS] scores, then probabilities, of the current page
  std::vector<float> qf;   // [HG, G, D] fp32 copy of q
  std::vector<uint16_t> qb;  // [HG, G, D] raw 16-bit copy of q (bf16 / fp16)
  std::vector<float> m;    // [HG, G]
  std::vector<float> l;    // [HG, G]
  std::vector<float> acc;  // [HG, G, D]
  void resize(const Geo& g, int64_t hg) {
    s.assign(g.G * g.BS, 0.f);
    qf.assign(hg * g.G * g.D, 0.f);
    qb.assign(hg * g.G * g.D, 0);
    m.assign(hg * g.G, kNegInf);
    l.assign(hg * g.G, 0.f);
    acc.assign(hg * g.G * g.D, 0.f);
  }
  void reset() {
    std::fill(m.begin(), m.end(), kNegInf);
    std::fill(l.begin(), l.end(), 0.f);
    std::fill(acc.begin(), acc.end(), 0.f);
  }
};

// One page (n tokens of one kv head) folded into the running state of that head's G query
// heads: m[G], l[G], acc[G, D]. qb: q as T (contiguous [G, D]); qf: q as fp32; kpf / vpf: the
// page to prefetch while this one is processed (or null).
// pbuf: room for G * (BS + 2) 16-bit probabilities (the bf16 P.V path).
template <typename T>
using BlockFn = void (*)(const Geo&, const T* qb, const float* qf, const T* kb, const T* vb,
                         int n, float* s, uint16_t* pbuf, float* m, float* l, float* acc,
                         const T* kpf, const T* vpf);

// ------------------------------------------------------------------------------------------
// Scalar path (any head_dim, any CPU).
// ------------------------------------------------------------------------------------------
template <typename T>
void block_scalar(const Geo& g, const T*, const float* qf, const T* kb, const T* vb, int n,
                  float* s_all, uint16_t*, float* m, float* l, float* acc, const T*, const T*) {
  const int64_t G = g.G, D = g.D, BS = g.BS;
  for (int64_t gi = 0; gi < G; ++gi) {
    float* s = s_all + gi * BS;
    const float* qg = qf + gi * D;
    float bmax = kNegInf;
    for (int t = 0; t < n; ++t) {
      const T* kt = kb + t * g.k_tok;
      float dot = 0.f;
      for (int64_t d = 0; d < D; ++d) dot += qg[d] * to_f(kt[d]);
      s[t] = dot * g.scale;
      bmax = std::max(bmax, s[t]);
    }
    const float mn = std::max(m[gi], bmax);
    const float corr = m[gi] == kNegInf ? 0.f : std::exp(m[gi] - mn);
    float sum = 0.f;
    for (int t = 0; t < n; ++t) {
      s[t] = std::exp(s[t] - mn);
      sum += s[t];
    }
    l[gi] = l[gi] * corr + sum;
    m[gi] = mn;
    float* a = acc + gi * D;
    if (corr != 1.f)
      for (int64_t d = 0; d < D; ++d) a[d] *= corr;
    for (int t = 0; t < n; ++t) {
      const T* vt = vb + t * g.v_tok;
      const float p = s[t];
      for (int64_t d = 0; d < D; ++d) a[d] += p * to_f(vt[d]);
    }
  }
}

// ------------------------------------------------------------------------------------------
// AVX-512 path.
// ------------------------------------------------------------------------------------------
#if DP_AVX512
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// e^x (softmax: x <= 0): x = n ln2 + r, degree-7 polynomial, 2^n by scalef. Relative error
// ~1e-7 over the clamped range [-87, 88].
inline __m512 exp512(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f);
  const __m512 ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// Prefetch one token's row of the page processed next (pf_mode 0 and 1).
inline void prefetch_row(const Geo& g, const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  if (g.pf_mode == 0) {
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
  } else if (g.pf_mode == 1) {
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T1);
  }
}

// Lane i of the result = the sum of the 16 lanes of v[i] (a transposing reduction tree: 45
// shuffles/adds for 16 dot products instead of 16 separate horizontal sums).
inline __m512 hsum16(const __m512 (&v)[16]) {
  __m512 w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i)
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 2; ++i)
    y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

inline __mmask16 tail_mask(int left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// s[gi][t] = scale * q[gi] . k[t] for the n tokens of one page, 16 tokens at a time; ND =
// head_dim / 16. While the first head runs, the next page's K rows are prefetched (kpf).
template <typename T, int ND>
inline void qk_block(const Geo& g, const T* qbf, const float* qf, const T* kb, int n, float* s,
                     const T* kpf) {
  const int64_t G = g.G;
  const int64_t row_bytes = g.k_tok * static_cast<int64_t>(sizeof(T));
  const __m512 vscale = _mm512_set1_ps(g.scale);
#if DP_AVX512BF16
  if constexpr (std::is_same_v<T, c10::BFloat16> && ND % 2 == 0) {
    // q.k as bf16 pairs accumulated in fp32 (bf16 products are exact in fp32).
    constexpr int NP = ND / 2;
    for (int64_t gi = 0; gi < G; ++gi) {
      __m512bh q[NP];
      for (int c = 0; c < NP; ++c)
        q[c] = (__m512bh)_mm512_loadu_si512(
            reinterpret_cast<const void*>(qbf + gi * ND * 16 + 32 * c));
      for (int t0 = 0; t0 < n; t0 += 16) {
        __m512 v[16];
        for (int j = 0; j < 16; ++j) {
          v[j] = _mm512_setzero_ps();
          if (t0 + j < n) {
            const T* kt = kb + (t0 + j) * g.k_tok;
            if (gi == 0 && kpf != nullptr) prefetch_row(g, kpf + (t0 + j) * g.k_tok, row_bytes);
            for (int c = 0; c < NP; ++c)
              v[j] = _mm512_dpbf16_ps(
                  v[j], q[c],
                  (__m512bh)_mm512_loadu_si512(reinterpret_cast<const void*>(kt + 32 * c)));
          }
        }
        _mm512_mask_storeu_ps(s + gi * g.BS + t0, tail_mask(n - t0),
                              _mm512_mul_ps(hsum16(v), vscale));
      }
    }
    return;
  }
#endif
  (void)qbf;
  for (int64_t gi = 0; gi < G; ++gi) {
    const float* qg = qf + gi * ND * 16;
    for (int t0 = 0; t0 < n; t0 += 16) {
      __m512 v[16];
      for (int j = 0; j < 16; ++j) {
        v[j] = _mm512_setzero_ps();
        if (t0 + j < n) {
          const T* kt = kb + (t0 + j) * g.k_tok;
          if (gi == 0 && kpf != nullptr) prefetch_row(g, kpf + (t0 + j) * g.k_tok, row_bytes);
          for (int c = 0; c < ND; ++c)
            v[j] = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * c), load16(kt + 16 * c), v[j]);
        }
      }
      _mm512_mask_storeu_ps(s + gi * g.BS + t0, tail_mask(n - t0),
                            _mm512_mul_ps(hsum16(v), vscale));
    }
  }
}

// acc[g0 .. g0+GB) += p[g][t] * v[t] over the n tokens of one page, CH 16-column chunks at a
// time with GB * CH accumulators in registers. The first pass prefetches the next page's V rows.
template <typename T, int ND, int GB>
inline void pv_block(const Geo& g, const T* vb, int n, const float* p, float* acc, int64_t g0,
                     const T* vpf) {
  constexpr int D = ND * 16;
  constexpr int CH = ND < 16 / GB ? ND : 16 / GB;
  const int64_t row_bytes = g.v_tok * static_cast<int64_t>(sizeof(T));
  for (int c0 = 0; c0 < ND; c0 += CH) {
    __m512 a[GB][CH];
    for (int j = 0; j < GB; ++j)
      for (int c = 0; c < CH; ++c) a[j][c] = _mm512_loadu_ps(acc + (g0 + j) * D + 16 * (c0 + c));
    for (int t = 0; t < n; ++t) {
      const T* vt = vb + t * g.v_tok + 16 * c0;
      if (c0 == 0 && vpf != nullptr) prefetch_row(g, vpf + t * g.v_tok, row_bytes);
      __m512 v[CH];
      for (int c = 0; c < CH; ++c) v[c] = load16(vt + 16 * c);
      for (int j = 0; j < GB; ++j) {
        const __m512 pb = _mm512_set1_ps(p[(g0 + j) * g.BS + t]);
        for (int c = 0; c < CH; ++c) a[j][c] = _mm512_fmadd_ps(pb, v[c], a[j][c]);
      }
    }
    for (int j = 0; j < GB; ++j)
      for (int c = 0; c < CH; ++c) _mm512_storeu_ps(acc + (g0 + j) * D + 16 * (c0 + c), a[j][c]);
  }
}

#if DP_AVX512BF16
// The bf16 P.V: probabilities rounded to bf16 (as GPU flash attention does before its second
// matmul) and V consumed as token pairs by vdpbf16ps, fp32 sums. Two rows v[t], v[t+1]
// interleaved by unpacklo/hi_epi16 give, per 32 columns, a "lo" vector for columns 8L+0..3 and a
// "hi" vector for columns 8L+4..7 of each 128-bit lane L, so the accumulator is kept in that
// permuted order (acc_index(), undone when the unit writes its result). pb: p as bf16 [G][BS+2].
template <int ND, int GB>
inline void pv_block_dp(const Geo& g, const c10::BFloat16* vb, int n, const uint16_t* pb,
                        float* acc, int64_t g0, const c10::BFloat16* vpf) {
  constexpr int D = ND * 16;
  constexpr int NP = ND / 2;                       // 32-column chunks
  constexpr int C2 = NP < 8 / GB ? NP : (8 / GB > 0 ? 8 / GB : 1);  // chunks per pass
  const int64_t row_bytes = g.v_tok * 2;
  const int64_t pstride = g.BS + 2;
  for (int c0 = 0; c0 < NP; c0 += C2) {
    __m512 lo[GB][C2], hi[GB][C2];
    for (int j = 0; j < GB; ++j)
      for (int c = 0; c < C2; ++c) {
        lo[j][c] = _mm512_loadu_ps(acc + (g0 + j) * D + 32 * (c0 + c));
        hi[j][c] = _mm512_loadu_ps(acc + (g0 + j) * D + 32 * (c0 + c) + 16);
      }
    for (int t = 0; t < n; t += 2) {
      const c10::BFloat16* r0 = vb + t * g.v_tok + 32 * c0;
      const bool pair = t + 1 < n;
      if (c0 == 0 && vpf != nullptr) {
        prefetch_row(g, vpf + t * g.v_tok, row_bytes);
        if (pair) prefetch_row(g, vpf + (t + 1) * g.v_tok, row_bytes);
      }
      __m512i ul[C2], uh[C2];
      for (int c = 0; c < C2; ++c) {
        const __m512i x0 = _mm512_loadu_si512(reinterpret_cast<const void*>(r0 + 32 * c));
        const __m512i x1 = pair ? _mm512_loadu_si512(
                                      reinterpret_cast<const void*>(r0 + g.v_tok + 32 * c))
                                : _mm512_setzero_si512();
        ul[c] = _mm512_unpacklo_epi16(x0, x1);
        uh[c] = _mm512_unpackhi_epi16(x0, x1);
      }
      for (int j = 0; j < GB; ++j) {
        uint32_t pp;
        std::memcpy(&pp, pb + (g0 + j) * pstride + t, 4);  // (p[t], p[t+1]); p[n] is 0
        const __m512bh vp = (__m512bh)_mm512_set1_epi32(static_cast<int>(pp));
        for (int c = 0; c < C2; ++c) {
          lo[j][c] = _mm512_dpbf16_ps(lo[j][c], vp, (__m512bh)ul[c]);
          hi[j][c] = _mm512_dpbf16_ps(hi[j][c], vp, (__m512bh)uh[c]);
        }
      }
    }
    for (int j = 0; j < GB; ++j)
      for (int c = 0; c < C2; ++c) {
        _mm512_storeu_ps(acc + (g0 + j) * D + 32 * (c0 + c), lo[j][c]);
        _mm512_storeu_ps(acc + (g0 + j) * D + 32 * (c0 + c) + 16, hi[j][c]);
      }
  }
}
#endif

template <typename T, int ND, bool DP>
void block_avx512(const Geo& g, const T* qb, const float* qf, const T* kb, const T* vb, int n,
                  float* s_all, uint16_t* pbuf, float* m, float* l, float* acc, const T* kpf,
                  const T* vpf) {
  constexpr int D = ND * 16;
  const int64_t G = g.G, BS = g.BS;
  const int skip = g_profile_skip.load(std::memory_order_relaxed);
  if (!(skip & 1)) qk_block<T, ND>(g, qb, qf, kb, n, s_all, kpf);
  // Online softmax, 16 scores at a time.
  for (int64_t gi = 0; gi < G; ++gi) {
    float* s = s_all + gi * BS;
    __m512 vmax = _mm512_set1_ps(kNegInf);
    for (int t = 0; t < n; t += 16)
      vmax = _mm512_max_ps(vmax,
                           _mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), tail_mask(n - t), s + t));
    const float bmax = _mm512_reduce_max_ps(vmax);
    const float mn = std::max(m[gi], bmax);
    const float corr = m[gi] == kNegInf ? 0.f : std::exp(m[gi] - mn);
    const __m512 vmn = _mm512_set1_ps(mn);
    __m512 vsum = _mm512_setzero_ps();
    for (int t = 0; t < n; t += 16) {
      const __mmask16 mk = tail_mask(n - t);
      __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + t), vmn));
      e = _mm512_maskz_mov_ps(mk, e);
      _mm512_mask_storeu_ps(s + t, mk, e);
      vsum = _mm512_add_ps(vsum, e);
    }
    l[gi] = l[gi] * corr + _mm512_reduce_add_ps(vsum);
    m[gi] = mn;
#if DP_AVX512BF16
    if constexpr (DP) {
      uint16_t* pr = pbuf + gi * (BS + 2);
      for (int t = 0; t < n; t += 16) {
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tail_mask(n - t), s + t));
        _mm256_mask_storeu_epi16(pr + t, tail_mask(n - t), (__m256i)h);
      }
      pr[n] = 0;
      pr[n + 1] = 0;
    }
#endif
    if (corr != 1.f) {
      float* a = acc + gi * D;
      const __m512 vc = _mm512_set1_ps(corr);
      for (int c = 0; c < ND; ++c)
        _mm512_storeu_ps(a + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(a + 16 * c), vc));
    }
  }
  if (skip & 2) return;
  int64_t g0 = 0;
#if DP_AVX512BF16
  if constexpr (DP) {
    const c10::BFloat16* v16 = reinterpret_cast<const c10::BFloat16*>(vb);
    const c10::BFloat16* vpf16 = reinterpret_cast<const c10::BFloat16*>(vpf);
    for (; g0 + 4 <= G; g0 += 4, vpf16 = nullptr)
      pv_block_dp<ND, 4>(g, v16, n, pbuf, acc, g0, vpf16);
    for (; g0 + 2 <= G; g0 += 2, vpf16 = nullptr)
      pv_block_dp<ND, 2>(g, v16, n, pbuf, acc, g0, vpf16);
    for (; g0 < G; ++g0, vpf16 = nullptr) pv_block_dp<ND, 1>(g, v16, n, pbuf, acc, g0, vpf16);
    return;
  }
#endif
  (void)pbuf;
  for (; g0 + 4 <= G; g0 += 4, vpf = nullptr) pv_block<T, ND, 4>(g, vb, n, s_all, acc, g0, vpf);
  for (; g0 + 2 <= G; g0 += 2, vpf = nullptr) pv_block<T, ND, 2>(g, vb, n, s_all, acc, g0, vpf);
  for (; g0 < G; ++g0, vpf = nullptr) pv_block<T, ND, 1>(g, vb, n, s_all, acc, g0, vpf);
}
#endif  // DP_AVX512

template <typename T>
struct Kernel {
  BlockFn<T> fn;
  bool permuted;  // the accumulator is in the bf16 P.V path's column order (acc_index)
};

// Prefetch a whole page (pf_mode 2: into L2, 3: into L1).
inline void prefetch_page(const void* p, int64_t bytes, bool l1) {
#if DP_AVX512
  const char* c = static_cast<const char*>(p);
  if (l1) {
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
  } else {
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T1);
  }
#else
  (void)p;
  (void)bytes;
  (void)l1;
#endif
}

// Where natural column d of a head's accumulator is stored on the bf16 P.V path.
inline int64_t acc_index(int64_t d) {
  const int64_t c = d / 32, L = (d % 32) / 8, i = d % 8;
  return c * 32 + (i < 4 ? 4 * L + i : 16 + 4 * L + (i - 4));
}

template <typename T>
Kernel<T> pick_block(int64_t D, bool force_scalar, bool pv_bf16) {
#if DP_AVX512
  if (!force_scalar) {
#if DP_AVX512BF16
    if (std::is_same_v<T, c10::BFloat16> && pv_bf16) {
      switch (D) {
        case 32: return {&block_avx512<T, 2, true>, true};
        case 64: return {&block_avx512<T, 4, true>, true};
        case 128: return {&block_avx512<T, 8, true>, true};
        case 256: return {&block_avx512<T, 16, true>, true};
        default: break;
      }
    }
#else
    (void)pv_bf16;
#endif
    switch (D) {
      case 16: return {&block_avx512<T, 1, false>, false};
      case 32: return {&block_avx512<T, 2, false>, false};
      case 64: return {&block_avx512<T, 4, false>, false};
      case 128: return {&block_avx512<T, 8, false>, false};
      case 256: return {&block_avx512<T, 16, false>, false};
      default: break;
    }
  }
#else
  (void)D;
  (void)force_scalar;
  (void)pv_bf16;
#endif
  return {&block_scalar<T>, false};
}

struct Options {
  bool force_scalar;
  bool pv_bf16;        // bf16 caches: P.V with probabilities rounded to bf16 (vdpbf16ps)
  int prefetch;        // pages ahead (0: none)
  int heads_per_unit;  // kv heads a work unit covers (0: all of them)
  int skip;            // profiling only (wrong results): see g_profile_skip; 4: no page work
  int pf_mode;         // Geo::pf_mode
};

template <typename T>
void run_attention(const at::Tensor& q, const at::Tensor& kc, const at::Tensor& vc,
                   const at::Tensor& tables, const at::Tensor& lens, at::Tensor& out,
                   const Options& opt) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KVH = kc.size(1), BS = kc.size(2);
  Geo g{H / KVH, D, BS, opt.pf_mode, kc.stride(0), kc.stride(1), kc.stride(2),
        vc.stride(0), vc.stride(1), vc.stride(2), 1.f / std::sqrt(static_cast<float>(D))};
  const T* qp = q.data_ptr<T>();
  const T* kp = kc.data_ptr<T>();
  const T* vp = vc.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int32_t* tp = tables.data_ptr<int32_t>();
  const int32_t* lp = lens.data_ptr<int32_t>();
  const int64_t tstride = tables.stride(0);
  const int threads = std::max(1, at::get_num_threads());
  int64_t HG = opt.heads_per_unit <= 0 ? KVH : std::min<int64_t>(opt.heads_per_unit, KVH);
  while (KVH % HG) --HG;
  const int64_t ngroups = KVH / HG;

  // Split requests' blocks into partitions when whole requests alone would leave threads idle
  // (small batches, long contexts); partitions are merged at the end (split-K).
  int64_t max_blocks = 0;
  for (int64_t b = 0; b < B; ++b)
    max_blocks = std::max<int64_t>(max_blocks, (std::max(lp[b], 0) + BS - 1) / BS);
  int64_t part = std::max<int64_t>(max_blocks, 1);
  if (B * ngroups < 4 * threads && max_blocks > 0) {
    const int64_t per_seq = (4 * threads + B * ngroups - 1) / (B * ngroups);
    part = std::max<int64_t>(8, (max_blocks + per_seq - 1) / per_seq);
  }
  std::vector<int64_t> part_base(B + 1, 0);  // first partial slot of request b
  for (int64_t b = 0; b < B; ++b) {
    const int64_t nb = (std::max(lp[b], 0) + BS - 1) / BS;
    part_base[b + 1] = part_base[b] + (nb + part - 1) / part;
  }
  std::vector<Unit> units;
  units.reserve(part_base[B] * ngroups);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t nb = (std::max(lp[b], 0) + BS - 1) / BS;
    for (int64_t hg = 0; hg < ngroups; ++hg)
      for (int64_t p0 = 0, i = 0; p0 < nb; p0 += part, ++i)
        units.push_back({static_cast<int32_t>(b), static_cast<int32_t>(hg * HG),
                         static_cast<int32_t>((hg + 1) * HG), static_cast<int32_t>(p0),
                         static_cast<int32_t>(std::min(nb, p0 + part)),
                         static_cast<int32_t>(i)});
  }
  const bool split = part < max_blocks;
  // Partials of split requests: [slot, kv head, G, D + 2] (m, l, acc).
  const int64_t pw = g.G * (D + 2);
  std::vector<float> partials(split ? part_base[B] * KVH * pw : 0);
  const Kernel<T> kern = pick_block<T>(D, opt.force_scalar, opt.pv_bf16);
  const BlockFn<T> fn = kern.fn;
  std::vector<int64_t> col(D);  // natural column -> accumulator index
  for (int64_t d = 0; d < D; ++d) col[d] = kern.permuted ? acc_index(d) : d;
  const int64_t nunits = static_cast<int64_t>(units.size());
  const int64_t GD = g.G * D;

#pragma omp parallel num_threads(threads)
  {
    Scratch sc;
    sc.resize(g, HG);
    T* qb = reinterpret_cast<T*>(sc.qb.data());
    std::vector<uint16_t> pbuf(g.G * (g.BS + 2) + 32, 0);
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < nunits; ++u) {
      const Unit& w = units[u];
      const int64_t b = w.b, nh = w.h1 - w.h0;
      const int32_t* table = tp + tstride * b;
      const int len = lp[b];
      sc.reset();
      for (int64_t j = 0; j < nh; ++j)
        for (int64_t gi = 0; gi < g.G; ++gi) {
          const T* src = qp + q.stride(0) * b + q.stride(1) * ((w.h0 + j) * g.G + gi);
          float* dst = &sc.qf[(j * g.G + gi) * D];
          if constexpr (sizeof(T) == 2) std::memcpy(qb + (j * g.G + gi) * D, src, D * sizeof(T));
          for (int64_t d = 0; d < D; ++d) dst[d] = to_f(src[d]);
        }
      // Pages in processing order: block-major, heads inside a block. The page `prefetch`
      // steps ahead in that order is prefetched while the current one is processed.
      const int64_t npages = static_cast<int64_t>(w.blk_end - w.blk_begin) * nh;
      for (int64_t pg = 0; pg < npages; ++pg) {
        const int blk = w.blk_begin + static_cast<int>(pg / nh);
        const int64_t j = pg % nh, h = w.h0 + j;
        const int64_t id = table[blk];
        const int n = static_cast<int>(std::min<int64_t>(BS, len - static_cast<int64_t>(blk) * BS));
        const T* kpf = nullptr;
        const T* vpf = nullptr;
        if (opt.prefetch > 0 && pg + opt.prefetch < npages) {
          const int64_t nx = pg + opt.prefetch;
          const int64_t nid = table[w.blk_begin + nx / nh], nh_ = w.h0 + nx % nh;
          kpf = kp + nid * g.k_blk + nh_ * g.k_head;
          vpf = vp + nid * g.v_blk + nh_ * g.v_head;
          if (g.pf_mode >= 2) {
            prefetch_page(kpf, BS * g.k_tok * static_cast<int64_t>(sizeof(T)), g.pf_mode == 3);
            prefetch_page(vpf, BS * g.v_tok * static_cast<int64_t>(sizeof(T)), g.pf_mode == 3);
            kpf = vpf = nullptr;
          }
        }
        if (opt.skip & 4) continue;
        fn(g, qb + j * GD, &sc.qf[j * GD], kp + id * g.k_blk + h * g.k_head,
           vp + id * g.v_blk + h * g.v_head, n, sc.s.data(), pbuf.data(), &sc.m[j * g.G],
           &sc.l[j * g.G], &sc.acc[j * GD], kpf, vpf);
      }
      const bool whole = part_base[b + 1] - part_base[b] == 1;
      for (int64_t j = 0; j < nh; ++j) {
        const int64_t h = w.h0 + j;
        for (int64_t gi = 0; gi < g.G; ++gi) {
          const float* a = &sc.acc[(j * g.G + gi) * D];
          if (whole) {
            T* o = op + out.stride(0) * b + out.stride(1) * (h * g.G + gi);
            const float inv = 1.f / sc.l[j * g.G + gi];
            for (int64_t d = 0; d < D; ++d) o[d] = from_f<T>(a[col[d]] * inv);
          } else {
            float* dst = &partials[((part_base[b] + w.part) * KVH + h) * pw + gi * (D + 2)];
            dst[0] = sc.m[j * g.G + gi];
            dst[1] = sc.l[j * g.G + gi];
            for (int64_t d = 0; d < D; ++d) dst[2 + d] = a[col[d]];
          }
        }
      }
    }
  }
  // Zero-length requests attend to nothing.
  for (int64_t b = 0; b < B; ++b)
    if (lp[b] <= 0) out[b].zero_();
  if (!split) return;
  std::vector<int64_t> todo;
  for (int64_t b = 0; b < B; ++b)
    if (part_base[b + 1] - part_base[b] > 1) todo.push_back(b);
  const int64_t nmerge = static_cast<int64_t>(todo.size()) * KVH;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t i = 0; i < nmerge; ++i) {
    const int64_t b = todo[i / KVH], h = i % KVH;
    const int64_t np = part_base[b + 1] - part_base[b];
    std::vector<float> acc(D);
    for (int64_t gi = 0; gi < g.G; ++gi) {
      float mmax = kNegInf;
      for (int64_t p = 0; p < np; ++p)
        mmax = std::max(mmax, partials[((part_base[b] + p) * KVH + h) * pw + gi * (D + 2)]);
      float l = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t p = 0; p < np; ++p) {
        const float* src = &partials[((part_base[b] + p) * KVH + h) * pw + gi * (D + 2)];
        const float w = std::exp(src[0] - mmax);
        l += w * src[1];
        for (int64_t d = 0; d < D; ++d) acc[d] += w * src[2 + d];
      }
      T* o = op + out.stride(0) * b + out.stride(1) * (h * g.G + gi);
      const float inv = 1.f / l;
      for (int64_t d = 0; d < D; ++d) o[d] = from_f<T>(acc[d] * inv);
    }
  }
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, bool force_scalar,
                                  int64_t prefetch_blocks, int64_t heads_per_unit, bool pv_bf16,
                                  int64_t skip, int64_t prefetch_mode) {
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu(),
              "cpu paged attention: tensors must be on the CPU");
  TORCH_CHECK(q.dim() == 3, "q must be [B, n_heads, head_dim]");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4,
              "caches must be [blocks, kv_heads, block_size, head_dim]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "K and V caches differ in shape");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() &&
                  q.scalar_type() == v_cache.scalar_type(),
              "q, K and V must have one dtype");
  TORCH_CHECK(q.size(2) == k_cache.size(3), "q and cache head_dim differ");
  TORCH_CHECK(q.size(1) % k_cache.size(1) == 0, "n_heads must be a multiple of kv_heads");
  TORCH_CHECK(q.stride(2) == 1, "q's head_dim must be contiguous");
  for (const auto* c : {&k_cache, &v_cache})
    TORCH_CHECK(c->stride(3) == 1, "cache head_dim must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt,
              "block_tables and context_lens must be int32");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == q.size(0) &&
                  block_tables.stride(1) == 1,
              "block_tables must be [B, max_blocks] with contiguous rows");
  TORCH_CHECK(context_lens.dim() == 1 && context_lens.size(0) == q.size(0) &&
                  context_lens.is_contiguous(),
              "context_lens must be [B]");
  const int64_t B = q.size(0), BS = k_cache.size(2), nblocks = k_cache.size(0);
  const int32_t* tp = block_tables.data_ptr<int32_t>();
  const int32_t* lp = context_lens.data_ptr<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t need = (lp[b] + BS - 1) / BS;
    TORCH_CHECK(need <= block_tables.size(1), "request ", b, ": context ", lp[b],
                " needs ", need, " blocks, its table has ", block_tables.size(1));
    for (int64_t i = 0; i < need; ++i) {
      const int64_t id = tp[b * block_tables.stride(0) + i];
      TORCH_CHECK(id >= 0 && id < nblocks, "request ", b, ": block id ", id,
                  " outside the pool's ", nblocks, " blocks");
    }
  }
  at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
  const Options opt{force_scalar, pv_bf16, static_cast<int>(prefetch_blocks),
                    static_cast<int>(heads_per_unit), static_cast<int>(skip),
                    static_cast<int>(prefetch_mode)};
  TORCH_CHECK(prefetch_mode >= 0 && prefetch_mode <= 3, "prefetch_mode must be 0..3");
  g_profile_skip.store(static_cast<int>(skip & 3), std::memory_order_relaxed);
  switch (q.scalar_type()) {
    case at::kBFloat16:
      run_attention<c10::BFloat16>(q, k_cache, v_cache, block_tables, context_lens, out, opt);
      break;
    case at::kFloat:
      run_attention<float>(q, k_cache, v_cache, block_tables, context_lens, out, opt);
      break;
    case at::kHalf:
      run_attention<c10::Half>(q, k_cache, v_cache, block_tables, context_lens, out, opt);
      break;
    default:
      TORCH_CHECK(false, "cpu paged attention: unsupported dtype ", q.scalar_type());
  }
  return out;
}

// A streaming read of every byte of t with all threads (host read bandwidth); returns a
// checksum so the reads cannot be optimized away.
double stream_read(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "stream_read: contiguous CPU tensor");
  const uint64_t* p = static_cast<const uint64_t*>(t.data_ptr());
  const int64_t n = t.numel() * t.element_size() / 8;
  const int threads = std::max(1, at::get_num_threads());
  uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t lo = std::min<int64_t>(n, chunk * id), hi = std::min<int64_t>(n, lo + chunk);
#if DP_AVX512
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = lo;
    for (; i + 32 <= hi; i += 32) {
      a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
      a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 8));
      a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 16));
      a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 24));
    }
    uint64_t s = _mm512_reduce_add_epi64(
        _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
    for (; i < hi; ++i) s += p[i];
#else
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = lo;
    for (; i + 4 <= hi; i += 4) {
      s0 += p[i];
      s1 += p[i + 1];
      s2 += p[i + 2];
      s3 += p[i + 3];
    }
    uint64_t s = s0 + s1 + s2 + s3;
    for (; i < hi; ++i) s += p[i];
#endif
    total += s;
  }
  return static_cast<double>(total % (1ull << 52));
}

// Pin each thread of the calling thread's OpenMP team to one core (round robin over cores).
int64_t pin_threads(std::vector<int64_t> cores) {
  TORCH_CHECK(!cores.empty(), "pin_threads: no cores given");
  const int threads = std::max(1, at::get_num_threads());
  int pinned = 0;
#pragma omp parallel num_threads(threads) reduction(+ : pinned)
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<int>(cores[omp_get_thread_num() % cores.size()]), &set);
    pinned += sched_setaffinity(0, sizeof(set), &set) == 0 ? 1 : 0;
  }
  return pinned;
}

// nbytes of zeroed memory from an anonymous mapping advised MADV_HUGEPAGE (transparent huge
// pages where the kernel allows them), as a uint8 tensor that unmaps it when freed. A paged
// pool touches one 4 KiB page per (block, head) page it reads, so with 4 KiB pages nearly every
// page read is also a TLB miss.
at::Tensor empty_hugepage(int64_t nbytes) {
  TORCH_CHECK(nbytes > 0, "empty_hugepage: nbytes must be positive");
  const int64_t huge = 2 << 20;
  const int64_t len = (nbytes + huge - 1) / huge * huge;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(p != MAP_FAILED, "empty_hugepage: mmap of ", len, " bytes failed");
#ifdef MADV_HUGEPAGE
  madvise(p, len, MADV_HUGEPAGE);
#endif
  return at::from_blob(
      p, {nbytes}, [len](void* q) { munmap(q, len); },
      at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

int64_t omp_threads() {
  int n = 0;
#pragma omp parallel num_threads(std::max(1, at::get_num_threads()))
  {
#pragma omp single
    n = omp_get_num_threads();
  }
  return n;
}

std::string vector_isa() {
#if DP_AVX512BF16
  return "avx512bf16";
#elif DP_AVX512
  return "avx512";
#else
  return "scalar";
#endif
}

}  // namespace

// Catch-all kernels (no dispatch key needed: the ops are CPU-only and have no autograd).
TORCH_LIBRARY(dualpace_cpu, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, bool force_scalar=False, int prefetch_blocks=1, "
        "int heads_per_unit=0, bool pv_bf16=False, int skip=0, int prefetch_mode=1) -> Tensor",
        &paged_decode_attention);
  m.def("stream_read(Tensor t) -> float", &stream_read);
  m.def("pin_threads(int[] cores) -> int", &pin_threads);
  m.def("omp_threads() -> int", &omp_threads);
  m.def("empty_hugepage(int nbytes) -> Tensor", &empty_hugepage);
  m.def("vector_isa() -> str", &vector_isa);
}
