// The int8 screen of the output head, shared by greedy_head.cpp and sampling_head.cpp: activations quantized to
// int8 codes, and their exact integer scores against the int8 copy of the head (AMX-INT8 tiles or AVX512-VNNI),
// from which each kernel builds rigorous per-row upper bounds on the bf16 logits.
#pragma once
#include "linear.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

// AMX-INT8 tiles: compiled where -march=native offers them (their tile state is granted by linear.h's amx_ready).
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
#define ANYDRAFT_AMX_INT8 1
#else
#define ANYDRAFT_AMX_INT8 0
#endif

namespace anydraft_native {

// R activation rows' codes (4 per int32, row stride K bytes) against one block of 16 head rows:
// acc[r] lane i = sum over columns of code * q for head row i (codes carry +128, taken out by the caller).
template <int R>
inline void int8_scores(const int32_t* codes, int64_t K, const int8_t* block, int64_t groups, __m512i* acc) {
  __m512i a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_si512();
  for (int64_t g = 0; g < groups; ++g) {
    const __m512i q = _mm512_loadu_si512(block + g * 64);
    for (int r = 0; r < R; ++r) {
#if defined(__AVX512VNNI__)
      a[r] = _mm512_dpbusd_epi32(a[r], _mm512_set1_epi32(codes[r * (K / 4) + g]), q);
#else
      alignas(64) int8_t q8[64];   // without VNNI: the same integers, one product at a time
      alignas(64) int32_t lanes[16];
      _mm512_store_si512(q8, q);
      _mm512_store_si512(lanes, a[r]);
      const int32_t code4 = codes[r * (K / 4) + g];
      const uint8_t* cu = reinterpret_cast<const uint8_t*>(&code4);
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 4; ++j) lanes[i] += int32_t(cu[j]) * int32_t(q8[4 * i + j]);
      a[r] = _mm512_load_si512(lanes);
#endif
    }
  }
  for (int r = 0; r < R; ++r) acc[r] = a[r];
}

// Which instructions score a block: the scores are exact integers either way (int32 sums of u8 x s8 products,
// far from overflow), so the choice changes no result and may follow the row count. AMX-INT8 (TDPBUSD: 16
// activation rows x 16 head rows x 64 columns per instruction) costs about one pass over the head whatever the
// rows, where VNNI's work grows with them (the verification forward's k+1 rows per request); at one row VNNI
// is as fast, and AMX then also loads and releases tile state for nothing. ANYDRAFT_NATIVE_AMX=0 turns it off.
constexpr int64_t SCREEN_AMX_MIN_ROWS = 2;

inline bool screen_uses_amx(int64_t rows) {
#if ANYDRAFT_AMX_INT8
  return rows >= SCREEN_AMX_MIN_ROWS && amx_ready();
#else
  (void)rows;
  return false;
#endif
}

// A thread's scorer of head blocks for A activation rows (codes [A, K] bytes, 4 per int32 lane, +128 carried):
// block_scores(block, out) writes out[j * 16 + i] = sum over columns of code_j * q_i for the block's 16 head rows.
class BlockScorer {
 public:
  BlockScorer(const uint8_t* codes, int64_t A, int64_t K) : codes_(codes), A_(A), K_(K), amx_(screen_uses_amx(A)) {
#if ANYDRAFT_AMX_INT8
    if (amx_) {   // tiles 0, 1: result and codes of a full group of 16 rows; 3, 4: of the last, partial group;
                  // 2: 16 groups of 4 columns x 16 head rows (the q_blocks layout)
      const int64_t full = A >= 16 ? 16 : 0, tail = A % 16;
      const int64_t rows[8] = {full, full, 16, tail, tail, 0, 0, 0}, colsb[8] = {64, 64, 64, 64, 64, 0, 0, 0};
      tiles_.load(rows, colsb);
    }
#endif
  }

  void block_scores(const int8_t* block, int32_t* out) const {
#if ANYDRAFT_AMX_INT8
    if (amx_) return amx_scores(block, out);
#endif
    const int64_t groups = K_ / 4;
    __m512i accs[4];
    for (int64_t a0 = 0; a0 < A_; a0 += 4) {
      const int32_t* c = reinterpret_cast<const int32_t*>(codes_ + a0 * K_);
      const int64_t ac = std::min<int64_t>(4, A_ - a0);
      switch (ac) {
        case 4: int8_scores<4>(c, K_, block, groups, accs); break;
        case 3: int8_scores<3>(c, K_, block, groups, accs); break;
        case 2: int8_scores<2>(c, K_, block, groups, accs); break;
        default: int8_scores<1>(c, K_, block, groups, accs); break;
      }
      for (int64_t j = 0; j < ac; ++j) _mm512_storeu_si512(out + (a0 + j) * 16, accs[j]);
    }
  }

