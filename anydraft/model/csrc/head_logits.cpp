// The output head's bf16 logits on the body's linear kernel (linear.h): each output computed the same way whatever
// the batch. Built on every CPU the body runs on; the screened heads (greedy_head.cpp and the other *_head.cpp)
// need AVX-512.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "entry_points.h"
#include "linear.h"

#include <vector>

using namespace anydraft_native;

bool matmul_uses_amx(int64_t K) { return use_amx(K); }

// logits [..., N] bf16 = bf16(hidden @ weight^T), each output computed the same way whatever the batch.
torch::Tensor head_logits(torch::Tensor hidden, torch::Tensor weight) {
  auto x = hidden.reshape({-1, hidden.size(-1)}).to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(K % LANES == 0 && weight.size(1) == K && weight.is_contiguous(), "head_logits: bad shapes");
  std::vector<float> y(M * N);
  linear(x.data_ptr<float>(), M, K, bf16_ptr(weight), nullptr, N, y.data());
  auto out = torch::empty({M, N}, hidden.options().dtype(at::kBFloat16));
  uint16_t* op = bf16_ptr_mut(out);
  at::parallel_for(0, M * N, 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) op[i] = float_to_bf16(y[i]);   // exact: y holds bf16 values
  });
  auto sizes = hidden.sizes().vec();
  sizes.back() = N;
  return out.view(sizes);
}

const char* vector_isa() { return VECTOR_ISA; }
