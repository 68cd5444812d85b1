// The decoder body's linear layers on AVX-512 vectors (or AVX2 halves, vec16.h), over weights packed once into the tile layout
// [ceil(N/32) * 2, K/2, 16, 2] (16 output columns x one pair of input columns per 64-byte vector) that the AMX tiles
// read too (tile_gemm.h): where AMX does not run a width, the body reads the same packed weight here.
//
// Why not linear.h's row-major kernel: it dots along k (16 lanes of k, then a lane tree per output), so every tile
// of 4 x 4 outputs re-reads its weight rows and ends in a reduction. Here an activation pair is broadcast against
// a vector of 16 output columns (VDPBF16PS), 8 rows x 3 vectors of 16 columns in registers: no reduction, a weight
// vector loaded once per 8 rows. On a 2-core Zen 4 (AVX-512 BF16, no AMX), 2 threads, weights streamed from memory,
// against linear.h: 1.3-1.5x at 16-64 rows, 1.4-2x at 256-2048 (prefill), 1.05-1.1x at one row; about oneDNN's
// speed (0.75-1.1x) at every size.
//
// Every output is one fixed function of its own activation row and weight column: an fp32 sum over the input pairs
// in k order (each VDPBF16PS step adds the pair's two exact products), then + bias and one bf16 rounding. Rows,
// their place in the batch and the threads (which split the output columns, never the sums) change no bit.
#pragma once
#include "linear.h"

namespace anydraft_native {

constexpr int64_t TILE_COLS = 16;     // output columns per weight tile (a vector of fp32 results here)
constexpr int64_t TILE_DEPTH = 32;    // input columns (bf16) per AMX tile

// weight [N, K] (K even) -> [ceil(N/32) * 2, K/2, 16, 2]: tile (n-block b, depth chunk c) is the 1 KB at (b, 16c);
// row p of block b holds input columns 2p, 2p+1 of the block's 16 output columns. Rows past N are zeros (never
// stored out).
inline void pack_weight_tiles(const uint16_t* w, int64_t N, int64_t K, uint16_t* packed) {
  const int64_t blocks = (N + 31) / 32 * 2;
  std::memset(packed, 0, blocks * TILE_COLS * K * sizeof(uint16_t));
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      uint32_t* block = reinterpret_cast<uint32_t*>(packed + (n / TILE_COLS) * TILE_COLS * K);
      const uint32_t* row = reinterpret_cast<const uint32_t*>(w + n * K);
      for (int64_t p = 0; p < K / 2; ++p) block[p * TILE_COLS + n % TILE_COLS] = row[p];
    }
  });
}

// rows x 16 fp32 results (row stride `stride` floats) + bias -> y rows, each rounded to bf16 as float_to_bf16.
inline void store_rows(const float* c, int64_t rows, int64_t stride, const uint16_t* bias, int64_t n0, int64_t N,
                       float* y) {
  const int64_t valid_cols = std::min<int64_t>(TILE_COLS, N - n0);
  if (valid_cols <= 0) return;
  const f32x16 b = bias ? load_bf16x16_first(bias + n0, valid_cols) : zero16();
  for (int64_t r = 0; r < rows; ++r)
    store16_first(y + r * N + n0, round_bf16x16(add16(load16(c + r * stride), b)), valid_cols);
}

// A register tile: VECTOR_ROWS activation rows x VECTOR_BLOCKS weight blocks of 16 columns, 24 of AVX-512's 32
// registers or all 16 of AVX2's (two per row: with fewer, the FMA units wait on each accumulator's chain) as
// accumulators. The tiling changes no output's arithmetic.
#if defined(__AVX512F__)
constexpr int VECTOR_ROWS = 8;
constexpr int VECTOR_BLOCKS = 3;
#else
constexpr int VECTOR_ROWS = 8;
constexpr int VECTOR_BLOCKS = 4;   // at most; see tile_blocks
#endif

// Weight blocks a tile of R rows holds: on AVX2 the 16 registers take 8 rows x 1 block, 4 x 2 or 2 x 4 (spilling
// a few), so that a decode step's one or two rows still keep 8 or more accumulators, as the FMA latency needs.
constexpr int tile_blocks(int R) {
#if defined(__AVX512F__)
  static_cast<void>(R);   // one width for every row count here
  return VECTOR_BLOCKS;
#else
  return R <= 2 ? 4 : R <= 4 ? 2 : 1;
#endif
}
// The first rows to meet a panel stream it from memory, fetching each block's line this many pairs (64 bytes each)
// ahead: 5-16% faster at 1-64 rows than the hardware prefetchers alone (A/B in one process, weights from memory).
constexpr int64_t STREAM_AHEAD = 32;

