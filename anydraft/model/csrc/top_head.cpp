// The output head's k largest logits, exact, without computing every logit: what a top-k (and top-p) sampled
// token needs. The int8 screen (screen.h) bounds every logit from above; the k head rows with the highest bounds
// among the head's first blocks (the probe) are computed exactly, their k-th largest value is a threshold no row of
// the true top k is below, and past the probe only rows whose bound reaches it are kept and computed exactly.
// Values are head_logits' (bf16 rounding of the same dot products), so the top k equal a sort of the full logits'
// (the larger value first, the lower row on ties). A row whose screen is unusable (non-finite input), or whose
// candidates pass num_rows / 16 (a flat screen), is computed over every head row.
// Given temperatures, also bounds on the mass the k leave out (what a top-p cut without top-k divides by, beside the
// k's own mass): the sum of exp(logit / T) over every other row below num_rows lies between its rows computed
// exactly plus the rows the screen left out at their lower bounds, and those plus the same rows at their upper bounds,
// each rounded to a quarter power of two (down, or up: a VSCALEFPS and a VPERMPS a block).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "screen.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace anydraft_native;

namespace {

constexpr int64_t CANDIDATE_FRACTION = 16;

// 2^(j/4) for j = 0..3 as floats rounded up (index 0) or down (1), the rest of 16 lanes unused.
inline const __m512& quarter_powers(bool up) {
  static const __m512 powers[2] = {
      _mm512_setr_ps(1.f, std::nextafter(1.18920712f, 2.f), std::nextafter(1.41421356f, 2.f),
                     std::nextafter(1.68179283f, 2.f), 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
      _mm512_setr_ps(1.f, std::nextafter(1.18920712f, 0.f), std::nextafter(1.41421356f, 0.f),
                     std::nextafter(1.68179283f, 0.f), 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)};
  return powers[up ? 0 : 1];
}

// Per lane, for a bound below the reference and scale = log2(e) / T: 2^(q / 4) with q the ceiling (up) or floor of
// 4 (bound - reference) scale, >= (up) or <= exp((bound - reference) / T); the log2 is moved away by 2^-10 of itself
// and of 1 first (room for the float product).
inline __m512 mass_bound(__m512 bound, __m512 reference, __m512 scale, bool up) {
  const __m512 log2 = _mm512_mul_ps(_mm512_sub_ps(bound, reference), scale);
  const __m512 moved = up ? _mm512_fmadd_ps(log2, _mm512_set1_ps(1.f - 1.f / 1024), _mm512_set1_ps(1.f / 1024))
                          : _mm512_fmsub_ps(log2, _mm512_set1_ps(1.f + 1.f / 1024), _mm512_set1_ps(1.f / 1024));
  constexpr int CEIL = _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC, FLOOR = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;
  const __m512 quarters = _mm512_mul_ps(moved, _mm512_set1_ps(4.f));
  const __m512 q = up ? _mm512_roundscale_ps(quarters, CEIL) : _mm512_roundscale_ps(quarters, FLOOR);
  const __m512 e = _mm512_roundscale_ps(_mm512_mul_ps(q, _mm512_set1_ps(0.25f)), FLOOR);
  const __m512i j = _mm512_cvttps_epi32(_mm512_fnmadd_ps(e, _mm512_set1_ps(4.f), q));   // q - 4e: 0..3 (-inf: any)
  return _mm512_scalef_ps(_mm512_permutexvar_ps(j, quarter_powers(up)), e);
}

struct Ranked {   // an exact logit and its head row: the larger value first, the lower row on ties
  float value;
  int64_t row;
  bool operator<(const Ranked& o) const { return value > o.value || (value == o.value && row < o.row); }
};

}  // namespace

// The k largest of head_logits(hidden, weight)[..., :num_rows] per activation row: (values [M, k] float, rows
// [M, k] int64), in rank order, and with inv_temperature [M] float64 (else empty) the left-out mass's bounds [M, 2]
// float64 (logs, in logit / T units: lower, upper; else empty). k <= num_rows. The screen's tensors as greedy_head.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> top_head(
    torch::Tensor hidden, torch::Tensor weight, torch::Tensor q_blocks, torch::Tensor row_scale, torch::Tensor q_sum,
    torch::Tensor slack_q, torch::Tensor slack_h, int64_t num_rows, int64_t k, torch::Tensor inv_temperature) {
  TORCH_CHECK(k > 0 && k <= num_rows, "top_head: need 0 < k <= num_rows");
  const HeadScreen h(hidden, weight, q_blocks, row_scale, q_sum, slack_q, slack_h, num_rows, "top_head");
  const int64_t M = h.M, K = h.K, blocks = h.blocks;
  const int threads = at::get_num_threads();
  const bool mass = inv_temperature.numel() > 0;
  TORCH_CHECK(!mass || (inv_temperature.scalar_type() == at::kDouble && inv_temperature.numel() == M),
              "top_head: inv_temperature must be float64 with one value per activation row, or empty");
  const torch::Tensor inv_temperature_c = inv_temperature.contiguous();
  const double* inv_t = mass ? inv_temperature_c.data_ptr<double>() : nullptr;
  std::vector<float> scale(M);   // log2(e) / T per activation row
  for (int64_t m = 0; m < M && mass; ++m) scale[m] = float(inv_t[m] * 1.4426950408889634);
  // per thread and row: 16 lanes of upper, then 16 of lower bounds on the mass the screen left out
  std::vector<float> left_out(mass ? threads * M * 32 : 0, 0.f);
  const int64_t probe = h.probe_blocks();
  const int64_t probed = std::min(probe * 16, num_rows);
  std::vector<float> bound(M * probe * 16);
  std::vector<std::vector<Candidate>> candidates(M * threads);
  std::vector<float> threshold(M, std::numeric_limits<float>::infinity());
  auto screen_blocks = [&](int64_t b_begin, int64_t b_end, bool keep_bounds) {
    if (b_begin >= b_end) return;
    at::parallel_for(b_begin, b_end, 256, [&](int64_t b0, int64_t b1) {
      const int t = at::get_thread_num();
      for_each_scored_block(h, h.codes.data(), M, b0, b1, [&](int64_t, int64_t n, __m512i, __mmask16 valid,
                                                             const BlockBound& block, const int32_t* ints) {
        for (int64_t m = 0; m < M; ++m) {
          __m512 upper = _mm512_set1_ps(std::numeric_limits<float>::infinity());
          __m512 lower = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
          if (h.screens[m].usable) {
            __m512 score, dot_lower;
            const __m512 logit = block.upper(ints + m * 16, h.screens[m], score, dot_lower);
            upper = bf16_logit_bound(logit, K);
            lower = bf16_logit_floor(dot_lower, K);
          }
          if (keep_bounds) {
            _mm512_storeu_ps(bound.data() + m * probe * 16 + n, upper);
          } else {
            const __mmask16 open = _mm512_mask_cmp_ps_mask(valid, upper, _mm512_set1_ps(threshold[m]), _CMP_NLT_UQ);
            if (open) keep_open(open, upper, n, candidates[M * t + m]);
            if (mass) {   // the rows left out here count at their bounds (candidates at their exact values, below)
              float* acc = left_out.data() + (int64_t(t) * M + m) * 32;
              const __mmask16 closed = valid & ~open;
              const __m512 ref = _mm512_set1_ps(threshold[m]), sc = _mm512_set1_ps(scale[m]);
              const __m512 above = _mm512_loadu_ps(acc), below = _mm512_loadu_ps(acc + 16);
              _mm512_storeu_ps(acc, _mm512_mask_add_ps(above, closed, above, mass_bound(upper, ref, sc, true)));
              _mm512_storeu_ps(acc + 16, _mm512_mask_add_ps(below, closed, below, mass_bound(lower, ref, sc, false)));
            }
          }
        }
      });
    });
  };

  // The probe's k highest bounds, computed exactly: their k-th largest value is at most the true k-th's.
  std::vector<std::vector<Ranked>> ranked(M);
  std::vector<char> everything(M, 0);
  screen_blocks(0, probe, true);
  for (int64_t m = 0; m < M; ++m) {
    if (!h.screens[m].usable || probed < k) {
      everything[m] = 1;
      continue;
    }
    std::vector<int64_t> rows(probed);
    for (int64_t n = 0; n < probed; ++n) rows[n] = n;
    const float* bm = bound.data() + m * probe * 16;
    std::nth_element(rows.begin(), rows.begin() + (k - 1), rows.end(),
                     [&](int64_t a, int64_t b) { return bm[a] > bm[b] || (bm[a] == bm[b] && a < b); });
    rows.resize(k);
    std::vector<float> exact(k);
    exact_dots(h.xb.data() + m * K, K, h.wp, rows.data(), k, exact.data());
    threshold[m] = *std::min_element(exact.begin(), exact.end());
  }
  screen_blocks(probe, blocks, false);

  auto values = torch::empty({M, k}, hidden.options().dtype(at::kFloat));
  auto rows_out = torch::empty({M, k}, hidden.options().dtype(at::kLong));
  auto tail = torch::empty({mass ? M : 0, 2}, hidden.options().dtype(at::kDouble));
  float* vp = values.data_ptr<float>();
  int64_t* rp = rows_out.data_ptr<int64_t>();
  double* tp = tail.data_ptr<double>();
  // logs of the rows computed exactly past the k, at their values, plus (unless every row was) the rows the screen
  // left out at their lower bounds (lower; the probe's rows that did not stand count 0), or the probe's and those at
  // their upper bounds (upper), with room for the float sums.
  auto left_out_mass = [&](int64_t m, const std::vector<Ranked>& all, bool every_row_exact, double* out) {
    const double reference = every_row_exact ? double(all[k - 1].value) : double(threshold[m]);
    double sum = 0;
    for (size_t i = k; i < all.size(); ++i) sum += std::exp((double(all[i].value) - reference) * inv_t[m]);
    const double log_of_reference = reference * inv_t[m], inf = std::numeric_limits<double>::infinity();
    auto screened = [&](int half) {   // row m's lanes of left_out over every thread: 0 upper, 1 lower bounds
      double total = 0;
      for (int t = 0; t < threads; ++t)
        for (int i = 0; i < 16; ++i) total += left_out[(int64_t(t) * M + m) * 32 + 16 * half + i];
      return total;
    };
    // float sums, each lane of at most `blocks` terms in [0, 1], each add off by at most 2^-24 of the partial sum
    const double float_room = double(blocks) * 0x1p-23;
    const double below = every_row_exact ? 0 : screened(1) * (1 - float_room);
    out[0] = sum + below > 0 ? std::log(sum + below) + log_of_reference : -inf;
    if (!every_row_exact) {
      __m512 lanes = _mm512_setzero_ps();
      const __m512 ref = _mm512_set1_ps(threshold[m]), sc = _mm512_set1_ps(scale[m]);
      const float* bm = bound.data() + m * probe * 16;
      for (int64_t n = 0; n < probed; n += 16) {
        const __mmask16 in = probed - n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (probed - n)) - 1);
        const __m512 b = _mm512_maskz_loadu_ps(in, bm + n);
        const __mmask16 left = _mm512_mask_cmp_ps_mask(in, b, ref, _CMP_LT_OQ);   // standing rows are exact
        lanes = _mm512_mask_add_ps(lanes, left, lanes, mass_bound(b, ref, sc, true));
      }
      const double bounded = _mm512_reduce_add_ps(lanes) + screened(0);
      sum += bounded * (1 + float_room) + double(num_rows) * 0x1p-120;   // terms under 2^-126 may flush to zero
    }
    out[1] = sum > 0 ? std::log(sum) + log_of_reference : -inf;
  };
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      std::vector<int64_t> standing;
      if (!everything[m]) {
        append_standing(bound.data() + m * probe * 16, probed, threshold[m], standing);
        for (int t = 0; t < threads; ++t) append_standing(candidates[M * t + m], threshold[m], standing);
      }
      if (everything[m] || int64_t(standing.size()) * CANDIDATE_FRACTION > num_rows) {
        standing.resize(num_rows);
        for (int64_t n = 0; n < num_rows; ++n) standing[n] = n;
      }
      std::vector<float> exact(standing.size());
      exact_dots(h.xb.data() + m * K, K, h.wp, standing.data(), int64_t(standing.size()), exact.data());
      std::vector<Ranked> all(standing.size());
      for (size_t i = 0; i < standing.size(); ++i) all[i] = {exact[i], standing[i]};
      // NaN logits (a non-finite input) rank last
      for (Ranked& r : all) if (std::isnan(r.value)) r.value = -std::numeric_limits<float>::infinity();
      std::partial_sort(all.begin(), all.begin() + k, all.end());
      for (int64_t i = 0; i < k; ++i) {
        vp[m * k + i] = all[i].value;
        rp[m * k + i] = all[i].row;
      }
      if (mass) left_out_mass(m, all, standing.size() == size_t(num_rows), tp + 2 * m);
    }
  });
  auto sizes = hidden.sizes().vec();
  sizes.back() = k;
  auto tail_sizes = hidden.sizes().vec();
  tail_sizes.back() = 2;
  return {values.view(sizes), rows_out.view(sizes), mass ? tail.view(tail_sizes) : tail};
}
