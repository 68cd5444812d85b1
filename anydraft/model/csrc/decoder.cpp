// The decoder body of a Llama-family model in one native call, for bf16 on x86-64 CPUs with AVX-512.
//
// Why: at the sizes of draft models (and of the shipped models) a PyTorch forward is ~50 framework calls
// per layer, each costing more than its arithmetic; at real sizes (hidden 1024+) the layers are a read of the
// weights, which linear() (kernels.h) does once for all rows of the forward.
// Every output row is computed the same way whatever the number of rows, its place among them, or the threads
// (each output in one fixed summation order; threads split outputs, never sums), so a k+1-token verification,
// a 1-token decode and a prefill give bit-identical rows: greedy speculative decoding in bf16 equals the target
// alone exactly, not only up to near-ties.
// Rounding follows the PyTorch path: every tensor PyTorch would store in bf16 is rounded to bf16 here.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "linear.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

using namespace anydraft_native;

namespace {

inline float sum_lanes(const float* x, int64_t n) {  // fixed order: 16 lanes, then the lane tree
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k = 0; k < n; k += LANES) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + k));
  return _mm512_reduce_add_ps(acc);
}

// rows of x [rows, n] (bf16 values in fp32) -> weight * bf16(x * rsqrt(mean(x^2) + eps)), HF's RMSNorm.
// weight rows: one weight vector per row, cycling (Qwen3's q/k norm: one vector per stacked head).
void rms_norm(const float* x, int64_t rows, int64_t n, const uint16_t* weight, int64_t weight_rows, float eps,
              float* out) {
  std::vector<float> squares(n);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    for (int64_t k = 0; k < n; ++k) squares[k] = xr[k] * xr[k];
    const float inv = 1.f / std::sqrt(sum_lanes(squares.data(), n) / float(n) + eps);
    const uint16_t* w = weight + (r % weight_rows) * n;
    for (int64_t k = 0; k < n; ++k) out[r * n + k] = round_bf16(bf16_to_float(w[k]) * round_bf16(xr[k] * inv));
  }
}

// x [M, heads, D] rotated in place: bf16(bf16(x*cos) + bf16(swap(x)*signed_sin)), cos/sin [M, D].
void rope(float* x, int64_t M, int64_t heads, int64_t D, const uint16_t* cos, const uint16_t* sin) {
  const int64_t half = D / 2;
  std::vector<float> rotated(D);
  for (int64_t m = 0; m < M; ++m) {
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
}

struct Window {  // where a forward's rows live in the cache
  int64_t B, S;
  const int64_t* slots;      // [B] cache row of each batch row
  const int64_t* positions;  // [B, S] cache index (= position) of each new token; key j visible iff j <= it
};

// Writes the new k/v [M, Hkv, D] into the layer's cache, then attends: out [M, Hq*D] (bf16 values).
void attend(const float* q, const float* k, const float* v, int64_t Hq, int64_t Hkv, int64_t D, float scale,
            const Window& win, torch::Tensor& k_cache, torch::Tensor& v_cache, float* out) {
  // k_cache/v_cache: [B_max, L_max + 1, Hkv, D] of this layer
  const int64_t row_stride = k_cache.stride(0), pos_stride = k_cache.stride(1);
  uint16_t* kc = bf16_ptr_mut(k_cache);
  uint16_t* vc = bf16_ptr_mut(v_cache);
  for (int64_t b = 0; b < win.B; ++b)
    for (int64_t s = 0; s < win.S; ++s) {
      const int64_t m = b * win.S + s;
      const int64_t at = win.slots[b] * row_stride + win.positions[m] * pos_stride;
      for (int64_t i = 0; i < Hkv * D; ++i) {
        kc[at + i] = float_to_bf16(k[m * Hkv * D + i]);
        vc[at + i] = float_to_bf16(v[m * Hkv * D + i]);
      }
    }
  const int64_t group = Hq / Hkv;
  at::parallel_for(0, win.B * win.S * Hq, 4, [&](int64_t i0, int64_t i1) {
    std::vector<float> probs;
    std::vector<float> acc(D);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t m = i / Hq, h = i % Hq, g = h / group, b = m / win.S;
      const int64_t num_keys = win.positions[m] + 1;
      const uint16_t* keys = kc + win.slots[b] * row_stride + g * D;
      const uint16_t* values = vc + win.slots[b] * row_stride + g * D;
      const float* qv = q + (m * Hq + h) * D;
      probs.resize(num_keys);
      float max_score = -INFINITY;
      for (int64_t j = 0; j < num_keys; ++j) {
        probs[j] = dot_row(qv, keys + j * pos_stride, D) * scale;
        max_score = std::max(max_score, probs[j]);
      }
      float total = 0.f;
      for (int64_t j = 0; j < num_keys; ++j) {
        probs[j] = std::exp(probs[j] - max_score);
        total += probs[j];
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < num_keys; ++j) {
        const uint16_t* vj = values + j * pos_stride;
        const __m512 p = _mm512_set1_ps(probs[j]);
        for (int64_t d = 0; d < D; d += LANES)
          _mm512_storeu_ps(acc.data() + d, _mm512_fmadd_ps(p, load_bf16x16(vj + d), _mm512_loadu_ps(acc.data() + d)));
      }
      float* o = out + (m * Hq + h) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = round_bf16(acc[d] / total);
    }
  });
}

}  // namespace

