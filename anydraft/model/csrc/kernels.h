// Helpers shared by the native kernels: bf16 <-> fp32, and the linear layer whose every output is computed in one
// fixed order (16 fp32 lanes of bf16 pair products over the row, then one lane tree), whatever the number of
// rows, the row's place among them, or the number of threads.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace anydraft_native {

constexpr int64_t LANES = 16;

inline float bf16_to_float(uint16_t v) {
  uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even, as PyTorch does
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

inline __m512 load_bf16x16(const uint16_t* p) {
  __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

inline const uint16_t* bf16_ptr(const torch::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}
inline uint16_t* bf16_ptr_mut(torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

// One fp32 vector's lanes summed in one fixed tree: ((l0+l8)+(l4+l12)) + ((l2+l10)+(l6+l14)) + ... as
// t_i = l_i + l_{i+8}, u_i = t_i + t_{i+4}, v_i = u_i + u_{i+2}, v_0 + v_1 (reduce16 does 16 at once, same tree).
inline float reduce_tree(__m512 v) {
  alignas(64) float l[16];
  _mm512_store_ps(l, v);
  float t[8], u[4];
  for (int i = 0; i < 8; ++i) t[i] = l[i] + l[i + 8];
  for (int i = 0; i < 4; ++i) u[i] = t[i] + t[i + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

// 16 vectors -> lane j = reduce_tree(a[j]), by transposing additions (about 2 instructions per sum).
inline __m512 reduce16(const __m512* a) {
  __m512 b[8], e[4], f[2];
  for (int p = 0; p < 8; ++p)   // lanes 0-7: t of a[2p], lanes 8-15: t of a[2p+1]
    b[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44), _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE));
  for (int p = 0; p < 4; ++p)   // 128-bit group g: u of a[4p+g]
    e[p] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], 0x88), _mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], 0xDD));
  for (int p = 0; p < 2; ++p)   // group g: v0, v1 of a[8p+g], then of a[8p+4+g]
    f[p] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * p], e[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(e[2 * p], e[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // lane 4g+j: the sum of a[g+4j]; put it at lane g+4j
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(f[0], f[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_ps(f[0], f[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, sums);
}

// acc lane i += x[2i+1] * w[2i+1], then += x[2i] * w[2i]: VDPBF16PS (products of bf16 are exact in fp32, one
// rounding per addition). Without AVX512-BF16 the same additions as two FMAs (equal except for denormals,
// which VDPBF16PS flushes).
inline __m512 dot_step(__m512 acc, __m512i x, __m512i w) {
#if defined(__AVX512BF16__)
  return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
#else
  const __m512i high = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(x, high)), _mm512_castsi512_ps(_mm512_and_si512(w, high)), acc);
  return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), acc);
#endif
}

constexpr int64_t PAIR_STEP = 32;   // bf16 per dot_step

inline __m512i load_step(const uint16_t* p, int64_t left) {   // 32 bf16, or the last `left` < 32 then zeros
  return left >= PAIR_STEP ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16((__mmask32)((1ull << left) - 1), p);
}

// The dot products of R activation rows (bf16, row stride K) with C weight rows (bf16, row stride K): one
// accumulator per pair, 32 columns per step, in column order. Each pair's arithmetic is the same whatever R and
// C: this tile is what lets a weight row be read once for several activation rows.
template <int R, int C>
inline void dot_tile(const uint16_t* x, int64_t K, const uint16_t* const* w, __m512 (*acc)[16], int c0) {
  __m512 a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += PAIR_STEP) {
    __m512i wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load_step(w[c] + k, K - k);
    for (int r = 0; r < R; ++r) {
      const __m512i xv = load_step(x + r * K + k, K - k);
      for (int c = 0; c < C; ++c) a[r][c] = dot_step(a[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c0 + c] = a[r][c];
}

// One activation row and one weight row: the same arithmetic as each pair of dot_tile + reduce16.
inline float dot_bf16(const uint16_t* x, const uint16_t* w, int64_t K) {
  __m512 acc[1][16];
  const uint16_t* rows[1] = {w};
  dot_tile<1, 1>(x, K, rows, acc, 0);
  return reduce_tree(acc[0][0]);
}

// fp32 vector of one activation row (fp32 holding bf16 values) and one bf16 row: attention scores.
inline float dot_row(const float* x, const uint16_t* w, int64_t K) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += LANES) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), load_bf16x16(w + k), acc);
  return _mm512_reduce_add_ps(acc);
}

// Activations as bf16 (exact: the fp32 values hold bf16 numbers).
inline std::vector<uint16_t> to_bf16(const float* x, int64_t n) {
  std::vector<uint16_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(x[i]);
  return out;
}

// R activation rows against a block of 16 weight rows [n0, n0+16) (rows past N repeat row N-1, not stored).
template <int R>
inline void linear_block(const uint16_t* x, int64_t K, const uint16_t* w, const uint16_t* bias, int64_t n0,
                         int64_t N, float* y) {
  __m512 acc[R][16];
  const uint16_t* rows[16];
  for (int c = 0; c < 16; ++c) rows[c] = w + std::min(n0 + c, N - 1) * K;
  for (int c0 = 0; c0 < 16; c0 += 4) dot_tile<R, 4>(x, K, rows + c0, acc, c0);
  const __mmask16 valid = (__mmask16)(N - n0 >= 16 ? 0xFFFF : (1u << (N - n0)) - 1);
  __m512 b = _mm512_setzero_ps();
  if (bias) b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(valid, bias + n0)), 16));
  for (int r = 0; r < R; ++r) {
    alignas(64) float sums[16];
    _mm512_store_ps(sums, _mm512_add_ps(reduce16(acc[r]), b));
    for (int c = 0; c < 16 && n0 + c < N; ++c) y[r * N + n0 + c] = round_bf16(sums[c]);
  }
}

// y [M, N] = bf16(x [M, K] @ w[N, K]^T + bias), values kept as fp32 holding bf16 numbers.
// Every output is the same function of its own activation row and weight row (dot_tile's order, reduce16's
// tree), whatever M, the row's place in the batch, or the threads: threads split the weight rows (outputs),
// never the columns they sum over. Each block of 16 weight rows is read from memory once for all M rows (4
// activation rows at a time against it, from cache after the first).
inline void linear(const float* x_f32, int64_t M, int64_t K, const uint16_t* w, const uint16_t* bias, int64_t N,
                   float* y) {
  const std::vector<uint16_t> x = to_bf16(x_f32, M * K);
  const int64_t blocks = (N + 15) / 16;
  const int64_t grain = std::max<int64_t>(1, 16384 / (K * std::max<int64_t>(M, 1)));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * 16;
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) linear_block<4>(x.data() + m * K, K, w, bias, n0, N, y + m * N);
      switch (M - m) {
        case 3: linear_block<3>(x.data() + m * K, K, w, bias, n0, N, y + m * N); break;
        case 2: linear_block<2>(x.data() + m * K, K, w, bias, n0, N, y + m * N); break;
        case 1: linear_block<1>(x.data() + m * K, K, w, bias, n0, N, y + m * N); break;
        default: break;
      }
    }
  });
}

}  // namespace anydraft_native
