// A small decoder-only transformer in the Llama style, as data: its configuration, the layout of its
// parameters in one flat array, the initialization, and safetensors checkpoints.
//
//   tokens -> embedding -> L x [ x += Wo attn(rope(Wq n1(x)), rope(Wk n1(x)), Wv n1(x))   (causal, GQA)
//                                x += Wd (silu(Wg n2(x)) * Wu n2(x)) ]                    (SwiGLU)
//          -> RMSNorm -> lm_head -> logits over the byte vocabulary -> cross-entropy with the next byte
//
// n1, n2 are RMSNorms with learned weights; rope is the half-split rotary embedding of layers.hpp;
// attention has `heads` query heads and `kv_heads` key/value heads of head_dim = dim / heads. The
// embedding and the output head are separate matrices, or one (tie_embeddings: lm_head reads the
// embedding's [vocab x dim] table, and its gradient adds to the embedding's). Linear weights are
// [out x in] (torch.nn.Linear's layout) and carry Hugging Face Llama's tensor names, so a checkpoint
// maps onto transformers' LlamaForCausalLM (rms_norm_eps = norm_eps, rope_theta, tie_word_embeddings).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "harness/registry.hpp"

namespace memtrade::model {

struct Config {
  int64_t vocab = 256;  // bytes
  int64_t dim = 0, layers = 0, heads = 0, kv_heads = 0, ffn = 0;
  int64_t context = 0;  // longest sequence the model is trained on (RoPE positions 0..context-1)
  float norm_eps = 1e-5f, rope_theta = 10000.f;
  bool tie_embeddings = false;

  int64_t head_dim() const { return dim / heads; }
  int64_t kv_dim() const { return kv_heads * head_dim(); }
};

// Throws Error naming the problem: sizes <= 0, heads not dividing dim, kv_heads not dividing heads,
// an odd head_dim (RoPE pairs), head_dim > 256 (the attention kernels), eps <= 0 or theta <= 1.
void validate(const Config& c);

// From JSON {"vocab": 256, "dim": ..., "layers": ..., "heads": ..., "kv_heads": ..., "ffn": ...,
// "context": ..., "norm_eps": ..., "rope_theta": ..., "tie_embeddings": false} (vocab, kv_heads,
// norm_eps, rope_theta and tie_embeddings optional; kv_heads defaults to heads), or from a case's parameters of the same names. Validated.
Config config_from_json(const Json& j);
Config config_from_case(const Case& c);
Json to_json(const Config& c);

// One parameter tensor inside the flat parameter array.
struct ParamTensor {
  std::string name;            // Hugging Face Llama name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // [out, in] for linear weights, [vocab, dim] embedding, [dim] norms
  int64_t offset = 0, size = 0;  // elements
  bool decay = false;          // AdamW weight decay applies (matrices, not norm weights)
};

// Offsets of every parameter in one flat array, in this order: embedding; per layer input_layernorm,
// q_proj, k_proj, v_proj, o_proj, post_attention_layernorm, gate_proj, up_proj, down_proj; final norm;
// lm_head (none when tied: head == embed).
struct ParamLayout {
  struct Layer { int64_t attn_norm, wq, wk, wv, wo, mlp_norm, wg, wu, wd; };
  std::vector<ParamTensor> tensors;
  std::vector<Layer> layer;       // element offsets per layer
  int64_t embed = 0, final_norm = 0, head = 0;
  int64_t total = 0;              // number of parameters
};
ParamLayout param_layout(const Config& c);

// Initial parameters, a pure function of (config, seed): matrices N(0, 0.02^2) (GPT-2 / Llama), the
// residual projections o_proj and down_proj scaled by 1/sqrt(2 layers), norm weights 1.
std::vector<float> init_params(const Config& c, uint64_t seed);

// FLOPs of one training step per token (forward + backward): 6 x matrix parameters (embedding lookup
// excluded, lm_head included) plus causal attention 3.5 x 2 x seq x dim per layer (scores and
// values, forward 1x, backward 2.5x, halved for the causal mask).
double train_flops_per_token(const Config& c, int64_t seq);

// Checkpoints: every parameter as a tensor in `dtype` (fp32, bf16 or fp16, rounded to nearest even),
// the config in the metadata ("memtrade.config" as JSON) plus any extra metadata given.
void save_checkpoint(const std::filesystem::path& path, const Config& c, std::span<const float> params,
                     DType dtype = DType::f32, const std::map<std::string, std::string>& extra = {});
// Reads the config and the parameters (converted to fp32); throws Error naming the file and the
// problem for a missing or mis-shaped tensor or a missing config.
std::vector<float> load_checkpoint(const std::filesystem::path& path, Config& c);

}  // namespace memtrade::model
