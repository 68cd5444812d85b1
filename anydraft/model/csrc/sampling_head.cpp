// The output head's sampled token, drawn exactly from softmax(head_logits / T) without computing every logit.
//
// Why: on CPU a sampled token used to cost the full logits (qwen3: a read of the 58 MB bf16 head per forward,
// then float32 copies, a softmax and a draw over 151936 entries), where greedy decoding reads only the int8 copy
// (greedy_head.cpp). Gumbel-max makes sampling an argmax: token = argmax_n (l_n / T + g_n) with g_n iid
// Gumbel(0, 1) is distributed exactly as softmax(l / T). The int8 screen bounds every l_n from above; a cheap
// float32 upper bound on g_n (from the top 24 bits of its uniform) bounds every perturbed value, and only rows
// whose bound reaches the best exact perturbed value found are computed exactly (head_logits' arithmetic, the
// noise in float64). The answer is the exact Gumbel-max over all rows; nothing is approximate but float64
// rounding of the noise (as the inverse-CDF draw of sampling.py rounds its sums).
//
// Noise, built by blocks of 16 ids (id >> 4) so that most of the head is bounded with one hash per block: the
// largest noise of a block is drawn first, g_max = -log(w0 / 16) with w0 = -log(u0) (Gumbel(log 16): the max of 16
// Gumbel(0, 1)), at lane j = z0 & 15 of the block (uniform, from bits of z0 that u0 does not use); every other id n
// of the block gets a Gumbel truncated below g_max, g_n = -log(w0 / 16 - log(u_n)). Together the 16 are exactly
// iid Gumbel(0, 1) (a maximum, where it lies, and the others given it). A block whose screened logits plus g_max's
// bound cannot reach the best value found needs nothing more. Uniforms: u = ((z >> 11) + 1/2) 2^-53 with
// z = (h(c, key) << 32) | h'(c, key), two keyed 32-bit hashes of a counter c (lowbias32 rounds with the key's halves
// mixed in): c = n for id n, c = (n >> 4) | 2^31 for its block (ids < 2^31). One 64-bit key per activation row (its
// request's key for that output position, sampling.draw_keys), so a seeded request draws the same token whatever
// its batch-mates, its position in the batch, the thread count or the step that draws it. Bounds need only h (z's
// top 24 bits), 16 counters per vector.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "noise.h"
#include "screen.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace anydraft_native;

namespace {

inline __m512i lowbias32x16(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int32_t(0x7FEB352Du)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int32_t(0x846CA68Bu)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

// hash_high and hash_low of 16 counters.
inline __m512i hash_high16(uint64_t key, __m512i n) {
  const __m512i x = _mm512_add_epi32(_mm512_mullo_epi32(n, _mm512_set1_epi32(int32_t(0x9E3779B9u))),
                                     _mm512_set1_epi32(int32_t(uint32_t(key))));
  return lowbias32x16(_mm512_xor_si512(lowbias32x16(x), _mm512_set1_epi32(int32_t(uint32_t(key >> 32)))));
}

inline __m512i hash_low16(uint64_t key, __m512i n) {
  const __m512i x = _mm512_add_epi32(_mm512_mullo_epi32(n, _mm512_set1_epi32(int32_t(0x85EBCA6Bu))),
                                     _mm512_set1_epi32(int32_t(uint32_t(key >> 32))));
  return lowbias32x16(_mm512_xor_si512(lowbias32x16(x), _mm512_set1_epi32(int32_t(uint32_t(key) ^ 0x5BD1E995u))));
}

inline __m512i block_counters16(__m512i ids) {
  return _mm512_or_si512(_mm512_srli_epi32(ids, 4), _mm512_set1_epi32(int32_t(BLOCK_COUNTER)));
}

// Natural log of 16 positive floats (0 -> -inf), abs error below 1e-6 * (1 + |log x|): exponent and mantissa in
// [sqrt(1/2), sqrt(2)), then 2 atanh(s) to s^9. Only used for bounds, which carry a margin far above its error.
inline __m512 log16(__m512 x) {
  __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
  __m512 e = _mm512_getexp_ps(x);
  const __mmask16 high = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356f), _CMP_GT_OQ);
  m = _mm512_mask_mul_ps(m, high, m, _mm512_set1_ps(0.5f));
  e = _mm512_mask_add_ps(e, high, e, _mm512_set1_ps(1.f));
  // s = (m - 1) / (m + 1) by a 14-bit reciprocal and one Newton step (~2^-27 relative; a division is slower)
  const __m512 d = _mm512_add_ps(m, _mm512_set1_ps(1.f));
  __m512 r = _mm512_rcp14_ps(d);
  r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.f)));
  const __m512 s = _mm512_mul_ps(_mm512_sub_ps(m, _mm512_set1_ps(1.f)), r);
  const __m512 s2 = _mm512_mul_ps(s, s);
  __m512 p = _mm512_set1_ps(2.f / 9.f);
  p = _mm512_fmadd_ps(p, s2, _mm512_set1_ps(2.f / 7.f));
  p = _mm512_fmadd_ps(p, s2, _mm512_set1_ps(2.f / 5.f));
  p = _mm512_fmadd_ps(p, s2, _mm512_set1_ps(2.f / 3.f));
  p = _mm512_fmadd_ps(p, s2, _mm512_set1_ps(2.f));
  // x = 0: getexp gives -inf and the sum is -inf, as log(0)
  return _mm512_fmadd_ps(e, _mm512_set1_ps(0.693147181f), _mm512_mul_ps(p, s));
}