 private:
#if ANYDRAFT_AMX_INT8
  // Two copies of one loop: the full groups' tiles (0, 1) and the last, partial group's (3, 4, configured with its
  // rows). Tile ids must be literals: GCC's intrinsics paste them into the assembly, so no template can share it.
  void amx_scores(const int8_t* block, int32_t* out) const {
    int64_t a0 = 0;
    for (; a0 + 16 <= A_; a0 += 16) {
      _tile_zero(0);
      for (int64_t k = 0; k < K_; k += 64) {
        _tile_loadd(1, codes_ + a0 * K_ + k, K_);
        _tile_loadd(2, block + k * 16, 64);
        _tile_dpbusd(0, 1, 2);
      }
      _tile_stored(0, out + a0 * 16, 64);
    }
    if (a0 < A_) {
      _tile_zero(3);
      for (int64_t k = 0; k < K_; k += 64) {
        _tile_loadd(4, codes_ + a0 * K_ + k, K_);
        _tile_loadd(2, block + k * 16, 64);
        _tile_dpbusd(3, 4, 2);
      }
      _tile_stored(3, out + a0 * 16, 64);
    }
  }
#endif
  const uint8_t* codes_;
  int64_t A_, K_;
  bool amx_;
#if ANYDRAFT_AMX_INT8
  Tiles tiles_;   // configured once, released with the scorer (Tiles: not copyable, so neither is the scorer)
#endif
};

struct Screen {  // one activation row quantized for the int8 pass
  bool usable;   // false: non-finite input, every row is computed exactly
  float scale, h_norm, e_norm;
};


// Activations: h ~ scale * p with p in [-127, 127], stored as p + 128 (VNNI's unsigned operand); codes [M * K].
inline void quantize_rows(const float* xp, int64_t M, int64_t K, std::vector<uint8_t>& codes, std::vector<Screen>& screens) {
  codes.assign(M * K, 0);
  screens.assign(M, Screen{});
  for (int64_t m = 0; m < M; ++m) {
    const float* h = xp + m * K;
    float max_abs = 0.f;
    double h_norm2 = 0.0, e_norm2 = 0.0;
    bool finite = true;
    for (int64_t k = 0; k < K; ++k) {
      finite = finite && std::isfinite(h[k]);
      max_abs = std::max(max_abs, std::fabs(h[k]));
      h_norm2 += double(h[k]) * h[k];
    }
    const float scale = max_abs > 0.f ? max_abs / 127.f : 1.f;
    for (int64_t k = 0; k < K; ++k) {
      const float p = finite ? std::nearbyint(h[k] / scale) : 0.f;
      codes[m * K + k] = uint8_t(int32_t(p) + 128);
      const double e = double(h[k]) - double(scale) * p;
      e_norm2 += e * e;
    }
    // x1.001: these norms multiply the per-row slacks, so they must not come out low.
    screens[m] = {finite, scale, float(std::sqrt(h_norm2) * 1.001), float(std::sqrt(e_norm2) * 1.001)};
  }
}

// The inputs both heads screen from: the activations (fp32 holding bf16 values, and as bf16), the bf16 head, its
// int8 copy as greedy_head.cpp describes (q_blocks, per-row scale, code sums, slacks), and the activations' codes.
struct HeadScreen {
  torch::Tensor x;   // [M, K] float; xp points into it
  int64_t M, K, groups, blocks, num_rows;
  const float* xp;
  std::vector<uint16_t> xb;   // exact: hidden is bf16
  const uint16_t* wp;
  const int8_t* qp;
  const float *sp, *sq, *sh;
  const int32_t* qs;
  std::vector<uint8_t> codes;
  std::vector<Screen> screens;

  HeadScreen(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& q_blocks,
             const torch::Tensor& row_scale, const torch::Tensor& q_sum, const torch::Tensor& slack_q,
             const torch::Tensor& slack_h, int64_t rows, const char* name)
      : x(hidden.reshape({-1, hidden.size(-1)}).to(at::kFloat).contiguous()), M(x.size(0)), K(x.size(1)),
        groups(K / 4), blocks((rows + 15) / 16), num_rows(rows) {
    TORCH_CHECK(K % 64 == 0 && q_blocks.size(1) == groups && blocks <= q_blocks.size(0), name, ": bad shapes");
    xp = x.data_ptr<float>();
    xb = to_bf16(xp, M * K);
    wp = bf16_ptr(weight);
    qp = q_blocks.data_ptr<int8_t>();
    sp = row_scale.data_ptr<float>();
    qs = q_sum.data_ptr<int32_t>();
    sq = slack_q.data_ptr<float>();
    sh = slack_h.data_ptr<float>();
    quantize_rows(xp, M, K, codes, screens);
  }

  const int8_t* block(int64_t b) const { return qp + b * groups * 64; }

  // The head's first blocks, whose bounds are kept for every activation row (the probe): at least 64 blocks or
  // 1/32 of the head. Past them a row is kept only where its bound reaches the probe's threshold (a candidate).
  int64_t probe_blocks() const { return std::min(blocks, std::max<int64_t>(64, blocks / 32)); }
};

