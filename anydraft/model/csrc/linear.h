// The linear layer of the native kernels: y = bf16(x @ w^T + bias) for bf16 activations and a bf16 weight in
// PyTorch's row-major layout, each weight block read from memory once for all activation rows. The output head
// (whose row-major weight its screens share) runs here; the decoder body's weights are packed at load and read by
// tile_gemm.h (AMX; the same values as here) or vector_gemm.h (AVX-512; its own fixed order, faster from 1 row up).
//
// Every output is one fixed function of its own activation row and weight row: its summation order depends on
// nothing else (not the number of rows, the row's place among them, or the threads, which split the weight
// rows and never the sums), so a row computed alone and inside any batch is bit-identical. Two paths, chosen
// per process and per width K only (never per batch), so that holds within a process:
//  - AMX (Sapphire Rapids and later; K a multiple of 32): 16 weight rows x up to 16 activation rows per tile
//    instruction, TDPBF16PS (each output a hardware dot product over its own row and column, in k order);
//  - AVX-512: 4 activation rows x 4 weight rows in registers, VDPBF16PS into 16 fp32 lanes, then one lane tree.
//    On AVX2 + FMA CPUs the same arithmetic on 8-lane halves (vec16.h), 2 x 4 rows, one half at a time.
// AMX runs for widths K >= AMX_MIN_WIDTH where the CPU and the OS grant it; below, AVX-512. Measured on a 2-core
// Sapphire Rapids VM, 2 threads, AMX against AVX-512 at widths 192-576 (the shipped models, smollm2-135m's shape):
// as fast at one row and up to 2x faster from 4 rows (shipped qwen3-target alone, batch 16: 1.2x; grown
// smollm2-135m, batch 4: 1.9x); at the Qwen3-0.6B shape a batch-16 decode step went from 185 to 96 ms. Narrower
// widths (test models) keep AVX-512. ANYDRAFT_NATIVE_AMX=0 turns AMX off, =1 uses it at every width that is a
// multiple of 32. Read once per process: which path runs depends on the width only, never on the rows.
#pragma once
#include "kernels.h"

