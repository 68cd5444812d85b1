// The int8 screen of the output head, shared by greedy_head.cpp and sampling_head.cpp: activations quantized to
// int8 codes, and their exact integer scores against the int8 copy of the head (AVX512-VNNI), from which each
// kernel builds rigorous per-row upper bounds on the bf16 logits.
#pragma once
#include "linear.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace anydraft_native {

// R activation rows' codes (4 per int32, row stride K bytes) against one block of 16 head rows:
// acc[r] lane i = sum over columns of code * q for head row i (codes carry +128, taken out by the caller).
template <int R>
inline void int8_scores(const int32_t* codes, int64_t K, const int8_t* block, int64_t groups, __m512i* acc) {
  __m512i a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_si512();
  for (int64_t g = 0; g < groups; ++g) {
    const __m512i q = _mm512_loadu_si512(block + g * 64);
    for (int r = 0; r < R; ++r) {
#if defined(__AVX512VNNI__)
      a[r] = _mm512_dpbusd_epi32(a[r], _mm512_set1_epi32(codes[r * (K / 4) + g]), q);
#else
      alignas(64) int8_t q8[64];   // without VNNI: the same integers, one product at a time
      alignas(64) int32_t lanes[16];
      _mm512_store_si512(q8, q);
      _mm512_store_si512(lanes, a[r]);
      const int32_t code4 = codes[r * (K / 4) + g];
      const uint8_t* cu = reinterpret_cast<const uint8_t*>(&code4);
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 4; ++j) lanes[i] += int32_t(cu[j]) * int32_t(q8[4 * i + j]);
      a[r] = _mm512_load_si512(lanes);
#endif
    }
  }
  for (int r = 0; r < R; ++r) acc[r] = a[r];
}

struct Screen {  // one activation row quantized for the int8 pass
  bool usable;   // false: non-finite input, every row is computed exactly
  float scale, h_norm, e_norm;
};


// Activations: h ~ scale * p with p in [-127, 127], stored as p + 128 (VNNI's unsigned operand); codes [M * K].
inline void quantize_rows(const float* xp, int64_t M, int64_t K, std::vector<uint8_t>& codes, std::vector<Screen>& screens) {
  codes.assign(M * K, 0);
  screens.assign(M, Screen{});
  for (int64_t m = 0; m < M; ++m) {
    const float* h = xp + m * K;
    float max_abs = 0.f;
    double h_norm2 = 0.0, e_norm2 = 0.0;
    bool finite = true;
    for (int64_t k = 0; k < K; ++k) {
      finite = finite && std::isfinite(h[k]);
      max_abs = std::max(max_abs, std::fabs(h[k]));
      h_norm2 += double(h[k]) * h[k];
    }
    const float scale = max_abs > 0.f ? max_abs / 127.f : 1.f;
    for (int64_t k = 0; k < K; ++k) {
      const float p = finite ? std::nearbyint(h[k] / scale) : 0.f;
      codes[m * K + k] = uint8_t(int32_t(p) + 128);
      const double e = double(h[k]) - double(scale) * p;
      e_norm2 += e * e;
    }
    // x1.001: these norms multiply the per-row slacks, so they must not come out low.
    screens[m] = {finite, scale, float(std::sqrt(h_norm2) * 1.001), float(std::sqrt(e_norm2) * 1.001)};
  }
}

}  // namespace anydraft_native
