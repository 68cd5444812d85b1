// Helpers shared by the native kernels: bf16 <-> fp32 and the attention scores' dot product (linear.h: the
// linear layers).
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

// fp32 vector of one activation row (fp32 holding bf16 values) and one bf16 row: attention scores.
inline float dot_row(const float* x, const uint16_t* w, int64_t K) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += LANES) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), load_bf16x16(w + k), acc);
  return _mm512_reduce_add_ps(acc);
}

}  // namespace anydraft_native