#include <cstdlib>
#include <string>
#include <vector>
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace anydraft_native {

// One fp32 vector's lanes summed in one fixed tree: ((l0+l8)+(l4+l12)) + ((l2+l10)+(l6+l14)) + ... as
// t_i = l_i + l_{i+8}, u_i = t_i + t_{i+4}, v_i = u_i + u_{i+2}, v_0 + v_1 (reduce16 does 16 at once, same tree).
inline float reduce_tree(f32x16 v) {
  alignas(64) float l[16];
  store16(l, v);
  float t[8], u[4];
  for (int i = 0; i < 8; ++i) t[i] = l[i] + l[i + 8];
  for (int i = 0; i < 4; ++i) u[i] = t[i] + t[i + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

// 16 vectors -> lane j = reduce_tree(a[j]): on AVX-512 by transposing additions (about 2 instructions per sum).
#if defined(__AVX512F__)
inline f32x16 reduce16(const f32x16* a) {
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
#else
// 8 vectors' t (t_i = l_i + l_{i+8}) -> lane j = the rest of reduce_tree(a[j]): u, v and the last sum, transposed.
inline __m256 reduce8(const __m256* t) {
  __m256 u[4], v[2];
  for (int p = 0; p < 4; ++p)   // lanes 0-3: u of t[2p], 4-7: u of t[2p+1]
    u[p] = _mm256_add_ps(_mm256_permute2f128_ps(t[2 * p], t[2 * p + 1], 0x20), _mm256_permute2f128_ps(t[2 * p], t[2 * p + 1], 0x31));
  for (int r = 0; r < 2; ++r)   // low half: v0, v1 of t[4r], then of t[4r+2]; high half: of t[4r+1], t[4r+3]
    v[r] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * r], u[2 * r + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(u[2 * r], u[2 * r + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // low half: sums of t[0], t[2], t[4], t[6]; high half: of t[1], t[3], t[5], t[7]
  const __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline f32x16 reduce16(const f32x16* a) {
  __m256 t[16];
  for (int j = 0; j < 16; ++j) t[j] = _mm256_add_ps(a[j].lo, a[j].hi);
  return {reduce8(t), reduce8(t + 8)};
}
#endif

constexpr int64_t PAIR_STEP = 32;   // bf16 per dot_step

inline i32x16 load_step(const uint16_t* p, int64_t left) {   // 32 bf16, or the last `left` < 32 then zeros
  return left >= PAIR_STEP ? load_pairs(p) : load_pairs_first(p, left);
}

// A register tile of DOT_ROWS activation rows x DOT_COLS weight rows: 16 accumulators in 16 (AVX-512) or 8 (AVX2:
// one 8-lane half at a time) of the vector registers. The tiling changes no output's arithmetic.
#if defined(__AVX512F__)
constexpr int DOT_ROWS = 4, DOT_COLS = 4;
#else
constexpr int DOT_ROWS = 2, DOT_COLS = 4;
#endif

// The dot products of R activation rows (bf16, row stride K) with C weight rows (bf16, row stride K): one
// accumulator per pair, 32 columns per step, in column order. Each pair's arithmetic is the same whatever R and
// C: this tile is what lets a weight row be read once for several activation rows.
template <int R, int C>
inline void dot_tile(const uint16_t* x, int64_t K, const uint16_t* const* w, f32x16 (*acc)[16], int c0) {
  f32x16 a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = zero16();
  int64_t k = 0;
#if !defined(__AVX512F__)
  // AVX2: dot_step's two FMAs per lane, in its order, with each operand widened once per step rather than once per
  // product, and the low and high 8 lanes (columns k..k+15 and k+16..k+31 of each step) summed in two passes so
  // that a tile's accumulators fit the 16 registers. The last partial step is below.
  const int64_t full = K - K % PAIR_STEP;
  for (int h = 0; h < 2; ++h) {
    __m256 lanes[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) lanes[r][c] = _mm256_setzero_ps();
    for (int64_t j = 16 * h; j < full; j += PAIR_STEP) {
      __m256 x_odd[R], x_even[R];
      for (int r = 0; r < R; ++r) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + r * K + j));
        x_odd[r] = odd_bf16x8(v);
        x_even[r] = even_bf16x8(v);
      }
      for (int c = 0; c < C; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[c] + j));
        const __m256 w_odd = odd_bf16x8(v), w_even = even_bf16x8(v);
        for (int r = 0; r < R; ++r)
          lanes[r][c] = _mm256_fmadd_ps(x_even[r], w_even, _mm256_fmadd_ps(x_odd[r], w_odd, lanes[r][c]));
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) (h ? a[r][c].hi : a[r][c].lo) = lanes[r][c];
  }
  k = full;
#endif
  for (; k < K; k += PAIR_STEP) {
    i32x16 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load_step(w[c] + k, K - k);
    for (int r = 0; r < R; ++r) {
      const i32x16 xv = load_step(x + r * K + k, K - k);
      for (int c = 0; c < C; ++c) a[r][c] = dot_step(a[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c0 + c] = a[r][c];
}

// One activation row and one weight row: the same arithmetic as each pair of dot_tile + reduce16.
inline float dot_bf16(const uint16_t* x, const uint16_t* w, int64_t K) {
  f32x16 acc[1][16];
  const uint16_t* rows[1] = {w};
  dot_tile<1, 1>(x, K, rows, acc, 0);
  return reduce_tree(acc[0][0]);
}

// Activations as bf16 (exact: the fp32 values hold bf16 numbers).
inline std::vector<uint16_t> to_bf16(const float* x, int64_t n) {
  std::vector<uint16_t> out(n);
  at::parallel_for(0, n, 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = float_to_bf16(x[i]);
  });
  return out;
}

// The same values as fp32 (each rounded to bf16 as to_bf16 rounds it), for kernels that broadcast them.
inline std::vector<float> to_bf16_values(const float* x, int64_t n) {
  std::vector<float> out(n);
  at::parallel_for(0, n, 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = round_bf16(x[i]);
  });
  return out;
}

// R activation rows against a block of 16 weight rows [n0, n0+16) (rows past N repeat row N-1, not stored).
template <int R>
inline void linear_block(const uint16_t* x, int64_t K, const uint16_t* w, const uint16_t* bias, int64_t n0,
                         int64_t N, float* y) {
  f32x16 acc[R][16];
  const uint16_t* rows[16];
  for (int c = 0; c < 16; ++c) rows[c] = w + std::min(n0 + c, N - 1) * K;
  for (int c0 = 0; c0 < 16; c0 += DOT_COLS) dot_tile<R, DOT_COLS>(x, K, rows + c0, acc, c0);
  const f32x16 b = bias ? load_bf16x16_first(bias + n0, N - n0) : zero16();
  for (int r = 0; r < R; ++r) {
    alignas(64) float sums[16];
    store16(sums, add16(reduce16(acc[r]), b));
    for (int c = 0; c < 16 && n0 + c < N; ++c) y[r * N + n0 + c] = round_bf16(sums[c]);
  }
}

// y [M, N] = bf16(x [M, K] @ w[N, K]^T + bias), values kept as fp32 holding bf16 numbers.
// Every output is the same function of its own activation row and weight row (dot_tile's order, reduce16's
// tree), whatever M, the row's place in the batch, or the threads: threads split the weight rows (outputs),
// never the columns they sum over. Each block of 16 weight rows is read from memory once for all M rows (4
// activation rows at a time against it, from cache after the first).
inline void linear_rows(const uint16_t* xp, int64_t M, int64_t K, const uint16_t* w, const uint16_t* bias,
                          int64_t N, float* y) {
  const int64_t blocks = (N + 15) / 16;
  const int64_t grain = std::max<int64_t>(1, 16384 / (K * std::max<int64_t>(M, 1)));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * 16;
      int64_t m = 0;
      for (; m + DOT_ROWS <= M; m += DOT_ROWS) linear_block<DOT_ROWS>(xp + m * K, K, w, bias, n0, N, y + m * N);
      switch (M - m) {
        case 3: linear_block<3>(xp + m * K, K, w, bias, n0, N, y + m * N); break;
        case 2: linear_block<2>(xp + m * K, K, w, bias, n0, N, y + m * N); break;
        case 1: linear_block<1>(xp + m * K, K, w, bias, n0, N, y + m * N); break;
        default: break;
      }
    }
  });
}


constexpr int64_t AMX_MIN_WIDTH = 128;

// ANYDRAFT_NATIVE_AMX: -1 unset (AMX from AMX_MIN_WIDTH), 0 off, 1 at every width.
inline int amx_setting() {
  static const int setting = [] {
    const char* value = std::getenv("ANYDRAFT_NATIVE_AMX");
    if (!value) return -1;
    const std::string v(value);
    return v == "0" ? 0 : v == "1" ? 1 : -1;
  }();
  return setting;
}

// Whether this process may use AMX tiles: Linux grants the tile state on request (once per process).
inline bool amx_ready() {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  static const bool ready = [] {
    if (amx_setting() == 0) return false;
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ready;
#else
  return false;
#endif
}

inline bool use_amx(int64_t K) {
  return K % 32 == 0 && (K >= AMX_MIN_WIDTH || amx_setting() == 1) && amx_ready();
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// Tiles: 0-3 results [16 weight rows, activation rows] fp32 (0, 1: group a; 2, 3: group b); 4, 5 weight rows
// [16, 32 bf16]; 6, 7 activations [16 column pairs, rows x 2 bf16] of groups a and b (up to 16 rows each).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// One thread's AMX tile configuration: load() sets tiles 0-7 (rows, bytes per row; 0 rows: unused) and skips the
// reload when nothing changed; the tiles are released when it goes out of scope.
struct Tiles {
  TileConfig cfg;
  bool loaded = false;
  void load(const int64_t (&rows)[8], const int64_t (&colsb)[8]) {
    TileConfig next;
    for (int t = 0; t < 8; ++t)
      if (rows[t]) {
        next.rows[t] = uint8_t(rows[t]);
        next.colsb[t] = uint16_t(colsb[t]);
      }
    if (loaded && std::memcmp(&next, &cfg, sizeof(TileConfig)) == 0) return;
    cfg = next;
    _tile_loadconfig(&cfg);
    loaded = true;
  }
  void use(int64_t width_a, int64_t width_b) {   // linear_amx's tiles (above) for groups of these activation rows
    const int64_t widths[8] = {width_a, width_a, width_b, width_b, 16, 16, width_a, width_b};
    int64_t rows[8], colsb[8];
    for (int t = 0; t < 8; ++t) {
      rows[t] = widths[t] ? 16 : 0;
      colsb[t] = 4 * widths[t];
    }
    load(rows, colsb);
  }
  Tiles() = default;
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
  ~Tiles() { if (loaded) _tile_release(); }
};

// Activation rows [mc, K] -> [K/2, mc] pairs (a tile row holds one pair of columns of every activation row).
inline void pair_columns(const uint16_t* x, int64_t mc, int64_t K, uint32_t* out) {
  for (int64_t j = 0; j < mc; ++j) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(x + j * K);
    for (int64_t p = 0; p < K / 2; ++p) out[p * mc + j] = row[p];
  }
}

// Two blocks of 16 weight rows (a0, a1; stride K) against one group of activation rows (paired) -> c[2][16][16].
inline void tile_dots(const uint16_t* a0, const uint16_t* a1, const uint32_t* xa, int64_t mca, int64_t K,
                      float (*c)[16][16]) {
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t k = 0; k < K; k += 32) {
    _tile_loadd(6, xa + (k / 2) * mca, 4 * mca);
    _tile_loadd(4, a0 + k, 2 * K);
    _tile_loadd(5, a1 + k, 2 * K);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
  }
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
}

// The same for two groups at once (prefill): each weight tile loaded once for both -> c[4][16][16].
inline void tile_dots2(const uint16_t* a0, const uint16_t* a1, const uint32_t* xa, int64_t mca, const uint32_t* xb,
                       int64_t mcb, int64_t K, float (*c)[16][16]) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < K; k += 32) {
    _tile_loadd(4, a0 + k, 2 * K);
    _tile_loadd(5, a1 + k, 2 * K);
    _tile_loadd(6, xa + (k / 2) * mca, 4 * mca);
    _tile_loadd(7, xb + (k / 2) * mcb, 4 * mcb);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
}

