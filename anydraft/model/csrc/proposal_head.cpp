// A coupled draft's proposal: the Gumbel-max, with the target's noise per target id, over the draft head's largest
// logits that the request's cut keeps (top-k by rank, top-p within them). A proposal only has to equal the target's
// own draw often (the target's draw decides what is emitted), so drawing among the largest logits, not every row,
// loses little: a row past them rarely wins the perturbed argmax. It costs the top-k screen (top_head.cpp, about the
// greedy screen) where the exact sampling head bounds the noise of every block it cannot rule out, and no tensor
// ops around it (a draft token is a small forward: around it, each op's microseconds counted).
#include <torch/extension.h>

#include "entry_points.h"
#include "noise.h"

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

using namespace anydraft_native;

// A head row per row of hidden [..., K]: argmax over the `selected` largest logits (top_head's, rank order) that
// row m keeps of logit * inv_temperature[m] + gumbel(keys[m], noise_ids[row]) (noise_ids int64 [>= num_rows]; empty:
// the row itself). Kept: the first top_k[m] (int64 [M], <= 0 = all; empty: all), then while the mass before a row,
// softmax(logit * inv_temperature) over those, is below top_p[m] (float64 [M]; empty or >= 1: all). The lower rank
// on ties. The screen's tensors as greedy_head.
torch::Tensor proposal_head(torch::Tensor hidden, torch::Tensor weight, torch::Tensor q_blocks, torch::Tensor row_scale,
                            torch::Tensor q_sum, torch::Tensor slack_q, torch::Tensor slack_h, int64_t num_rows,
                            int64_t selected, torch::Tensor inv_temperature, torch::Tensor keys,
                            torch::Tensor noise_ids, torch::Tensor top_k, torch::Tensor top_p) {
  auto [values, rows, unused] = top_head(hidden, weight, q_blocks, row_scale, q_sum, slack_q, slack_h, num_rows,
                                         selected, torch::empty({0}, hidden.options().dtype(at::kDouble)));
  const int64_t M = values.numel() / selected;
  auto inv_t = inv_temperature.to(at::kDouble).contiguous();
  auto key_t = keys.to(at::kLong).contiguous();
  TORCH_CHECK(inv_t.numel() == M && key_t.numel() == M, "proposal_head: one temperature and one key per row");
  auto ids_t = noise_ids.to(at::kLong).contiguous();
  TORCH_CHECK(ids_t.numel() == 0 || ids_t.numel() >= num_rows, "proposal_head: a noise id per head row, or none");
  auto top_k_t = top_k.to(at::kLong).contiguous();
  auto top_p_t = top_p.to(at::kDouble).contiguous();
  TORCH_CHECK(top_k_t.numel() == 0 || top_k_t.numel() == M, "proposal_head: one top_k per row, or none");
  TORCH_CHECK(top_p_t.numel() == 0 || top_p_t.numel() == M, "proposal_head: one top_p per row, or none");
  const float* vp = values.data_ptr<float>();
  const int64_t* rp = rows.data_ptr<int64_t>();
  const double* invp = inv_t.data_ptr<double>();
  const uint64_t* kp = reinterpret_cast<const uint64_t*>(key_t.data_ptr<int64_t>());
  const int64_t* idp = ids_t.numel() ? ids_t.data_ptr<int64_t>() : nullptr;
  const int64_t* tkp = top_k_t.numel() ? top_k_t.data_ptr<int64_t>() : nullptr;
  const double* tpp = top_p_t.numel() ? top_p_t.data_ptr<double>() : nullptr;
  auto result = torch::empty({M}, hidden.options().dtype(at::kLong));
  int64_t* out = result.data_ptr<int64_t>();
  for (int64_t m = 0; m < M; ++m) {
    TORCH_CHECK(invp[m] > 0 && std::isfinite(invp[m]), "proposal_head: temperature must be > 0");
    const float* v = vp + m * selected;
    const int64_t* r = rp + m * selected;
    int64_t kept = tkp && tkp[m] > 0 ? std::min(tkp[m], selected) : selected;
    if (tpp && tpp[m] < 1.0 && std::isfinite(v[0])) {   // the smallest prefix whose mass reaches top_p
      std::vector<double> weights(kept);   // exp((logit - largest) / T), each once
      double total = 0;
      for (int64_t i = 0; i < kept; ++i) total += weights[i] = std::exp((double(v[i]) - double(v[0])) * invp[m]);
      double before = 0;
      int64_t nucleus = 0;
      while (nucleus < kept && before < tpp[m] * total) before += weights[nucleus++];
      kept = std::max<int64_t>(nucleus, 1);
    }
    double best = -std::numeric_limits<double>::infinity();
    int64_t chosen = r[0];   // non-finite logits everywhere: the first row, as a greedy draft would
    for (int64_t i = 0; i < kept; ++i) {
      const double perturbed = double(v[i]) * invp[m] + gumbel(kp[m], idp ? idp[r[i]] : r[i]);
      if (perturbed > best) {
        best = perturbed;
        chosen = r[i];
      }
    }
    out[m] = chosen;
  }
  auto sizes = hidden.sizes().vec();
  sizes.pop_back();
  return result.view(sizes);
}
