// The output head's greedy argmax, computed exactly without computing all the logits (head_logits.cpp), on AVX-512.
//
// Why: on CPU the output head is memory-bound (qwen3's 151936 x 192 bf16 rows are 58 MB per forward) and,
// with the native body, most of a forward. An int8 copy of the head is half the bytes; with int8 activations
// its dot products are exact integers (AVX512-VNNI). Each int8 score plus a rigorous bound on what the two
// quantizations can hide gives an upper bound on the row's true logit; only rows whose bound reaches the
// best exact logit found are computed exactly (head_logits' arithmetic), so the answer is the argmax of
// head_logits, lowest index on ties, from typically a handful of exact rows instead of 151936.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "screen.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace anydraft_native;

namespace {

struct Best {  // running argmax: the larger value, the lower index on ties
  float value = -std::numeric_limits<float>::infinity();
  int64_t index = -1;
  void offer(float v, int64_t i) {
    if (index < 0 || v > value || (v == value && i < index)) {
      value = v;
      index = i;
    }
  }
};

inline float exact_logit(const uint16_t* x, const uint16_t* w, int64_t K, int64_t row) {
  float out;
  exact_dots(x, K, w, &row, 1, &out);   // as linear() with no bias
  return out;
}

// A row whose screen leaves more than this fraction of the head to compute exactly (degenerate activations, e.g.
// one token repeated, whose outliers make the int8 copy of the row coarse) gets all its logits from linear(),
// which reads the head once for all such rows: the same values, so the same argmax, at no more than their cost.
constexpr int64_t FALLBACK_FRACTION = 64;
// With AMX bf16 the full logits of up to 16 rows cost one read of the bf16 head, while a VNNI screen's work grows
// with the rows: past this many rows (measured crossover about 12 on a Sapphire Rapids VM, 0.6B head) every row
// takes the full logits, unless AMX-INT8 tiles screen them (screen.h), about one read of the int8 head for all.
constexpr int64_t SCREEN_MAX_ROWS_AMX = 8;

}  // namespace

bool screen_uses_amx_tiles(int64_t rows) { return screen_uses_amx(rows); }

