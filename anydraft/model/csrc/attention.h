// The native body's attention: a forward's new keys and values written into the layer's cache, then each query's
// softmax over the keys its position sees, read back from the cache.
//
// Why vectorised this way: at decode sizes a query meets tens to thousands of keys; one key at a time (a dot
// product, a horizontal sum, a scalar exp) it took 14% of a batch-16 decode step at the Qwen3-1.7B shape. Here 16
// keys' scores come out of independent accumulators and one transposed lane sum (reduce16), their weights out of
// one vector exp, and the values are summed in registers.
//
// Each query's output is one fixed function of its own query and the keys and values it sees (scores per key,
// weights summed in blocks of 16 keys in position order, lanes in one fixed tree): no other token of the forward,
// nor the threads, changes it, so a token verified in a batch and decoded alone attend identically.
#pragma once
#include "linear.h"

#include <cmath>

namespace anydraft_native {

struct Window {  // where a forward's tokens live in the paged cache
  int64_t M;
  const int64_t* slots;      // [M] cache row of each new token
  const int64_t* positions;  // [M] position of each new token; key j of its row visible iff j <= it
  const int64_t* tables;     // [rows, table_width] block of each row's positions p / block_size
  int64_t table_width;
  int64_t block_size;        // a multiple of 16: a block holds whole 16-key groups
  const int64_t* table(int64_t m) const { return tables + slots[m] * table_width; }
};

// Where position j of a row lives: its block's first entry plus the offset in the block (units: bf16 elements).
inline int64_t key_offset(const int64_t* blocks, int64_t j, int64_t block_size, int64_t block_stride,
                          int64_t pos_stride) {
  return blocks[j / block_size] * block_stride + (j % block_size) * pos_stride;
}

constexpr int64_t AHEAD = 8;   // keys prefetched ahead: a head's rows lie pos_stride apart, past the prefetchers' reach

// out [P*16] = bf16(sum_j weights[j] * values[j] * inv_total) for P registers of one head's values (rows pos_stride
// apart), the sums kept in registers over all keys in position order.
template <int P>
inline void add_values(const float* weights, const uint16_t* values, const int64_t* blocks, int64_t block_size,
                       int64_t block_stride, int64_t pos_stride, int64_t num_keys, f32x16 inv_total, float* out) {
  f32x16 acc[P];
  for (int i = 0; i < P; ++i) acc[i] = zero16();
  for (int64_t j = 0; j < num_keys; ++j) {
    const uint16_t* v = values + key_offset(blocks, j, block_size, block_stride, pos_stride);
    if (j + AHEAD < num_keys) {
      const uint16_t* ahead = values + key_offset(blocks, j + AHEAD, block_size, block_stride, pos_stride);
      for (int i = 0; i < P; i += 2) _mm_prefetch(reinterpret_cast<const char*>(ahead + i * LANES), _MM_HINT_T0);
    }
    const f32x16 w = splat16(weights[j]);
    for (int i = 0; i < P; ++i) acc[i] = fmadd16(w, load_bf16x16(v + i * LANES), acc[i]);
  }
  for (int i = 0; i < P; ++i) store16(out + i * LANES, round_bf16x16(mul16(acc[i], inv_total)));
}

// One query q [D] against keys/values [num_keys] of one head (bf16 rows pos_stride apart) -> out [D] (bf16 values).
// scores: scratch of num_keys rounded up to 16.
inline void attend_query(const float* q, const uint16_t* keys, const uint16_t* values, const int64_t* blocks,
                         int64_t block_size, int64_t block_stride, int64_t pos_stride, int64_t num_keys, int64_t D,
                         float scale, float* scores, float* out) {
  f32x16 top = splat16(-INFINITY);
  for (int64_t j0 = 0; j0 < num_keys; j0 += 16) {   // a 16-key group lies in one block (block_size % 16 == 0)
    const int64_t n = std::min<int64_t>(16, num_keys - j0);
    const uint16_t* group = keys + key_offset(blocks, j0, block_size, block_stride, pos_stride);
    f32x16 acc[16];
    for (int j = 0; j < 16; ++j) acc[j] = zero16();
    if (j0 + 16 < num_keys) {   // the next group's keys, one line per 32 values
      const uint16_t* next = keys + key_offset(blocks, j0 + 16, block_size, block_stride, pos_stride);
      for (int64_t j = 0; j < n && j0 + 16 + j < num_keys; ++j)
        for (int64_t d = 0; d < D; d += 2 * LANES)
          _mm_prefetch(reinterpret_cast<const char*>(next + j * pos_stride + d), _MM_HINT_T0);
    }
    for (int64_t d = 0; d < D; d += LANES) {
      const f32x16 qd = load16(q + d);
      for (int64_t j = 0; j < n; ++j)
        acc[j] = fmadd16(qd, load_bf16x16(group + j * pos_stride + d), acc[j]);
    }
    const f32x16 s = keep_first(mul16(reduce16(acc), splat16(scale)), n, -INFINITY);
    store16(scores + j0, s);
    top = max16(top, s);
  }
  const f32x16 max_score = splat16(max_lanes(top));   // a max is exact in any order
  f32x16 total = zero16();
  for (int64_t j0 = 0; j0 < num_keys; j0 += 16) {   // e^-inf = 0 past the last key
    const f32x16 e = exp16(sub16(load16(scores + j0), max_score));
    store16(scores + j0, e);
    total = add16(total, e);
  }
  const f32x16 inv_total = splat16(1.f / reduce_tree(total));
  int64_t d0 = 0;
  for (; d0 + 4 * LANES <= D; d0 += 4 * LANES)
    add_values<4>(scores, values + d0, blocks, block_size, block_stride, pos_stride, num_keys, inv_total, out + d0);
  for (; d0 < D; d0 += LANES)
    add_values<1>(scores, values + d0, blocks, block_size, block_stride, pos_stride, num_keys, inv_total, out + d0);
}

// Writes the new k/v [M, Hkv, D] into the layer's cache, then attends: out [M, Hq*D] (bf16 values).
inline void attend(const float* q, const float* k, const float* v, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                   const Window& win, torch::Tensor& k_cache, torch::Tensor& v_cache, float* out) {
  // k_cache/v_cache: [num_blocks, block_size, Hkv, D] of this layer
  const int64_t block_stride = k_cache.stride(0), pos_stride = k_cache.stride(1), bs = win.block_size;
  uint16_t* kc = bf16_ptr_mut(k_cache);
  uint16_t* vc = bf16_ptr_mut(v_cache);
  for_rows(win.M, 2 * Hkv * D, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t at = key_offset(win.table(m), win.positions[m], bs, block_stride, pos_stride);
      for (int64_t i = 0; i < Hkv * D; ++i) {
        kc[at + i] = float_to_bf16(k[m * Hkv * D + i]);
        vc[at + i] = float_to_bf16(v[m * Hkv * D + i]);
      }
    }
  });
  const int64_t group = Hq / Hkv;
  at::parallel_for(0, win.M * Hq, 4, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t m = i / Hq, h = i % Hq, g = h / group;
      const int64_t num_keys = win.positions[m] + 1;
      scores.resize((num_keys + 15) / 16 * 16);
      attend_query(q + (m * Hq + h) * D, kc + g * D, vc + g * D, win.table(m), bs, block_stride, pos_stride,
                   num_keys, D, scale, scores.data(), out + (m * Hq + h) * D);
    }
  });
}

}  // namespace anydraft_native