// R activation rows (bf16 pairs, row stride `pairs`) x C packed blocks (stride 16 * K bf16) -> c [R][C][16] fp32.
#if defined(__AVX512F__)
template <int R, int C, bool STREAM>
inline void vector_tile(const uint32_t* x, int64_t pairs, const uint16_t* w, int64_t block_stride, float* c) {
  f32x16 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) acc[r][j] = zero16();
  for (int64_t p = 0; p < pairs; ++p) {
    i32x16 wv[C];
    for (int j = 0; j < C; ++j) wv[j] = load_pairs(w + j * block_stride + p * 2 * TILE_COLS);
    if constexpr (STREAM)   // a prefetch never faults, so the lines past a block's end need no check
      for (int j = 0; j < C; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(w + j * block_stride + (p + STREAM_AHEAD) * 2 * TILE_COLS), _MM_HINT_T0);
    for (int r = 0; r < R; ++r) {
      const i32x16 xv = splat_pair(x[r * pairs + p]);
      for (int j = 0; j < C; ++j) acc[r][j] = dot_step(acc[r][j], xv, wv[j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) store16(c + (r * C + j) * TILE_COLS, acc[r][j]);
}

#else
// AVX2: the same two FMAs per pair and lane (odd element, then even) as dot_step, with each weight vector widened
// to fp32 once per pair for all R rows and each activation value broadcast as fp32, instead of widening both
// operands for every product.
// x here: the activations as fp32 values (bf16 numbers), row stride 2 * pairs, so a broadcast is a load.
template <int R, int C, bool STREAM>
inline void vector_tile(const float* x, int64_t pairs, const uint16_t* w, int64_t block_stride, float* c) {
  __m256 lo[R][C], hi[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) lo[r][j] = hi[r][j] = _mm256_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    for (int j = 0; j < C; ++j) {
      const uint16_t* wp = w + j * block_stride + p * 2 * TILE_COLS;
      const i32x16 wv = load_pairs(wp);
      if constexpr (STREAM) _mm_prefetch(reinterpret_cast<const char*>(wp + STREAM_AHEAD * 2 * TILE_COLS), _MM_HINT_T0);
      const __m256 odd_lo = odd_bf16x8(wv.lo), odd_hi = odd_bf16x8(wv.hi);
      const __m256 even_lo = even_bf16x8(wv.lo), even_hi = even_bf16x8(wv.hi);
      for (int r = 0; r < R; ++r) {
        const __m256 x_odd = _mm256_broadcast_ss(x + r * 2 * pairs + 2 * p + 1);
        const __m256 x_even = _mm256_broadcast_ss(x + r * 2 * pairs + 2 * p);
        lo[r][j] = _mm256_fmadd_ps(x_even, even_lo, _mm256_fmadd_ps(x_odd, odd_lo, lo[r][j]));
        hi[r][j] = _mm256_fmadd_ps(x_even, even_hi, _mm256_fmadd_ps(x_odd, odd_hi, hi[r][j]));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) store16(c + (r * C + j) * TILE_COLS, {lo[r][j], hi[r][j]});
}
#endif

template <int R, bool STREAM, typename X>
inline void vector_tile_rows(int rows, int blocks, const X* x, int64_t pairs, const uint16_t* w,
                             int64_t block_stride, float* c) {
  if (rows == R) {
    if constexpr (tile_blocks(R) >= 4) if (blocks == 4) return vector_tile<R, 4, STREAM>(x, pairs, w, block_stride, c);
    if constexpr (tile_blocks(R) >= 3) if (blocks == 3) return vector_tile<R, 3, STREAM>(x, pairs, w, block_stride, c);
    if constexpr (tile_blocks(R) >= 2) if (blocks == 2) return vector_tile<R, 2, STREAM>(x, pairs, w, block_stride, c);
    return vector_tile<R, 1, STREAM>(x, pairs, w, block_stride, c);
  }
  if constexpr (R > 1) vector_tile_rows<R - 1, STREAM, X>(rows, blocks, x, pairs, w, block_stride, c);
}

// y [M, N] = bf16(x [M, K] @ w^T + bias), x as fp32 holding bf16 values, w packed by pack_weight_tiles, K even.
// Threads take panels of weight blocks (as many as a tile of min(M, 8) rows holds); each panel meets every
// activation row, 8 at a time (the first 8 stream it from memory, the others read it from L2).
inline void linear_vectors(const float* x_f32, int64_t M, int64_t K, const uint16_t* packed, const uint16_t* bias,
                           int64_t N, float* y) {
#if defined(__AVX512F__)
  const std::vector<uint16_t> xb = to_bf16(x_f32, M * K);
  const uint32_t* x = reinterpret_cast<const uint32_t*>(xb.data());
  const int64_t row_stride = K / 2;
#else
  const std::vector<float> xb = to_bf16_values(x_f32, M * K);
  const float* x = xb.data();
  const int64_t row_stride = K;
#endif
  const int64_t pairs = K / 2, blocks = (N + TILE_COLS - 1) / TILE_COLS;
  const int64_t panel = tile_blocks(int(std::min<int64_t>(M, VECTOR_ROWS)));
  const int64_t panels = (blocks + panel - 1) / panel;
  at::parallel_for(0, panels, 1, [&](int64_t q0, int64_t q1) {
    alignas(64) float c[VECTOR_ROWS * VECTOR_BLOCKS * TILE_COLS];
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t b0 = q * panel;
      const int width = int(std::min<int64_t>(panel, blocks - b0));
      const uint16_t* w = packed + b0 * TILE_COLS * K;
      for (int64_t m = 0; m < M; m += VECTOR_ROWS) {
        const int rows = int(std::min<int64_t>(VECTOR_ROWS, M - m));
        if (m == 0) vector_tile_rows<VECTOR_ROWS, true>(rows, width, x, pairs, w, TILE_COLS * K, c);
        else vector_tile_rows<VECTOR_ROWS, false>(rows, width, x + m * row_stride, pairs, w, TILE_COLS * K, c);
        for (int j = 0; j < width; ++j)
          store_rows(c + j * TILE_COLS, rows, width * TILE_COLS, bias, (b0 + j) * TILE_COLS, N, y + m * N);
      }
    }
  });
}

}  // namespace anydraft_native
