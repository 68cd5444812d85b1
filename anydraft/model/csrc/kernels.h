// Helpers shared by the native kernels: bf16 <-> fp32 (one value and 16 at once), a vector exp, and the row loop
// split over threads (linear.h: the linear layers).
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include "vec16.h"

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

inline const uint16_t* bf16_ptr(const torch::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}
inline uint16_t* bf16_ptr_mut(torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

// e^x in 16 lanes, to about 1 ulp: x = n ln2 + r (|r| <= ln2/2, Cody-Waite split of ln2), e^r by its Taylor
// polynomial to degree 7 (remainder < 1e-8), scaled by 2^n (underflows to 0, overflows to inf).
// Why not std::exp: it is scalar; softmax weights and SiLU take one per value.
inline f32x16 exp16(f32x16 x) {
  x = max16(x, splat16(-104.f));   // below: e^x is 0 in fp32; keeps n finite
  const f32x16 n = round_to_int16(mul16(x, splat16(1.44269504088896341f)));
  f32x16 r = fnmadd16(n, splat16(0.693359375f), x);
  r = fnmadd16(n, splat16(-2.12194440e-4f), r);
  const float coef[8] = {1.f / 5040, 1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};
  f32x16 p = splat16(coef[0]);
  for (int i = 1; i < 8; ++i) p = fmadd16(p, r, splat16(coef[i]));
  return scale_by_pow2(p, n);
}

// fn(r0, r1) over rows [0, rows) of `width` values each, split over threads once there is enough work (a decode
// step's few rows run inline). Rows are independent, so the split changes no value.
template <typename F>
void for_rows(int64_t rows, int64_t width, const F& fn) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1)), fn);
}

}  // namespace anydraft_native