inline void linear_amx(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, const uint16_t* bias, int64_t N,
                       float* y) {
  const int64_t groups = (M + 15) / 16;
  std::vector<uint32_t> xb(M * K / 2);   // group g (16 rows) at g * 8K, paired
  for (int64_t g = 0; g < groups; ++g)
    pair_columns(x + g * 16 * K, std::min<int64_t>(16, M - g * 16), K, xb.data() + g * 8 * K);
  const int64_t pairs = (N + 31) / 32;   // 32 weight rows per step
  const int64_t grain = std::max<int64_t>(1, 8192 / (K * std::max<int64_t>(M, 1)));
  at::parallel_for(0, pairs, grain, [&](int64_t p0, int64_t p1) {
    Tiles tiles;
    std::vector<uint16_t> tail;   // the last weight rows, zero-padded to 32 (rows past N are not stored)
    alignas(64) float c[4][16][16];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * 32;
      const uint16_t* a = w + n0 * K;
      if (n0 + 32 > N) {
        tail.assign(32 * K, 0);
        std::memcpy(tail.data(), a, (N - n0) * K * sizeof(uint16_t));
        a = tail.data();
      }
      for (int64_t g = 0; g < groups; g += 2) {
        const int64_t mca = std::min<int64_t>(16, M - g * 16), mcb = g + 1 < groups ? std::min<int64_t>(16, M - g * 16 - 16) : 0;
        tiles.use(mca, mcb);
        if (mcb) tile_dots2(a, a + 16 * K, xb.data() + g * 8 * K, mca, xb.data() + (g + 1) * 8 * K, mcb, K, c);
        else tile_dots(a, a + 16 * K, xb.data() + g * 8 * K, mca, K, c);
        for (int64_t i = 0; i < 32 && n0 + i < N; ++i) {
          const float b = bias ? bf16_to_float(bias[n0 + i]) : 0.f;
          for (int64_t j = 0; j < mca; ++j) y[(g * 16 + j) * N + n0 + i] = round_bf16(c[i / 16][i % 16][j] + b);
          for (int64_t j = 0; j < mcb; ++j) y[(g * 16 + 16 + j) * N + n0 + i] = round_bf16(c[2 + i / 16][i % 16][j] + b);
        }
      }
    }
  });
}
#endif

