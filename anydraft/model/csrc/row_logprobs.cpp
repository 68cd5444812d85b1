// Raw logprobs of bf16 logits, row by row in a few passes over each row and nothing written per vocabulary entry:
// the chosen token's logprob and rank and the n largest (spec_decode/logprobs.py's rules; its PyTorch path writes
// the whole log_softmax and sorts candidates out of it, which on a CPU cost more than the head's logits for small
// hidden sizes). logprob_j = (x_j - max) - log(sum_i exp(x_i - max)) in fp32 over the first `vocab` entries; the
// sum's order is fixed per row, so a row's values do not depend on the batch it came in.
#include <torch/extension.h>

#include "entry_points.h"
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

using namespace anydraft_native;

namespace {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

struct Entry {
  float value;
  int64_t id;
};

// The order of the top-n: the larger value first, the lower id first among equal values.
inline bool before(const Entry& a, const Entry& b) { return a.value > b.value || (a.value == b.value && a.id < b.id); }

struct Row {
  const uint16_t* x;
  int64_t vocab;

  f32x16 block(int64_t j) const {   // entries j..j+15; past the vocabulary -inf
    const int64_t left = vocab - j;
    return left >= LANES ? load_bf16x16(x + j) : keep_first(load_bf16x16_first(x + j, left), left, NEG_INF);
  }
  float at(int64_t j) const { return bf16_to_float(x[j]); }
};

// Pass 1: the row's max and its m largest logits (logit order, then id): a heap whose top is the worst kept; once
// full, a block is looked at lane by lane only where a lane beats that worst (rare after the first blocks).
float max_and_candidates(const Row& row, int64_t m, std::vector<Entry>& heap) {
  const auto worse = [](const Entry& a, const Entry& b) { return before(a, b); };   // max-heap of "after"
  heap.clear();
  f32x16 top = splat16(NEG_INF);
  alignas(64) float lanes[LANES];
  for (int64_t j = 0; j < row.vocab; j += LANES) {
    const f32x16 v = row.block(j);
    top = max16(top, v);
    const bool full = int64_t(heap.size()) == m;
    uint32_t hits = full ? lanes_above(v, heap.front().value) : 0xFFFFu;
    if (!hits) continue;
    store16(lanes, v);
    for (int64_t i = 0; i < LANES && j + i < row.vocab; ++i) {
      if (!(hits >> i & 1u)) continue;
      const Entry e{lanes[i], j + i};
      if (int64_t(heap.size()) < m) {
        heap.push_back(e);
        std::push_heap(heap.begin(), heap.end(), worse);
      } else if (before(e, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), worse);
        heap.back() = e;
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
  }
  return max_lanes(top);
}

// Pass 2: log(sum exp(x - max)). Each chunk of SUM_CHUNK entries is summed in 16 lanes (add_lanes' fixed tree),
// the chunks' sums in double: a long row's rounding error stays that of a short one's.
constexpr int64_t SUM_CHUNK = 1024;

float log_sum(const Row& row, float max) {
  const f32x16 shift = splat16(max);
  double total = 0;
  for (int64_t c = 0; c < row.vocab; c += SUM_CHUNK) {
    f32x16 acc = zero16();
    for (int64_t j = c; j < std::min(c + SUM_CHUNK, row.vocab); j += LANES) {
      const int64_t left = row.vocab - j;
      const f32x16 e = exp16(sub16(row.block(j), shift));
      acc = add16(acc, left >= LANES ? e : keep_first(e, left, 0.f));
    }
    total += add_lanes(acc);
  }
  return float(std::log(total));
}

struct Shift {
  float max, log_sum;
  float logprob(float x) const { return (x - max) - log_sum; }
  f32x16 logprobs(f32x16 x) const { return sub16(sub16(x, splat16(max)), splat16(log_sum)); }
};

// Pass 3: how many entries have a logprob above `value` (the rank is one more).
int64_t count_above(const Row& row, const Shift& s, float value) {
  int64_t count = 0;
  for (int64_t j = 0; j < row.vocab; j += LANES)
    count += __builtin_popcount(lanes_above(s.logprobs(row.block(j)), value));
  return count;
}

// Only for a crowded row (more entries share the n-th logprob than the candidates hold): the lowest `needed` ids
// whose logprob equals `value`, in id order.
void lowest_ids_at(const Row& row, const Shift& s, float value, int64_t needed, std::vector<Entry>& out) {
  for (int64_t j = 0; j < row.vocab && needed > 0; ++j) {
    if (s.logprob(row.at(j)) == value) {
      out.push_back({value, j});
      --needed;
    }
  }
}

}  // namespace

// logits [R, V] bf16, chosen [R] long (a negative id: no token there, zeros out; others capped at the vocabulary),
// the first `vocab` entries counted, n >= 0 top entries from m >= max(n, 1) candidates
// -> (logprob [R] f32, rank [R] long, top ids [R, n] long, top logprobs [R, n] f32).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> row_logprobs(
    torch::Tensor logits, torch::Tensor chosen, int64_t vocab, int64_t n, int64_t m) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kBFloat16 && logits.is_contiguous(),
              "row_logprobs: logits must be [R, V] contiguous bf16");
  const int64_t R = logits.size(0), V = logits.size(1);
  TORCH_CHECK(vocab >= 1 && vocab <= V && n >= 0 && n <= vocab && m >= std::max<int64_t>(n, 1),
              "row_logprobs: need 1 <= vocab <= V, 0 <= n <= vocab, m >= max(n, 1)");
  m = std::min(m, vocab);
  auto ids = chosen.to(at::kLong).contiguous();
  TORCH_CHECK(ids.numel() == R, "row_logprobs: one chosen id per row");
  auto logprob = torch::empty({R}, logits.options().dtype(at::kFloat));
  auto rank = torch::empty({R}, logits.options().dtype(at::kLong));
  auto top_ids = torch::empty({R, n}, logits.options().dtype(at::kLong));
  auto top_logprobs = torch::empty({R, n}, logits.options().dtype(at::kFloat));
  const uint16_t* x = bf16_ptr(logits);
  const int64_t* cp = ids.data_ptr<int64_t>();
  float *lp = logprob.data_ptr<float>(), *tlp = top_logprobs.data_ptr<float>();
  int64_t *rp = rank.data_ptr<int64_t>(), *tip = top_ids.data_ptr<int64_t>();
  for_rows(R, V, [&](int64_t r0, int64_t r1) {
    std::vector<Entry> candidates, chosen_top;
    for (int64_t r = r0; r < r1; ++r) {
      if (cp[r] < 0) {   // no token at this position (past a row's emitted ones): nothing to compute
        lp[r] = 0.f;
        rp[r] = 1;
        std::fill(tip + r * n, tip + (r + 1) * n, 0);
        std::fill(tlp + r * n, tlp + (r + 1) * n, 0.f);
        continue;
      }
      const Row row{x + r * V, vocab};
      const float max = max_and_candidates(row, m, candidates);
      const Shift s{max, log_sum(row, max)};
      const int64_t c = std::min(cp[r], vocab - 1);
      lp[r] = s.logprob(row.at(c));
      rp[r] = 1 + count_above(row, s, lp[r]);
      for (Entry& e : candidates) e.value = s.logprob(e.value);
      std::sort(candidates.begin(), candidates.end(), before);
      if (n == 0) continue;
      const float nth = candidates[n - 1].value;
      chosen_top.assign(candidates.begin(), candidates.begin() + n);
      // Every logprob outside the candidates is <= the last candidate's; equal to the n-th only if that one is.
      if (m < vocab && candidates.back().value == nth) {
        chosen_top.clear();
        for (const Entry& e : candidates)
          if (e.value > nth) chosen_top.push_back(e);
        lowest_ids_at(row, s, nth, n - int64_t(chosen_top.size()), chosen_top);
      }
      for (int64_t i = 0; i < n; ++i) {
        tip[r * n + i] = chosen_top[i].id;
        tlp[r * n + i] = chosen_top[i].value;
      }
    }
  });
  return {logprob, rank, top_ids, top_logprobs};
}