constexpr int32_t TOP_MAX = 0xFFFFFF;   // z's top 24 bits all set: v = 1 below

// Lower bounds on w = -log u for 16 uniforms given z's top 24 bits (u < v = (top + 1) 2^-24, so w > -log v), less a
// margin over log16's error; 0 where v = 1.
inline __m512 neglog_lower16(__m512i top) {
  const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(top, _mm512_set1_epi32(1))), _mm512_set1_ps(0x1p-24f));
  const __m512 w = _mm512_sub_ps(_mm512_setzero_ps(), log16(v));
  return _mm512_max_ps(_mm512_fnmadd_ps(w, _mm512_set1_ps(1e-5f), _mm512_sub_ps(w, _mm512_set1_ps(2e-6f))),
                       _mm512_setzero_ps());
}

// Upper bounds on -log s for s >= s_low >= 0 (+inf for s_low = 0), with a margin over log16's error.
inline __m512 neglog_upper16(__m512 s_low) {
  const __m512 g = _mm512_sub_ps(_mm512_setzero_ps(), log16(s_low));
  return _mm512_add_ps(g, _mm512_fmadd_ps(_mm512_abs_ps(g), _mm512_set1_ps(1e-4f), _mm512_set1_ps(1e-4f)));
}

inline __m512i top_bits16(__m512i z_high) { return _mm512_srli_epi32(z_high, 8); }

// Bounds on the largest noise of 16 blocks given their counters' hash_high: -log(w0 / 16) from w0's lower bound.
inline __m512 block_max_bound16(__m512 w0_low) {
  return neglog_upper16(_mm512_mul_ps(w0_low, _mm512_set1_ps(1.f / 16.f)));
}

// The largest finite bound block_max_bound16 gives, over every top below TOP_MAX (log16 near 1 is not monotone to
// the last bit, so the 2^16 tops nearest it are scanned; below them v < 1 - 2^-8 and the bound is under 9).
inline float block_noise_cap() {
  static const float cap = [] {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    float worst = 9.f;
    for (int32_t t0 = TOP_MAX - 65536; t0 < TOP_MAX; t0 += 16) {
      const __m512i top = _mm512_min_epi32(_mm512_add_epi32(_mm512_set1_epi32(t0), lane), _mm512_set1_epi32(TOP_MAX - 1));
      worst = std::max(worst, _mm512_reduce_max_ps(block_max_bound16(neglog_lower16(top))));
    }
    return std::nextafter(worst, std::numeric_limits<float>::infinity());
  }();
  return cap;
}

// Bounds on the noise of 16 ids: their blocks' w0 lower bounds, which lane holds its block's maximum, and each id's
// own uniform (hash_high of the id): -log(w0 / 16) at the maximum, -log(w0 / 16 + w_n) elsewhere.
inline __m512 noise_bound16(uint64_t key, __m512i ids, __m512 w0_low, __mmask16 at_max) {
  const __m512 w = _mm512_maskz_mov_ps(__mmask16(~at_max), neglog_lower16(top_bits16(hash_high16(key, ids))));
  return neglog_upper16(_mm512_fmadd_ps(w0_low, _mm512_set1_ps(1.f / 16.f), w));
}

struct BestDouble {  // running argmax: the larger value, the lower index on ties
  double value = -std::numeric_limits<double>::infinity();
  int64_t index = -1;
  void offer(double v, int64_t i) {
    if (index < 0 || v > value || (v == value && i < index)) {
      value = v;
      index = i;
    }
  }
};

}  // namespace

