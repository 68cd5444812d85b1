// The Python module of the native kernels: decoder.cpp (the decoder body), greedy_head.cpp (the output head's logits
// and greedy token), sampling_head.cpp (its sampled token and its noise), top_head.cpp (its k largest logits),
// proposal_head.cpp (a coupled draft's token among them).
#include <torch/extension.h>

#include <tuple>
#include <vector>

torch::Tensor decoder_forward(torch::Tensor input_ids, torch::Tensor embed, std::vector<torch::Tensor> layers,
                              torch::Tensor final_norm, torch::Tensor k_cache, torch::Tensor v_cache,
                              std::vector<int64_t> slots, std::vector<int64_t> positions, torch::Tensor inv_freq,
                              int64_t Hq, int64_t Hkv, int64_t D, double eps_d, torch::Tensor captured,
                              std::vector<int64_t> capture_layers);
torch::Tensor pack_body_weight(torch::Tensor weight);
torch::Tensor body_linear_op(torch::Tensor x, torch::Tensor weight, int64_t N);
torch::Tensor head_logits(torch::Tensor hidden, torch::Tensor weight);
std::tuple<torch::Tensor, torch::Tensor> greedy_head(torch::Tensor hidden, torch::Tensor weight, torch::Tensor q_blocks, torch::Tensor row_scale,
                          torch::Tensor q_sum, torch::Tensor slack_q, torch::Tensor slack_h, int64_t num_rows);

torch::Tensor sampling_head(torch::Tensor hidden, torch::Tensor weight, torch::Tensor q_blocks, torch::Tensor row_scale,
                            torch::Tensor q_sum, torch::Tensor slack_q, torch::Tensor slack_h, int64_t num_rows,
                            torch::Tensor inv_temperature, torch::Tensor keys, torch::Tensor noise_ids,
                            torch::Tensor floors);
torch::Tensor head_noise(torch::Tensor keys, torch::Tensor ids);
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> top_head(
    torch::Tensor hidden, torch::Tensor weight, torch::Tensor q_blocks, torch::Tensor row_scale, torch::Tensor q_sum,
    torch::Tensor slack_q, torch::Tensor slack_h, int64_t num_rows, int64_t k, torch::Tensor inv_temperature);

torch::Tensor proposal_head(torch::Tensor hidden, torch::Tensor weight, torch::Tensor q_blocks, torch::Tensor row_scale,
                            torch::Tensor q_sum, torch::Tensor slack_q, torch::Tensor slack_h, int64_t num_rows,
                            int64_t selected, torch::Tensor inv_temperature, torch::Tensor keys,
                            torch::Tensor noise_ids, torch::Tensor top_k, torch::Tensor top_p);

bool matmul_uses_amx(int64_t K);
bool screen_uses_amx_tiles(int64_t rows);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("matmul_path", [](int64_t K) { return matmul_uses_amx(K) ? "amx" : "avx512"; },
        "which linear kernel runs a weight of K columns in this process");
  m.def("screen_path", [](int64_t rows) { return screen_uses_amx_tiles(rows) ? "amx" : "vnni"; },
        "which instructions score the int8 head screen for this many activation rows in this process");
  m.def("decoder_forward", &decoder_forward, "Llama-family decoder body, bf16, batch-invariant");
  m.def("pack_body_weight", &pack_body_weight, "a body weight packed in the tile layout the body reads (AMX tiles or AVX-512 vectors), or None for an odd width");
  m.def("body_linear", &body_linear_op, "x @ weight^T in bf16 as the decoder body computes it (weight row-major or packed)");
  m.def("head_logits", &head_logits, "bf16 logits of an output head, batch-invariant");
  m.def("greedy_head", &greedy_head, "exact argmax of head_logits, screened by an int8 copy of the head");
  m.def("sampling_head", &sampling_head, "exact Gumbel-max draw from softmax(head_logits / T), screened likewise");
  m.def("head_noise", &head_noise, "the sampling head's float64 noise of each (key, id): keys [M], ids [M, n]");
  m.def("proposal_head", &proposal_head, "a coupled draft's token: Gumbel-max with given noise ids over the largest head_logits a top-k / top-p cut keeps");
  m.def("top_head", &top_head, "the k largest head_logits (values, rows) per activation row, screened likewise, and given temperatures bounds on the log-mass of the rest");
}
