// The decoder body of a Llama-family model in one native call, for bf16 on x86-64 CPUs with AVX-512.
//
// Why: at the sizes of draft models (and of the shipped models) a PyTorch forward is ~50 framework calls
// per layer, each costing more than its arithmetic; at real sizes (hidden 1024+) the layers are a read of the
// weights, which linear_vectors() (vector_gemm.h) or linear_tiles() (AMX, tile_gemm.h) read once for all rows
// of the forward; attention reads the cache (attention.h). A forward's tokens may come from several rows (a
// ragged prefill).
// Every output row is computed the same way whatever the number of rows, its place among them, or the threads
// (each output in one fixed summation order; threads split outputs, never sums), so a k+1-token verification,
// a 1-token decode and a prefill give bit-identical rows: greedy speculative decoding in bf16 equals the target
// alone exactly, not only up to near-ties.
// Rounding follows the PyTorch path: every tensor PyTorch would store in bf16 is rounded to bf16 here.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "attention.h"
#include "linear.h"
#include "tile_gemm.h"
#include "vector_gemm.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

using namespace anydraft_native;

namespace {

inline float sum_lanes(const float* x, int64_t n) {  // fixed order: 16 lanes, then the lane tree
  f32x16 acc = zero16();
  for (int64_t k = 0; k < n; k += LANES) acc = add16(acc, load16(x + k));
  return add_lanes(acc);
}

// Uninitialised fp32 scratch (every element is written before it is read), allocated once per forward.
using Scratch = std::unique_ptr<float[]>;
inline Scratch scratch(int64_t n) { return Scratch(new float[std::max<int64_t>(n, 1)]); }

// rows of x [rows, n] (bf16 values in fp32) -> weight * bf16(x * rsqrt(mean(x^2) + eps)), HF's RMSNorm.
// weight rows: one weight vector per row, cycling (Qwen3's q/k norm: one vector per stacked head).
void rms_norm(const float* x, int64_t rows, int64_t n, const uint16_t* weight, int64_t weight_rows, float eps,
              float* out) {
  for_rows(rows, n, [&](int64_t r0, int64_t r1) {
    std::vector<float> squares(n);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      for (int64_t k = 0; k < n; ++k) squares[k] = xr[k] * xr[k];
      const float inv = 1.f / std::sqrt(sum_lanes(squares.data(), n) / float(n) + eps);
      const uint16_t* w = weight + (r % weight_rows) * n;
      for (int64_t k = 0; k < n; ++k) out[r * n + k] = round_bf16(bf16_to_float(w[k]) * round_bf16(xr[k] * inv));
    }
  });
}

// x [M, heads, D] rotated in place: bf16(bf16(x*cos) + bf16(swap(x)*signed_sin)), cos/sin [M, D].
void rope(float* x, int64_t M, int64_t heads, int64_t D, const uint16_t* cos, const uint16_t* sin) {
  const int64_t half = D / 2;
  for_rows(M, heads * D, [&](int64_t m0, int64_t m1) {
    std::vector<float> rotated(D);
    for (int64_t m = m0; m < m1; ++m) {
      const uint16_t* c = cos + m * D;
      const uint16_t* s = sin + m * D;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + (m * heads + h) * D;
        for (int64_t d = 0; d < D; ++d) {
          const float swapped = v[d < half ? d + half : d - half];
          rotated[d] = round_bf16(round_bf16(v[d] * bf16_to_float(c[d])) + round_bf16(swapped * bf16_to_float(s[d])));
        }
        std::memcpy(v, rotated.data(), D * sizeof(float));
      }
    }
  });
}

// A body weight is packed at load into the tile layout [ceil(N/32) * 2, K/2, 16, 2] (vector_gemm.h; NativeDecoder
// packs it) and read by AMX tiles where they run width K (tile_gemm.h), else by AVX-512 vectors (vector_gemm.h);
// a row-major [N, K] weight (odd K, or a caller's own) runs linear.h's kernel.
int64_t in_features(const torch::Tensor& w) { return w.dim() == 4 ? w.size(1) * 2 : w.size(1); }

void body_linear(const float* x, int64_t M, int64_t K, const torch::Tensor& w, const uint16_t* bias, int64_t N,
                 float* y) {
  TORCH_CHECK(in_features(w) == K, "weight of ", in_features(w), " columns for inputs of ", K);
  if (w.dim() == 2) return linear(x, M, K, bf16_ptr(w), bias, N, y);
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (use_amx(K)) return linear_tiles(x, M, K, bf16_ptr(w), bias, N, y);
#endif
  linear_vectors(x, M, K, bf16_ptr(w), bias, N, y);
}

}  // namespace

// weight [N, K] bf16 -> [ceil(N/32) * 2, K/2, 16, 2], the layout the body's packed kernels read; undefined for an
// odd K (no column pairs), which keeps the row-major kernel.
torch::Tensor pack_body_weight(torch::Tensor weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "pack_body_weight: a 2-D bf16 weight expected");
  const int64_t N = weight.size(0), K = weight.size(1);
  if (K % 2) return torch::Tensor();
  auto w = weight.contiguous();
  auto packed = torch::empty({(N + 31) / 32 * 2, K / 2, 16, 2}, weight.options());
  pack_weight_tiles(bf16_ptr(w), N, K, bf16_ptr_mut(packed));
  return packed;
}