// y [M, N] = bf16(x [M, K] @ w[N, K]^T + bias), x given as fp32 holding bf16 values, y as such values.
inline void linear(const float* x_f32, int64_t M, int64_t K, const uint16_t* w, const uint16_t* bias, int64_t N,
                   float* y) {
  const std::vector<uint16_t> x = to_bf16(x_f32, M * K);
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (use_amx(K)) return linear_amx(x.data(), M, K, w, bias, N, y);
#endif
  linear_rows(x.data(), M, K, w, bias, N, y);
}

// Exact logits of chosen weight rows for one activation row (bf16): the very value linear() gives each
// (bias-free), so a screen can compute only the rows it needs. out[i] for rows[i], i < count.
inline void exact_dots(const uint16_t* x, int64_t K, const uint16_t* w, const int64_t* rows, int64_t count,
                       float* out) {
  if (count == 0) return;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (use_amx(K)) {
    Tiles tiles;
    tiles.use(1, 0);
    std::vector<uint16_t> gathered(32 * K);
    alignas(64) float c[2][16][16];
    for (int64_t i0 = 0; i0 < count; i0 += 32) {
      const int64_t n = std::min<int64_t>(32, count - i0);
      std::fill(gathered.begin() + n * K, gathered.end(), 0);
      for (int64_t i = 0; i < n; ++i) std::memcpy(&gathered[i * K], w + rows[i0 + i] * K, K * sizeof(uint16_t));
      tile_dots(gathered.data(), gathered.data() + 16 * K, reinterpret_cast<const uint32_t*>(x), 1, K, c);
      for (int64_t i = 0; i < n; ++i) out[i0 + i] = round_bf16(c[i / 16][i % 16][0] + 0.f);
    }
    return;
  }
#endif
  for (int64_t i = 0; i < count; ++i) out[i] = round_bf16(dot_bf16(x, w + rows[i] * K, K) + 0.f);
}

}  // namespace anydraft_native
