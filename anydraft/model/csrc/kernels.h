// Helpers shared by the native kernels: bf16 <-> fp32 (one value and 16 at once), a vector exp, and the row loop
// split over threads (linear.h: the linear layers).
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

// 16 fp32 values rounded to bf16 (kept as fp32), exactly as float_to_bf16 rounds each one (NaN kept quiet).
inline __m512 round_bf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i high = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  const __m512i rounded = _mm512_and_si512(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)))),
      high);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(rounded, nan, _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x400000)), high)));
}

// e^x in 16 lanes, to about 1 ulp: x = n ln2 + r (|r| <= ln2/2, Cody-Waite split of ln2), e^r by its Taylor
// polynomial to degree 7 (remainder < 1e-8), scaled by 2^n (VSCALEFPS: underflows to 0, overflows to inf).
// Why not std::exp: it is scalar; softmax weights and SiLU take one per value.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));   // below: e^x is 0 in fp32; keeps n finite
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  const float coef[8] = {1.f / 5040, 1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};
  __m512 p = _mm512_set1_ps(coef[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(coef[i]));
  return _mm512_scalef_ps(p, n);
}

// fn(r0, r1) over rows [0, rows) of `width` values each, split over threads once there is enough work (a decode
// step's few rows run inline). Rows are independent, so the split changes no value.
template <typename F>
void for_rows(int64_t rows, int64_t width, const F& fn) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1)), fn);
}

}  // namespace anydraft_native
