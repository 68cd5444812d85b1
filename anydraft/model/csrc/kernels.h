// Helpers shared by the native kernels: bf16 <-> fp32, and the one dot-product order every output row uses
// (16 fp32 lanes with FMA over the row, then the lane reduction), whatever the number of rows.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

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

// R rows of x (fp32, row stride K) dotted with one bf16 weight row; one fixed order per output.
template <int R>
inline void dot_rows(const float* x, int64_t K, const uint16_t* w, float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += LANES) {
    __m512 wk = load_bf16x16(w + k);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * K + k), wk, acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

// One row: the same arithmetic as each row of dot_rows (attention scores, exact head logits).
inline float dot_row(const float* x, const uint16_t* w, int64_t K) {
  float out;
  dot_rows<1>(x, K, w, &out);
  return out;
}

template <int R>
inline void linear_block(const float* x, int64_t K, const uint16_t* w, const uint16_t* bias, int64_t n0, int64_t n1,
                  int64_t N, float* y) {
  float out[R];
  for (int64_t n = n0; n < n1; ++n) {
    dot_rows<R>(x, K, w + n * K, out);
    const float b = bias ? bf16_to_float(bias[n]) : 0.f;
    for (int r = 0; r < R; ++r) y[r * N + n] = round_bf16(out[r] + b);
  }
}

// y [M, N] = bf16(x [M, K] @ w[N, K]^T + bias), values kept as fp32 holding bf16 numbers. Weight rows are
// taken 64 at a time for every group of 4 input rows, so a large weight is read from memory once.
inline void linear(const float* x, int64_t M, int64_t K, const uint16_t* w, const uint16_t* bias, int64_t N,
                   float* y) {
  const int64_t grain = std::max<int64_t>(64, 65536 / K);
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t nb = n0; nb < n1; nb += 64) {
      const int64_t ne = std::min(nb + 64, n1);
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) linear_block<4>(x + m * K, K, w, bias, nb, ne, N, y + m * N);
      switch (M - m) {
        case 3: linear_block<3>(x + m * K, K, w, bias, nb, ne, N, y + m * N); break;
        case 2: linear_block<2>(x + m * K, K, w, bias, nb, ne, N, y + m * N); break;
        case 1: linear_block<1>(x + m * K, K, w, bias, nb, ne, N, y + m * N); break;
        default: break;
      }
    }
  });
}


}  // namespace anydraft_native
