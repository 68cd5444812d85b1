// 16 fp32 lanes as one value, for the decoder body's kernels: one __m512 on AVX-512, two __m256 halves on AVX2.
//
// Why: the body's kernels (linear.h, vector_gemm.h, attention.h, decoder.cpp) are written once against these
// operations, so a CPU with AVX2 and FMA but no AVX-512 runs the same batch-invariant body instead of PyTorch's
// bf16 path (which on such CPUs computes a linear layer row by row: verifying k+1 tokens cost k+1 decode steps).
// Each operation is one fixed function of its inputs on a given build; the two builds may round differently
// (e.g. VDPBF16PS flushes denormals), never two calls of one build.
// The output heads' screens (screen.h and the *_head.cpp files but head_logits) stay AVX-512 only.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#if !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__FMA__))
#error "the native kernels need AVX-512 (avx512f) or AVX2 with FMA"
#endif

namespace anydraft_native {

#if defined(__AVX512F__)
constexpr const char* VECTOR_ISA = "avx512";
using f32x16 = __m512;    // 16 fp32 lanes
using i32x16 = __m512i;   // 16 pairs of bf16 (lane i: elements 2i, 2i+1)

inline f32x16 zero16() { return _mm512_setzero_ps(); }
inline f32x16 splat16(float v) { return _mm512_set1_ps(v); }
inline f32x16 load16(const float* p) { return _mm512_loadu_ps(p); }
inline void store16(float* p, f32x16 v) { _mm512_storeu_ps(p, v); }
inline f32x16 add16(f32x16 a, f32x16 b) { return _mm512_add_ps(a, b); }
inline f32x16 sub16(f32x16 a, f32x16 b) { return _mm512_sub_ps(a, b); }
inline f32x16 mul16(f32x16 a, f32x16 b) { return _mm512_mul_ps(a, b); }
inline f32x16 div16(f32x16 a, f32x16 b) { return _mm512_div_ps(a, b); }
inline f32x16 max16(f32x16 a, f32x16 b) { return _mm512_max_ps(a, b); }
inline f32x16 fmadd16(f32x16 a, f32x16 b, f32x16 c) { return _mm512_fmadd_ps(a, b, c); }    // a*b + c, one rounding
inline f32x16 fnmadd16(f32x16 a, f32x16 b, f32x16 c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a*b, one rounding
inline f32x16 round_to_int16(f32x16 v) {   // to the nearest integer, ties to even
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline f32x16 scale_by_pow2(f32x16 v, f32x16 n) { return _mm512_scalef_ps(v, n); }   // v * 2^n, n integral
inline float max_lanes(f32x16 v) { return _mm512_reduce_max_ps(v); }
inline float add_lanes(f32x16 v) { return _mm512_reduce_add_ps(v); }   // a fixed order of this build
inline uint32_t lanes_above(f32x16 v, float t) {   // bit i set where lane i > t (false for NaN)
  return _mm512_cmp_ps_mask(v, _mm512_set1_ps(t), _CMP_GT_OQ);
}
inline __mmask16 first_lanes(int64_t n) { return (__mmask16)(n >= 16 ? 0xFFFF : (1u << n) - 1); }
inline f32x16 keep_first(f32x16 v, int64_t n, float fill) {   // lanes past n replaced by fill
  return _mm512_mask_mov_ps(_mm512_set1_ps(fill), first_lanes(n), v);
}
inline void store16_first(float* p, f32x16 v, int64_t n) { _mm512_mask_storeu_ps(p, first_lanes(n), v); }
inline f32x16 load_bf16x16(const uint16_t* p) {
  __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
inline f32x16 load_bf16x16_first(const uint16_t* p, int64_t n) {   // zeros past n, nothing read there
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(first_lanes(n), p)), 16));
}
inline i32x16 load_pairs(const void* p) { return _mm512_loadu_si512(p); }
inline i32x16 load_pairs_first(const uint16_t* p, int64_t left) {   // `left` < 32 bf16, then zeros
  return _mm512_maskz_loadu_epi16((__mmask32)((1ull << left) - 1), p);
}
inline i32x16 splat_pair(uint32_t pair) { return _mm512_set1_epi32(int32_t(pair)); }

// 16 fp32 values rounded to bf16 (kept as fp32), exactly as float_to_bf16 rounds each one (NaN kept quiet).
inline f32x16 round_bf16x16(f32x16 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i high = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  const __m512i rounded = _mm512_and_si512(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)))),
      high);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(rounded, nan, _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x400000)), high)));
}

// acc lane i += x[2i+1] * w[2i+1], then += x[2i] * w[2i]: VDPBF16PS (products of bf16 are exact in fp32, one
// rounding per addition). Without AVX512-BF16 the same additions as two FMAs (equal except for denormals,
// which VDPBF16PS flushes).
inline f32x16 dot_step(f32x16 acc, i32x16 x, i32x16 w) {
#if defined(__AVX512BF16__)
  return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
#else
  const __m512i high = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(x, high)), _mm512_castsi512_ps(_mm512_and_si512(w, high)), acc);
  return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), acc);
#endif
}

#else   // AVX2 + FMA: lanes 0-7 in lo, 8-15 in hi
constexpr const char* VECTOR_ISA = "avx2";
struct f32x16 { __m256 lo, hi; };
struct i32x16 { __m256i lo, hi; };

