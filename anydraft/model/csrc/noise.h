// The heads' counter-based noise, scalar: the float64 Gumbel of each (key, id), built by blocks of 16 ids
// (sampling_head.cpp's header says how and why). One definition for every head that draws with it: the sampling
// head's exact draw, the noise of chosen rows (head_noise) and a draft's proposal (proposal_head.cpp) must give an id
// the same noise under the same key, or coupled draws stop coinciding.
#pragma once

#include <cmath>
#include <cstdint>

namespace anydraft_native {

inline uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

inline uint32_t hash_high(uint64_t key, uint32_t n) {   // z's high half
  return lowbias32(lowbias32(n * 0x9E3779B9u + uint32_t(key)) ^ uint32_t(key >> 32));
}

inline uint32_t hash_low(uint64_t key, uint32_t n) {    // z's low half
  return lowbias32(lowbias32(n * 0x85EBCA6Bu + uint32_t(key >> 32)) ^ uint32_t(key) ^ 0x5BD1E995u);
}

constexpr uint32_t BLOCK_COUNTER = 0x80000000u;   // a block's counter: its id >> 4 with the top bit set

inline uint64_t hash64(uint64_t key, uint32_t counter) {
  return (uint64_t(hash_high(key, counter)) << 32) | hash_low(key, counter);
}

inline double uniform_of(uint64_t z) { return (double(z >> 11) + 0.5) * 0x1p-53; }   // in (0, 1)

// The exact noise of id n (float64): its block's largest noise, or a Gumbel truncated below it.
inline double gumbel(uint64_t key, int64_t n) {
  const uint64_t z0 = hash64(key, uint32_t(n >> 4) | BLOCK_COUNTER);
  const double w0 = -std::log(uniform_of(z0));
  if (uint32_t(n & 15) == uint32_t(z0 & 15)) return -std::log(w0 / 16.0);
  return -std::log(w0 / 16.0 - std::log(uniform_of(hash64(key, uint32_t(n)))));
}

}  // namespace anydraft_native