// argmax over rows [0, num_rows) of head_logits(hidden, weight) per row of hidden -> ([...] int64, [...] bool:
// whether the row took the full-logits fallback).
// Per row n of the head (padded to blocks of 16): weight_n ~ row_scale[n] * q_n with q int8, laid out as
// q_blocks [N/16, K/4, 16, 4] so one VNNI instruction advances 16 rows by 4 columns (no horizontal sums);
// q_sum[n] = sum of q_n; slack_q[n] = ||row_scale * q_n||, slack_h[n] = ||w_n - row_scale * q_n|| plus the
// summation-error term, both rounded up.
std::tuple<torch::Tensor, torch::Tensor> greedy_head(torch::Tensor hidden, torch::Tensor weight, torch::Tensor q_blocks, torch::Tensor row_scale,
                          torch::Tensor q_sum, torch::Tensor slack_q, torch::Tensor slack_h, int64_t num_rows) {
  const HeadScreen h(hidden, weight, q_blocks, row_scale, q_sum, slack_q, slack_h, num_rows, "greedy_head");
  const int64_t M = h.M, K = h.K, blocks = h.blocks;
  const std::vector<Screen>& screens = h.screens;

  // Pass 1, over the head's first blocks (the probe): every row's bound is kept; the best score per activation row
  // (and thread) seeds the exact search. Then over the rest, against the probe's threshold (at most the final one,
  // so nothing that could win is dropped): only the rows whose bound reaches it are kept, as candidates.
  const int threads = at::get_num_threads();
  std::vector<Best> seeds(M * threads);
  std::vector<float> threshold(M, -std::numeric_limits<float>::infinity());
  const bool screen = !(use_amx(K) && M > SCREEN_MAX_ROWS_AMX) || screen_uses_amx(M);
  const int64_t probe = screen ? h.probe_blocks() : 0;
  const int64_t probed = probe * 16;
  std::vector<float> bound(M * probed);
  // Per thread and activation row; a row with more candidates than this takes the full logits (as a screen
  // leaving more than 1/FALLBACK_FRACTION of the head standing does).
  const int64_t max_candidates = num_rows / FALLBACK_FRACTION + 1;
  std::vector<std::vector<Candidate>> candidates(M * threads);
  std::vector<char> overflow(M * threads, 0);
  // Blocks [b_begin, b_end) of the head for the activation rows `active`: bounds kept (probe) or filtered.
  auto screen_blocks = [&](int64_t b_begin, int64_t b_end, const std::vector<int64_t>& active, bool keep_bounds) {
    const int64_t A = int64_t(active.size());
    if (A == 0 || b_begin >= b_end) return;
    std::vector<uint8_t> active_codes(A * K);
    for (int64_t j = 0; j < A; ++j) std::memcpy(&active_codes[j * K], &h.codes[active[j] * K], K);
    at::parallel_for(b_begin, b_end, 256, [&](int64_t b0, int64_t b1) {
      const int t = at::get_thread_num();
      Best* seed = &seeds[M * t];
      std::vector<__m512> best_score(A, _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
      std::vector<__m512i> best_row(A, _mm512_set1_epi32(-1));
      for_each_scored_block(h, active_codes.data(), A, b0, b1, [&](int64_t, int64_t n, __m512i rows, __mmask16 valid,
                                                                 const BlockBound& block, const int32_t* ints) {
        for (int64_t j = 0; j < A; ++j) {
          const int64_t m = active[j];
          __m512 score;
          const __m512 upper = block.upper(ints + j * 16, screens[m], score);
          if (keep_bounds) {
            _mm512_storeu_ps(bound.data() + m * probed + n, upper);
          } else {
            const __mmask16 open = _mm512_mask_cmp_ps_mask(valid, upper, _mm512_set1_ps(threshold[m]), _CMP_NLT_UQ);
            if (open && !overflow[M * t + m]) {   // rare: almost every block has no row left standing
              std::vector<Candidate>& kept = candidates[M * t + m];
              keep_open(open, upper, n, kept);
              if (int64_t(kept.size()) > max_candidates) overflow[M * t + m] = 1;
            }
          }
          const __mmask16 better = _mm512_mask_cmp_ps_mask(valid, score, best_score[j], _CMP_GT_OQ);
          best_score[j] = _mm512_mask_blend_ps(better, best_score[j], score);
          best_row[j] = _mm512_mask_blend_epi32(better, best_row[j], rows);
        }
      });
      for (int64_t j = 0; j < A; ++j) {
        alignas(64) float scores[16];
        alignas(64) int32_t row_ids[16];
        _mm512_store_ps(scores, best_score[j]);
        _mm512_store_si512(row_ids, best_row[j]);
        for (int l = 0; l < 16; ++l)
          if (row_ids[l] >= 0) seed[active[j]].offer(scores[l], row_ids[l]);
      }
    });
  };

  std::vector<Best> best(M);
  // best[m]: the best exact logit among the seeds so far (it only rises, so the probe's threshold is at most the
  // final one); threshold[m]: a row whose bound is more than a bf16 step below it cannot round up to it (the room
  // of screen.h's bf16_logit_bound, taken off the threshold here).
  auto set_threshold = [&](int64_t m) {
    for (int t = 0; t < threads; ++t) {
      const Best& s = seeds[M * t + m];
      if (s.index >= 0) best[m].offer(exact_logit(h.xb.data() + m * K, h.wp, K, s.index), s.index);
    }
    const float v = best[m].value;
    threshold[m] = screens[m].usable ? v - std::fabs(v) * (1.f / 64.f) - float(K) * std::numeric_limits<float>::min()
                                     : -std::numeric_limits<float>::infinity();
  };
  auto probe_survivors = [&](int64_t m) {   // probed rows whose bound reaches the threshold
    std::vector<int64_t> rows;
    append_standing(bound.data() + m * probed, std::min(probed, num_rows), threshold[m], rows);
    return rows;
  };

  // Rows the probe already leaves wide open (more than 1/FALLBACK_FRACTION of the probed rows standing) skip the
  // rest of the screen and take the full logits, so a degenerate row costs little more than its full logits.
  std::vector<int64_t> all(screen ? M : 0), rest;
  for (int64_t m = 0; m < int64_t(all.size()); ++m) all[m] = m;
  screen_blocks(0, probe, all, true);
  std::vector<char> is_full(M, screen ? 0 : 1);
  for (int64_t m = 0; m < int64_t(all.size()); ++m) {
    set_threshold(m);
    if (int64_t(probe_survivors(m).size()) * FALLBACK_FRACTION > std::min(probed, num_rows)) is_full[m] = 1;
    else rest.push_back(m);
  }
  screen_blocks(probe, blocks, rest, false);
  // The final threshold, and each screened row's survivors: probed rows and candidates that still reach it.
  std::vector<std::vector<int64_t>> survivors(M);
  for (int64_t m : rest) {
    set_threshold(m);
    survivors[m] = probe_survivors(m);
    for (int t = 0; t < threads; ++t) {
      is_full[m] |= overflow[M * t + m];
      append_standing(candidates[M * t + m], threshold[m], survivors[m]);
    }
    if (int64_t(survivors[m].size()) * FALLBACK_FRACTION > num_rows) is_full[m] = 1;
  }

  // Rows the screen cannot narrow enough: all their logits at once (linear() reads the head once for all).
  std::vector<int64_t> full_rows;
  for (int64_t m = 0; m < M; ++m)
    if (is_full[m]) full_rows.push_back(m);
  if (!full_rows.empty()) {
    const int64_t F = int64_t(full_rows.size());
    std::vector<float> xf(F * K), logits(F * num_rows);
    for (int64_t f = 0; f < F; ++f) std::memcpy(&xf[f * K], h.xp + full_rows[f] * K, K * sizeof(float));
    linear(xf.data(), F, K, h.wp, nullptr, num_rows, logits.data());
    for (int64_t f = 0; f < F; ++f) {
      Best top;
      for (int64_t n = 0; n < num_rows; ++n) top.offer(logits[f * num_rows + n], n);
      best[full_rows[f]] = top;
    }
  }

  // Pass 2: exact logits of the rows that could still win.
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      if (is_full[m] || survivors[m].empty()) continue;
      std::vector<float> exact(survivors[m].size());
      exact_dots(h.xb.data() + m * K, K, h.wp, survivors[m].data(), int64_t(survivors[m].size()), exact.data());
      for (size_t i = 0; i < survivors[m].size(); ++i) best[m].offer(exact[i], survivors[m][i]);
    }
  });
  auto result = torch::empty({M}, hidden.options().dtype(at::kLong));
  auto fell_back = torch::empty({M}, hidden.options().dtype(at::kBool));
  for (int64_t m = 0; m < M; ++m) {
    result.data_ptr<int64_t>()[m] = best[m].index;
    fell_back.data_ptr<bool>()[m] = is_full[m] != 0;
  }
  const auto batch = hidden.sizes().slice(0, hidden.dim() - 1);
  return {result.view(batch), fell_back.view(batch)};
}