// One block's 16 head rows, from row n: an activation row's exact int8 scores -> upper bounds on its logits.
struct BlockBound {
  __m512i offset;   // the codes' +128, taken out
  __m512 row_scale, slack_q, slack_h;

  BlockBound(const HeadScreen& h, int64_t n)
      : offset(_mm512_slli_epi32(_mm512_loadu_si512(h.qs + n), 7)), row_scale(_mm512_loadu_ps(h.sp + n)),
        slack_q(_mm512_loadu_ps(h.sq + n)), slack_h(_mm512_loadu_ps(h.sh + n)) {}

  // score: each logit's int8 estimate; returned: score plus what the two quantizations can hide (>= the fp32 dot)
  __m512 upper(const int32_t* ints, const Screen& s, __m512& score) const {
    __m512 slack;
    score = estimate(ints, s, slack);
    return _mm512_add_ps(score, slack);
  }

  // The same, and lower: the score less what they can hide (<= the fp32 dot).
  __m512 upper(const int32_t* ints, const Screen& s, __m512& score, __m512& lower) const {
    __m512 slack;
    score = estimate(ints, s, slack);
    lower = _mm512_sub_ps(score, slack);
    return _mm512_add_ps(score, slack);
  }

 private:
  __m512 estimate(const int32_t* ints, const Screen& s, __m512& slack) const {
    const __m512i dot = _mm512_sub_epi32(_mm512_loadu_si512(ints), offset);   // exact integer p . q_n per lane
    slack = _mm512_fmadd_ps(slack_q, _mm512_set1_ps(s.e_norm), _mm512_mul_ps(slack_h, _mm512_set1_ps(s.h_norm)));
    return _mm512_mul_ps(_mm512_mul_ps(row_scale, _mm512_set1_ps(s.scale)), _mm512_cvtepi32_ps(dot));
  }
};

// A bound on 16 logits' bf16 values from a bound on their fp32 dots (BlockBound::upper): rounding to bf16 can raise
// a value by |value| / 256 and flushing denormal partial sums to zero by K * FLT_MIN; /64 leaves room. The sampling
// and top heads raise their bounds by this room; greedy_head lowers its threshold by the same room instead.
inline __m512 bf16_logit_bound(__m512 dot_bound, int64_t K) {
  return _mm512_add_ps(_mm512_fmadd_ps(_mm512_abs_ps(dot_bound), _mm512_set1_ps(1.f / 64.f), dot_bound),
                       _mm512_set1_ps(float(K) * std::numeric_limits<float>::min()));
}

// A bound from below on 16 logits' bf16 values from one on their fp32 dots, with bf16_logit_bound's room.
inline __m512 bf16_logit_floor(__m512 dot_floor, int64_t K) {
  return _mm512_sub_ps(_mm512_fnmadd_ps(_mm512_abs_ps(dot_floor), _mm512_set1_ps(1.f / 64.f), dot_floor),
                       _mm512_set1_ps(float(K) * std::numeric_limits<float>::min()));
}

// The head's blocks [b0, b1), each read once and scored for every activation row whose codes are given (A rows):
// fn(b, n, rows, valid, block, ints), n = 16 b the block's first head row, rows its 16 head rows, valid those below
// num_rows, block their bounds, ints [A, 16] the exact int8 scores. Every head's screen pass is this loop.
template <class Fn>
inline void for_each_scored_block(const HeadScreen& h, const uint8_t* codes, int64_t A, int64_t b0, int64_t b1,
                                  Fn&& fn) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const BlockScorer scorer(codes, A, h.K);
  std::vector<int32_t> ints(A * 16);
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n = b * 16;
    const __m512i rows = _mm512_add_epi32(_mm512_set1_epi32(int32_t(n)), lane);
    const __mmask16 valid = _mm512_cmplt_epi32_mask(rows, _mm512_set1_epi32(int32_t(h.num_rows)));
    const BlockBound block(h, n);
    scorer.block_scores(h.block(b), ints.data());
    fn(b, n, rows, valid, block, static_cast<const int32_t*>(ints.data()));
  }
}

struct Candidate {   // a head row past the probe whose bound reached the probe's threshold
  int32_t row;
  float bound;
};

// The open lanes of a block (head rows n + lane) with their bounds.
inline void keep_open(__mmask16 open, __m512 upper, int64_t n, std::vector<Candidate>& kept) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, upper);
  for (; open; open &= open - 1) {
    const int i = __builtin_ctz(open);
    kept.push_back({int32_t(n + i), lanes[i]});
  }
}

// Head rows still standing at `threshold`: among the probed rows [0, count) (their bounds), or among candidates.
inline void append_standing(const float* bounds, int64_t count, float threshold, std::vector<int64_t>& rows) {
  for (int64_t n = 0; n < count; ++n)
    if (!(bounds[n] < threshold)) rows.push_back(n);
}

inline void append_standing(const std::vector<Candidate>& kept, float threshold, std::vector<int64_t>& rows) {
  for (const Candidate& c : kept)
    if (!(c.bound < threshold)) rows.push_back(c.row);
}

}  // namespace anydraft_native