// x [M, K] bf16 @ a body weight (row-major or packed) -> [M, N] bf16: one of the body's linear layers alone.
torch::Tensor body_linear_op(torch::Tensor x, torch::Tensor weight, int64_t N) {
  auto xf = x.to(at::kFloat).contiguous();
  const int64_t M = xf.size(0), K = xf.size(1);
  std::vector<float> y(M * N);
  body_linear(xf.data_ptr<float>(), M, K, weight.contiguous(), nullptr, N, y.data());
  return torch::from_blob(y.data(), {M, N}, at::kFloat).to(at::kBFloat16);
}

// input_ids [B, S] -> last hidden states after the final norm, [B, S, H] bf16.
// layers: per layer 8 tensors: input_norm [H], qkv_weight [(Hq+2Hkv)*D, H], qkv_bias or empty,
//   qk_norm [Hq+Hkv, D] or empty, o_weight [H, Hq*D], post_norm [H], gate_up_weight [2I, H], down_weight [H, I]
//   (each weight packed or row-major, see body_linear).
// k_cache / v_cache: [L, num_blocks, block_size, Hkv, D] bf16, paged: position p of row r lives in block
// block_tables[r][p / block_size]. Token m = b*S + s is written at (slots[m], positions[m]),
// its position is also its rotary position, and key j of its slot is visible to it iff j <= its position. Tokens
// of one row need not share a batch row: several prompts can run as one ragged sequence (B = 1) with no padding.
// inv_freq: [D/2] float32 rotary inverse frequencies.
// captured: [B, S, len(capture_layers) * H] bf16, or empty: the residual stream at the input of each listed layer
// (id L = the last layer's output before the final norm), side by side, for a hidden-state draft.
torch::Tensor decoder_forward(torch::Tensor input_ids, torch::Tensor embed, std::vector<torch::Tensor> layers,
                              torch::Tensor final_norm, torch::Tensor k_cache, torch::Tensor v_cache,
                              torch::Tensor block_tables, std::vector<int64_t> slots, std::vector<int64_t> positions,
                              torch::Tensor inv_freq,
                              int64_t Hq, int64_t Hkv, int64_t D, double eps_d, torch::Tensor captured,
                              std::vector<int64_t> capture_layers) {
  TORCH_CHECK(embed.scalar_type() == at::kBFloat16 && embed.is_contiguous(), "embed: contiguous bf16 expected");
  TORCH_CHECK(layers.size() % 8 == 0, "8 tensors per layer expected");
  auto ids = input_ids.to(at::kLong).contiguous();
  const int64_t B = ids.size(0), S = ids.size(1), H = embed.size(1), M = B * S;
  TORCH_CHECK(int64_t(slots.size()) == M && int64_t(positions.size()) == M, "one slot and one position per token");
  const int64_t L = layers.size() / 8;
  const float eps = float(eps_d), scale = 1.f / std::sqrt(float(D));
  const int64_t qkv_width = (Hq + 2 * Hkv) * D;
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous() && block_tables.dim() == 2,
              "block_tables: contiguous int64 [rows, blocks] expected");
  TORCH_CHECK(k_cache.dim() == 5 && k_cache.size(2) % 16 == 0, "k_cache: [L, blocks, block_size % 16 == 0, Hkv, D]");
  for (int64_t m = 0; m < M; ++m)
    TORCH_CHECK(slots[m] >= 0 && slots[m] < block_tables.size(0) && positions[m] >= 0 &&
                positions[m] < block_tables.size(1) * k_cache.size(2), "token ", m, " outside the block tables");
  const Window win{M, slots.data(), positions.data(), block_tables.data_ptr<int64_t>(), block_tables.size(1),
                   k_cache.size(2)};
  // cos and sign-folded sin per token, rounded to bf16 as the PyTorch path stores them (llama.CausalLM.rope)
  std::vector<uint16_t> cos(M * D), sin(M * D);
  const float* freq = inv_freq.data_ptr<float>();
  for_rows(M, 8 * D, [&](int64_t m0, int64_t m1) {   // a cos and a sin cost about 8 plain operations
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t d = 0; d < D; ++d) {
        const float angle = float(positions[m]) * freq[d % (D / 2)];
        cos[m * D + d] = float_to_bf16(std::cos(angle));
        sin[m * D + d] = float_to_bf16(d < D / 2 ? -std::sin(angle) : std::sin(angle));
      }
  });

  int64_t I_max = 0;
  for (int64_t l = 0; l < L; ++l) I_max = std::max(I_max, in_features(layers[l * 8 + 7]));
  const int64_t QK = (Hq + Hkv) * D;   // q and k heads, stacked for their norm and rotation
  Scratch x = scratch(M * H), normed = scratch(M * H), qkv = scratch(M * qkv_width), qk = scratch(M * QK),
          qk_normed = scratch(M * QK), q = scratch(M * Hq * D), k = scratch(M * Hkv * D), v = scratch(M * Hkv * D),
          attn = scratch(M * Hq * D), proj = scratch(M * H), gate_up = scratch(M * 2 * I_max), act = scratch(M * I_max);
  const uint16_t* table = bf16_ptr(embed);
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t m = 0; m < M; ++m)
    TORCH_CHECK(id[m] >= 0 && id[m] < embed.size(0), "token id ", id[m], " outside the embedding's ", embed.size(0), " rows");
  for_rows(M, H, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t i = 0; i < H; ++i) x[m * H + i] = bf16_to_float(table[id[m] * H + i]);
  });
  // x += proj, rounded to bf16 as PyTorch's bf16 residual add
  auto add_residual = [&]() {
    for_rows(M, H, [&](int64_t m0, int64_t m1) {
      for (int64_t i = m0 * H; i < m1 * H; ++i) x[i] = round_bf16(x[i] + proj[i]);
    });
  };

  const int64_t num_captured = capture_layers.size();
  TORCH_CHECK(num_captured == 0 || (captured.scalar_type() == at::kBFloat16 && captured.is_contiguous() &&
              captured.numel() == M * num_captured * H), "captured: contiguous bf16 [B, S, layers * H] expected");
  // x holds bf16-exact values (every residual add is rounded), so the copy is exact.
  auto capture = [&](int64_t layer) {
    for (int64_t c = 0; c < num_captured; ++c) {
      if (capture_layers[c] != layer) continue;
      uint16_t* dst = bf16_ptr_mut(captured);
      for_rows(M, H, [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m)
          for (int64_t i = 0; i < H; ++i) dst[(m * num_captured + c) * H + i] = float_to_bf16(x[m * H + i]);
      });
    }
  };
  for (int64_t l = 0; l < L; ++l) {
    capture(l);
    const torch::Tensor* t = &layers[l * 8];
    const int64_t I = in_features(t[7]);
    rms_norm(x.get(), M, H, bf16_ptr(t[0]), 1, eps, normed.get());
    body_linear(normed.get(), M, H, t[1], t[2].defined() && t[2].numel() ? bf16_ptr(t[2]) : nullptr, qkv_width,
                qkv.get());
    for_rows(M, qkv_width, [&](int64_t m0, int64_t m1) {   // split q | k | v per token
      for (int64_t m = m0; m < m1; ++m) {
        std::memcpy(&qk[m * QK], &qkv[m * qkv_width], QK * sizeof(float));
        std::memcpy(&v[m * Hkv * D], &qkv[m * qkv_width + QK], Hkv * D * sizeof(float));
      }
    });
    float* rotated = qk.get();
    if (t[3].defined() && t[3].numel()) {
      rms_norm(qk.get(), M * (Hq + Hkv), D, bf16_ptr(t[3]), Hq + Hkv, eps, qk_normed.get());
      rotated = qk_normed.get();
    }
    rope(rotated, M, Hq + Hkv, D, cos.data(), sin.data());
    for_rows(M, QK, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) {
        std::memcpy(&q[m * Hq * D], &rotated[m * QK], Hq * D * sizeof(float));
        std::memcpy(&k[m * Hkv * D], &rotated[m * QK + Hq * D], Hkv * D * sizeof(float));
      }
    });
    auto k_layer = k_cache[l];
    auto v_layer = v_cache[l];
    attend(q.get(), k.get(), v.get(), Hq, Hkv, D, scale, win, k_layer, v_layer, attn.get());
    body_linear(attn.get(), M, Hq * D, t[4], nullptr, H, proj.get());
    add_residual();

    rms_norm(x.get(), M, H, bf16_ptr(t[5]), 1, eps, normed.get());
    body_linear(normed.get(), M, H, t[6], nullptr, 2 * I, gate_up.get());
    for_rows(M, I, [&](int64_t m0, int64_t m1) {   // bf16(bf16(silu(gate)) * up), 16 values at a time (I % 16 == 0)
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t i = 0; i < I; i += LANES) {
          const f32x16 g = load16(&gate_up[m * 2 * I + i]), u = load16(&gate_up[m * 2 * I + I + i]);
          const f32x16 silu = div16(g, add16(splat16(1.f), exp16(sub16(zero16(), g))));
          store16(&act[m * I + i], round_bf16x16(mul16(round_bf16x16(silu), u)));
        }
    });
    body_linear(act.get(), M, I, t[7], nullptr, H, proj.get());
    add_residual();
  }
  capture(L);
  rms_norm(x.get(), M, H, bf16_ptr(final_norm), 1, eps, normed.get());
  auto out = torch::empty({B, S, H}, embed.options());
  uint16_t* o = bf16_ptr_mut(out);
  for_rows(M, H, [&](int64_t m0, int64_t m1) {
    for (int64_t i = m0 * H; i < m1 * H; ++i) o[i] = float_to_bf16(normed[i]);
  });
  return out;
}