// input_ids [B, S] -> last hidden states after the final norm, [B, S, H] bf16.
// layers: per layer 8 tensors: input_norm [H], qkv_weight [(Hq+2Hkv)*D, H], qkv_bias or empty,
//   qk_norm [Hq+Hkv, D] or empty, o_weight [H, Hq*D], post_norm [H], gate_up_weight [2I, H], down_weight [H, I].
// k_cache / v_cache: [L, B_max, L_max+1, Hkv, D] bf16, written at (slots[b], positions[b*S + s]); a new token's
// position is also its rotary position, and key j is visible to it iff j <= its position.
// inv_freq: [D/2] float32 rotary inverse frequencies.
// captured: [B, S, len(capture_layers) * H] bf16, or empty: the residual stream at the input of each listed layer
// (id L = the last layer's output before the final norm), side by side, for a hidden-state draft.
torch::Tensor decoder_forward(torch::Tensor input_ids, torch::Tensor embed, std::vector<torch::Tensor> layers,
                              torch::Tensor final_norm, torch::Tensor k_cache, torch::Tensor v_cache,
                              std::vector<int64_t> slots, std::vector<int64_t> positions, torch::Tensor inv_freq,
                              int64_t Hq, int64_t Hkv, int64_t D, double eps_d, torch::Tensor captured,
                              std::vector<int64_t> capture_layers) {
  TORCH_CHECK(embed.scalar_type() == at::kBFloat16 && embed.is_contiguous(), "embed: contiguous bf16 expected");
  TORCH_CHECK(layers.size() % 8 == 0, "8 tensors per layer expected");
  auto ids = input_ids.to(at::kLong).contiguous();
  const int64_t B = ids.size(0), S = ids.size(1), H = embed.size(1), M = B * S;
  TORCH_CHECK(int64_t(slots.size()) == B && int64_t(positions.size()) == M, "one slot per row, one position per token");
  const int64_t L = layers.size() / 8;
  const float eps = float(eps_d), scale = 1.f / std::sqrt(float(D));
  const int64_t qkv_width = (Hq + 2 * Hkv) * D;
  const Window win{B, S, slots.data(), positions.data()};
  // cos and sign-folded sin per token, rounded to bf16 as the PyTorch path stores them (llama.CausalLM.rope)
  std::vector<uint16_t> cos(M * D), sin(M * D);
  const float* freq = inv_freq.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t d = 0; d < D; ++d) {
      const float angle = float(positions[m]) * freq[d % (D / 2)];
      cos[m * D + d] = float_to_bf16(std::cos(angle));
      sin[m * D + d] = float_to_bf16(d < D / 2 ? -std::sin(angle) : std::sin(angle));
    }

  std::vector<float> x(M * H), normed(M * H), qkv(M * qkv_width), q(M * Hq * D), k(M * Hkv * D), v(M * Hkv * D);
  std::vector<float> attn(M * Hq * D), proj(M * H);
  const uint16_t* table = bf16_ptr(embed);
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t m = 0; m < M; ++m) {
    TORCH_CHECK(id[m] >= 0 && id[m] < embed.size(0), "token id ", id[m], " outside the embedding's ", embed.size(0), " rows");
    for (int64_t i = 0; i < H; ++i) x[m * H + i] = bf16_to_float(table[id[m] * H + i]);
  }

  const int64_t num_captured = capture_layers.size();
  TORCH_CHECK(num_captured == 0 || (captured.scalar_type() == at::kBFloat16 && captured.is_contiguous() &&
              captured.numel() == M * num_captured * H), "captured: contiguous bf16 [B, S, layers * H] expected");
  // x holds bf16-exact values (every residual add is rounded), so the copy is exact.
  auto capture = [&](int64_t layer) {
    for (int64_t c = 0; c < num_captured; ++c) {
      if (capture_layers[c] != layer) continue;
      uint16_t* dst = bf16_ptr_mut(captured);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < H; ++i) dst[(m * num_captured + c) * H + i] = float_to_bf16(x[m * H + i]);
    }
  };
  for (int64_t l = 0; l < L; ++l) {
    capture(l);
    const torch::Tensor* t = &layers[l * 8];
    const int64_t I = t[6].size(0) / 2;
    rms_norm(x.data(), M, H, bf16_ptr(t[0]), 1, eps, normed.data());
    linear(normed.data(), M, H, bf16_ptr(t[1]), t[2].defined() && t[2].numel() ? bf16_ptr(t[2]) : nullptr,
           qkv_width, qkv.data());
    // split q | k | v per token; q and k heads stacked for their norm and rotation
    std::vector<float> qk(M * (Hq + Hkv) * D);
    for (int64_t m = 0; m < M; ++m) {
      std::memcpy(&qk[m * (Hq + Hkv) * D], &qkv[m * qkv_width], (Hq + Hkv) * D * sizeof(float));
      std::memcpy(&v[m * Hkv * D], &qkv[m * qkv_width + (Hq + Hkv) * D], Hkv * D * sizeof(float));
    }
    if (t[3].defined() && t[3].numel()) {
      std::vector<float> qk_normed(qk.size());
      rms_norm(qk.data(), M * (Hq + Hkv), D, bf16_ptr(t[3]), Hq + Hkv, eps, qk_normed.data());
      qk.swap(qk_normed);
    }
    rope(qk.data(), M, Hq + Hkv, D, cos.data(), sin.data());
    for (int64_t m = 0; m < M; ++m) {
      std::memcpy(&q[m * Hq * D], &qk[m * (Hq + Hkv) * D], Hq * D * sizeof(float));
      std::memcpy(&k[m * Hkv * D], &qk[m * (Hq + Hkv) * D + Hq * D], Hkv * D * sizeof(float));
    }
    auto k_layer = k_cache[l];
    auto v_layer = v_cache[l];
    attend(q.data(), k.data(), v.data(), Hq, Hkv, D, scale, win, k_layer, v_layer, attn.data());
    linear(attn.data(), M, Hq * D, bf16_ptr(t[4]), nullptr, H, proj.data());
    for (int64_t i = 0; i < M * H; ++i) x[i] = round_bf16(x[i] + proj[i]);

    rms_norm(x.data(), M, H, bf16_ptr(t[5]), 1, eps, normed.data());
    std::vector<float> gate_up(M * 2 * I), act(M * I);
    linear(normed.data(), M, H, bf16_ptr(t[6]), nullptr, 2 * I, gate_up.data());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < I; ++i) {
        const float g = gate_up[m * 2 * I + i], u = gate_up[m * 2 * I + I + i];
        act[m * I + i] = round_bf16(round_bf16(g / (1.f + std::exp(-g))) * u);
      }
    linear(act.data(), M, I, bf16_ptr(t[7]), nullptr, H, proj.data());
    for (int64_t i = 0; i < M * H; ++i) x[i] = round_bf16(x[i] + proj[i]);
  }
  capture(L);
  rms_norm(x.data(), M, H, bf16_ptr(final_norm), 1, eps, normed.data());
  auto out = torch::empty({B, S, H}, embed.options());
  uint16_t* o = bf16_ptr_mut(out);
  for (int64_t i = 0; i < M * H; ++i) o[i] = float_to_bf16(normed[i]);
  return out;
}
