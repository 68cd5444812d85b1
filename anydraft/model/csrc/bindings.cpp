// The Python module of the native kernels: decoder.cpp (the decoder body), head_logits.cpp (the output head's logits),
// row_logprobs.cpp (logprobs read off bf16 logits),
// greedy_head.cpp (its greedy token), sampling_head.cpp (its sampled token and its noise), top_head.cpp (its k largest logits),
// proposal_head.cpp (a coupled draft's token among them).
#include "entry_points.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("matmul_path", [](int64_t K) { return matmul_uses_amx(K) ? "amx" : vector_isa(); },
        "which linear kernel runs a weight of K columns in this process: amx, avx512 or avx2");
  m.def("decoder_forward", &decoder_forward, "Llama-family decoder body, bf16, batch-invariant");
  m.def("pack_body_weight", &pack_body_weight, "a body weight packed in the tile layout the body reads (AMX tiles or AVX-512 vectors), or None for an odd width");
  m.def("body_linear", &body_linear_op, "x @ weight^T in bf16 as the decoder body computes it (weight row-major or packed)");
  m.def("head_logits", &head_logits, "bf16 logits of an output head, batch-invariant");
  m.def("row_logprobs", &row_logprobs, "raw logprobs of bf16 logits per row: the chosen id's (and its rank) and the n largest, from m candidates");
#if defined(__AVX512F__)   // the screened heads (an int8 copy of the head scored with VNNI)
  m.def("screen_path", [](int64_t rows) { return screen_uses_amx_tiles(rows) ? "amx" : "vnni"; },
        "which instructions score the int8 head screen for this many activation rows in this process");
  m.def("greedy_head", &greedy_head, "exact argmax of head_logits, screened by an int8 copy of the head");
  m.def("sampling_head", &sampling_head, "exact Gumbel-max draw from softmax(head_logits / T), screened likewise");
  m.def("head_noise", &head_noise, "the sampling head's float64 noise of each (key, id): keys [M], ids [M, n]");
  m.def("proposal_head", &proposal_head, "a coupled draft's token: Gumbel-max with given noise ids over the largest head_logits a top-k / top-p cut keeps");
  m.def("top_head", &top_head, "the k largest head_logits (values, rows) per activation row, screened likewise, and given temperatures bounds on the log-mass of the rest");
#endif
}
