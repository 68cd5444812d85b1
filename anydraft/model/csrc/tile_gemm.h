// The decoder body's linear layers on AMX tiles, with each weight packed once into the tiles' layout (vector_gemm.h,
// pack_weight_tiles; the AVX-512 kernel there reads the same packed weight where AMX does not run).
//
// Why: linear.h reads PyTorch's row-major weight as it is, so each tile load gathers 16 rows 2*K bytes apart
// (rows that share L1 sets) and its results come out transposed; at prefill sizes that ran at 0.4-0.8 TFLOP/s on
// a 2-core Sapphire Rapids VM where oneDNN reaches 0.8-1.7. Here the weight is stored as the tiles read it (16
// output columns x 32 input columns per 1 KB tile, contiguous), activations are re-laid the same way per call, and
// each result tile is a block of output rows stored as vectors: 1.5-2x faster from 16 rows up (bench numbers in
// the module docstring of model/native_extension.py).
//
// Each output is still one fixed function of its own activation row and weight row: TDPBF16PS over k in column
// order, products of the same bf16 pairs as linear_amx (whose operands it swaps: the products commute), so the
// two paths give bit-identical values, and blocking the rows or splitting the weight over threads changes no sum.
#pragma once
#include "vector_gemm.h"

#include <memory>

namespace anydraft_native {

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
constexpr int64_t PANEL_PAIRS = 4;    // pairs of weight tiles a thread takes at once (a 256 KB panel at K = 2048)
constexpr int64_t CHUNK_GROUPS = 16;  // activation groups of 16 rows kept in L2 while the panels pass over them

// activations [M, K] (fp32 holding bf16 values) -> bf16 [ceil(M/16), K/32, 16, 32]: one 1 KB tile per (16-row
// group, depth chunk). Rows past M are left unwritten: the last group's tiles are configured with its rows only.
inline void pack_activation_tiles(const float* x, int64_t M, int64_t K, uint16_t* packed) {
  const int64_t chunks = K / TILE_DEPTH;
  at::parallel_for(0, M, std::max<int64_t>(1, 65536 / K), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t c = 0; c < chunks; ++c) {
        uint16_t* dst = packed + ((m / 16 * chunks + c) * 16 + m % 16) * TILE_DEPTH;
        for (int64_t i = 0; i < TILE_DEPTH; ++i) dst[i] = float_to_bf16(x[m * K + c * TILE_DEPTH + i]);
      }
  });
}

// Tiles 0-3 results [rows, 16 columns] fp32 (0, 1: group a x columns of b0, b1; 2, 3: group b); 4, 5 activations
// of groups a, b [rows, 32 bf16]; 6, 7 weights [16 column pairs, 16 x 2 bf16].
inline void use_gemm_tiles(Tiles& tiles, int64_t rows_a, int64_t rows_b) {
  const int64_t rows[8] = {rows_a, rows_a, rows_b, rows_b, rows_a, rows_b, 16, 16};
  const int64_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
  tiles.load(rows, colsb);
}

// The weight tiles PREFETCH_TILES depth chunks ahead of k, one cache line at a time: the hardware prefetchers
// alone left a decode step's weight stream at 15-27 GB/s (a 16-row and a 1-row step alike); 4 KB ahead per stream
// gave 12-40% more (scratch runs, cold weights, 2 threads).
constexpr int64_t PREFETCH_TILES = 4;
inline void prefetch_weight_tiles(const uint16_t* w0, const uint16_t* w1, int64_t k, int64_t chunks) {
  if (k + PREFETCH_TILES >= chunks) return;
  const int64_t ahead = (k + PREFETCH_TILES) * 512;
  for (int64_t line = 0; line < 512; line += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(w0 + ahead + line), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w1 + ahead + line), _MM_HINT_T0);
  }
}

// y [M, N] = bf16(x [M, K] @ w^T + bias), x as fp32 holding bf16 values, w packed by pack_weight_tiles, K a
// multiple of 32.
inline void linear_tiles(const float* x, int64_t M, int64_t K, const uint16_t* packed, const uint16_t* bias,
                         int64_t N, float* y) {
  const int64_t groups = (M + 15) / 16, chunks = K / TILE_DEPTH;
  const std::unique_ptr<uint16_t[]> xt(new uint16_t[groups * 16 * K]);
  pack_activation_tiles(x, M, K, xt.get());
  const int64_t pairs = (N + 31) / 32, panels = (pairs + PANEL_PAIRS - 1) / PANEL_PAIRS;
  at::parallel_for(0, panels, 1, [&](int64_t q0, int64_t q1) {
    Tiles tiles;
    alignas(64) float c[4][16][16];
    for (int64_t g0 = 0; g0 < groups; g0 += CHUNK_GROUPS)
      for (int64_t q = q0; q < q1; ++q)
        for (int64_t g = g0; g < std::min(groups, g0 + CHUNK_GROUPS); g += 2) {
          const int64_t rows_a = std::min<int64_t>(16, M - g * 16);
          const int64_t rows_b = g + 1 < groups ? std::min<int64_t>(16, M - g * 16 - 16) : 0;
          use_gemm_tiles(tiles, rows_a, rows_b);
          const uint16_t* xa = xt.get() + g * 16 * K;
          const uint16_t* xb = xa + 16 * K;
          for (int64_t p = q * PANEL_PAIRS; p < std::min(pairs, (q + 1) * PANEL_PAIRS); ++p) {
            const uint16_t* w0 = packed + p * 32 * K;
            const uint16_t* w1 = w0 + 16 * K;
            _tile_zero(0);
            _tile_zero(1);
            if (rows_b) {
              _tile_zero(2);
              _tile_zero(3);
              for (int64_t k = 0; k < chunks; ++k) {
                prefetch_weight_tiles(w0, w1, k, chunks);
                _tile_loadd(4, xa + k * 512, 64);
                _tile_loadd(5, xb + k * 512, 64);
                _tile_loadd(6, w0 + k * 512, 64);
                _tile_loadd(7, w1 + k * 512, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
              }
              _tile_stored(2, c[2], 64);
              _tile_stored(3, c[3], 64);
            } else {
              for (int64_t k = 0; k < chunks; ++k) {
                prefetch_weight_tiles(w0, w1, k, chunks);
                _tile_loadd(4, xa + k * 512, 64);
                _tile_loadd(6, w0 + k * 512, 64);
                _tile_loadd(7, w1 + k * 512, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
              }
            }
            _tile_stored(0, c[0], 64);
            _tile_stored(1, c[1], 64);
            float* ya = y + g * 16 * N;
            store_rows(&c[0][0][0], rows_a, 16, bias, p * 32, N, ya);
            store_rows(&c[1][0][0], rows_a, 16, bias, p * 32 + 16, N, ya);
            if (rows_b) {
              store_rows(&c[2][0][0], rows_b, 16, bias, p * 32, N, ya + 16 * N);
              store_rows(&c[3][0][0], rows_b, 16, bias, p * 32 + 16, N, ya + 16 * N);
            }
          }
        }
  });
}
#endif

}  // namespace anydraft_native
