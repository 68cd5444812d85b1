// The native module's functions, declared once: for the bindings (bindings.cpp) and for a kernel that calls another
// (proposal_head.cpp calls top_head).
#pragma once
#include <torch/extension.h>

#include <tuple>
#include <vector>

torch::Tensor decoder_forward(torch::Tensor input_ids, torch::Tensor embed, std::vector<torch::Tensor> layers,
                              torch::Tensor final_norm, torch::Tensor k_cache, torch::Tensor v_cache,
                              torch::Tensor block_tables, std::vector<int64_t> slots, std::vector<int64_t> positions,
                              torch::Tensor inv_freq,
                              int64_t Hq, int64_t Hkv, int64_t D, double eps_d, torch::Tensor captured,
                              std::vector<int64_t> capture_layers);
torch::Tensor pack_body_weight(torch::Tensor weight);
torch::Tensor body_linear_op(torch::Tensor x, torch::Tensor weight, int64_t N);
torch::Tensor head_logits(torch::Tensor hidden, torch::Tensor weight);
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> row_logprobs(
    torch::Tensor logits, torch::Tensor chosen, int64_t vocab, int64_t n, int64_t m);
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
const char* vector_isa();
bool screen_uses_amx_tiles(int64_t rows);