// One token per row of hidden [..., K]: argmax over rows [0, num_rows) of head_logits(hidden, weight) / T + g,
// T = 1 / inv_temperature[m] (float64, > 0), g of head row n from keys[m] (int64, any bits) and the counter
// noise_ids[n] (int64 [>= num_rows]; empty: n itself). A head whose rows stand for other ids (a draft's head over a
// target vocabulary) passes those ids, so that the draft and the target draw with the same noise per id.
// floors[m] (float [M]; empty: none): only rows whose logit is at least it take part (a top-p cut's kept set, a
// prefix of the rows by logit): the Gumbel-max restricted to them. The screen's tensors as greedy_head.
torch::Tensor sampling_head(torch::Tensor hidden, torch::Tensor weight, torch::Tensor q_blocks, torch::Tensor row_scale,
                            torch::Tensor q_sum, torch::Tensor slack_q, torch::Tensor slack_h, int64_t num_rows,
                            torch::Tensor inv_temperature, torch::Tensor keys, torch::Tensor noise_ids,
                            torch::Tensor floors) {
  TORCH_CHECK(num_rows > 0, "sampling_head: bad shapes");
  const HeadScreen h(hidden, weight, q_blocks, row_scale, q_sum, slack_q, slack_h, num_rows, "sampling_head");
  const int64_t M = h.M, K = h.K, blocks = h.blocks;
  auto inv_t = inv_temperature.to(at::kDouble).contiguous();
  auto key_t = keys.to(at::kLong).contiguous();
  TORCH_CHECK(inv_t.numel() == M && key_t.numel() == M, "sampling_head: one temperature and one key per row");
  const double* invp = inv_t.data_ptr<double>();
  const uint64_t* kp = reinterpret_cast<const uint64_t*>(key_t.data_ptr<int64_t>());
  for (int64_t m = 0; m < M; ++m) TORCH_CHECK(invp[m] > 0 && std::isfinite(invp[m]), "sampling_head: temperature must be > 0");
  auto floor_t = floors.to(at::kFloat).contiguous();
  const bool floored = floor_t.numel() > 0;
  TORCH_CHECK(!floored || floor_t.numel() == M, "sampling_head: one floor per row, or none");
  const float* floorp = floored ? floor_t.data_ptr<float>() : nullptr;
  auto ids_t = noise_ids.to(at::kLong).contiguous();
  const bool mapped = ids_t.numel() > 0;
  TORCH_CHECK(!mapped || ids_t.numel() >= num_rows, "sampling_head: a noise id per head row");
  // Padded to whole blocks (the padding lanes are never candidates).
  std::vector<int32_t> counters(blocks * 16);   // noise ids are vocabulary ids: below 2^31
  const int64_t* idp = mapped ? ids_t.data_ptr<int64_t>() : nullptr;   // once: data_ptr() checks on every call
  for (int64_t n = 0; n < blocks * 16; ++n) counters[n] = int32_t(mapped ? idp[std::min(n, num_rows - 1)] : n);

  // Pass 1, over the head's first blocks (the probe): every row's upper bound on its perturbed value (+inf for a
  // row without a usable screen) is kept, and per thread and lane the row with the highest bound seeds the exact
  // search. Then over the rest, against the probe's threshold (at most the final one): only rows whose bound
  // reaches it are kept, as candidates (a full bound array was M x the head's rows of floats written and read).
  const int threads = at::get_num_threads();
  const int64_t probe = h.probe_blocks();
  const int64_t probed = probe * 16;
  std::vector<float> bound(M * probed);
  std::vector<std::vector<Candidate>> candidates(M * threads);
  std::vector<int64_t> seeds(M * threads * 16, -1);
  std::vector<float> threshold(M, -std::numeric_limits<float>::infinity());
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  // Where the noise ids are the head rows themselves (a target's head), a head block is a noise block: its largest
  // noise is bounded once per block and row m, 16 blocks per vector, before the block's scores are looked at.
  // Mapped ids (a draft's head) fall in many blocks: each lane's block is hashed, and its logs are taken only where
  // the largest finite block bound (block_noise_cap) could reach.
  const float cap = block_noise_cap();
  auto screen_blocks = [&](int64_t b_begin, int64_t b_end, bool keep_bounds) {
    if (b_begin >= b_end) return;
    at::parallel_for(b_begin, b_end, 256, [&](int64_t b0, int64_t b1) {
      const int t = at::get_thread_num();
      int64_t* seed = &seeds[M * 16 * t];
      std::vector<__m512> best_bound(M, _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
      std::vector<__m512i> best_row(M, _mm512_set1_epi32(-1));
      std::vector<float> block_w0(mapped ? 0 : M * 16), block_max(mapped ? 0 : M * 16);   // 16 blocks at a time
      for_each_scored_block(h, h.codes.data(), M, b0, b1, [&](int64_t b, int64_t n, __m512i rows, __mmask16 valid,
                                                             const BlockBound& block, const int32_t* ints) {
        if (!mapped && (b - b0) % 16 == 0)   // the next 16 blocks, for every row m: w0's lower bound, g_max's bound
          for (int64_t m = 0; m < M; ++m) {
            const __m512i blocks16 = _mm512_or_si512(_mm512_add_epi32(_mm512_set1_epi32(int32_t(b)), lane),
                                                     _mm512_set1_epi32(int32_t(BLOCK_COUNTER)));
            const __m512 w0 = neglog_lower16(top_bits16(hash_high16(kp[m], blocks16)));
            _mm512_storeu_ps(block_w0.data() + m * 16, w0);
            _mm512_storeu_ps(block_max.data() + m * 16, block_max_bound16(w0));
          }
        for (int64_t m = 0; m < M; ++m) {
          __m512 upper = _mm512_set1_ps(std::numeric_limits<float>::infinity());
          if (h.screens[m].usable) {
            __m512 score;
            const __m512 logit = block.upper(ints + m * 16, h.screens[m], score);   // >= the fp32 dot
            const __m512 rounded = bf16_logit_bound(logit, K);   // >= the bf16 logit
            // / T in float32 (relative error 2^-23 at most, against a 1e-5 relative margin), then the noise's bound
            const __m512 scaled = _mm512_mul_ps(rounded, _mm512_set1_ps(float(invp[m])));
            const __m512 scaled_up = _mm512_fmadd_ps(_mm512_abs_ps(scaled), _mm512_set1_ps(1e-5f), scaled);
            const __m512i ids = _mm512_loadu_si512(counters.data() + n);
            const __m512 threshold_m = _mm512_set1_ps(threshold[m]);
            __m512 w0;
            __mmask16 at_max;
            if (mapped) {
              const __m512i lane_blocks = block_counters16(ids);
              const __m512i top0 = top_bits16(hash_high16(kp[m], lane_blocks));
              if (!keep_bounds) {   // past the probe: skip the logs where even the largest block noise cannot reach
                const __mmask16 unbounded = _mm512_cmpeq_epi32_mask(top0, _mm512_set1_epi32(TOP_MAX));   // v = 1
                __m512 reach = _mm512_add_ps(scaled_up, _mm512_set1_ps(cap));
                reach = _mm512_fmadd_ps(_mm512_abs_ps(reach), _mm512_set1_ps(1e-6f), reach);
                if (!(_mm512_mask_cmp_ps_mask(valid, reach, threshold_m, _CMP_NLT_UQ) | (unbounded & valid)))
                  continue;   // no row of this block can win for m (nor seed it: its bound is below the best exact value)
              }
              w0 = neglog_lower16(top0);
              const __m512i lane_at_max = _mm512_and_si512(hash_low16(kp[m], lane_blocks), _mm512_set1_epi32(15));
              at_max = _mm512_cmpeq_epi32_mask(lane_at_max, _mm512_and_si512(ids, _mm512_set1_epi32(15)));
            } else {
              const int64_t i = m * 16 + (b - b0) % 16;
              if (!keep_bounds) {   // past the probe: this block's largest noise cannot lift any row to the best value
                __m512 reach = _mm512_add_ps(scaled_up, _mm512_set1_ps(block_max[i]));
                reach = _mm512_fmadd_ps(_mm512_abs_ps(reach), _mm512_set1_ps(1e-6f), reach);
                if (!_mm512_mask_cmp_ps_mask(valid, reach, threshold_m, _CMP_NLT_UQ)) continue;
              }
              w0 = _mm512_set1_ps(block_w0[i]);
              at_max = __mmask16(1u << (hash_low(kp[m], uint32_t(b) | BLOCK_COUNTER) & 15));
            }
            upper = _mm512_add_ps(scaled_up, noise_bound16(kp[m], ids, w0, at_max));
            upper = _mm512_fmadd_ps(_mm512_abs_ps(upper), _mm512_set1_ps(1e-6f), upper);   // the sum's rounding
          }
          if (keep_bounds) {
            _mm512_storeu_ps(bound.data() + m * probed + n, upper);
          } else {
            const __mmask16 open = _mm512_mask_cmp_ps_mask(valid, upper, _mm512_set1_ps(threshold[m]), _CMP_NLT_UQ);
            if (open) keep_open(open, upper, n, candidates[M * t + m]);   // rare: most blocks leave no row standing
          }
          const __mmask16 better = _mm512_mask_cmp_ps_mask(valid, upper, best_bound[m], _CMP_GT_OQ);
          best_bound[m] = _mm512_mask_blend_ps(better, best_bound[m], upper);
          best_row[m] = _mm512_mask_blend_epi32(better, best_row[m], rows);
        }
      });
      for (int64_t m = 0; m < M; ++m) {
        alignas(64) int32_t row_ids[16];
        _mm512_store_si512(row_ids, best_row[m]);
        for (int l = 0; l < 16; ++l)
          if (row_ids[l] >= 0) seed[m * 16 + l] = row_ids[l];
      }
    });
  };

  // The exact perturbed value of head row n for activation row m: the bf16 logit (head_logits' value) / T + g
  // (rows under the floor take no part: a bound above a best value that only they reach stays safe).
  auto perturbed = [&](int64_t m, const float* logits, const int64_t* rows, int64_t count, BestDouble& best) {
    for (int64_t i = 0; i < count; ++i)
      if (!floored || !(logits[i] < floorp[m]))
        best.offer(double(logits[i]) * invp[m] + gumbel(kp[m], counters[rows[i]]), rows[i]);
  };
  // best[m] takes the seeds' exact values (it only rises, so the probe's threshold is at most the final one); a
  // row whose bound is below it (rounded down to float) cannot win.
  std::vector<BestDouble> best(M);
  auto set_thresholds = [&] {
    for (int64_t m = 0; m < M; ++m) {
      std::vector<int64_t> rows;
      for (int t = 0; t < threads; ++t)
        for (int l = 0; l < 16; ++l)
          if (seeds[(M * t + m) * 16 + l] >= 0) rows.push_back(seeds[(M * t + m) * 16 + l]);
      std::vector<float> logits(rows.size());
      exact_dots(h.xb.data() + m * K, K, h.wp, rows.data(), int64_t(rows.size()), logits.data());
      perturbed(m, logits.data(), rows.data(), int64_t(rows.size()), best[m]);
      const double v = best[m].value;
      threshold[m] = std::isfinite(v) ? std::nextafter(float(v), -std::numeric_limits<float>::infinity())
                                      : -std::numeric_limits<float>::infinity();
    }
    std::fill(seeds.begin(), seeds.end(), -1);
  };
  screen_blocks(0, probe, true);
  set_thresholds();
  screen_blocks(probe, blocks, false);
  set_thresholds();

  // Pass 2: the exact perturbed values of the rows that could still win (probed rows and candidates).
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      std::vector<int64_t> survivors;
      append_standing(bound.data() + m * probed, std::min(probed, num_rows), threshold[m], survivors);
      for (int t = 0; t < threads; ++t) append_standing(candidates[M * t + m], threshold[m], survivors);
      std::vector<float> exact(survivors.size());
      exact_dots(h.xb.data() + m * K, K, h.wp, survivors.data(), int64_t(survivors.size()), exact.data());
      perturbed(m, exact.data(), survivors.data(), int64_t(survivors.size()), best[m]);
    }
  });
  auto result = torch::empty({M}, hidden.options().dtype(at::kLong));
  int64_t* rp = result.data_ptr<int64_t>();
  // NaN everywhere (a non-finite hidden state) wins nowhere: such a row gets its first seed, as argmax of NaN.
  for (int64_t m = 0; m < M; ++m) rp[m] = best[m].index >= 0 ? best[m].index : 0;
  return result.view(hidden.sizes().slice(0, hidden.dim() - 1));
}

// The noise gumbel() gives each id, for a draw among chosen rows (a top-k cut): keys [M] int64, ids [M, n] int64
// (< 2^31) -> [M, n] float64.
torch::Tensor head_noise(torch::Tensor keys, torch::Tensor ids) {
  auto key_t = keys.to(at::kLong).contiguous();
  auto id_t = ids.to(at::kLong).contiguous();
  const int64_t M = key_t.numel();
  TORCH_CHECK(id_t.dim() == 2 && id_t.size(0) == M, "head_noise: ids [M, n] for keys [M]");
  const int64_t n = id_t.size(1);
  auto out = torch::empty({M, n}, id_t.options().dtype(at::kDouble));
  const uint64_t* kp = reinterpret_cast<const uint64_t*>(key_t.data_ptr<int64_t>());
  const int64_t* ip = id_t.data_ptr<int64_t>();
  double* op = out.data_ptr<double>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < n; ++i) op[m * n + i] = gumbel(kp[m], ip[m * n + i]);
  return out;
}
