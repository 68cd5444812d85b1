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
  // Block by block, a pointer stepping through each: no division per key (a 64-bit one costs more than the FMAs).
  for (int64_t b = 0, j0 = 0; j0 < num_keys; ++b, j0 += block_size) {
    const uint16_t* v = values + blocks[b] * block_stride;
    const int64_t n = std::min(block_size, num_keys - j0);
    const uint16_t* next = j0 + block_size < num_keys ? values + blocks[b + 1] * block_stride : nullptr;
    for (int64_t j = 0; j < n; ++j, v += pos_stride) {
      const uint16_t* ahead = j + AHEAD < n ? v + AHEAD * pos_stride
                              : next != nullptr && j0 + j + AHEAD < num_keys ? next + (j + AHEAD - n) * pos_stride
                              : nullptr;
      if (ahead != nullptr)
        for (int i = 0; i < P; i += 2) _mm_prefetch(reinterpret_cast<const char*>(ahead + i * LANES), _MM_HINT_T0);
      const f32x16 w = splat16(weights[j0 + j]);
      for (int i = 0; i < P; ++i) acc[i] = fmadd16(w, load_bf16x16(v + i * LANES), acc[i]);
    }
  }
  for (int i = 0; i < P; ++i) store16(out + i * LANES, round_bf16x16(mul16(acc[i], inv_total)));
}

// The keys of the 16-key group after the one at j0, one line per 32 values, while this one is scored.
inline void prefetch_next_group(const uint16_t* keys, const int64_t* blocks, int64_t block_size, int64_t block_stride,
                                int64_t pos_stride, int64_t j0, int64_t num_keys, int64_t D) {
  if (j0 + 16 >= num_keys) return;
  const uint16_t* next = keys + key_offset(blocks, j0 + 16, block_size, block_stride, pos_stride);
  for (int64_t j = 0; j < 16 && j0 + 16 + j < num_keys; ++j)
    for (int64_t d = 0; d < D; d += 2 * LANES)
      _mm_prefetch(reinterpret_cast<const char*>(next + j * pos_stride + d), _MM_HINT_T0);
}

inline void weigh_values(const uint16_t* values, const int64_t* blocks, int64_t block_size, int64_t block_stride,
                         int64_t pos_stride, int64_t num_keys, int64_t D, f32x16 top, float* scores, float* out);

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
    prefetch_next_group(keys, blocks, block_size, block_stride, pos_stride, j0, num_keys, D);
    for (int64_t d = 0; d < D; d += LANES) {
      const f32x16 qd = load16(q + d);
      for (int64_t j = 0; j < n; ++j)
        acc[j] = fmadd16(qd, load_bf16x16(group + j * pos_stride + d), acc[j]);
    }
    const f32x16 s = keep_first(mul16(reduce16(acc), splat16(scale)), n, -INFINITY);
    store16(scores + j0, s);
    top = max16(top, s);
  }
  weigh_values(values, blocks, block_size, block_stride, pos_stride, num_keys, D, top, scores, out);
}