inline f32x16 zero16() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline f32x16 splat16(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
inline f32x16 load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store16(float* p, f32x16 v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
inline f32x16 add16(f32x16 a, f32x16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline f32x16 sub16(f32x16 a, f32x16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline f32x16 mul16(f32x16 a, f32x16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline f32x16 div16(f32x16 a, f32x16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline f32x16 max16(f32x16 a, f32x16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline f32x16 fmadd16(f32x16 a, f32x16 b, f32x16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline f32x16 fnmadd16(f32x16 a, f32x16 b, f32x16 c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
inline f32x16 round_to_int16(f32x16 v) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(v.lo, mode), _mm256_round_ps(v.hi, mode)};
}
// v * 2^n for integral n >= -150 as one multiplication by 2^(n/2) (exact for the v exp16 passes, 0.5-2) and one
// by 2^(n - n/2): one rounding, like VSCALEFPS; n is capped at 254 (the product is inf by then).
inline __m256 scale_half(__m256 v, __m256 n) {
  const __m256i ni = _mm256_min_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(254));
  const __m256i first = _mm256_srai_epi32(ni, 1), second = _mm256_sub_epi32(ni, first);
  const auto pow2 = [](__m256i e) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
  };
  return _mm256_mul_ps(_mm256_mul_ps(v, pow2(first)), pow2(second));
}
inline f32x16 scale_by_pow2(f32x16 v, f32x16 n) { return {scale_half(v.lo, n.lo), scale_half(v.hi, n.hi)}; }
inline float max_lanes(f32x16 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, _mm256_max_ps(v.lo, v.hi));
  float m = l[0];
  for (int i = 1; i < 8; ++i) m = l[i] > m ? l[i] : m;
  return m;
}
inline float add_lanes(f32x16 v) {   // the same tree as linear.h's reduce_tree
  const __m256 t = _mm256_add_ps(v.lo, v.hi);
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));   // (u0 + u2), (u1 + u3)
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}
inline uint32_t lanes_above(f32x16 v, float t) {   // bit i set where lane i > t (false for NaN)
  const __m256 u = _mm256_set1_ps(t);
  return uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(v.lo, u, _CMP_GT_OQ))) |
         uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(v.hi, u, _CMP_GT_OQ))) << 8;
}
inline __m256 lanes_below(int64_t n) {   // all-ones in lanes i < n of 8
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(n < 0 ? 0 : n > 8 ? 8 : n)), index));
}
inline f32x16 keep_first(f32x16 v, int64_t n, float fill) {
  const __m256 f = _mm256_set1_ps(fill);
  return {_mm256_blendv_ps(f, v.lo, lanes_below(n)), _mm256_blendv_ps(f, v.hi, lanes_below(n - 8))};
}
inline void store16_first(float* p, f32x16 v, int64_t n) {
  alignas(32) float l[16];
  store16(l, v);
  std::memcpy(p, l, (n >= 16 ? 16 : n) * sizeof(float));
}
inline __m256 widen_bf16x8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
inline f32x16 load_bf16x16(const uint16_t* p) {
  return {widen_bf16x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          widen_bf16x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline f32x16 load_bf16x16_first(const uint16_t* p, int64_t n) {
  alignas(32) uint16_t l[16] = {};
  std::memcpy(l, p, (n >= 16 ? 16 : n) * sizeof(uint16_t));
  return load_bf16x16(l);
}
inline i32x16 load_pairs(const void* p) {
  const __m256i* q = reinterpret_cast<const __m256i*>(p);
  return {_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)};
}
inline i32x16 load_pairs_first(const uint16_t* p, int64_t left) {
  alignas(32) uint16_t l[32] = {};
  std::memcpy(l, p, left * sizeof(uint16_t));
  return load_pairs(l);
}
inline i32x16 splat_pair(uint32_t pair) { return {_mm256_set1_epi32(int32_t(pair)), _mm256_set1_epi32(int32_t(pair))}; }

inline __m256 round_bf16x8(__m256 v) {   // float_to_bf16's rounding, NaN kept quiet
  const __m256i u = _mm256_castps_si256(v);
  const __m256i high = _mm256_set1_epi32(int32_t(0xFFFF0000u));
  const __m256i rounded = _mm256_and_si256(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)))),
      high);
  // |u| > inf as signed ints: both sides are below 2^31
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  const __m256i quiet = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x400000)), high);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(rounded, quiet, nan));
}
inline f32x16 round_bf16x16(f32x16 v) { return {round_bf16x8(v.lo), round_bf16x8(v.hi)}; }

// The two bf16 of each 32-bit pair as fp32 (exact): the odd element (the high half), the even one (the low).
inline __m256 odd_bf16x8(__m256i pairs) { return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(int32_t(0xFFFF0000u)))); }
inline __m256 even_bf16x8(__m256i pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)); }

// The odd elements' products, then the even ones', as two FMAs per half (AVX-512's path without BF16).
inline __m256 dot_step8(__m256 acc, __m256i x, __m256i w) {
  acc = _mm256_fmadd_ps(odd_bf16x8(x), odd_bf16x8(w), acc);
  return _mm256_fmadd_ps(even_bf16x8(x), even_bf16x8(w), acc);
}
inline f32x16 dot_step(f32x16 acc, i32x16 x, i32x16 w) { return {dot_step8(acc.lo, x.lo, w.lo), dot_step8(acc.hi, x.hi, w.hi)}; }
#endif

}  // namespace anydraft_native