// scores [num_keys rounded up to 16] (and their lane-wise max `top`) -> softmax weights, then out [D] = the values
// weighed by them (bf16 values).
inline void weigh_values(const uint16_t* values, const int64_t* blocks, int64_t block_size, int64_t block_stride,
                         int64_t pos_stride, int64_t num_keys, int64_t D, f32x16 top, float* scores, float* out) {
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

#if !defined(__AVX512F__)
// AVX2: G queries that read the same keys (query heads of one KV head, at one position), each exactly as
// attend_query computes it. Widening a key's bf16 to fp32 costs more than the FMAs it feeds, and 16 keys'
// accumulators would take 32 of the 16 registers, so here each widened key step feeds all G queries, a few keys
// at a time (their own accumulators per query, in d order, as in attend_query), then reduce16 per query as before.
// acc[g][j0 + jj] = key (j0 + jj)'s accumulator for query g (the FMAs of attend_query, in d order), J keys at once
// so that G * J chains of FMAs are in flight.
template <int G, int J>
inline void key_steps(const float* const* q, const uint16_t* k, int64_t pos_stride, int64_t D, f32x16 (*acc)[16],
                      int64_t j0) {
  f32x16 a[G][J];
  for (int g = 0; g < G; ++g)
    for (int jj = 0; jj < J; ++jj) a[g][jj] = zero16();
  for (int64_t d = 0; d < D; d += LANES)
    for (int jj = 0; jj < J; ++jj) {
      const f32x16 kd = load_bf16x16(k + jj * pos_stride + d);
      for (int g = 0; g < G; ++g) a[g][jj] = fmadd16(load16(q[g] + d), kd, a[g][jj]);
    }
  for (int g = 0; g < G; ++g)
    for (int jj = 0; jj < J; ++jj) acc[g][j0 + jj] = a[g][jj];
}

template <int G>
inline void attend_queries(const float* const* q, const uint16_t* keys, const uint16_t* values, const int64_t* blocks,
                           int64_t block_size, int64_t block_stride, int64_t pos_stride, int64_t num_keys, int64_t D,
                           float scale, float* const* scores, float* const* out) {
  constexpr int J = G >= 3 ? 1 : 4 / G;   // keys per pass: G * J chains, G * J * 2 accumulator registers
  f32x16 top[G];
  for (int g = 0; g < G; ++g) top[g] = splat16(-INFINITY);
  f32x16 acc[G][16];
  for (int64_t j0 = 0; j0 < num_keys; j0 += 16) {
    const int64_t n = std::min<int64_t>(16, num_keys - j0);
    const uint16_t* group = keys + key_offset(blocks, j0, block_size, block_stride, pos_stride);
    prefetch_next_group(keys, blocks, block_size, block_stride, pos_stride, j0, num_keys, D);
    int64_t j = 0;
    for (; j + J <= n; j += J) key_steps<G, J>(q, group + j * pos_stride, pos_stride, D, acc, j);
    for (; j < n; ++j) key_steps<G, 1>(q, group + j * pos_stride, pos_stride, D, acc, j);
    for (int g = 0; g < G; ++g) {
      for (int64_t j = n; j < 16; ++j) acc[g][j] = zero16();
      const f32x16 s = keep_first(mul16(reduce16(acc[g]), splat16(scale)), n, -INFINITY);
      store16(scores[g] + j0, s);
      top[g] = max16(top[g], s);
    }
  }
  for (int g = 0; g < G; ++g)
    weigh_values(values, blocks, block_size, block_stride, pos_stride, num_keys, D, top[g], scores[g], out[g]);
}

// Queries of heads h0..h0+count-1 (count <= 4, one KV head) at one position.
inline void attend_head_group(const float* q, const uint16_t* keys, const uint16_t* values, const int64_t* blocks,
                              int64_t block_size, int64_t block_stride, int64_t pos_stride, int64_t num_keys,
                              int64_t D, float scale, int count, std::vector<float>& scratch, float* out) {
  const int64_t width = (num_keys + 15) / 16 * 16;
  scratch.resize(count * width);
  const float* qs[4];
  float* scores[4];
  float* outs[4];
  for (int g = 0; g < count; ++g) qs[g] = q + g * D, scores[g] = scratch.data() + g * width, outs[g] = out + g * D;
  switch (count) {
    case 4: return attend_queries<4>(qs, keys, values, blocks, block_size, block_stride, pos_stride, num_keys, D, scale, scores, outs);
    case 3: return attend_queries<3>(qs, keys, values, blocks, block_size, block_stride, pos_stride, num_keys, D, scale, scores, outs);
    case 2: return attend_queries<2>(qs, keys, values, blocks, block_size, block_stride, pos_stride, num_keys, D, scale, scores, outs);
    default: return attend_queries<1>(qs, keys, values, blocks, block_size, block_stride, pos_stride, num_keys, D, scale, scores, outs);
  }
}
#endif

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
#if !defined(__AVX512F__)
  const int64_t chunk = std::min<int64_t>(group, 4), chunks = (group + chunk - 1) / chunk;   // heads per task
  at::parallel_for(0, win.M * Hkv * chunks, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scratch;
    for (int64_t i = i0; i < i1; ++i) {
      // Positions taken from both ends in turn: a causal prefill's later tokens see more keys, and each thread's
      // contiguous range of tasks should hold as many of those as the other's.
      const int64_t t = i / (Hkv * chunks), m = t % 2 == 0 ? t / 2 : win.M - 1 - t / 2;
      const int64_t g = i / chunks % Hkv, h = g * group + i % chunks * chunk;
      const int count = int(std::min(chunk, (g + 1) * group - h));
      attend_head_group(q + (m * Hq + h) * D, kc + g * D, vc + g * D, win.table(m), bs, block_stride, pos_stride,
                        win.positions[m] + 1, D, scale, count, scratch, out + (m * Hq + h) * D);
    }
  });
#else
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
#endif
}

}  // namespace anydraft_native
